"""ZeroMQ in the kernels and Jupyter servers the suite starts (``sitecustomize`` installs this): queues without a
limit and, when asked, a kernel slow to take a click.

**No message dropped.** A kernel's IOPub is a PUB socket. ZeroMQ keeps at most 1,000 messages queued for each
subscriber on each side of a connection (the kernel's send queue, the reader's receive queue) and drops the rest
without a word. Two panels' set-up publishes 1,518 messages in about two seconds; in a loaded trial of the suite a
test's client did not read for long enough, and the end of that cell, its ``idle`` status with it, never came ("no
message for 120 s", trial 33). Stopping the reading process for 6 s during that cell lost the same tail every time
(992 of 1,518 arrived). A Jupyter server relays a kernel's IOPub to the browser through the same kind of queue. So
every PUB socket made here has no send limit and every SUB socket no receive limit, set where the socket is made:
ZeroMQ copies a socket's limits into its listener when it binds, and ipykernel binds as soon as it makes one.
``tests/_kernels.py`` does the same for the clients the tests themselves read with.

**NBT_SLOW_COMM=S** (seconds): a kernel waits that long before it handles each message a front end sends for a click
or a changed value (ipywidgets' ``update`` and ``custom`` comm messages, not the state requests of a page's first
drawing). A browser test that acts on what a click changes before the kernel has answered it then fails every time,
not once in a loaded run (the data map's lasso drew before its drag surface existed: CI, 2026-11-30)::

    NBT_SLOW_COMM=1 bash scripts/test.sh tests/browser
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_SLOW = float(os.environ.get("NBT_SLOW_COMM") or 0)


def _unbounded_sockets(zmq: Any) -> None:
    make = zmq.Context.socket

    def socket(self: Any, socket_type: int, *args: Any, **kwargs: Any) -> Any:
        made = make(self, socket_type, *args, **kwargs)
        if socket_type in (zmq.PUB, zmq.XPUB):
            made.setsockopt(zmq.SNDHWM, 0)
        elif socket_type in (zmq.SUB, zmq.XSUB):
            made.setsockopt(zmq.RCVHWM, 0)
        return made

    zmq.Context.socket = socket


def _slow_comms(module: Any) -> None:
    manager = getattr(module, "CommManager", None)
    if manager is None or "comm_msg" not in vars(manager):  # ipykernel 7's inherits comm.base_comm's, patched there
        return
    handle = manager.comm_msg

    def comm_msg(self: Any, *args: Any, **kwargs: Any) -> Any:
        msg = args[-1] if args else kwargs.get("msg")
        data = ((msg or {}).get("content") or {}).get("data") or {}
        if data.get("method") in ("update", "custom"):
            time.sleep(_SLOW)
        return handle(self, *args, **kwargs)

    manager.comm_msg = comm_msg


_AFTER_IMPORT: dict[str, Callable[[Any], None]] = {"zmq": _unbounded_sockets}
if _SLOW > 0:
    _AFTER_IMPORT.update({"comm.base_comm": _slow_comms, "ipykernel.comm.manager": _slow_comms})


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_AFTER_IMPORT[name](module)`` once the module ``name`` has executed; nothing is imported early."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        then = _AFTER_IMPORT.get(name)
        if then is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        after = then  # not None here; a closure over ``then`` would still be typed Optional

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                loader.exec_module(module)
                after(module)

        spec.loader = Loader()
        return spec


sys.meta_path.insert(0, _AfterImport())
