"""Bounded chart payloads: min/max bucketing (spikes survive), a streaming version, and a debiased EMA.

A chart series never sends more than ``max_points`` points, however long the run: the x range is cut
into buckets and each bucket keeps its lowest and its highest point (in x order), so a single loss
spike or an LR warm-up peak is still drawn. The full data stays in :class:`nbtrainer.History`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["Ema", "MinMaxStream", "decimate", "minmax_indices"]


def _lo_hi(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    finite = np.isfinite(y)
    return np.where(finite, y, np.inf), np.where(finite, y, -np.inf)


def minmax_indices(ys: np.ndarray | Sequence[np.ndarray], max_points: int = 2000) -> np.ndarray:
    """Sorted indices to keep so at most ``max_points`` remain: each bucket's min and max.

    ``ys`` is one series or several of the same length (rows); with several, the union of their
    extremes is kept and the bucket count is divided among them. Non-finite values are never picked.

    Example:
        >>> y = np.zeros(10_000); y[1234] = 50.0
        >>> idx = minmax_indices(y, 100)
        >>> len(idx) <= 100 and 1234 in idx
        True
    """
    rows = np.atleast_2d(np.asarray(ys, dtype=float))
    n = rows.shape[1]
    if n <= max_points:
        return np.arange(n)
    n_buckets = max(1, max_points // (2 * rows.shape[0]))
    width = math.ceil(n / n_buckets)
    pad = n_buckets * width - n
    keep: list[np.ndarray] = []
    for y in rows:
        lo, hi = _lo_hi(y)
        lo = np.concatenate([lo, np.full(pad, np.inf)]).reshape(-1, width)
        hi = np.concatenate([hi, np.full(pad, -np.inf)]).reshape(-1, width)
        offsets = np.arange(lo.shape[0]) * width
        a, b = lo.argmin(axis=1), hi.argmax(axis=1)
        ok = np.isfinite(lo[np.arange(len(a)), a])
        keep += [(a + offsets)[ok], (b + offsets)[ok]]
    return np.unique(np.concatenate(keep))


def decimate(x: Iterable[float], y: Iterable[float], max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` reduced to at most ``max_points`` points by :func:`minmax_indices`."""
    xa, ya = (
        np.asarray(list(x) if not isinstance(x, np.ndarray) else x, float),
        np.asarray(list(y) if not isinstance(y, np.ndarray) else y, float),
    )
    idx = minmax_indices(ya, max_points)
    return xa[idx], ya[idx]


# -- streaming --------------------------------------------------------------------------------------
# A bucket is a row (x_lo, y_lo, x_hi, y_hi); y_lo == +inf marks a bucket without finite values.
def _bucket(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    lo, hi = _lo_hi(y)
    a, b = int(lo.argmin()), int(hi.argmax())
    return np.array([x[a], lo[a], x[b], hi[b]])


def _buckets(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    lo, hi = _lo_hi(ys)
    a, b = lo.argmin(axis=1)[:, None], hi.argmax(axis=1)[:, None]
    take = np.take_along_axis
    return np.hstack([take(xs, a, 1), take(lo, a, 1), take(xs, b, 1), take(hi, b, 1)])


def _merge(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Merge bucket ``q`` into the earlier bucket ``p`` (ties keep ``p``'s point)."""
    lo = p[:2] if p[1] <= q[1] else q[:2]
    hi = p[2:] if p[3] >= q[3] else q[2:]
    return np.concatenate([lo, hi])


def _merge_pairs(rows: np.ndarray) -> np.ndarray:
    a, b = rows[0::2], rows[1::2]
    lo = np.where((a[:, 1] <= b[:, 1])[:, None], a[:, :2], b[:, :2])
    hi = np.where((a[:, 3] >= b[:, 3])[:, None], a[:, 2:], b[:, 2:])
    return np.hstack([lo, hi])


class MinMaxStream:
    """Append points as they arrive; :meth:`points` returns at most ``max_points`` of them.

    Buckets hold ``width`` consecutive points. When there are more than ``max_points // 2 - 1``
    buckets, neighbours merge and ``width`` doubles, so memory and the cost of an append stay
    bounded for any run length, and every bucket still contributes its min and max.

    Example:
        >>> s = MinMaxStream(100)
        >>> for start in range(0, 100_000, 1000):
        ...     xs = np.arange(start, start + 1000); s.extend(xs, np.where(xs == 54321, 9.0, 0.0))
        >>> x, y = s.points()
        >>> len(x) <= 100, 54321.0 in x, s.count
        (True, True, 100000)
    """

    def __init__(self, max_points: int = 2000) -> None:
        self.max_buckets = max(2, max_points // 2 - 1)
        self.clear()

    def clear(self) -> None:
        self.width = 1
        self.count = 0
        self._rows = np.empty((0, 4))
        self._partial: np.ndarray | None = None
        self._partial_n = 0

    def extend(self, x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> None:
        x, y = np.asarray(x, dtype=float).reshape(-1), np.asarray(y, dtype=float).reshape(-1)
        n, i, w = len(x), 0, self.width
        if not n:
            return
        self.count += n
        if self._partial is not None:  # an open bucket (of self._partial_n < w points)
            take = min(w - self._partial_n, n)
            self._partial = partial = _merge(self._partial, _bucket(x[:take], y[:take]))
            self._partial_n += take
            i = take
            if self._partial_n == w:
                self._rows = np.vstack([self._rows, partial[None]])
                self._partial, self._partial_n = None, 0
        k = (n - i) // w
        if k:
            end = i + k * w
            self._rows = np.vstack([self._rows, _buckets(x[i:end].reshape(k, w), y[i:end].reshape(k, w))])
            i = end
        if i < n:
            self._partial, self._partial_n = _bucket(x[i:], y[i:]), n - i
        self._shrink()

    def _shrink(self) -> None:
        while len(self._rows) + (1 if self._partial_n else 0) > self.max_buckets:
            rows = self._rows
            if len(rows) % 2:  # the odd one out joins the (newer) partial bucket
                last = rows[-1]
                self._partial = last if self._partial is None else _merge(last, self._partial)
                self._partial_n += self.width
                rows = rows[:-1]
            self._rows = _merge_pairs(rows)
            self.width *= 2

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        rows = self._rows if self._partial is None else np.vstack([self._rows, self._partial[None]])
        rows = rows[np.isfinite(rows[:, 1])]
        if not len(rows):
            return np.empty(0), np.empty(0)
        lo_first = (rows[:, 0] <= rows[:, 2])[:, None]
        first = np.where(lo_first, rows[:, :2], rows[:, 2:])
        second = np.where(lo_first, rows[:, 2:], rows[:, :2])
        pts = np.stack([first, second], axis=1).reshape(-1, 2)
        keep = np.ones(len(pts), dtype=bool)
        keep[1::2] = rows[:, 0] != rows[:, 2]  # one point when min and max are the same point
        pts = pts[keep]
        return pts[:, 0], pts[:, 1]


class Ema:
    """Debiased exponential moving average (TensorBoard-style smoothing); non-finite values pass as NaN."""

    def __init__(self, weight: float = 0.9) -> None:
        if not 0.0 <= weight < 1.0:
            raise ValueError(f"smoothing weight must be in [0, 1), got {weight!r}.")
        self.weight = weight
        self.clear()

    def clear(self) -> None:
        self._value, self._decay = 0.0, 1.0

    def extend(self, ys: Iterable[float]) -> list[float]:
        w, v, d = self.weight, self._value, self._decay
        out: list[float] = []
        for y in ys:
            if not math.isfinite(y):
                out.append(math.nan)
                continue
            v = w * v + (1.0 - w) * y
            d *= w
            out.append(v / (1.0 - d))
        self._value, self._decay = v, d
        return out
