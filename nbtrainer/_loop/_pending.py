"""The training values a fit has not read from the device yet (:class:`PendingReads`), and what one read makes of them.

Each micro-batch leaves its detached loss (a 0-d device tensor) and its batch size here, and each optimizer step a mark
(the step, the micro-batches taken so far, its LR: with several param groups, every group's). :meth:`PendingReads.read`
is the throttled read of the loop's sync budget (``_fit_loop``'s docstring, points 1 and 2): the losses and the metrics'
pending values stacked and read in one transfer, added exactly to the epoch's running sums (``LoopState``), and turned
into one point per closed optimizer step (``close_windows``), kept until the next refresh delivers them.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._loop._loop_state import close_windows
from nbtrainer._loop._metrics import exact_add

if TYPE_CHECKING:
    from nbtrainer._loop._loop_state import LoopState
    from nbtrainer._loop._metrics import MetricSet

__all__ = ["PendingReads"]

log = logging.getLogger(__name__)


class PendingReads:
    """What a fit has not read from the device yet (see the module docstring).

    Attributes:
        losses / sizes: each micro-batch's loss (on the device) and batch size since the last read. The epoch loop
            appends to these very lists (it holds them as locals): they are cleared in place, never replaced.
        taken: micro-batches taken in the whole fit.
        marks: the optimizer steps not yet closed by a read: ``(global step, micro-batches taken, lr)`` (``lr`` as
            ``_step.used_lr`` gives it: a list with several param groups).
        points: per-step ``(step, loss, lr)`` read, not yet delivered by a refresh (``lr``: group 0's).
        group_lrs: every param group's LR at the steps of ``points`` taken with several groups, by step.
        open: ``(loss, batch size)`` read so far of the accumulation window still open.
    """

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []
        self.sizes: list[int] = []
        self.base = 0  # cumulative micro-batch index of losses[0]
        self.taken = 0
        self.marks: list[tuple[int, int, Any]] = []
        self.points: list[tuple[int, float, float]] = []
        self.group_lrs: dict[int, tuple[float, ...]] = {}
        self.open: list[tuple[float, int]] = []

    def mark_step(self, step: int, lr: Any) -> None:
        self.marks.append((step, self.taken, lr))

    def take_points(self) -> tuple[list[tuple[int, float, float]], dict[int, tuple[float, ...]]]:
        """The points read since the last call, and their steps' param groups' LRs (``Progress.step_group_lrs``)."""
        points, group_lrs, self.points, self.group_lrs = self.points, self.group_lrs, [], {}
        return points, group_lrs

    def release(self) -> None:
        """Drop the device values not read yet (an out-of-memory error frees them with the step's tensors)."""
        self.losses.clear()
        self.sizes.clear()

    def drop(self) -> None:
        """Forget the steps since the last read too (a rollback restored an earlier state)."""
        self.release()
        self.base = self.taken
        self.marks, self.points, self.open, self.group_lrs = [], [], [], {}

    def deliver_after_failure(self, flush: Callable[[], None], refresh: Callable[[], None]) -> None:
        """A fit failed: read what is pending (one transfer) and deliver the steps read with one last refresh, so that
        the History, the charts and the progress hold every step taken up to the failure before its error goes on.
        A NaN/inf loss's refresh read its steps, then raised before delivering them: they come here, the non-finite
        ones as NaN/inf (where it went wrong). Nothing raised here replaces the fit's own error."""
        try:
            with contextlib.suppress(Exception):  # a NaN/inf among them (the steps are read first), a broken device
                flush()
            if self.points:
                refresh()
        except Exception:  # a callback's on_refresh: the fit's own error is the one to see
            log.debug("delivering the steps before a failure failed; the fit's error is raised", exc_info=True)

    def read(self, state: LoopState, metrics: MetricSet, *, gating: bool) -> tuple[list[float], list[tuple]] | None:
        """Read the pending losses and metric values (one transfer) into ``state``'s running sums and ``metrics``;
        returns the losses read and the points of the steps they closed (None: nothing was pending). ``gating``
        (``on_nonfinite="skip"/"stop"``): non-finite losses stay out of the running loss."""
        if not self.losses:
            return None
        n = len(self.losses)
        parts = [torch.stack(self.losses).float()]  # 0-d losses (checked on the first batch)
        parts += metrics.drain()
        host = torch.cat([p.reshape(-1).to(parts[0].device) for p in parts]).tolist()  # SYNC (throttled)
        losses = host[:n]
        metric_vals = {name: host[n * (i + 1) : n * (i + 2)] for i, name in enumerate(metrics.pending)}
        sizes = self.sizes
        if gating:  # skipped windows stay out of the running loss
            state.nonfinite_samples += sum(b for v, b in zip(losses, sizes, strict=True) if not math.isfinite(v))
            weighted = [v * b for v, b in zip(losses, sizes, strict=True) if math.isfinite(v)]
        else:  # exact whatever the refresh chunking (a resumed run reproduces the epoch loss bit for bit)
            weighted = [v * b for v, b in zip(losses, sizes, strict=True)]
        state.loss_sum = exact_add(state.loss_parts, weighted)
        metrics.absorb(metric_vals, sizes)
        marked, self.open, self.marks = close_windows(
            self.open, zip(losses, sizes, strict=True), self.marks, end=self.base + n
        )
        self.base += n
        self.losses.clear()  # in place: the epoch loop holds local aliases of these lists
        self.sizes.clear()
        points = []
        for step, loss, lr in marked:
            if isinstance(lr, list):  # several param groups: group 0's is the point's, every group's kept beside
                lrs = self.group_lrs[step] = tuple(float(v) for v in lr)
                lr = lrs[0]
            points.append((step, loss, float(lr)))
        self.points += points
        return losses, points
