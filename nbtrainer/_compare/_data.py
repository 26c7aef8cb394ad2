"""The data side of a comparison: every strategy sees the same batches in the same order, and a strategy
with gradient accumulation gets each batch cut into micro-batches (same samples per optimizer step)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from nbtrainer._data._split import split_batch

__all__ = ["DataOrder", "SplitLoader", "split_batch"]


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
    """Puts every loader's shuffling generators back as they were, before each strategy: a generator of the user's
    own has its state moved by each run."""

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
                setattr(owner, attr, gen)  # as it was (a Trainer lends its own only for an epoch)
            except (AttributeError, ValueError):  # pragma: no cover - read-only attribute
                pass
            if state is not None:
                gen.set_state(state)
