"""The Trainer's live control (:class:`LiveControl`): requests from any thread, applied by the training thread at the
next optimizer-step boundary, and the calls deferred until an event has reached every callback.

Calls from other threads (a widget's button, a magic, Ctrl-C) only queue a request in :attr:`LiveControl.requests`
(``nbtrainer._loop._control.Control``); the loop calls :meth:`LiveControl.apply` at each step boundary (through
``LoopHost.apply_control``), which applies what was asked (LR, accumulation, pause) and records each change as an
``on_control`` event, so the History shows it where it took effect. Between fits a change is applied at once.
The public verbs (``request_stop``, ``pause``, ``set_lr``...) are the Trainer's (``_trainer/_control``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer._loop._control import Control, lr_parts, reference_lr, rescale_lr

if TYPE_CHECKING:
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["LiveControl"]


class LiveControl:
    """A Trainer's live control (see the module docstring), owned by one :class:`~nbtrainer.Trainer`: it changes
    that trainer's LR, accumulation and status, and tells its callbacks.

    Attributes:
        requests: the thread-safe requests (stop, pause, values, calls to run on the training thread).
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self.requests = Control()
        self._deferred: list[Callable[[], Any]] = []

    def apply_or_queue(self, key: str, value: Any) -> None:
        """Request ``key = value``; applied now between fits, else at the next step boundary."""
        self.requests.set(key, value)
        if not self._trainer.run_state.fitting:
            self.apply()

    def apply(self) -> None:
        """Apply what was requested (the training thread, at a step boundary); hold here while paused."""
        trainer, control, run = self._trainer, self.requests, self._trainer.run_state
        while True:
            pending, calls = control.take()
            for key, value in pending.items():
                if key == "lr":
                    # {optimizer name or None (each): (reference LR, who set it or None)}
                    for name, (lr, source) in value.items():
                        parts = lr_parts(trainer.optimizer, trainer.scheduler, name)
                        old = reference_lr(parts[0][0])
                        for opt, sched in parts:
                            rescale_lr(opt, sched, lr / reference_lr(opt))
                        self.event("lr" if name is None else f"lr:{name}", old, lr, source=source)
                elif key == "grad_accum_steps":
                    old, trainer.grad_accum_steps = trainer.grad_accum_steps, value
                    trainer.progress.grad_accum_steps = value
                    self.event("grad_accum_steps", old, value)
                elif key == "pause" and run.fitting:
                    self.event("pause" if value else "resume", None, None)
            for fn, fut in calls:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:
                        fut.set_exception(exc)
            if not run.fitting or not control.paused or control.stop_requested:
                return
            trainer.status = "paused"
            if run.loop is not None:
                run.loop.refresh()
            control.wait_while_paused()
            if not control.paused:
                trainer.status = "running"
                if not control.dirty:
                    self.event("resume", None, None)
                    return

    def event(self, kind: str, old: Any, new: Any, *, source: str | None = None) -> None:
        """Tell the callbacks of a change (``on_control``), at the run's current step and epoch; ``source``
        (who made it, e.g. ``"typed"``) goes on the event when given."""
        trainer = self._trainer
        st = trainer.run_state.loop_state
        event = {"step": st.global_step, "epoch": st.epoch + 1, "kind": kind, "old": old, "new": new}
        if source is not None:
            event["source"] = source
        trainer.callbacks.call("on_control", trainer=trainer, event=event)

    # -- calls deferred until the current event has reached every callback -----------------------------
    def defer(self, fn: Callable[[], Any]) -> None:
        if not self._trainer.run_state.fitting:
            fn()
        else:
            self._deferred.append(fn)

    def has_deferred(self) -> bool:
        return bool(self._deferred)

    def run_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()

    def drop_deferred(self) -> None:
        """The fit ends: what was not run is dropped."""
        self._deferred.clear()
