"""Ctrl-C during ``fit``: stop at the next optimizer step, save ``last.ckpt`` there, and end as the front end expects.

The first Ctrl-C (SIGINT) does not raise in the middle of a step: it asks the loop to stop at the next optimizer
step boundary, where the state is whole (no half-accumulated window), so a ``ModelCheckpoint`` with
``save_on_interrupt`` (on by default with ``save_last``) can write ``last.ckpt`` exactly there. A second Ctrl-C
raises ``KeyboardInterrupt`` at once, as Python does by default. Then, once the run is closed (``on_fit_end``
has run): in a notebook ``fit`` returns the History marked ``interrupted`` (the kernel stays alive); in a script
it re-raises ``KeyboardInterrupt``, so the script stops with exit status 130 instead of carrying on.

The handler is installed only on the main thread, only over Python's default handler (``ipykernel`` puts that
back while a cell runs; a handler of the user's is left alone), and not under DDP (the ranks would stop at
different steps and wait for each other forever).
"""

from __future__ import annotations

import logging
import signal
import threading
import traceback
import warnings
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from nbtrainer._events._frontend import in_notebook

if TYPE_CHECKING:
    from nbtrainer._loop._control import Control
    from nbtrainer._loop._host import LoopHost

__all__ = ["INTERRUPT_REASON", "StopOnInterrupt", "reraise_in_script", "save_on_interrupt"]

log = logging.getLogger(__name__)

INTERRUPT_REASON = "KeyboardInterrupt"


class StopOnInterrupt:
    """A context manager: the first SIGINT inside it requests a stop through ``control``; the second raises."""

    def __init__(self, control: Control, *, enabled: bool = True) -> None:
        self._control = control
        self._enabled = enabled
        self._previous: Any = None
        self.received = False

    def __enter__(self) -> StopOnInterrupt:
        self.received = False
        if (
            self._enabled
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        signal.signal(signal.SIGINT, self._previous)  # a second Ctrl-C raises KeyboardInterrupt at once
        self._control.request_stop(INTERRUPT_REASON)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._previous is not None:
            if signal.getsignal(signal.SIGINT) == self._handle:
                signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def save_on_interrupt(trainer: LoopHost) -> list[str]:
    """Write ``last.ckpt`` of every ``ModelCheckpoint(save_on_interrupt=True)`` now (the loop is at a step
    boundary), each a ``save_on_interrupt`` event in the History; returns the paths written. Nothing before the
    run's first step (a checkpoint would only repeat the start). A failed save leaves the previous file as it was
    (atomic write) and says so."""
    from nbtrainer._events._model_checkpoint import ModelCheckpoint

    st = trainer.run_state.loop_state
    written: list[str] = []
    if st.global_step == 0:
        return written
    for cb in ModelCheckpoint.all_in(trainer.callbacks.callbacks):
        if not cb.save_on_interrupt:
            continue
        try:
            path = cb.save_now(trainer)
        except BaseException as exc:  # a second Ctrl-C during the write included: the run is ending anyway
            log.debug(
                "last.ckpt could not be written at the interrupt: warned, the run is ending anyway", exc_info=True
            )
            warnings.warn(
                f"ModelCheckpoint could not write {cb.last_path!r} at the interrupt ({type(exc).__name__}: {exc}); "
                "the previous file, if any, is unchanged.",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        written.append(path)
        trainer.history.add_event(step=st.global_step, epoch=st.epoch + 1, kind="save_on_interrupt", old=None, new=path)
    return written


def reraise_in_script(exc: BaseException | None) -> None:
    """Outside a notebook, raise ``KeyboardInterrupt`` (``exc`` when there is one) once the run is closed."""
    if in_notebook():
        return
    if exc is None:
        raise KeyboardInterrupt
    # The finished frames of the loop would keep the last batch and its activations alive as long as the
    # exception lives; and no frame may hold the exception it raises (a cycle only the gc breaks).
    traceback.clear_frames(exc.__traceback__)
    try:
        raise exc
    finally:
        del exc
