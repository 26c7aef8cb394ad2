"""The data order of a training loader: the generator its sampler shuffles with, as state a checkpoint carries.

A shuffling sampler without a generator of its own draws from the global RNG each epoch, which no checkpoint can
replay. :class:`ShuffleOrder` owns a generator for it (seeded from the global, seeded RNG when a run starts) and
lends it to the loader for one epoch at a time: the order of an epoch is a function of the generator's state,
which the loop records at each epoch start (``LoopState.sampler_state``) and a resumed run sets back, for an exact
resume mid-epoch and at epoch boundaries. At the end of each epoch (and of the fit, however it ends) the loader gets
back what it had, so the user's ``DataLoader`` is left exactly as it was: a second ``Trainer(seed=0)`` on the same
loader (a re-run notebook cell) shuffles as the first did.

What no generator covers (a custom sampler or an ``IterableDataset`` shuffling with torch's global RNG, the
workers' base seed of a loader without a generator, a dataset's draws while the iterator is built) comes from the
global RNG as the epoch's iterator is built: the loop records those RNG states at each epoch start
(``LoopState.epoch_rng``) and :meth:`ShuffleOrder.replay` builds a resumed epoch's iterator under them again. The loop
records the loader's sizes too (:func:`loader_size`): a position counted in batches means the same samples only on a
loader of the same sizes, which a resume checks (``_resume._continue.check_position``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from nbtrainer._data._batch import safe_len
from nbtrainer._setup._seed import capture_rng, restore_rng, seed_worker

__all__ = ["ShuffleOrder", "item_sampler", "loader_size"]


def loader_size(loader: Any) -> dict[str, int | None]:
    """What a position counted in batches means for ``loader``, known without iterating it: its ``batches`` per
    epoch (``len``), ``batch_size`` and ``samples`` per epoch (``len(loader.sampler)``); None where it cannot say."""
    size = getattr(loader, "batch_size", None)
    return {
        "batches": safe_len(loader),
        "batch_size": size if isinstance(size, int) else None,
        "samples": _sampler_len(getattr(loader, "sampler", None)),
    }


def item_sampler(loader: Any) -> Any:
    """The sampler that orders a DataLoader's items when torch's own ``BatchSampler`` batches them, else None: a batch
    sampler of the user's own decides the order itself (and ``DataLoader(batch_sampler=...)`` keeps a
    ``SequentialSampler`` as ``.sampler`` that says nothing of it)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    return batch_sampler.sampler if type(batch_sampler) is torch.utils.data.BatchSampler else None


def _sampler_len(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except (TypeError, NotImplementedError):  # no sampler, a stream's, or a custom one without a length
        return None


class ShuffleOrder:
    """The generator that shuffles one training loader, lent to it for an epoch at a time.

    Args:
        loader: the training loader. Without a sampler that has a ``generator`` (a list of batches, an iterable
            dataset, a ``DistributedSampler``) there is nothing to lend: :meth:`lend` returns None. A sampler with
            a generator of its own keeps it (its state is the order, read and set the same way).
        deterministic: also seed the loader's workers (``worker_init_fn``) while the generator is lent.

    Example:
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, shuffle=True)
        >>> order = ShuffleOrder(loader)
        >>> gen = order.lend()
        >>> loader.sampler.generator is gen, order.give_back(), loader.sampler.generator
        (True, None, None)
    """

    def __init__(self, loader: Any, *, deterministic: bool = False) -> None:
        self.loader = loader
        self.deterministic = deterministic
        sampler = getattr(loader, "sampler", None)
        self._sampler = sampler if sampler is not None and hasattr(sampler, "generator") else None
        self._own: torch.Generator | None = None
        self._saved: list[tuple[Any, str, Any]] = []  # (object, attribute, the user's value) to put back

    @property
    def generator(self) -> torch.Generator | None:
        """The generator the loader shuffles with this epoch (the user's, or the one lent); None: no shuffling."""
        if self._sampler is None:
            return None
        return self._sampler.generator if self._sampler.generator is not None else self._own

    def lend(self, *, state: torch.Tensor | None = None) -> torch.Generator | None:
        """Give the loader the generator for this epoch. ``state``: the epoch's saved start state (a resumed or
        continued run), set on it; without one, the generator is seeded from the global RNG at its first lending
        (only then is a number drawn from it, so a continued run draws what the uninterrupted one drew)."""
        sampler = self._sampler
        if sampler is None:
            return None
        gen = sampler.generator if sampler.generator is not self._own else None  # the user's own, if any
        if gen is None:
            if self._own is None:
                self._own = torch.Generator()
                if state is None:
                    self._own.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))  # from the (seeded) global RNG
            gen = self._own
        if state is not None:
            # a checkpoint loaded with map_location=<the GPU> brings the state there; generators take CPU bytes
            gen.set_state(state.cpu())
        if not self._saved:
            loader = self.loader
            if sampler.generator is None:
                self._lend(sampler, "generator", gen)
            if getattr(loader, "generator", "absent") is None:
                self._lend(loader, "generator", gen)  # worker base seeds follow the same state
            if self.deterministic and int(getattr(loader, "num_workers", 0)) > 0 and loader.worker_init_fn is None:
                self._lend(loader, "worker_init_fn", seed_worker)
        return gen

    @contextlib.contextmanager
    def replay(self, epoch_rng: dict[str, Any] | None) -> Iterator[None]:
        """Resuming mid-epoch: build the epoch's iterator (and skip the batches already trained on) under the RNG
        states ``epoch_rng`` it was first built under (``capture_rng()`` at that epoch's start), then put back the
        RNG it found. None (a checkpoint written before these states were kept): under the RNG as it is, as it
        always was (exact only where the order comes from a generator)."""
        if epoch_rng is None:
            yield
            return
        found = capture_rng()
        restore_rng(epoch_rng)
        try:
            yield
        finally:
            restore_rng(found)

    def _lend(self, obj: Any, name: str, value: Any) -> None:
        self._saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def give_back(self) -> None:
        """The loader's own values back (the end of an epoch, of the fit)."""
        while self._saved:
            obj, name, value = self._saved.pop()
            setattr(obj, name, value)
