"""Wait for a run while the kernel keeps handling the panel's clicks.

While a cell executes, the kernel's main thread is busy with it: widget messages (Pause, Stop, a slider
moved) queue up behind the cell and arrive only after the run. Two ways out, picked at run time:

1. **ipykernel >= 7 (kernel subshells, JEP 91).** The kernel routes each incoming comm message to the
   subshell its comm names (``comm._reply_subshell_for``); a subshell is a thread with its own event loop.
   While the cell waits, every comm of the kernel is routed to one nbtrainer subshell, so clicks are handled
   there at once; the routing is removed when the wait ends. Execute requests still queue behind the cell,
   in order, as usual.

   A page reloaded (or a second tab opened) while the cell waits needs more than the comms: the front end
   first asks ``kernel_info`` (JupyterLab drops every kernel message until it has the answer), then
   ``comm_info`` and opens the widget manager's control comm to fetch every widget's state. Those requests
   name no subshell, so they would queue behind the cell and the panel would stay "Loading widget..."
   until the run ended. While the cell waits they are readdressed (header re-signed with the session key)
   to the nbtrainer subshell, which answers them at once; the panel comes back live and Stop works.
   The kernel's shell channel thread looks up the comm of every ``comm_msg`` to route it, and logs "No such
   comm" when the page's ``comm_open`` is still queued in that subshell; the message is delivered all the
   same (the header names the subshell), so that one warning is dropped (a comm that is really missing is
   still reported by the thread that handles the message).
2. **Older kernels:** ``jupyter-ui-poll`` processes the queued widget messages from inside the waiting cell
   (it relies on ``kernel.do_one_iteration``, which ipykernel 7.4 no longer has, hence option 1).

Kernel > Interrupt still raises ``KeyboardInterrupt`` in the waiting cell.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

from ._notebook import in_notebook

__all__ = ["wait_until"]

log = logging.getLogger(__name__)

_warned = False
_SUBSHELLS: dict[int, str] = {}  # id(kernel) -> the nbtrainer subshell (one per kernel, reused)
_ACTIVE: dict[int, str] = {}  # id(kernel) -> subshell that answers the main shell's front-end requests now
_ROUTERS: set[int] = set()  # kernels whose shell channel goes through _readdress
# What a reloaded page asks before its widgets can show (and the comms it opens and uses meanwhile).
_FRONTEND_REQUESTS = frozenset({"kernel_info_request", "comm_info_request", "comm_open", "comm_msg", "comm_close"})
# Set while the kernel routes a message we readdressed: its comm lookup's "No such comm" is not a real loss.
_ROUTING = contextvars.ContextVar("nbtrainer_routing_readdressed", default=False)


class _RoutingLookupFilter(logging.Filter):
    """Drops the comm package's "No such comm" warning logged while the shell channel thread routes a message
    that :func:`_readdress` sent to a subshell (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_ROUTING.get() and str(record.msg).startswith("No such comm"))


_LOOKUP_FILTER = _RoutingLookupFilter()


def _kernel() -> Any:
    if threading.current_thread() is not threading.main_thread() or not in_notebook():
        return None
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return getattr(shell, "kernel", None)


def _subshell(kernel: Any) -> str | None:
    """The id of this kernel's nbtrainer subshell (created once), or None where subshells are unsupported."""
    if (
        not getattr(kernel, "_supports_kernel_subshells", False)
        or getattr(kernel, "shell_channel_thread", None) is None
    ):
        return None
    if id(kernel) in _SUBSHELLS:
        return _SUBSHELLS[id(kernel)]
    manager = kernel.shell_channel_thread.manager
    made: Future = Future()

    def create() -> None:  # subshells are created on the shell channel thread only
        try:
            made.set_result(manager._create_subshell())
        except BaseException as exc:
            log.debug("creating a subshell failed: its caller gets the exception from the Future", exc_info=True)
            made.set_exception(exc)

    manager._shell_channel_io_loop.add_callback(create)  # thread-safe hand-over to that thread's loop
    try:
        _SUBSHELLS[id(kernel)] = made.result(timeout=10)
    except Exception:  # an ipykernel whose internals moved: fall back to jupyter-ui-poll
        log.debug(
            "no kernel subshell (an ipykernel whose internals moved): jupyter-ui-poll is used instead", exc_info=True
        )
        return None
    return _SUBSHELLS[id(kernel)]


def _readdress(session: Any, frames: list[Any], subshell_id: str) -> list[Any]:
    """``frames`` (one shell message) sent to ``subshell_id`` if it is a front-end request meant for the main
    shell; else unchanged. The header names the subshell and is signed again (ipykernel checks that a
    request handled by a subshell names it)."""
    import zmq
    from jupyter_client.session import DELIM

    i = next(k for k, f in enumerate(frames) if bytes(f.bytes if hasattr(f, "bytes") else f) == DELIM)
    raw = [bytes(f.bytes if hasattr(f, "bytes") else f) for f in frames[i + 2 : i + 6]]
    header = session.unpack(raw[0])
    if header.get("msg_type") not in _FRONTEND_REQUESTS or header.get("subshell_id"):
        return frames
    header["subshell_id"] = subshell_id
    packed = session.pack(header)
    signature = session.sign([packed, *raw[1:]])
    return [*frames[: i + 1], zmq.Frame(signature), zmq.Frame(packed), *frames[i + 3 :]]


def _install_router(kernel: Any) -> bool:
    """Put :func:`_readdress` in front of the kernel's shell channel (once; idle unless ``_ACTIVE`` names a
    subshell for this kernel). False where this ipykernel's internals differ (clicks still work)."""
    key = id(kernel)
    if key in _ROUTERS:
        return True
    thread, stream = kernel.shell_channel_thread, getattr(kernel, "shell_stream", None)
    main, session = getattr(kernel, "shell_channel_thread_main", None), getattr(kernel, "session", None)
    if stream is None or main is None or session is None or not hasattr(thread, "io_loop"):
        return False

    async def on_shell(frames: list[Any]) -> None:
        subshell_id = _ACTIVE.get(key)
        if subshell_id is None:
            await main(frames)
            return
        with contextlib.suppress(Exception):  # a message we cannot read: the kernel's handler reports it
            frames = _readdress(session, frames, subshell_id)
        # each message runs as its own task (ZMQStream wraps the coroutine in ensure_future), so the flag
        # stays with this one
        token = _ROUTING.set(True)
        try:
            await main(frames)
        finally:
            _ROUTING.reset(token)

    made: Future = Future()

    def install() -> None:  # the stream belongs to the shell channel thread
        try:
            stream.on_recv(on_shell, copy=False)
            made.set_result(True)
        except BaseException as exc:
            log.debug("installing the routing failed: its caller gets the exception from the Future", exc_info=True)
            made.set_exception(exc)

    thread.io_loop.add_callback(install)
    try:
        made.result(timeout=10)
    except Exception:
        log.debug("the subshell routing could not be installed: jupyter-ui-poll is used instead", exc_info=True)
        return False
    logging.getLogger("Comm").addFilter(_LOOKUP_FILTER)  # the comm package's logger (comm.base_comm)
    _ROUTERS.add(key)
    return True


@contextlib.contextmanager
def _route_comms(kernel: Any, subshell_id: str) -> Iterator[None]:
    """Every comm's frontend messages go to ``subshell_id`` inside the block, comms opened meanwhile (an LR
    finder's chart) included: those are routed as they register. Nothing rescans the kernel's comms while the
    cell waits: every widget ever displayed keeps its comm (ipywidgets never drops one), about 500 a panel, and a
    rescan every 50 ms of a notebook's 20,000 comms held the GIL as long as the training thread ran (w.fit() 2-3x
    slower after 40 panels; bench/RESULTS.md, issue 49)."""

    def route(data: Any, default: Any) -> str:
        return subshell_id

    manager = kernel.comm_manager
    routed = list(manager.comms.values())
    for comm in routed:
        comm._reply_subshell_for = route  # read by the shell channel thread for each comm_msg
    register = manager.register_comm

    def register_routed(comm: Any) -> Any:
        comm._reply_subshell_for = route
        routed.append(comm)
        return register(comm)

    manager.register_comm = register_routed  # an instance attribute over the class's method, removed below
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del manager.register_comm
        for comm in routed:
            with contextlib.suppress(AttributeError):
                del comm._reply_subshell_for  # back to the class's own routing


def wait_until(done: Callable[[float], bool], *, interval: float = 0.05) -> None:
    """Block until ``done(timeout)`` returns True; from a notebook cell, widget messages keep being handled."""
    global _warned
    kernel = _kernel()
    if kernel is None:
        while not done(0.1):
            pass
        return
    subshell_id = _subshell(kernel)
    if subshell_id is not None:
        if _install_router(kernel):
            _ACTIVE[id(kernel)] = subshell_id
        try:
            with _route_comms(kernel, subshell_id):
                # the subshell handles the clicks; this thread only waits for the end, which ``done`` sees at once
                # (a join), so it wakes once a second, not each ``interval``: each wake takes the GIL from the
                # training thread
                while not done(1.0):
                    pass
        finally:
            _ACTIVE.pop(id(kernel), None)
        return
    try:
        from jupyter_ui_poll import ui_events
    except ImportError:
        if not _warned:
            _warned = True
            warnings.warn(
                "Pause/Stop clicks are not processed while this cell waits: `pip install "
                "jupyter-ui-poll`, or use w.start() and let the cell end.",
                RuntimeWarning,
                stacklevel=3,
            )
        while not done(0.1):
            pass
        return
    with ui_events() as poll:
        while not done(0.0):
            poll(20)  # up to 20 queued widget messages (clicks, slider moves) per turn
            time.sleep(interval)
