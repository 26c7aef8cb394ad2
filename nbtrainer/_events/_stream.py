"""The public event stream: hook names, the progress snapshot and the duck-typed dispatcher.

Callbacks are plain objects; the trainer calls a hook only if the object defines it (like Fabric's
``call(hook_name, **kwargs)``). The progress bar, the history recorder and the notebook widget are all
consumers of the same events.

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
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["EVENTS", "CallbackList", "Progress"]

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


@dataclasses.dataclass
class Progress:
    """A snapshot of a running fit, delivered by ``on_refresh`` (plain Python values, already on host).

    ``step_points`` holds the optimizer steps completed since the previous refresh as
    ``(global_step, loss, lr)`` tuples, so a chart can draw every step without a per-step sync.

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
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    step_points: list[tuple[int, float, float]] = dataclasses.field(default_factory=list)
    eta_epoch: float | None = None
    eta_fit: float | None = None
    step_times: dict[str, float] | None = None
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
    lookup and an empty loop per call.
    """

    def __init__(self, callbacks: Iterable[Any] = ()) -> None:
        self.callbacks: list[Any] = list(callbacks)
        self._bound: dict[str, list[Any]] = {}
        self.rebuild()

    def rebuild(self) -> None:
        self._bound = {
            name: [getattr(cb, name) for cb in self.callbacks if callable(getattr(cb, name, None))] for name in EVENTS
        }

    def append(self, callback: Any) -> None:
        self.callbacks.append(callback)
        self.rebuild()

    def remove(self, callback: Any) -> None:
        self.callbacks = [cb for cb in self.callbacks if cb is not callback]
        self.rebuild()

    def has(self, hook: str) -> bool:
        return bool(self._bound.get(hook))

    def call(self, hook: str, **kwargs: Any) -> None:
        for fn in self._bound[hook]:
            fn(**kwargs)

    def caller(self, hook: str) -> Callable[..., None] | None:
        """A function calling ``hook`` on the callbacks defining it now (the one bound method itself when one does,
        for a per-step hook: no dispatch), or None when none does."""
        bound = self._bound.get(hook)
        if not bound:
            return None
        if len(bound) == 1:
            return bound[0]
        return functools.partial(self.call, hook)
