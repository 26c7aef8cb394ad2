"""Streamed statistics of a dataset's items, one batch at a time, in memory that does not grow with the inputs.

Per input field (a tensor the model receives): running moments per feature (a table's column, an image's channel),
the smallest and largest value, the items holding a NaN or an infinity and where; per item a 64-bit hash of its
inputs (BLAKE2b over the bytes of every field's row) and of its target, so duplicates are found by sorting hashes,
never by keeping items. Targets: class counts (integer labels), or moments (float targets).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["FieldStats", "HashLog", "Split", "TargetStats", "label_part", "row_hashes"]

Tensor = torch.Tensor


def _rows_bytes(value: Any, n: int, mask: np.ndarray | None = None) -> list[bytes] | None:
    """Each item's bytes of one field (a tensor, an array, or a list of strings / numbers); None: cannot tell.
    ``mask`` (items x positions, the batch's attention mask): a field with those two leading dimensions keeps only
    each item's real positions, so an item hashes alike whatever length its batch was padded to."""
    if isinstance(value, Tensor):
        t = value.detach()
        if t.ndim == 0 or t.shape[0] != n:
            return None
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        arr = t.cpu().contiguous().numpy()
    elif isinstance(value, np.ndarray) and value.ndim and value.shape[0] == n:
        arr = np.ascontiguousarray(value)
    elif isinstance(value, (list, tuple)) and len(value) == n:
        return [repr(v).encode() for v in value]
    else:
        return None
    if mask is not None and arr.ndim >= 2 and arr.shape[1] == mask.shape[1]:
        per_position = arr.reshape(n, mask.shape[1], -1)
        return [np.ascontiguousarray(per_position[i][mask[i]]).tobytes() for i in range(n)]
    return [row.tobytes() for row in arr.reshape(n, -1)]


def row_hashes(fields: Sequence[Any], n: int, mask: Any = None) -> np.ndarray | None:
    """One 64-bit hash per item over all ``fields`` (None when a field cannot be split per item). ``mask``: the
    batch's ``attention_mask`` (items x positions), when it has one: padding is left out of each item's bytes
    (per-batch padding would otherwise hide a duplicate in a batch padded to another length)."""
    keep = None
    if isinstance(mask, Tensor) and mask.ndim == 2 and mask.shape[0] == n:
        keep = mask.detach().cpu().numpy().astype(bool)
    per_field = [_rows_bytes(f, n, keep) for f in fields]
    if not per_field or any(p is None for p in per_field):
        return None
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        h = hashlib.blake2b(digest_size=8)
        for rows in per_field:
            row = rows[i]  # type: ignore[index]
            h.update(len(row).to_bytes(8, "little"))  # field boundaries: (ab, c) is not (a, bc)
            h.update(row)
        out[i] = int.from_bytes(h.digest(), "little", signed=True)
    return out


class HashLog:
    """Hashes of one split's items with their dataset indices (16 bytes an item), joined at the end."""

    def __init__(self) -> None:
        self._hashes: list[np.ndarray] = []
        self._indices: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []

    def add(self, hashes: np.ndarray, indices: np.ndarray, labels: np.ndarray | None) -> None:
        self._hashes.append(hashes)
        self._indices.append(indices)
        self._labels.append(labels if labels is not None else np.full(len(hashes), np.iinfo(np.int64).min))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self._hashes:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, empty
        return np.concatenate(self._hashes), np.concatenate(self._indices), np.concatenate(self._labels)


def _feature_view(t: Tensor) -> Tensor:
    """``(items, features)``: a table's columns, an image's (or a sequence's) channels at dimension 1."""
    if t.ndim == 1:
        return t.reshape(-1, 1)
    if t.ndim == 2:
        return t
    return t.transpose(0, 1).reshape(t.shape[1], -1).T  # every position of a channel is a value of that channel


def _fallback_view(t: Tensor) -> Tensor:
    """``(values, features)`` when dimension 1 is a length that varies from batch to batch (sequences padded per
    batch): the last dimension's features for ``(B, T, D)``, one feature for ``(B, T)``."""
    return t.reshape(-1, t.shape[-1]) if t.ndim >= 3 else t.reshape(-1, 1)


class _Moments:
    """Running count, sum, sum of squares, min, max and non-finite count per feature, in float64."""

    def __init__(self, features: int) -> None:
        f = self.features = features
        self.count = torch.zeros(f, dtype=torch.float64)
        self.sum = torch.zeros(f, dtype=torch.float64)
        self.sumsq = torch.zeros(f, dtype=torch.float64)
        self.min = torch.full((f,), math.inf, dtype=torch.float64)
        self.max = torch.full((f,), -math.inf, dtype=torch.float64)
        self.nonfinite = torch.zeros(f, dtype=torch.int64)  # values per feature

    def add(self, x: Tensor) -> None:
        finite = torch.isfinite(x)
        bad = ~finite
        if bool(bad.any()):
            self.nonfinite += bad.sum(0)
            x = torch.where(finite, x, 0.0)
        self.count += finite.sum(0)
        self.sum += x.sum(0)
        self.sumsq += (x * x).sum(0)
        self.min = torch.minimum(self.min, torch.where(finite, x, math.inf).min(0).values)
        self.max = torch.maximum(self.max, torch.where(finite, x, -math.inf).max(0).values)


class FieldStats:
    """Running moments of one input field, per feature (float fields), and where values are not finite.

    Features are a table's columns or dimension 1 of larger items (an image's channels); when dimension 1 turns out
    to vary from batch to batch (sequences padded per batch), a second set of moments, kept from the first batch
    over the last dimension (or the whole row), takes over, so every batch still counts."""

    def __init__(self, name: str, sample: Tensor) -> None:
        self.name = name
        self.dtype = str(sample.dtype).replace("torch.", "")
        self.shape = tuple(sample.shape[1:])
        self.floating = sample.is_floating_point() or sample.is_complex()
        self.layout = "table" if sample.ndim == 2 else "channels" if sample.ndim >= 3 else "values"
        self.items = 0
        self._main = _Moments(1 if sample.ndim <= 1 else int(sample.shape[1]))
        # a 4-d item's dimension 1 is an image's channels; a 3-d one's may be a sequence's steps, a table's width a
        # padded length: those keep a second set of moments (each batch's values counted twice, in the check only)
        self._fallback: _Moments | None = (
            _Moments(int(sample.shape[-1])) if sample.ndim == 3 else _Moments(1) if sample.ndim == 2 else None
        )
        self._varies = False
        self.nonfinite_items = 0
        self.nonfinite_first: list[int] = []  # the first dataset indices holding one
        self.mismatch = False

    @property
    def _active(self) -> _Moments:
        return self._fallback if self._varies and self._fallback is not None else self._main

    features = property(lambda self: self._active.features)
    count = property(lambda self: self._active.count)
    sum = property(lambda self: self._active.sum)
    sumsq = property(lambda self: self._active.sumsq)
    min = property(lambda self: self._active.min)
    max = property(lambda self: self._active.max)
    nonfinite = property(lambda self: self._active.nonfinite)

    def add(self, value: Tensor, indices: np.ndarray) -> None:
        n = value.shape[0]
        self.items += n
        if tuple(value.shape[1:]) != self.shape:
            self.mismatch = True  # variable-length items (padded per batch)
        if not self.floating or value.is_complex():
            return
        x = value.detach().to("cpu", torch.float64)
        per_item = ~torch.isfinite(x.reshape(n, -1)).all(1)
        if bool(per_item.any()):
            self.nonfinite_items += int(per_item.sum())
            if len(self.nonfinite_first) < 20:
                self.nonfinite_first += indices[per_item.numpy()].tolist()[: 20 - len(self.nonfinite_first)]
        if value.ndim >= 2 and int(value.shape[1]) != self._main.features and not self._varies:
            if self._fallback is None or (value.ndim == 3 and int(value.shape[-1]) != self._fallback.features):
                return  # neither dimension 1 nor the last one keeps its size: no moments from this batch
            self._varies = True
            self.layout = "sequence" if value.ndim == 3 else "values"
        if not self._varies:
            self._main.add(_feature_view(x))
        if self._fallback is not None and (value.ndim < 3 or int(value.shape[-1]) == self._fallback.features):
            self._fallback.add(_fallback_view(x))

    # -- summaries -------------------------------------------------------------------------------
    def moments(self) -> tuple[Tensor, Tensor]:
        """Mean and standard deviation per feature (NaN where nothing finite was seen)."""
        n = self.count.clamp(min=1)
        mean = torch.where(self.count > 0, self.sum / n, math.nan)
        var = (self.sumsq / n - mean * mean).clamp(min=0)
        return mean, var.sqrt()

    def overall(self) -> dict[str, float]:
        """Mean, std, min and max over every finite value of the field."""
        n = float(self.count.sum())
        if not n:
            return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan}
        mean = float(self.sum.sum()) / n
        var = max(float(self.sumsq.sum()) / n - mean * mean, 0.0)
        return {"mean": mean, "std": math.sqrt(var), "min": float(self.min.min()), "max": float(self.max.max())}

    def constant(self) -> list[int]:
        """Features with one value over every item (and at least one finite value)."""
        if not self.floating:
            return []
        same = (self.count > 0) & (self.min == self.max)
        return same.nonzero().flatten().tolist()


def label_part(targets: Any) -> Tensor | None:
    """The class labels inside a tuple of targets: its first part, when that is one integer label per item and every
    other part has a row per item too (``(y, weight)`` of items ``(x, y, weight)`` with ``num_inputs=1``: a weighted
    loss's per-item weights); None otherwise (a tensor of targets is read as it is)."""
    if not isinstance(targets, (tuple, list)) or len(targets) < 2:
        return None
    first = targets[0]
    if not (isinstance(first, Tensor) and first.ndim == 1 and not first.is_floating_point()):
        return None
    n = first.shape[0]
    return first if all(isinstance(p, Tensor) and p.ndim and p.shape[0] == n for p in targets[1:]) else None


class TargetStats:
    """What the targets are: class labels (counted), float values (moments) or several labels per item.

    ``probabilities``: what float rows ``(items, classes)`` are, where the criterion tells: True for class
    probabilities (``CrossEntropyLoss``: one-hot or soft rows, each item counted as its largest class), False for
    several labels per item (``BCEWithLogitsLoss``), None where it cannot tell (then 0/1 rows read as multi-label)."""

    def __init__(self, *, probabilities: bool | None = None) -> None:
        self.probabilities = probabilities
        self.parts: int | None = None  # targets a tuple of that many: its first read as the class labels
        self.kind: str | None = None  # "labels", "binary", "multilabel", "values", "none" or "other"
        self.counts: dict[int, int] = {}
        self.items = 0
        self.values = FieldStats("targets", torch.zeros(1, 1))
        self._first_float = True  # the first float batch shapes ``values``
        self.positives: Tensor | None = None

    def add(self, targets: Any, indices: np.ndarray | None = None) -> np.ndarray | None:
        """Count one batch's targets (``indices``: their items' dataset indices, which a NaN target is reported by);
        returns the item labels (int64) where targets are class labels."""
        if targets is None:
            self.kind = self.kind or "none"
            return None
        part = label_part(targets)
        if part is not None:
            self.parts, targets = len(targets), part
        if not isinstance(targets, Tensor):
            self.kind = "other"
            return None
        t = targets.detach().cpu()
        n = t.shape[0] if t.ndim else 1
        self.items += n
        if not t.is_floating_point() and t.ndim == 1:
            self.kind = "labels"
            self._count(t)
            return t.numpy().astype(np.int64)
        if t.is_floating_point():
            # Every float batch enters the moments, whatever the targets turn out to be: 0/1 batches read as a binary
            # or multi-label head's may be followed by soft ones (label smoothing), and then the targets are values
            # whose statistics (a NaN's items among them) include those first batches.
            if self._first_float:
                self._first_float = False
                self.values = FieldStats("targets", t.reshape(n, -1))
            self.values.add(t.reshape(n, -1), indices if indices is not None else np.arange(self.items - n, self.items))
            if self.probabilities and t.ndim == 2 and t.shape[1] > 1 and self.kind in (None, "labels"):
                return self._largest_class(t)
            hard = bool(((t == 0) | (t == 1)).all())
            single = t.ndim == 1 or (t.ndim == 2 and t.shape[1] == 1)
            if hard and single and self.kind in (None, "binary"):
                # 0/1 floats, one per item: a binary classifier's targets (BCEWithLogitsLoss), counted as classes
                self.kind = "binary"
                labels = t.reshape(-1).long()
                ones = int(labels.sum())
                self.counts[1] = self.counts.get(1, 0) + ones
                self.counts[0] = self.counts.get(0, 0) + len(labels) - ones
                return labels.numpy().astype(np.int64)
            if hard and t.ndim == 2 and t.shape[1] > 1 and self.kind in (None, "multilabel"):
                self.kind = "multilabel"
                sums = t.sum(0).double()
                self.positives = sums if self.positives is None else self.positives + sums
                return None
            # values other than 0 and 1 (or after them): not labels, for good; one 0/1 batch later changes nothing
            self.counts.clear()
            self.positives = None
            self.kind = "values"
            return None
        self.kind = "other"  # integer targets of several values per item (tokens, masks)
        self._count(t)
        return None

    def _count(self, labels: Tensor) -> None:
        """Each value's items added to :attr:`counts`."""
        values, counts = torch.unique(labels, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.counts[v] = self.counts.get(v, 0) + c

    def _largest_class(self, t: Tensor) -> np.ndarray:
        """Class-probability rows as labels: each row's largest class, counted; a row with a NaN counts for no class
        (its item is named by the moments' non-finite check) and gets no label."""
        self.kind = "labels"
        finite = torch.isfinite(t).all(1)
        labels = t.argmax(1)
        self._count(labels[finite])
        out = labels.numpy().astype(np.int64)
        out[~finite.numpy()] = np.iinfo(np.int64).min  # HashLog's "no label"
        return out


@dataclasses.dataclass
class Split:
    """What one pass over a split kept (``_check``)."""

    name: str
    items: int
    of: int | None
    sampled: bool
    fields: dict[str, FieldStats]
    hashes: HashLog
    targets: TargetStats
    unreadable: dict[str, str]
    unhashed: bool
