"""A page's late widget restore must not take over, or re-render away, the widgets it is showing (issue 59).

The trap (classic Notebook 6.5 with ipywidgets 7.7, the widget stack of Colab's runtime; ``widgetsnbextension`` 3's
widget manager): when a page's widget manager starts it fetches the widgets the kernel already has. It asks the
``jupyter.widget.control`` comm first and, when that does not answer within 3 s, falls back to
``comm_info_request`` and one ``request_state`` per comm listed. A notebook opened and Run All at once whose first
cell imports torch keeps the kernel busy longer than that, so the fallback's ``comm_info_request`` waits in the
kernel and is answered after the panel's cell made and displayed its widgets. Then, in the page:

* for every comm listed whose model it does not have yet, the manager registers a comm object of its own under
  that id. The reply travels on the shell channel, the widgets' ``comm_open`` on iopub, so it often arrives first:
  the manager's comm then replaces the one the displayed model listens on, and every later update of that widget
  goes to a comm nobody reads. The panel stays at its first state (no title, "epoch 0/?", no stat cards, no
  health lights) while the run finishes.
* once the restore is done it re-renders every cell with widget output (meant for a notebook's saved widgets);
  a view removed that way blanks its output's model id, which the re-render then reads: the live panel disappears.

Measured in a real Chromium, notebook opened and Run All at once, a fresh kernel each time: the panel incomplete
or gone in 4 of 8 runs.

A page needs that restore only for the widgets made before it connected; those made after reach it as
``comm_open``. So when a page asks ``comm_info_request`` for ``jupyter.widget`` after widgets were made since the
kernel first heard from it (its client session, ``header.session``), the restore can only do harm and the kernel
does not answer: the page's manager waits for good and touches nothing. Any other ``comm_info_request`` (a
reloaded page, a second tab, a page whose cells made no widget yet, another target) is answered as before. The
control comm's answer is left alone: it travels on iopub, behind the ``comm_open`` messages, so the page has those
models already.

Only on ipywidgets 7 (the classic Notebook's and Colab's stack): ipywidgets 8's JupyterLab manager refuses to open
a comm twice and re-renders nothing, and Colab's own manager never asks ``comm_info``. Installed once per kernel
(:func:`guard_restore`, before a panel makes its first widget); a kernel whose internals differ is left alone.

On every widget stack, a ``comm_info_request`` is answered even when another thread opens or closes a comm while the
kernel lists them. ipykernel (6 and 7) builds its answer with a comprehension over the comm manager's dict; a widget
made at that moment by a panel's helper thread (the LR finder's and Profile's results, the plan's rows) or by a
subshell's click handler changes the dict's size, the handler raises, and the page waits for an answer that never
comes (a loaded trial's reload check waited 30 s for one). The guard answers from one copy of the dict (a single C
call under the GIL), with ipykernel's own reply; asking ipykernel again until a listing went through was not enough
when another thread opens comms without pause.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["guard_restore"]

WIDGET_TARGET = "jupyter.widget"
_GUARDED: set[int] = set()  # id(kernel)
_LOCK = threading.Lock()


def _session(parent: Any) -> str | None:
    header = parent.get("header") if isinstance(parent, dict) else None
    session = header.get("session") if isinstance(header, dict) else None
    return session if isinstance(session, str) and session else None


class RestoreGuard:
    """The widget comms open when the kernel first heard from each client session, and the ``comm_info_request``
    handler that leaves a page's late restore unanswered.

    Args:
        kernel: the ipykernel ``Kernel`` (its ``set_parent``, ``shell_handlers`` and ``comm_manager`` are used).

    Example:
        >>> guard_restore()  # in a notebook cell, before the panel's widgets are made  # doctest: +SKIP
    """

    def __init__(self, kernel: Any, *, restore: bool = True) -> None:
        self.kernel = kernel
        self.restore = restore  # ipywidgets 7: a late restore is left unanswered
        self.known: dict[str, frozenset[str]] = {}
        self._set_parent: Callable[..., Any] = kernel.set_parent
        self._answer: Callable[..., Any] = kernel.shell_handlers["comm_info_request"]

    def widget_comms(self) -> set[str]:
        manager = getattr(self.kernel, "comm_manager", None)
        comms = dict(getattr(manager, "comms", None) or {})
        return {cid for cid, comm in comms.items() if getattr(comm, "target_name", None) == WIDGET_TARGET}

    def first_contact(self, parent: Any) -> None:
        """Note the widget comms open now if ``parent`` is the first message of its session."""
        session = _session(parent)
        if session is not None and session not in self.known:
            self.known.setdefault(session, frozenset(self.widget_comms()))

    def set_parent(self, *args: Any, **kwargs: Any) -> Any:
        """The kernel's own ``set_parent``, which it calls for every message it handles: a new session noted first."""
        self.first_contact(args[1] if len(args) > 1 else kwargs.get("parent"))
        return self._set_parent(*args, **kwargs)

    def late(self, parent: dict[str, Any]) -> bool:
        """``parent`` (a ``comm_info_request``) is a page's restore coming after its own cells made widgets."""
        if not self.restore or (parent.get("content") or {}).get("target_name") != WIDGET_TARGET:
            return False
        self.first_contact(parent)  # set_parent saw it first, unless this kernel skips it
        known = self.known.get(_session(parent) or "")
        return known is not None and not self.widget_comms() <= known

    async def comm_info_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        if self.late(parent):
            return  # unanswered: see the module docstring
        manager, session = getattr(self.kernel, "comm_manager", None), getattr(self.kernel, "session", None)
        comms = getattr(manager, "comms", None)
        if not isinstance(comms, dict) or session is None:  # internals it does not know: the kernel's own answer
            result = self._answer(stream, ident, parent)
            if hasattr(result, "__await__"):
                await result
            return
        target = (parent.get("content") or {}).get("target_name")
        listed = {
            cid: {"target_name": comm.target_name}
            for cid, comm in dict(comms).items()  # the copy: other threads open and close comms meanwhile
            if target is None or comm.target_name == target
        }
        session.send(stream, "comm_info_reply", {"comms": listed, "status": "ok"}, parent, ident)


def _kernel() -> Any:
    shell = sys.modules["IPython"].get_ipython() if "IPython" in sys.modules else None
    return getattr(shell, "kernel", None)


def guard_restore() -> bool:
    """Install the guard in this process's kernel (once): comm_info answered whatever the threads; on ipywidgets 7,
    a page's late restore left unanswered. False where there is no kernel, or internals it does not know.

    The session of the request being handled now (the cell that makes the panel) is noted first, so the widgets made
    from here on count as made since that page connected."""
    import ipywidgets

    kernel = _kernel()
    handlers = getattr(kernel, "shell_handlers", None)
    if kernel is None or not isinstance(handlers, dict) or not callable(handlers.get("comm_info_request")):
        return False
    restore = str(ipywidgets.__version__).startswith("7.") and callable(getattr(kernel, "set_parent", None))
    with _LOCK:
        if id(kernel) in _GUARDED:
            return True
        guard = RestoreGuard(kernel, restore=restore)
        if restore:
            get_parent = getattr(kernel, "get_parent", None)
            if callable(get_parent):
                guard.first_contact(get_parent())
            kernel.set_parent = guard.set_parent  # an instance attribute over the method: the kernel calls it by name
        handlers["comm_info_request"] = guard.comm_info_request
        _GUARDED.add(id(kernel))
    return True
