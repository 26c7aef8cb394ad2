"""Where a fit is (:class:`LoopState`): epoch, batch, steps and running sums, as plain data a checkpoint carries.

The Trainer's run keeps one (``trainer.run_state.loop_state``; the loop works on it through ``LoopHost.state``),
a checkpoint saves its ``state_dict()`` and a resume loads it back before the loop starts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from nbtrainer._data._order import ShuffleOrder, loader_size
from nbtrainer._setup._seed import capture_rng

__all__ = ["LoopState", "close_windows", "window_loss"]


class LoopState:
    """Where a fit is: everything needed to continue exactly (plain data)."""

    def __init__(self) -> None:
        self.epoch = 0  # 0-based index of the current epoch
        self.batch = 0  # batches consumed in the current epoch
        self.global_step = 0  # optimizer-step windows completed (skipped fp16 steps included)
        self.skipped_steps = 0
        self.epoch_complete = False
        self.samples = 0
        self.loss_sum = 0.0
        self.loss_parts: list[float] = []  # exact running sum of loss * batch size (see _metrics.exact_add)
        self.nonfinite_samples = 0  # samples whose loss was left out (on_nonfinite="skip"/"stop")
        self.epoch_time = 0.0  # seconds spent in this epoch before a resume
        # Each param group's LR as the last optimizer step used it, when a per-step scheduler has moved it on since
        # (None: the groups hold it): the epoch row's lr, also when a resume lands between that step and the row.
        self.step_lrs: list[float] | None = None
        # The sampler generator's state at the start of the current epoch; advanced to the next
        # epoch's start state when an epoch completes (exact resume mid-epoch and at epoch boundaries).
        self.sampler_state: torch.Tensor | None = None
        # The RNG states (_setup._seed.capture_rng) the current epoch's iterator was built under: what no sampler
        # generator covers (a sampler or dataset on the global RNG, workers' base seeds) replays from them.
        self.epoch_rng: dict[str, Any] | None = None
        # The loader's batches, batch size and samples per epoch (_data._order.loader_size) when the current epoch
        # started: a resume refuses a loader on which ``batch`` would not mean the same samples.
        self.loader_size: dict[str, int | None] | None = None
        # What the last fit was asked for (set as it starts): a checkpoint saved after it ended still says how many
        # epochs were planned, so that a run ended by max_steps is not taken for a finished one.
        self.fit_epochs: int | None = None
        self.fit_max_steps: int | None = None

    @contextlib.contextmanager
    def epoch_order(self, order: ShuffleOrder, *, resumed: bool) -> Iterator[None]:
        """Around building an epoch's iterator: at an epoch's start, keep the RNG states it is built under and the
        loader's size (once an epoch: nothing per step); resuming mid-epoch, build it under those states again
        (:meth:`ShuffleOrder.replay`)."""
        if resumed:
            with order.replay(self.epoch_rng):
                yield
            return
        self.epoch_rng, self.loader_size = capture_rng(), loader_size(order.loader)
        yield

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def close_windows(
    open_window: list[tuple[float, int]],
    read: Iterable[tuple[float, int]],
    marks: list[tuple[int, int, Any]],
    *,
    end: int,
) -> tuple[list[tuple[int, float, Any]], list[tuple[float, int]], list[tuple[int, int, Any]]]:
    """One point per closed optimizer step: its window's sample-weighted mean loss (a one-batch window is just its
    loss). ``open_window`` holds the ``(loss, batch size)`` read earlier of the window still open, ``read`` those
    just read, ``marks`` the steps taken as ``(step, cumulative micro-batch end, lr)`` and ``end`` the cumulative
    micro-batch count read so far. Returns the points (each with its mark's ``lr`` as it was marked), the window
    left open and the marks not yet closed."""
    vals = open_window + list(read)
    first = end - len(vals)  # cumulative micro-batch index of vals[0]
    points: list[tuple[int, float, Any]] = []
    lo = j = 0
    for step, cum, lr in marks:
        if cum > end:
            break
        hi = cum - first
        points.append((step, window_loss(vals[lo:hi]), lr))
        lo = hi
        j += 1
    return points, vals[lo:], marks[j:]


def window_loss(window: list[tuple[float, int]]) -> float:
    """An optimizer step's loss from its window's ``(loss, batch size)``: the sample-weighted mean (a one-batch window
    is just its loss), so a smaller last micro-batch counts for its items, as its gradient does (``TrainStep``)."""
    if len(window) == 1:
        return window[0][0]
    total = sum(b for _, b in window) or 1
    return sum(v * b for v, b in window) / total
