"""A plan's rows, each simulated when it is first needed (:class:`RowSearch`).

Every row's peak comes from a simulated step (:mod:`nbtrainer._plan._steps`), and a search over a decoder's
combinations simulates dozens of them. Most questions need far fewer: ``predict`` one row, the ``best`` row (the
fastest that fits). Its time factor and its switches are known without a simulation, so the search simulates rows
in order of speed and stops at the first group that holds a row that fits; only the table of rows (``rows``, the
text, the picture, a step-down's candidates) simulates them all. Whatever is asked first, each row is computed once,
by the same function, and the answers are the ones an eager search gives: the same rows, in the same order, the same
best (the same object in ``rows``).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nbtrainer._cancel import raise_if_cancelled
from nbtrainer._options import MemoryOptions
from nbtrainer._plan._context import Context
from nbtrainer._plan._cost import time_factor
from nbtrainer._plan._result import PlanRow
from nbtrainer._plan._steps import plan_row

__all__ = ["RowSearch", "Table"]


@dataclass(frozen=True)
class Table:
    """What needs every row: the rows shown (fastest first), the pickable rows whose peak fits (a step-down's
    choices, fastest first)."""

    shown: list[PlanRow]
    candidates: list[PlanRow]


def _pareto(rows: list[PlanRow]) -> list[PlanRow]:
    """The rows no other row beats on both time and peak (ties: the fewer switches), fastest first."""
    ordered = sorted(rows, key=lambda r: (r.time_factor, r.peak_bytes, len(r.switches)))
    front: list[PlanRow] = []
    smallest = math.inf
    for row in ordered:
        if row.peak_bytes < smallest:
            front.append(row)
            smallest = row.peak_bytes
    return front


class RowSearch:
    """The rows of one plan: ``(memory switches, micro-batch)`` each, simulated on first use.

    Args:
        ctx: the plan's context (its simulation cache is shared with ``predict``).
        specs: every combination the plan lists, in the search's order.
        batch_size, usable, context_bytes: as :func:`nbtrainer._plan._steps.plan_row` takes them.
        pickable: whether ``best`` may pick a row with these switches (rows that change what trains: when asked).
        plain: the switches of the baseline row (listed even when another row beats it).
        cancel: set from another thread, no further row is simulated: a row not yet known raises
            ``concurrent.futures.CancelledError`` (a row takes a second; a search, up to a minute on a loaded machine).
    """

    def __init__(
        self,
        ctx: Context,
        specs: Sequence[tuple[MemoryOptions, int]],
        *,
        batch_size: int,
        usable: int,
        context_bytes: int,
        pickable: Callable[[MemoryOptions], bool],
        plain: MemoryOptions,
        cancel: threading.Event | None = None,
    ) -> None:
        self.ctx, self.specs = ctx, list(specs)
        self.batch_size, self.usable, self.context_bytes = batch_size, usable, context_bytes
        self.pickable, self.plain, self.cancel = pickable, plain, cancel
        self.seconds = 0.0  # spent simulating rows here (the plan adds it to its own time)
        self._rows: list[PlanRow | None] = [None] * len(self.specs)
        self._best: tuple[PlanRow | None] | None = None
        self._table: Table | None = None
        self._lock = threading.RLock()  # a plan read from two threads computes each row once

    def row(self, i: int) -> PlanRow:
        with self._lock:
            row = self._rows[i]
            if row is None:
                raise_if_cancelled(self.cancel, "plan_memory: cancelled (its cancel event is set)")
                memory, micro = self.specs[i]
                start = time.perf_counter()
                row = plan_row(self.ctx, memory, micro, self.batch_size, self.usable, self.context_bytes)
                self.seconds += time.perf_counter() - start
                self._rows[i] = row
            return row

    def _speed(self, i: int) -> tuple[float, int]:
        """A row's ``(time_factor, len(switches))`` from its switches alone: what :func:`plan_row` gives it."""
        memory, micro = self.specs[i]
        accum = self.batch_size // micro
        return time_factor(self.ctx.device.type, memory, accum, self.ctx.blocks), len(memory.changed()) + (accum > 1)

    def best(self) -> PlanRow | None:
        """The fastest pickable row that fits; among equally fast rows the one with fewest switches, then the
        smallest peak (an eager search's order: rows sorted by ``(time_factor, len(switches), peak_bytes)``, the
        first that fits). Rows are simulated a group of equal speed at a time, fastest first, until one fits."""
        with self._lock:
            if self._best is None:
                order = sorted((i for i in range(len(self.specs)) if self.pickable(self.specs[i][0])), key=self._speed)
                found = None
                for _, group in itertools.groupby(order, key=self._speed):
                    rows = sorted((self.row(i) for i in group), key=lambda r: r.peak_bytes)
                    found = next((r for r in rows if r.fits), None)
                    if found is not None:
                        break
                self._best = (found,)
            return self._best[0]

    def table(self) -> Table:
        """Every row simulated: the plain rows' front, then the front of the rows that train something else (listed,
        picked only when asked), the baseline and the best; and a step-down's candidates."""
        with self._lock:
            if self._table is None:
                rows = [self.row(i) for i in range(len(self.specs))]
                best = self.best()
                order = sorted(
                    (r for r, (memory, _) in zip(rows, self.specs, strict=True) if self.pickable(memory)),
                    key=lambda r: (r.time_factor, len(r.switches), r.peak_bytes),
                )
                baseline = next((r for r in rows if r.memory == self.plain and r.grad_accum_steps == 1), None)
                shown = _pareto([r for r in rows if not r.changes_training]) + _pareto(
                    [r for r in rows if r.changes_training]
                )
                for extra in (baseline, best):
                    if extra is not None and extra not in shown:
                        shown.append(extra)
                shown.sort(key=lambda r: (r.time_factor, r.peak_bytes))
                self._table = Table(
                    shown=shown, candidates=[r for r in order if r.peak_bytes + r.context_bytes <= self.usable]
                )
            return self._table
