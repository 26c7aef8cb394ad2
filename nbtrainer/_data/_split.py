"""A batch cut into micro-batches along its first dimension: the comparison's accumulation and the Trainer's
``memory_budget_gb`` split (a loader batch trained as several forward / backward passes, one optimizer step)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from nbtrainer._data._batch import first_tensor, is_record, rebuild_sequence

__all__ = ["split_batch"]


def _split(obj: Any, k: int, size: int) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        if obj.dim() > 0 and obj.shape[0] == size:
            return list(obj.tensor_split(k))
        return [obj] * k
    if isinstance(obj, Mapping):
        by_key = {key: _split(value, k, size) for key, value in obj.items()}
        mapping_type: Any = type(obj)  # dict, OrderedDict, a BatchEncoding...: rebuilt from (key, value) pairs
        return [mapping_type((key, by_key[key][i]) for key in obj) for i in range(k)]
    if isinstance(obj, (tuple, list)):
        parts = [_split(value, k, size) for value in obj]
        return [rebuild_sequence(obj, [p[i] for p in parts]) for i in range(k)]
    if is_record(obj):  # dataclass batches (nbtrainer._data._batch)
        fields = {f.name: _split(getattr(obj, f.name), k, size) for f in dataclasses.fields(obj) if f.init}
        return [dataclasses.replace(obj, **{name: p[i] for name, p in fields.items()}) for i in range(k)]
    return [obj] * k


def split_batch(batch: Any, k: int) -> list[Any]:
    """``batch`` cut into ``k`` micro-batches along the first dimension (fewer if it has fewer rows).

    Example:
        >>> [tuple(t.shape[0] for t in part) for part in split_batch((torch.zeros(10, 3), torch.zeros(10)), 4)]
        [(3, 3), (3, 3), (2, 2), (2, 2)]
    """
    first = first_tensor(batch)
    if k <= 1 or first is None or first.dim() == 0:
        return [batch]
    size = int(first.shape[0])
    return _split(batch, min(k, size), size)
