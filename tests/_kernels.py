"""Kernels the tests start talk to them over Unix sockets, not TCP ports, and lose no message (``kernel_manager``).

jupyter_client chooses a kernel's five TCP ports by binding port 0 and closing the socket, writes them to the
connection file, and the kernel binds them a second or more later, once ipykernel is imported. On a busy machine with
three workers, kernels, Jupyter servers and Chromium opening connections, another process can take one of those ports
in that window, and the kernel dies at start ("Address already in use", then nbclient's "Kernel died before replying
to kernel_info": a fresh-clone run of 3ba3546). Unix sockets in a directory of the kernel's own cannot be taken by
anyone else. The directory is short (a Unix socket path is at most 107 bytes) and removed with the kernel.

A kernel's messages to a test are never dropped: ZeroMQ drops what is past 1,000 queued messages on each side of a
kernel's IOPub, and a loaded trial lost the end of a 1,518-message cell that way (``tests/_site/_nbt_zmq.py`` says
more). The kernels the suite starts make their IOPub queue unbounded (``tests/_site``), and each client made here reads
into an unbounded one.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

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
    make_client = km.client

    def client(*args: Any, **kwargs: Any) -> Any:
        import zmq

        kc = make_client(*args, **kwargs)
        kc.context.setsockopt(zmq.RCVHWM, 0)  # a default for the sockets it makes: its channels are made later
        return kc

    km.client = client  # type: ignore[method-assign]
    return km


def notebook_client(nb: Any, **kw: Any) -> Any:
    """``nbclient.NotebookClient(nb, **kw)`` whose kernel is started by :func:`kernel_manager`."""
    import nbclient

    client = nbclient.NotebookClient(nb, km=kernel_manager(kw.pop("kernel_name", "python3")), **kw)
    client.owns_km = True  # it shuts the kernel down after the run, as it does a kernel it started itself
    return client
