"""Kernels the tests start talk to them over Unix sockets, not TCP ports, and lose no message (``kernel_manager``).

jupyter_client chooses a kernel's five TCP ports by binding port 0 and closing the socket, writes them to the
connection file, and the kernel binds them a second or more later, once ipykernel is imported. On a busy machine with
three workers, kernels, Jupyter servers and Chromium opening connections, another process can take one of those ports
in that window, and the kernel dies at start ("Address already in use", then nbclient's "Kernel died before replying
to kernel_info": a fresh-clone run of 3ba3546). Unix sockets in a directory of the kernel's own cannot be taken by
anyone else. The directory is short (a Unix socket path is at most 107 bytes) and removed with the kernel.

A kernel's messages to a test are never dropped (``kernel_manager``). Its IOPub is a PUB socket: ZeroMQ keeps at most
1,000 messages queued for a subscriber on each side of the connection (the kernel's and the client's high-water
marks) and drops the rest without a word. Two panels' set-up publishes 1,518 messages in about two seconds; in a loaded
trial of the suite the client's process did not read for long enough, the last messages of that cell were dropped
with its ``idle`` status, and the test waited for an idle that never came ("no message for 120 s", trial 33). Stopping
the client's process for 6 s while that cell ran lost the same ones (992 of 1,518 arrived). So each kernel's IOPub
queue is set unbounded before a test's client connects, and so is each client's.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

# how a test's kernel starts, in place of ``-m ipykernel_launcher``: its IOPub socket is made with an unbounded send
# queue. ZeroMQ copies a socket's queue limit into its listener when it binds, so it is set where the socket is made
# (ipykernel makes its own context, and binds at once); the rest is ipykernel_launcher as ``-m`` runs it.
_LAUNCH = """
import runpy, zmq
_socket = zmq.Context.socket
def _unbounded(self, socket_type, *args, **kwargs):
    made = _socket(self, socket_type, *args, **kwargs)
    if socket_type in (zmq.PUB, zmq.XPUB):
        made.setsockopt(zmq.SNDHWM, 0)
    return made
zmq.Context.socket = _unbounded
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""

__all__ = ["kernel_manager", "notebook_client"]


def kernel_manager(kernel_name: str = "python3", **kw: Any) -> Any:
    """A ``jupyter_client.KernelManager`` for ``kernel_name`` whose sockets are files in a fresh directory."""
    import jupyter_client

    folder = tempfile.mkdtemp(prefix="nbt-k")
    km = jupyter_client.KernelManager(kernel_name=kernel_name, transport="ipc", ip=f"{folder}/k", **kw)
    shutdown = km.shutdown_kernel

    def shutdown_and_clean(*args: Any, **kwargs: Any) -> Any:
        try:
            return shutdown(*args, **kwargs)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    km.shutdown_kernel = shutdown_and_clean  # type: ignore[method-assign]  # the folder goes with the kernel
    make_client, format_cmd = km.client, km.format_kernel_cmd

    def client(*args: Any, **kwargs: Any) -> Any:
        import zmq

        kc = make_client(*args, **kwargs)
        kc.context.setsockopt(zmq.RCVHWM, 0)  # a default for the sockets it makes: its channels are made later
        return kc

    def kernel_cmd(*args: Any, **kwargs: Any) -> list[str]:
        cmd = list(format_cmd(*args, **kwargs))
        for i in range(len(cmd) - 1):
            if cmd[i : i + 2] == ["-m", "ipykernel_launcher"]:
                return [*cmd[:i], "-c", _LAUNCH, *cmd[i + 2 :]]
        raise RuntimeError(f"not an ipykernel command, its IOPub queue cannot be unbounded: {cmd}")

    km.client = client  # type: ignore[method-assign]
    km.format_kernel_cmd = kernel_cmd  # type: ignore[method-assign]
    return km


def notebook_client(nb: Any, **kw: Any) -> Any:
    """``nbclient.NotebookClient(nb, **kw)`` whose kernel is started by :func:`kernel_manager`."""
    import nbclient

    client = nbclient.NotebookClient(nb, km=kernel_manager(kw.pop("kernel_name", "python3")), **kw)
    client.owns_km = True  # it shuts the kernel down after the run, as it does a kernel it started itself
    return client
