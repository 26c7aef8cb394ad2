"""The data side of a comparison: every strategy sees the same batches in the same order, and a strategy
with gradient accumulation gets each batch cut into micro-batches (same samples per optimizer step)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from nbtrainer._data._batch import _first_tensor, is_record, rebuild_sequence

__all__ = ["DataOrder", "SplitLoader", "split_batch"]


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
    first = _first_tensor(batch)
    if k <= 1 or first is None or first.dim() == 0:
        return [batch]
    size = int(first.shape[0])
    return _split(batch, min(k, size), size)


class SplitLoader:
    """Each batch of ``loader`` as ``k`` micro-batches (same samples per optimizer step as the baseline)."""

    def __init__(self, loader: Any, k: int) -> None:
        self.loader, self.k = loader, k

    @property
    def sampler(self) -> Any:  # the Trainer seeds / saves the inner loader's shuffling through this
        return getattr(self.loader, "sampler", None)

    @property
    def generator(self) -> Any:  # a DataLoader draws its workers' base seed from this one
        return getattr(self.loader, "generator", None)

    @generator.setter
    def generator(self, value: Any) -> None:
        self.loader.generator = value

    def __len__(self) -> int:
        return len(self.loader) * self.k  # TypeError when the loader has no len(), like the loader itself

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield from split_batch(batch, self.k)


class DataOrder:
    """Puts every loader's shuffling generators back as they were, before each strategy."""

    def __init__(self, loaders: Iterable[Any]) -> None:
        self.saved: list[tuple[Any, str, Any, Any]] = []
        for loader in loaders:
            if loader is None:
                continue
            for owner in (getattr(loader, "sampler", None), loader):
                if owner is None or not hasattr(owner, "generator"):
                    continue
                gen = owner.generator
                state = gen.get_state() if isinstance(gen, torch.Generator) else None
                self.saved.append((owner, "generator", gen, state))

    def reset(self) -> None:
        for owner, attr, gen, state in self.saved:
            try:
                setattr(owner, attr, gen)  # drop a generator a Trainer installed
            except (AttributeError, ValueError):  # pragma: no cover - read-only attribute
                pass
            if state is not None:
                gen.set_state(state)
