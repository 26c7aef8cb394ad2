"""Background fits: the training thread, its event feed, and the registry of live runs by model.

The registry exists so that re-running a notebook cell (a new widget on the same model) cannot leave
the old widget's thread training in the background: the old run is stopped first, and a run this
layer did not start (a plain ``fit`` in another thread) is refused with a clear message.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import logging
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer import ProgressBar, Trainer, start_training_thread

if TYPE_CHECKING:
    from nbtrainer import Trainer

__all__ = ["Feed", "Run", "claim_model", "live_run"]

log = logging.getLogger(__name__)

_LIVE: dict[int, Run] = {}  # id(model) -> the widget run training it
_LOCK = threading.Lock()


class Feed:
    """The widget's callback. It runs on the training thread, so it only appends to a deque (O(1)):
    it never touches a widget, never waits and never reads the device."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()
        self.wake = threading.Event()
        self._detached: list[Any] = []

    def attach(self, trainer: Trainer) -> None:
        """Become ``trainer``'s progress display for a run: its console bars are taken off until :meth:`detach`."""
        self._detached = [cb for cb in trainer.callbacks.callbacks if isinstance(cb, ProgressBar)]
        for cb in self._detached:
            trainer.remove_callback(cb)
        trainer.add_callback(self)

    def detach(self, trainer: Trainer) -> None:
        """Give ``trainer`` back as it was (on the training thread, right after fit) and wake the UI thread."""
        with contextlib.suppress(Exception):
            trainer.remove_callback(self)
        for cb in self._detached:
            if cb not in trainer.callbacks.callbacks:
                trainer.add_callback(cb)
        self._detached = []
        self.wake.set()

    def drain(self) -> list[tuple[str, Any]]:
        items = []
        q = self.queue
        while q:
            items.append(q.popleft())
        return items

    def on_fit_start(self, trainer: Trainer) -> None:
        self.queue.append(("start", None))

    def on_refresh(self, trainer: Trainer, progress: Any) -> None:
        # Shallow copy: the loop reuses the object, but replaces (never mutates) its lists and dicts.
        self.queue.append(("progress", copy.copy(progress)))

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        self.queue.append(("epoch", logs))  # the History row itself: keys other callbacks add land too
        self.wake.set()

    def on_control(self, trainer: Trainer, event: dict[str, Any]) -> None:
        self.queue.append(("control", dict(event)))
        self.wake.set()

    def on_health(self, trainer: Trainer, report: Any) -> None:
        self.queue.append(("health", report))  # the health card's problem and advice
        self.wake.set()

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self.queue.append(("exception", exception))
        self.wake.set()

    def on_fit_end(self, trainer: Trainer, history: Any) -> None:
        self.queue.append(("end", history))
        self.wake.set()


class Run:
    """One ``trainer.fit(...)`` in a daemon thread; the error, if any, is kept for ``wait()``.

    The thread is started by ``nbtrainer.start_training_thread``: the starting thread (the kernel's main thread,
    idle or waiting while the run trains) gives its idle OpenMP pool back first, so the training thread's parallel
    regions are not throttled and the run trains as fast as a fit on the main thread (issue 49, ``nbtrainer._threads``).
    """

    def __init__(
        self,
        trainer: Trainer,
        model_key: int,
        fit_kwargs: dict[str, Any],
        *,
        owner: str,
        on_done: Callable[[Run], None] | None = None,
        cell: tuple[str, str] | None = None,
    ) -> None:
        self.trainer = trainer
        self.cell = cell  # (cell id, execution) that created the widget: a re-run must not leave a zombie
        self.model_key = model_key
        self.fit_kwargs = fit_kwargs
        self.owner = owner
        self.on_done = on_done
        self.history: Any = None  # this run's History (None: it failed before fit began one)
        self.error: BaseException | None = None
        self.traceback = ""
        self.stop_reason: str | None = None
        self.status = "running"  # the trainer's final status once the fit has returned
        self.done = threading.Event()
        self.thread: threading.Thread | None = None  # made by start()
        self.followers: list[threading.Thread] = []  # threads that finish this run's work (the panel's UI thread)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.done.is_set()

    def start(self) -> None:
        with _LOCK:
            other = _LIVE.get(self.model_key)
            if other is not None and other.alive:
                raise RuntimeError(f"{other.owner} is already training this model; stop it first.")
            _LIVE[self.model_key] = self
        try:
            self.thread = start_training_thread(self._main, name=f"nbtrainer-fit ({self.owner})", stop=self._at_exit)
        except BaseException:
            with _LOCK:
                if _LIVE.get(self.model_key) is self:
                    del _LIVE[self.model_key]
            raise

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.trainer.request_stop(reason)

    def _at_exit(self) -> None:
        """The interpreter is exiting while this run trains: stop at the next step, then let the threads that finish
        the run's work (the UI thread's last push and summary run torch ops too) end before the interpreter's state
        goes."""
        self.stop("the interpreter is exiting")
        self.join(60)
        for thread in self.followers:
            thread.join(10)

    def join(self, timeout: float | None = None) -> bool:
        if self.thread is None:  # never started
            return True
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _main(self) -> None:
        before = self.trainer.history
        try:
            self.history = self.trainer.fit(**self.fit_kwargs)
        except BaseException as exc:
            log.debug("the fit failed: shown in the panel, and re-raised by wait()", exc_info=True)
            self.error = exc
            self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            # None when fit refused its arguments before beginning a History: the trainer's is the last run's
            self.history = self.trainer.history if self.trainer.history is not before else None
        finally:
            self.status = "failed" if self.error is not None else self.trainer.status
            with _LOCK:
                if _LIVE.get(self.model_key) is self:
                    del _LIVE[self.model_key]
            try:
                if self.on_done is not None:
                    self.on_done(self)
            finally:
                self.done.set()


def live_run(model: Any) -> Run | None:
    """The widget run training ``model`` now, if any."""
    with _LOCK:
        run = _LIVE.get(id(model))
    return run if run is not None and run.alive else None


def _rerun(earlier: tuple[str, str] | None, now: tuple[str, str] | None) -> bool:
    """Same notebook cell, another execution of it."""
    return earlier is not None and now is not None and earlier[0] == now[0] and earlier[1] != now[1]


def claim_model(
    model: Any, *, owner: str, exclude: Run | None = None, timeout: float = 10.0, cell: tuple[str, str] | None = None
) -> str | None:
    """Make sure nothing else trains ``model`` and no earlier widget of the same notebook ``cell`` still
    trains (re-running a cell that re-creates the model): stop those widget runs (returns a message
    saying so); refuse (RuntimeError) a fit this layer did not start, or a run that does not stop in
    ``timeout``."""
    for t in Trainer.active():
        trains = t.model is model or getattr(t.model, "_orig_mod", None) is model  # torch.compile wraps it
        if trains and (exclude is None or t is not exclude.trainer):
            run = live_run(model)
            if run is None or run.trainer is not t:
                raise RuntimeError(
                    f"This model is being trained by another fit() in this process (status {t.status!r}, step "
                    f"{t.global_step}), not started by a TrainerWidget. Stop it first (trainer.request_stop() or "
                    "`%nbtrainer stop`), then start this widget."
                )
    with _LOCK:
        runs = [
            r
            for r in _LIVE.values()
            if r.alive and r is not exclude and (r.model_key == id(model) or _rerun(r.cell, cell))
        ]
    messages = []
    for run in runs:
        step = run.trainer.global_step
        why = "this model" if run.model_key == id(model) else "a model of this notebook cell (re-run)"
        run.stop(f"replaced by {owner}")
        if not run.join(timeout):
            raise RuntimeError(
                f"{run.owner} is still training {why} and did not stop within {timeout:g} s (a slow batch or "
                "validation?). Call .stop() on that widget or `%nbtrainer stop`, wait for it, then try again."
            )
        messages.append(
            f"Stopped the previous run on {why} ({run.owner}, at step {step}) so that it does not "
            "keep training in the background."
        )
    return " ".join(messages) or None
