"""Ending a long call from another thread: the Event the panel's helper threads pass (``cancel=``, ``stop=``).

``plan_memory(cancel=)``, ``check_data(cancel=)`` and ``lr_find(stop=)`` each run for seconds to a minute in a helper
thread of the panel; closing the panel or the interpreter's exit sets the Event, and the call ends at its next safe
point (between rows, batches or sweep steps: never inside a torch op). One check of what was passed, here, so the
three refuse the same things with the same words before any work starts. Imports nothing of nbtrainer, no torch.
"""

from __future__ import annotations

import concurrent.futures
import threading

__all__ = ["cancel_event", "raise_if_cancelled"]


def cancel_event(event: threading.Event | None, *, caller: str, keyword: str = "cancel") -> threading.Event | None:
    """``event`` if it is None or Event-like (anything with a callable ``is_set()``); a TypeError naming ``caller``."""
    if event is not None and not callable(getattr(event, "is_set", None)):
        raise TypeError(
            f"{caller}({keyword}=...) takes a threading.Event, got {type(event).__name__}: set the Event from another "
            "thread to end the call early."
        )
    return event


def raise_if_cancelled(event: threading.Event | None, what: str) -> None:
    """A ``concurrent.futures.CancelledError`` saying ``what`` was cancelled, when ``event`` is set."""
    if event is not None and event.is_set():
        raise concurrent.futures.CancelledError(what)
