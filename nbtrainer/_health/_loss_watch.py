"""Loss spikes and a rising loss, from the per-step losses the refresh has already read (host values, no device).

A spike is a finite loss above the running mean of the last ``window`` finite losses by more than ``zscore``
standard deviations, once ``warmup`` losses have been seen; it does not enter the running statistics (one bad
batch must not widen the band that judges the next). The standard deviation has a floor of 1% of the mean's
magnitude, so a flat loss does not turn every wobble into a spike.

A rising loss: over the last ``window`` steps, the mean of the second half is above the mean of the first half by
more than three standard errors and by more than 5%.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

__all__ = ["LossWatch", "Rise", "Spike"]


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
class Rise:
    step: int
    before: float  # mean loss of the first half of the window
    after: float  # ... of the second half


class LossWatch:
    """Feeds on ``(step, loss)`` pairs in order; :meth:`add` returns the spikes among them."""

    def __init__(self, *, window: int, zscore: float, warmup: int | None = None) -> None:
        self.window, self.zscore = window, zscore
        self.warmup = warmup if warmup is not None else max(10, window // 4)
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._sum = self._sumsq = 0.0

    def reset(self) -> None:
        self._recent.clear()
        self._sum = self._sumsq = 0.0

    @property
    def mean(self) -> float | None:
        n = len(self._recent)
        return self._sum / n if n else None

    def _push(self, value: float) -> None:
        recent = self._recent
        if len(recent) == recent.maxlen:
            old = recent[0]
            self._sum -= old
            self._sumsq -= old * old
        recent.append(value)
        self._sum += value
        self._sumsq += value * value

    def add(self, points: list[tuple[int, float]]) -> list[Spike]:
        spikes: list[Spike] = []
        for step, loss in points:
            if not math.isfinite(loss):
                continue  # the non-finite signal's business
            n = len(self._recent)
            if n >= self.warmup:
                mean = self._sum / n
                # sums drift a little over a long run: recomputed from the window when they go negative
                var = max(self._sumsq / n - mean * mean, 0.0)
                std = max(math.sqrt(var), 0.01 * abs(mean), 1e-12)
                if loss > mean + self.zscore * std:
                    spikes.append(Spike(step, loss, mean, std))
                    continue
            self._push(loss)
        return spikes

    def rise(self, step: int) -> Rise | None:
        """A rising loss over the window now, or None (needs a full window)."""
        values = list(self._recent)
        n = len(values)
        if n < self.window or n < 8:
            return None
        half = n // 2
        a, b = values[:half], values[n - half :]
        ma, mb = sum(a) / half, sum(b) / half
        va = sum((v - ma) ** 2 for v in a) / max(half - 1, 1)
        vb = sum((v - mb) ** 2 for v in b) / max(half - 1, 1)
        sem = math.sqrt((va + vb) / half)
        if mb > ma + 3 * sem and mb - ma > 0.05 * abs(ma):
            return Rise(step, ma, mb)
        return None
