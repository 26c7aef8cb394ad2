"""A memory budget kept during a fit: the example batch, the row to apply, and the check of the measured peak.

``Trainer(memory_budget_gb=X)`` plans at the start of its first fit (``nbtrainer._trainer._memory_budget``) with what
lives here, none of which needs the Trainer:

* :func:`example_batch`: one batch of the training data, read without moving the loader's shuffling state;
* :func:`choose`: the plan's best row, or a ``ValueError`` that names the smallest row's need and what would help;
* :func:`step_down`: the next row after a measured peak above the budget, the plan's predictions scaled by the miss;
* :class:`PeakCheck`: the measured peak of the first optimizer steps (``max_memory_reserved`` and the context on
  CUDA, the tensor tracker of :mod:`nbtrainer._memory._peak` elsewhere), compared with the budget at a step boundary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from nbtrainer._plan._result import MemoryPlan, PlanRow, _nothing_fits

__all__ = ["CHECKED_STEPS", "TIMED_STEPS", "PeakCheck", "choose", "example_batch", "step_down"]

#: Optimizer steps measured after the plan is applied (and after each step down): the second one has the
#: optimizer's state, the steady state the plan predicts.
CHECKED_STEPS = 2
#: Optimizer steps timed after a check that fits (the checked steps are slower on a CPU: every tensor is tracked).
TIMED_STEPS = 3


def example_batch(loader: Any) -> Any:
    """One training batch, read so that the fit's data order does not change.

    A ``DataLoader`` over a map-style dataset gives its first ``batch_size`` samples through its own collate
    function (its sampler and generator are not touched); anything else that can be iterated again gives its
    first batch. A one-shot iterator cannot (its first batch would be lost to the fit).
    """
    from torch.utils.data import DataLoader, IterableDataset

    if isinstance(loader, DataLoader) and not isinstance(loader.dataset, IterableDataset):
        size = loader.batch_size
        dataset: Any = loader.dataset
        if size is not None and len(dataset) > 0:
            return loader.collate_fn([dataset[i] for i in range(min(size, len(dataset)))])
    if iter(loader) is loader:
        raise ValueError(
            "memory_budget_gb needs training data it can read twice (a DataLoader, a list of batches, arrays), "
            "not a one-shot iterator: its first batch is planned before the fit reads it."
        )
    try:
        return next(iter(loader))
    except StopIteration:
        raise ValueError("memory_budget_gb: the training data is empty.") from None


def choose(plan: MemoryPlan) -> PlanRow:
    """The plan's best row; nothing fits: a ``ValueError`` naming the smallest row's need and what would help."""
    if plan.best is not None:
        return plan.best
    raise ValueError(
        f"memory_budget_gb={plan.budget_bytes / 2**30:g}: nothing fits on {plan.device}: "
        f"{_nothing_fits(plan, ask='train them with Trainer(..., quantize=..., lora={...}) and no memory_budget_gb')} "
        "The switches you set yourself are kept: turning one off may help too."
    )


def step_down(plan: MemoryPlan, current: PlanRow, measured: int, *, optimizer: str | None) -> PlanRow | None:
    """The fastest row expected to fit once the plan's miss on ``current`` is taken into account.

    ``measured``: what :class:`PeakCheck` measured, the prediction's counterpart (the reserved bytes on CUDA, the
    peak of the tensors elsewhere). The plan under-predicted ``current`` by ``measured / predicted``; every row's
    prediction is scaled by that ratio, and the fastest one that then fits within the full budget (with the CUDA
    context), smaller than ``current``, is next. ``optimizer``: only rows with this optimizer kind (its state exists
    by now). None: nothing smaller fits.
    """
    ratio = measured / max(current.reserved_bytes, 1)
    for row in plan._candidates:
        if row.peak_bytes >= current.peak_bytes or row.memory.optimizer != optimizer:
            continue
        if row.memory.optimizer_in_backward != current.memory.optimizer_in_backward:
            continue  # set up once, when the trainer was built
        if row.reserved_bytes * ratio + row.context_bytes <= plan.budget_bytes:
            return row
    return None


class PeakCheck:
    """The measured peak of the next :data:`CHECKED_STEPS` optimizer steps, compared with ``budget_bytes``.

    A callback the Trainer adds for ``memory_budget_gb``: :meth:`arm` before the steps to measure; at the last
    of them ``over(measured_bytes)`` is called (on the training thread, at a step boundary) when the device needs
    more than the budget. On CUDA that is ``torch.cuda.max_memory_reserved`` (reset when armed: what the caching
    allocator took from the device) plus ``context_bytes`` (the CUDA context, held outside it); on other devices the
    tracker of :mod:`nbtrainer._memory._peak` follows every tensor over those steps only (it slows them; no other step).
    """

    def __init__(
        self,
        budget_bytes: int,
        device: torch.device,
        over: Callable[[int], None],
        context_bytes: int = 0,
        timed: Callable[..., None] | None = None,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.device = device
        self.over = over
        self.context_bytes = context_bytes if device.type == "cuda" else 0
        self.measured: list[int] = []  # each check's peak, in order
        #: seconds per optimizer step of the :data:`TIMED_STEPS` after each check (a tracked step is slower)
        self.step_seconds: list[float] = []
        # called with (the check's peak, seconds per step) once they are timed; at the end of a fit that ended first
        # (finish), with what was measured by then: seconds None when no step was timed, and the steps it covers
        self._timed = timed
        self._left = 0
        self._tracker: Any = None
        self._clock: list[float] = []  # the ends of the timed steps (the first: where timing starts)

    def arm(self, model: torch.nn.Module, optimizer: Any) -> None:
        self._left = CHECKED_STEPS
        self._clock = []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        from nbtrainer._memory._peak import PeakTracker

        self._close()
        tracker = PeakTracker()
        tracker.watch(model=model, optimizer=optimizer)
        tracker.__enter__()
        self._tracker = tracker

    def _close(self) -> None:
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.__exit__(None, None, None)
            tracker.close()

    def _tick(self) -> None:
        if self.device.type == "cuda":  # the steps' kernels done: one sync at each end of the timed steps, no other
            torch.cuda.synchronize(self.device)
        self._clock.append(time.perf_counter())
        if len(self._clock) == TIMED_STEPS + 1:
            seconds = (self._clock[-1] - self._clock[0]) / TIMED_STEPS
            self.step_seconds.append(seconds)
            self._clock = []
            if self._timed is not None and self.measured:
                self._timed(self.measured[-1], seconds)

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        if self._clock:
            self._tick()
        if self._left <= 0:
            return
        self._left -= 1
        if self._left:
            return
        peak = self._read_peak()
        if peak + self.context_bytes > self.budget_bytes:
            self.over(peak)
        else:
            self._tick()  # the next TIMED_STEPS steps, untracked, are timed

    def _read_peak(self) -> int:
        if self.device.type == "cuda":
            peak = int(torch.cuda.max_memory_reserved(self.device))
        else:
            peak = int(self._tracker.peak_bytes)
            self._close()
        peak = _largest_over_ranks(peak, self.device)  # every rank steps down together, or none does
        self.measured.append(peak)
        return peak

    def finish(self) -> None:
        """The fit's loop has ended: a fit shorter than the check and its timing (a smoke run of a few steps) is
        told what was measured by then, once here and not at each step. Its peak is read now when the check had
        steps left; a timing cut short is not kept in :attr:`step_seconds`, whose rounds are TIMED_STEPS long."""
        left, clock = self._left, self._clock
        self._left, self._clock = 0, []
        if 0 < left < CHECKED_STEPS:  # stepped since armed, the peak not read yet; a fit never steps down at its end
            peak = self._read_peak()
            if self._timed is not None:
                self._timed(peak, None, peak_steps=CHECKED_STEPS - left, timed_steps=0)
        elif clock and self.measured and self._timed is not None:  # checked, fewer steps timed than planned
            timed = len(clock) - 1
            seconds = (clock[-1] - clock[0]) / timed if timed else None
            self._timed(self.measured[-1], seconds, peak_steps=CHECKED_STEPS, timed_steps=timed)

    def on_exception(self, trainer: Any, exception: BaseException) -> None:
        self._left = 0
        self._clock = []
        self._close()

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        self._left = 0
        self._clock = []
        self._close()


def _largest_over_ranks(value: int, device: torch.device) -> int:
    """The largest ``value`` over the ranks of a DDP / FSDP run (one collective; ``value`` on one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return value
    where = device if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.int64, device=where)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())  # two checked steps per plan: the only host reads this adds
