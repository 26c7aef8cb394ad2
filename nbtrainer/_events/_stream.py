"""The public event stream: hook names, the progress snapshot and the duck-typed dispatcher.

Callbacks are plain objects; the trainer calls a hook only if the object defines it (like Fabric's
``call(hook_name, **kwargs)``), with the keywords below (``HOOK_KEYWORDS``): the Trainer and ``add_callback`` check
that each hook takes them by those names (or ``**kwargs``) before anything runs. The progress bar, the history
recorder and the notebook widget are all consumers of the same events.

Events, in the order they fire (``epoch`` is 1-based everywhere):

==============================  ==========================================================================
``on_fit_start(trainer)``        before any batch is computed (the arguments have been checked; the first
                                training and validation batches are checked after it)
``on_epoch_start(trainer, epoch)``  not again for an epoch resumed mid-way (it started in the saved run)
``on_train_batch_start(trainer, batch, batch_idx)``   per micro-batch, already on the device
``on_train_forward(trainer, outputs, targets, indices)``  per micro-batch, right after the forward the step makes:
                                device tensors (never read them here); ``indices`` the batch's dataset indices (a
                                list, ``range`` or int64 tensor; None where the loop cannot know them). Only with
                                the default forward (not ``training_step=``, LBFGS or a memory plan's split)
``on_train_batch_end(trainer, batch_idx, loss)``      ``loss`` is a device tensor: never ``.item()`` it here
``on_before_optimizer_step(trainer, optimizer)``      grads are unscaled and clipped
``on_optimizer_step(trainer, step, skipped)``         after the step; ``skipped`` when fp16's scaler skipped
``on_refresh(trainer, progress)``   wall-clock throttled (``refresh_interval``); the only place running
                                    values are read from the device. ``progress`` is a :class:`Progress`.
``on_control(trainer, event)``     a control request (lr, accumulation, pause, stop, rollback) took effect
``on_health(trainer, report)``     ``nbtrainer.Health`` found something (a :class:`~nbtrainer.HealthReport`)
``on_validation_start(trainer)`` / ``on_validation_end(trainer, logs)``  in fit and in ``evaluate()``
``on_epoch_end(trainer, epoch, logs)``  ``logs`` is the History row for the epoch
``on_exception(trainer, exception)``   then the exception propagates (KeyboardInterrupt excepted)
``on_fit_end(trainer, history)``       always, also after stop / interrupt / error
==============================  ==========================================================================

**What a watching consumer costs per step** (issue 54). A hook defined on a callback is a Python call at every
event of its kind, and the per-step and per-micro-batch ones are the only events whose count grows with the run:
on a small model a few microseconds a step are a few percent. A consumer that needs the run's per-step values
reads them where the loop already keeps them, once per refresh window, instead of hooking every step:

* ``on_refresh``'s :class:`Progress`: ``step_points`` (every step's loss and LR since the last refresh, one
  device read for all), ``step_times`` and ``step_samples``, ``global_step``, ``batch`` (all points of one refresh
  belong to ``progress.epoch``: the epoch's end delivers a refresh of its own);
* the running loop (``trainer.run_state.loop``, a ``FitLoop``): ``keep_window_batches()`` has it keep
  references to the micro-batches of the open accumulation window (``KeptBatches.batches``, dropped at each
  optimizer step after the step's events) and to the last one trained (``.last``): no copy, no call;
* **scheduled steps**: a callback with an attribute ``next_optimizer_step`` (an int, or None for "only skipped
  steps") gets ``on_before_optimizer_step`` and ``on_optimizer_step`` only at steps ``>= next_optimizer_step``
  (the step about to be taken, then the one just taken) and at skipped steps, which are rare; the loop compares
  one int per step (``CallbackList.next_due``). The callback moves the attribute on as it goes (at a delivery,
  or in any other event but the per-batch ones, after which the list looks at it again). ``nbtrainer.Health``
  is delivered at its sampled steps and the one before each; ``Samples`` at its ``every_n_steps``.

``tests/events/test_step_cost.py`` counts the calls per step the watching consumers make.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["CONTROL_KINDS", "EVENTS", "HOOK_KEYWORDS", "CallbackList", "Progress", "check_hook_signatures"]

#: the ``on_control`` events that change a value the run trains with (``old`` -> ``new``): what loggers chart
CONTROL_KINDS = ("lr", "grad_accum_steps")

EVENTS: tuple[str, ...] = (
    "on_fit_start",
    "on_epoch_start",
    "on_train_batch_start",
    "on_train_forward",
    "on_train_batch_end",
    "on_before_optimizer_step",
    "on_optimizer_step",
    "on_refresh",
    "on_control",
    "on_health",
    "on_validation_start",
    "on_validation_end",
    "on_epoch_end",
    "on_exception",
    "on_fit_end",
)

#: the keywords each hook is called with (the table above); a hook must accept them all by name
HOOK_KEYWORDS: dict[str, tuple[str, ...]] = {
    "on_fit_start": ("trainer",),
    "on_epoch_start": ("trainer", "epoch"),
    "on_train_batch_start": ("trainer", "batch", "batch_idx"),
    "on_train_forward": ("trainer", "outputs", "targets", "indices"),
    "on_train_batch_end": ("trainer", "batch_idx", "loss"),
    "on_before_optimizer_step": ("trainer", "optimizer"),
    "on_optimizer_step": ("trainer", "step", "skipped"),
    "on_refresh": ("trainer", "progress"),
    "on_control": ("trainer", "event"),
    "on_health": ("trainer", "report"),
    "on_validation_start": ("trainer",),
    "on_validation_end": ("trainer", "logs"),
    "on_epoch_end": ("trainer", "epoch", "logs"),
    "on_exception": ("trainer", "exception"),
    "on_fit_end": ("trainer", "history"),
}


@dataclasses.dataclass
class Progress:
    """A snapshot of a running fit, delivered by ``on_refresh`` (plain Python values, already on host).

    ``step_points`` holds the optimizer steps completed since the previous refresh as
    ``(global_step, loss, lr)`` tuples, so a chart can draw every step without a per-step sync.

    ``step_times`` is the latest sampled step-time breakdown in ms (``data``, ``forward``, ``backward``,
    ``optimizer``; the loop samples micro-batches 1, 11, 21, 31, then every ``timing_every``, each under accumulation
    the micro-batch that closes its window, with that optimizer step, and counts each micro-batch of the window as
    long as that one; on Linux the time the training thread waited for a CPU on a busy machine is left out:
    ``nbtrainer._loop._ready_clock``), and
    ``step_samples`` every sample taken since the previous refresh as ``(global_step, times)``: a reader that needs
    each sample, not only the last, gets them all however slow the refresh.

    ``lr`` is group 0's learning rate now (a per-step scheduler has already moved it on for the next step);
    ``step_lrs`` each param group's LR as the last optimizer step used it: what the epoch's row and ``LRMonitor``
    report. ``step_group_lrs``: with several param groups, every group's LR (group 0's first: the point's ``lr``)
    that each step of ``step_points`` used, by step; empty with one param group.

    ``status`` is ``running``, ``pausing`` (a pause was requested; the loop has not reached the step
    boundary yet), ``paused`` (the loop holds), ``stopping``, then the fit's final status. ``memory`` is the
    peak of the last refresh window in bytes (CUDA allocator peak, reset each window; process RSS on CPU),
    ``memory_peak`` the fit's peak so far and ``memory_capacity`` the device's total
    (``nbtrainer._memory._window``).
    """

    status: str = "running"
    stage: str = "train"
    epoch: int = 0
    epochs: int = 0
    batch: int = 0
    batches: int | None = None
    global_step: int = 0
    total_steps: int | None = None
    samples: int = 0
    elapsed: float = 0.0
    epoch_elapsed: float = 0.0
    samples_per_s: float = 0.0
    loss: float | None = None
    lr: float | None = None
    step_lrs: list[float] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    step_points: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    step_group_lrs: dict[int, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    eta_epoch: float | None = None
    eta_fit: float | None = None
    step_times: dict[str, float] | None = None
    step_samples: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    grad_accum_steps: int = 1
    skipped_steps: int = 0
    memory: int | None = None
    memory_peak: int | None = None
    memory_capacity: int | None = None
    memory_kind: str = "rss"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class CallbackList:
    """Dispatch hooks to the callbacks that define them.

    The bound methods for each hook are resolved once, so a hook nobody defines costs one dict
    lookup and an empty loop per call. Callbacks with a ``next_optimizer_step`` attribute get the two
    step hooks only when their step has come, or at a skipped step (the module docstring: scheduled steps):
    ``has(...)`` counts the others only, and the loop calls the hook when one of them takes every step or
    the step is ``>= next_due`` (or skipped, for ``on_optimizer_step``).

    Attributes:
        next_due: the smallest ``next_optimizer_step`` of the scheduled callbacks (``math.inf`` when none
            wants a step).

    Example:
        >>> class EveryTenth:
        ...     next_optimizer_step = 10
        ...     def on_optimizer_step(self, trainer, step, skipped):
        ...         print("step", step)
        ...         self.next_optimizer_step = step + 10
        >>> callbacks = CallbackList([EveryTenth()])
        >>> for step in range(1, 25):  # what the loop does: a call only when one is due
        ...     if callbacks.has("on_optimizer_step") or step >= callbacks.next_due:
        ...         callbacks.call("on_optimizer_step", trainer=None, step=step, skipped=False)
        step 10
        step 20
    """

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks: list[Any] = list(callbacks)
        self._bound: dict[str, list[Any]] = {}
        self._scheduled: list[Any] = []
        self.next_due: float = math.inf
        self.rebuild()

    def rebuild(self) -> None:
        scheduled = [cb for cb in self.callbacks if _scheduled(cb)]
        self._bound = {
            name: [
                getattr(cb, name)
                for cb in self.callbacks
                if callable(getattr(cb, name, None)) and not (name in _STEP_HOOKS and _scheduled(cb))
            ]
            for name in EVENTS
        }
        self._scheduled = scheduled
        self.reschedule()

    def reschedule(self) -> None:
        """Look at the scheduled callbacks' ``next_optimizer_step`` again (after they moved it)."""
        due = math.inf
        for cb in self._scheduled:
            step = cb.next_optimizer_step
            if step is not None and step < due:
                due = step
        self.next_due = due

    def append(self, callback: Any) -> None:
        self.callbacks.append(callback)
        self.rebuild()

    def remove(self, callback: Any) -> None:
        self.callbacks = [cb for cb in self.callbacks if cb is not callback]
        self.rebuild()

    def has(self, hook: str) -> bool:
        """Whether a callback takes ``hook`` at every event (the scheduled ones are not counted)."""
        return bool(self._bound.get(hook))

    def call(self, hook: str, **kwargs: Any) -> None:
        for fn in self._bound[hook]:
            fn(**kwargs)
        if self._scheduled and hook not in _PER_BATCH:
            if hook == "on_optimizer_step":
                self.call_due(hook, kwargs["step"], kwargs["skipped"], kwargs)
            else:
                self.reschedule()

    def call_before_step(self, step: int, **kwargs: Any) -> None:
        """``on_before_optimizer_step`` before optimizer step ``step`` (the loop's call: it knows the step)."""
        for fn in self._bound["on_before_optimizer_step"]:
            fn(**kwargs)
        if step >= self.next_due:
            self.call_due("on_before_optimizer_step", step, False, kwargs)

    def call_due(self, hook: str, step: int, skipped: bool, kwargs: dict[str, Any]) -> None:
        """``hook`` (a step hook) to the scheduled callbacks whose step has come (all of them at a skipped
        step); then :meth:`reschedule` after ``on_optimizer_step``."""
        for cb in self._scheduled:
            want = cb.next_optimizer_step
            fn = getattr(cb, hook, None)
            if fn is not None and (skipped or (want is not None and step >= want)):
                fn(**kwargs)
        if hook == "on_optimizer_step":
            self.reschedule()

    def caller(self, hook: str) -> Callable[..., None] | None:
        """A function calling ``hook`` on the callbacks defining it now (the one bound method itself when one does,
        for a per-step hook: no dispatch), or None when none does."""
        bound = self._bound.get(hook)
        if not bound:
            return None
        if len(bound) == 1:
            return bound[0]
        return functools.partial(self.call, hook)


#: the two hooks a scheduled callback gets only at its steps
_STEP_HOOKS = frozenset({"on_before_optimizer_step", "on_optimizer_step"})
#: the hooks fired per micro-batch or per step: no rescheduling after them (the loop's hot path)
_PER_BATCH = frozenset({"on_train_batch_start", "on_train_forward", "on_train_batch_end", "on_before_optimizer_step"})


def _scheduled(callback: Any) -> bool:
    """A callback that asks for scheduled step deliveries (module docstring)."""
    return hasattr(callback, "next_optimizer_step") and any(callable(getattr(callback, h, None)) for h in _STEP_HOOKS)


def check_hook_signatures(callback: Any) -> None:
    """Refuse a hook that cannot take the keywords it will be called with: the call would fail only when the event
    first fires (``on_epoch_end`` after a whole epoch trained). Extra parameters with defaults and ``**kwargs`` are
    fine."""
    for name, keywords in HOOK_KEYWORDS.items():
        hook = getattr(callback, name, None)
        if not callable(hook):
            continue
        try:
            sig = inspect.signature(hook)
        except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check
            continue
        try:
            sig.bind(**dict.fromkeys(keywords))
        except TypeError:
            raise TypeError(
                f"Callback {type(callback).__name__} defines {name}{sig}, but nbtrainer calls it with the keywords "
                f"{', '.join(k + '=' for k in keywords)}: {_mismatch(sig, keywords)}, so it would fail when the event "
                f"first fires. Name its parameters {name}(self, {', '.join(keywords)}), or accept **kwargs."
            ) from None


def _mismatch(sig: inspect.Signature, keywords: tuple[str, ...]) -> str:
    params = sig.parameters.values()
    by_name = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    parts = []
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        parts += [f"it has no parameter {k!r}" for k in keywords if k not in by_name]
    unfilled = [
        p.name
        for p in params
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and (p.name not in keywords or p.kind is p.POSITIONAL_ONLY)
    ]
    parts += [f"{n!r} would get no value" for n in unfilled]
    return "; ".join(parts) or "the keywords do not bind"
