"""Loss spikes and a rising loss, from the per-step losses the refresh has already read (host values, no device).

A spike is a finite loss above the running mean of the last ``window`` finite losses by more than ``zscore``
standard deviations, once ``warmup`` losses have been seen; it does not enter the running statistics (one bad
batch must not widen the band that judges the next). The standard deviation has a floor of 1% of the mean's
magnitude, so a flat loss does not turn every wobble into a spike.

A rising loss: over the last ``window`` steps, the mean of the second half is above the mean of the first half by
more than three standard errors and by more than 5%.

A run that does not learn (:meth:`LossWatch.stuck`), over a full window since the fit started or since the last fix
(``reset``): both halves of the window above the chance level (``ln C`` for a cross-entropy over ``C`` classes) by
more than 5% and not falling by 10%; or the loss flat (the halves within three standard errors or 1% of each
other) where it started: at least 90% of the segment's first losses, and near chance when the chance level is known
(without one, Health tells it as a warning: a fine-tuned regressor may start where it ends). Without a chance level
a flat loss is convergence, not failure, when it is far below the first losses this model was seen with
(``first_seen``, under half) or near where its previous fit ended while learning (``ended``, within 10%).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LossWatch", "Rise", "Spike", "Stuck"]


@dataclass
class Spike:
    step: int
    loss: float
    mean: float
    std: float

    @property
    def zscore(self) -> float:
        return (self.loss - self.mean) / self.std


@dataclass
class Stuck:
    """A window in which the run did not learn: ``why`` is ``"above_chance"`` or ``"flat"``; ``onset`` the step
    after the last loss below the chance level (``above_chance``)."""

    why: str
    step: int
    mean: float  # of the window's second half
    start: float | None  # the segment's first losses' mean
    onset: int


@dataclass
class Rise:
    step: int
    before: float  # mean loss of the first half of the window
    after: float  # ... of the second half


class LossWatch:
    """Feeds on ``(step, loss, lr)`` points in order; :meth:`add` returns the spikes among them."""

    def __init__(self, *, window: int, zscore: float, warmup: int | None = None) -> None:
        self.window, self.zscore = window, zscore
        self.warmup = warmup if warmup is not None else max(10, window // 4)
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._sum = self._sumsq = 0.0
        self.chance: float | None = None  # the loss of a uniform guess, when known
        self.start: float | None = None  # the mean of the segment's first ``warmup`` losses
        self.first_step: int | None = None  # the segment's first step
        self.below_chance_at: int | None = None  # the last step whose loss was below the chance level
        self.seen = 0  # finite losses since the segment started
        self.since = 0  # the segment's first step: the losses of earlier steps are not its own
        self._first: list[float] = []
        self._halved: tuple[int, tuple[float, float, float] | None] = (-1, None)
        # Kept across segments (and given from earlier fits by Health): what tells a converged run from a stuck one
        self.first_seen: float | None = None  # the first losses' mean the model was seen with
        self.ended: float | None = None  # the mean loss where the model's previous fit ended, learning

    def reset(self, since: int = 0) -> None:
        """A new segment from step ``since`` (a fit's start, a fix, a rollback): the statistics start again."""
        self.since = since
        self._recent.clear()
        self._sum = self._sumsq = 0.0
        self.start = self.first_step = self.below_chance_at = None
        self.seen = 0
        self._first = []
        self._halved = (-1, None)

    @property
    def mean(self) -> float | None:
        n = len(self._recent)
        return self._sum / n if n else None

    def add(self, points: Sequence[tuple[int, float, float]]) -> list[Spike]:
        """Feed the refresh's ``(step, loss, lr)`` points (``Progress.step_points``) in order; returns the spikes
        among them. One pass with local names and no call per point: a refresh of a small model's run brings about
        a thousand (issue 54)."""
        if points and points[0][0] < self.since:
            # A fix takes effect at a step boundary before the refresh that reads the steps up to it: the step it
            # closed trained on the old weights (the diverged loss the fix is for), and must not count as after it.
            points = [p for p in points if p[0] >= self.since]
        spikes: list[Spike] = []
        chance, warmup, zscore = self.chance, self.warmup, self.zscore
        recent, full = self._recent, self._recent.maxlen
        total, squares, seen, below = self._sum, self._sumsq, self.seen, self.below_chance_at
        first = self._first if self.start is None else None
        isfinite, sqrt, inf = math.isfinite, math.sqrt, math.inf
        for step, loss, _ in points:
            if not isfinite(loss):
                continue  # the non-finite signal's business
            if self.first_step is None:
                self.first_step = step
            seen += 1
            if first is not None:
                first.append(loss)
                if len(first) >= warmup:
                    self.start, first = sum(first) / len(first), None
                    if self.first_seen is None:
                        self.first_seen = self.start
            if chance is not None and loss < chance:
                below = step
            n = len(recent)
            if n >= warmup:
                mean = total / n
                # sums drift a little over a long run: the variance is floored at 0
                std = max(sqrt(max(squares / n - mean * mean, 0.0)), 0.01 * abs(mean), 1e-12)
                if loss > mean + zscore * std:
                    spikes.append(Spike(step, loss, mean, std))
                    continue
            if n == full:
                old = recent[0]
                square = old * old
                # A value that holds most of the squares (a diverging start's 1e26 in a window of losses near 1)
                # must not be subtracted: the sums kept only the rounding error of adding the small losses to it,
                # and without it the mean came out 0.01 or negative, a false spike at every later step. The window
                # is summed again instead (such a value leaves rarely: the common step stays a few float ops).
                if square + square > squares or squares == inf:  # inf: a square overflowed (inf - inf is NaN)
                    recent.append(loss)
                    total, squares = sum(recent), sum([v * v for v in recent])
                    continue
                total -= old
                squares -= square
            recent.append(loss)
            total += loss
            squares += loss * loss
        self._sum, self._sumsq, self.seen, self.below_chance_at = total, squares, seen, below
        return spikes

    def _halves(self) -> tuple[float, float, float] | None:
        """Means of the full window's two halves and their standard error (None before a full window); once per
        batch of points (the rise and the stuck check of one refresh share it)."""
        if self._halved[0] == self.seen:
            return self._halved[1]
        result = self._halves_now()
        self._halved = (self.seen, result)
        return result

    def _halves_now(self) -> tuple[float, float, float] | None:
        values = list(self._recent)
        n = len(values)
        if n < self.window or n < 8:
            return None
        half = n // 2
        a, b = values[:half], values[n - half :]
        ma, mb = sum(a) / half, sum(b) / half
        va = sum((v - ma) ** 2 for v in a) / max(half - 1, 1)
        vb = sum((v - mb) ** 2 for v in b) / max(half - 1, 1)
        return ma, mb, math.sqrt((va + vb) / half)

    def stuck(self, step: int) -> Stuck | None:
        """The run did not learn over the last full window (see the module docstring), or None."""
        if self.seen < self.window:
            return None
        halves = self._halves()
        if halves is None:
            return None
        ma, mb, sem = halves
        chance = self.chance
        first = self.first_step if self.first_step is not None else step
        if chance is not None and min(ma, mb) > 1.05 * chance and mb > 0.9 * ma:
            onset = self.below_chance_at + 1 if self.below_chance_at is not None else first
            return Stuck("above_chance", step, mb, self.start, onset)
        flat = abs(mb - ma) <= max(3 * sem, 0.01 * abs(ma))
        near = chance is None or mb > 0.8 * chance
        if flat and near and self.start is not None and mb >= 0.9 * self.start and not self._converged(mb):
            return Stuck("flat", step, mb, self.start, first)
        return None

    def _converged(self, level: float) -> bool:
        """A flat loss at ``level`` is where an earlier fit of the model brought it (see the module docstring).
        With a chance level, "near chance" already tells a stuck run from a converged one."""
        if self.chance is not None:
            return False
        below_first = self.first_seen is not None and level < 0.5 * self.first_seen
        return below_first or (self.ended is not None and level <= 1.1 * self.ended)

    def rise(self, step: int) -> Rise | None:
        """A rising loss over the window now, or None (needs a full window)."""
        halves = self._halves()
        if halves is None:
            return None
        ma, mb, sem = halves
        if mb > ma + 3 * sem and mb - ma > 0.05 * abs(ma):
            return Rise(step, ma, mb)
        return None
