"""Control of a running fit, in one place: stop, pause/resume, LR and accumulation changes, calls to run on the
training thread; and the LR arithmetic a change of the reference LR makes (:func:`reference_lr`, :func:`rescale_lr`).

* :class:`Control`: the thread-safe requests. They come from any thread (a widget's button, a magic, a signal
  handler); the hot loop only reads ``dirty`` (a plain attribute) per step, the lock is taken when something was
  requested.
* :class:`LiveControl`: a Trainer's control, which applies the requests at the next optimizer-step boundary and
  tells the callbacks (``on_control``). It sees the Trainer as its ``LoopHost`` (``_loop`` is below the
  Trainer and never imports it). The public verbs (``request_stop``, ``pause``, ``set_lr``...) are the Trainer's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin before Python 3.11
from typing import TYPE_CHECKING, Any, TypeVar

from nbtrainer._events._progress import replan

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView
    from nbtrainer._loop._host import LoopHost

T = TypeVar("T")

__all__ = [
    "Control",
    "ForeignStop",
    "LiveControl",
    "is_plateau",
    "lr_parts",
    "plateau_monitor",
    "reference_key",
    "reference_lr",
    "rescale_lr",
    "step_epoch_scheduler",
]

log = logging.getLogger(__name__)


class Control:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self.dirty = False  # read without the lock in the hot loop: a stale read only delays by one step
        self.stop_requested = False
        self.stop_reason: str | None = None
        self.stop_at = 0.0  # time.monotonic() of the stop request
        self._pending: dict[str, Any] = {}
        self._calls: list[tuple[Callable[[], Any], Future]] = []

    # -- requests (any thread) ---------------------------------------------------------------
    def request_stop(self, reason: str = "requested") -> None:
        with self._lock:
            if not self.stop_requested:
                self.stop_requested = True
                self.stop_reason = reason
                self.stop_at = time.monotonic()
            self.dirty = True
        self._resume.set()  # a paused run must wake up to stop

    def pause(self) -> None:
        with self._lock:
            self._resume.clear()
            self._pending["pause"] = True
            self.dirty = True

    def resume(self) -> None:
        with self._lock:
            self._pending["pause"] = False
            self.dirty = True
        self._resume.set()

    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self._pending[key] = value
            self.dirty = True

    def peek(self, key: str) -> Any:
        """The value requested for ``key`` and not applied yet (None: none)."""
        with self._lock:
            return self._pending.get(key)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the training thread at the next step boundary; returns a Future."""
        fut: Future = Future()
        with self._lock:
            self._calls.append((fn, fut))
            self.dirty = True
        return fut

    # -- the training thread -------------------------------------------------------------------
    def take(self) -> tuple[dict[str, Any], list[tuple[Callable[[], Any], Future]]]:
        with self._lock:
            pending, calls = self._pending, self._calls
            self._pending, self._calls = {}, []
            self.dirty = self.stop_requested
        return pending, calls

    def wait_while_paused(self, poll: float = 0.1) -> None:
        while not self._resume.wait(poll):
            if self.stop_requested or self._calls:
                return

    def reset(self, keep_stop_since: float | None = None) -> None:
        """Drop the requests left from before a fit; a stop requested at or after ``keep_stop_since`` (the fit's
        call) is kept: it was meant for this fit (a script that returns while its fit is still batching arrays)."""
        with self._lock:
            keep = self.stop_requested and keep_stop_since is not None and self.stop_at >= keep_stop_since
            self.stop_requested = keep
            self.stop_reason = self.stop_reason if keep else None
            self._pending.clear()
            for _, fut in self._calls:
                fut.cancel()
            self._calls.clear()
            self.dirty = keep
        self._resume.set()


class LiveControl:
    """A Trainer's live control, owned by one :class:`~nbtrainer.Trainer`: requests from any thread (:class:`Control`)
    applied by the training thread at the next optimizer-step boundary (the loop calls :meth:`apply` through
    ``FitLoop``'s step boundary; between fits at once), each change told to the callbacks as an ``on_control`` event
    so the History shows it where it took effect; and the calls deferred until an event has reached every callback.

    Attributes:
        requests: the thread-safe requests (stop, pause, values, calls to run on the training thread).
    """

    def __init__(self, trainer: LoopHost) -> None:
        self._trainer = trainer
        self.requests = Control()
        self._deferred: list[Callable[[], Any]] = []

    def request_lr(self, lr: float, name: str | None, source: str | None) -> None:
        """``set_lr``: the reference LR of the optimizer ``name`` (None: each), applied at the next step boundary;
        an unknown name is refused now, not at the step."""
        trainer = self._trainer
        lr_parts(trainer.optimizer, trainer.scheduler, name)
        pending = dict(self.requests.peek("lr") or {})
        pending[name] = (lr, source)
        self.apply_or_queue("lr", pending)

    def on_fit_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` now, or from another thread while a fit runs, on the training thread at the next step boundary
        (the call waits for it)."""
        fit_thread = self._trainer.run_state.fit_thread
        if fit_thread is None or threading.get_ident() == fit_thread:
            return fn()
        return self.wait_for(self.requests.submit(fn), fn)

    def wait_for(self, future: Future, ended: Callable[[], T]) -> T:
        """The result of a call submitted to the training thread (``requests.submit``), waited for from another
        thread; ``ended()`` in its place when the fit ended without taking it (it ended between the caller's check
        and the submit, after its end had run what was queued: nothing would ever take the call)."""
        run = self._trainer.run_state
        while True:
            try:
                result: T = future.result(timeout=0.1)
                return result
            except FutureTimeout:
                if not run.fitting and future.cancel():
                    return ended()

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
                            _snap_reference(opt, lr)
                        self.event("lr" if name is None else f"lr:{name}", old, lr, source=source)
                elif key == "grad_accum_steps":
                    old = trainer.grad_accum_steps
                    trainer.options = trainer.options.replace("step", grad_accum_steps=value)
                    trainer.progress.grad_accum_steps = value
                    if run.loop is not None:  # the total steps (and the ETA) count the new windows from here
                        replan(trainer.progress, run.loop_state, value, run.loop.epochs, run.loop.max_steps)
                    self.event("grad_accum_steps", old, value)
                elif key == "pause" and run.fitting:
                    self.event("pause" if value else "resume", None, None)
            for fn, fut in calls:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:
                        log.debug(
                            "a call run on the training thread failed: its caller gets the exception from the Future",
                            exc_info=True,
                        )
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


# -- LR arithmetic: what a set_lr request does to the optimizer and its schedule -------------------------------
def reference_key(group: dict[str, Any]) -> str:
    """Which key of a param group holds its reference LR: OneCycle's ``max_lr``, else the base (``initial_lr``) a
    scheduler started from, else ``lr``."""
    return "max_lr" if "max_lr" in group else "initial_lr" if "initial_lr" in group else "lr"


def reference_lr(optimizer: Any) -> float:
    """The reference learning rate of group 0 (:func:`reference_key`)."""
    group = optimizer.param_groups[0]
    return float(group[reference_key(group)])


#: The absolute LRs a param group holds for its schedule: ``initial_lr`` (every scheduler's start), OneCycleLR's
#: ``max_lr`` / ``min_lr``, SWALR's ``swa_lr``.
_GROUP_LRS = ("lr", "initial_lr", "max_lr", "min_lr", "swa_lr")
#: The absolute LRs torch's schedulers hold themselves (torch/optim/lr_scheduler.py): every scheduler's ``base_lrs``,
#: ReduceLROnPlateau's ``min_lrs``, CyclicLR's ``max_lrs``.
_SCHEDULER_LR_LISTS = ("base_lrs", "min_lrs", "max_lrs")
#: The single absolute LRs they hold: the floor of CosineAnnealingLR / CosineAnnealingWarmRestarts (``eta_min``), and
#: ReduceLROnPlateau's floor for param groups added later (``default_min_lr``).
_SCHEDULER_LRS = ("eta_min", "default_min_lr")


def rescale_lr(optimizer: Any, scheduler: Any, factor: float) -> None:
    """Multiply the LR schedule by ``factor``: the current LRs and every absolute LR the schedule is computed from (the
    groups' :data:`_GROUP_LRS`, the scheduler's own, those of a SequentialLR's or ChainedScheduler's children), so the
    schedule continues scaled: their formulas are linear in these."""
    for group in optimizer.param_groups:
        for key in _GROUP_LRS:
            if key in group and isinstance(group[key], (int, float)):
                group[key] = group[key] * factor
    if scheduler is not None:
        _rescale_scheduler(scheduler, factor)
        if getattr(scheduler, "_last_lr", None) is not None:  # torch's own field: get_last_lr() reads it
            scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def _snap_reference(optimizer: Any, lr: float) -> None:
    """The reference LR set is the one asked for: ``old * (lr / old)`` can land one ulp off (3e-3 read back as
    0.0029999999999999996 in the History and the run store)."""
    group = optimizer.param_groups[0]
    group[reference_key(group)] = lr


def _rescale_scheduler(scheduler: Any, factor: float) -> None:
    for name in _SCHEDULER_LR_LISTS:
        if isinstance(getattr(scheduler, name, None), list):
            setattr(scheduler, name, [lr * factor for lr in getattr(scheduler, name)])
    for name in _SCHEDULER_LRS:
        if isinstance(getattr(scheduler, name, None), (int, float)):
            setattr(scheduler, name, getattr(scheduler, name) * factor)
    # SequentialLR / ChainedScheduler hold none of their own: each child computes the LRs from its own fields when
    # its turn comes (after the milestone, too), and its get_last_lr() is what the parent reports after stepping it
    for child in getattr(scheduler, "_schedulers", None) or ():
        _rescale_scheduler(child, factor)
        if getattr(child, "_last_lr", None) is not None:
            child._last_lr = [lr * factor for lr in child._last_lr]


def lr_parts(optimizer: Any, scheduler: Any, name: str | None = None) -> list[tuple[Any, Any]]:
    """``(optimizer, its scheduler)`` pairs an LR change applies to: the one optimizer, or of several named ones
    (``nbtrainer._setup._optimizers.Optimizers``) the one called ``name`` (None: each)."""
    children = getattr(optimizer, "optimizers", None)
    if children is None:
        if name is not None:
            raise ValueError(f"optimizer={name!r} names one of several optimizers; this trainer has one.")
        return [(optimizer, scheduler)]
    if name is not None and name not in children:
        raise ValueError(f"optimizer={name!r}: no optimizer of that name; the optimizers are {list(children)}.")
    schedulers = getattr(scheduler, "schedulers", {}) or {}
    return [(opt, schedulers.get(n)) for n, opt in children.items() if name is None or n == name]


def is_plateau(scheduler: Any) -> bool:
    """``ReduceLROnPlateau`` steps per epoch on a logged value, whatever the scheduler interval."""
    import torch

    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def plateau_monitor(host: TrainerView) -> str:
    """The key a ``ReduceLROnPlateau`` of ``host`` watches, decided once for the fit: ``scheduler_monitor``, else
    ``val_loss`` when the fit validates (at all: maybe not every epoch), else ``loss``. Never one epoch's train loss
    and the next one's validation loss: the plateau would compare two different quantities."""
    return host.options.step.scheduler_monitor or ("val_loss" if host.has_validation else "loss")


def step_epoch_scheduler(host: TrainerView, logs: dict[str, Any]) -> None:
    """Step ``host``'s epoch scheduler at the end of an epoch: ``ReduceLROnPlateau`` on :func:`plateau_monitor`,
    not at all on an epoch that does not log it (no validation this epoch: ``val_every_n_epochs``); any other one
    plainly."""
    scheduler = host.scheduler
    if is_plateau(scheduler):
        key = plateau_monitor(host)
        if key not in logs:
            if key in host.expected_log_keys():
                return
            # fit refused such a monitor before the first step; a scheduler set during the fit was not checked
            raise KeyError(
                f"ReduceLROnPlateau monitors {key!r}, which is not logged; set scheduler_monitor= to one of "
                f"{sorted(logs)}."
            )
        scheduler.step(logs[key])
    else:
        scheduler.step()


class ForeignStop:
    """Another trainer's stop flag on the Trainer (Lightning's ``trainer.should_stop = True``, Keras'
    ``stop_training``): nbtrainer never reads one, so a callback setting it trained on to the last epoch. Reading or
    setting it raises, naming ``request_stop``."""

    def __init__(self, origin: str) -> None:
        self.origin, self.name = origin, ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        raise AttributeError(self._message())

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(self._message())

    def _message(self) -> str:
        return (
            f"Trainer.{self.name} is {self.origin}'s stop flag; nbtrainer never reads it, so setting it would not "
            "stop the fit. Call trainer.request_stop('your reason') (a callback may, in any hook): the fit stops at "
            "the next optimizer-step boundary and returns normally, with history.stop_reason saying why."
        )
