"""Batched fetch: one indexing call per batch for a DataLoader over in-memory data.

A ``DataLoader`` builds each batch as ``default_collate([dataset[i] for i in indices])``: one Python call
and one tensor per sample, then a stack. For a small model that is most of the step. When the result is
provably the same, we build it with one ``index_select`` per tensor instead (or one ``__getitems__``).

Equivalence, kept exactly:

* **the same indices in the same order**: the loader's own ``batch_sampler`` is iterated, as
  ``DataLoader.__iter__`` does (``iter(batch_sampler)`` first, then the iterator's base-seed draw from
  ``loader.generator``, or the global RNG when it has none), so every generator draw happens in the same
  order and the Trainer's sampler seeding, ``set_epoch`` (DistributedSampler), ``drop_last`` and exact
  resume all hold;
* **the same batch**: ``index_select`` of contiguous tensors is a row copy, as ``torch.stack`` of the rows
  is, so values, dtypes, shapes and the container type (``default_collate`` turns tuples into lists) match.

Taken only for ``type(loader) is DataLoader`` with ``num_workers == 0``, a batch sampler (automatic
batching) and ``collate_fn is default_collate``, over a ``TensorDataset``, an ``ArrayDataset``
(``fit((X, y))``), a ``Subset`` of either (``random_split``), or any map-style dataset with
``__getitems__`` (then ``default_collate(dataset.__getitems__(indices))``, exactly the DataLoader's fetch
without its iterator). Anything else (workers, a custom collate, a dataset of files) takes the loader's
own iterator: :func:`batched_fetch` returns ``None`` and nothing changes.
"""

from __future__ import annotations

import array
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from nbtrainer._atomic import CheckpointError
from nbtrainer._data._arrays import ArrayDataset
from nbtrainer._data._cleaned import CleanedDataset, target_position

__all__ = ["BatchedFetch", "TensorSource", "batched_fetch", "index_tensor", "ran_out", "skip_batches"]

Tensor = torch.Tensor
_select = torch.index_select


def index_tensor(indices: Any) -> Tensor:
    """A batch sampler's indices as an int64 CPU tensor (a list of 256 ints: ~5 us, not ~30 us)."""
    if type(indices) is list:
        try:
            return torch.frombuffer(array.array("q", indices), dtype=torch.int64)
        except (TypeError, ValueError, OverflowError):  # empty, or not plain ints
            pass
    if isinstance(indices, Tensor):
        if type(indices) is Tensor and indices.dtype is torch.int64 and indices.ndim == 1:
            return indices  # made here already (a DataMap's batch: _item_index.IndexTrack.reading)
        return indices.reshape(-1).to(torch.int64)
    return torch.tensor([operator.index(i) for i in indices], dtype=torch.int64)


class TensorSource:
    """Equal-length tensors a batch is sliced from, and how the slices become a batch."""

    def __init__(
        self, tensors: list[Tensor], assemble: Callable[[list[Tensor]], Any], index: Tensor | None = None
    ) -> None:
        self.tensors = tensors
        self.assemble = assemble
        self.index = index  # Subset: positions in the base tensors of the subset's rows

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def to(self, device: torch.device) -> TensorSource:
        """The same source with its tensors on ``device`` (a one-off copy per fit)."""
        index = self.index.to(device) if self.index is not None else None
        return TensorSource([t.to(device) for t in self.tensors], self.assemble, index)

    def gather(self, idx: Tensor, *, pin: bool = False) -> Any:
        """The batch of rows ``idx`` (an int64 tensor on the source's device)."""
        try:
            rows = _select(self.index, 0, idx) if self.index is not None else idx
            if pin:  # straight into page-locked memory: the copy to the GPU can then be asynchronous
                parts = [
                    _select(t, 0, rows, out=torch.empty((rows.shape[0], *t.shape[1:]), dtype=t.dtype, pin_memory=True))
                    for t in self.tensors
                ]
            else:
                parts = [_select(t, 0, rows) for t in self.tensors]
        except (IndexError, RuntimeError):
            # index_select refuses negative indices; Python indexing (what dataset[i] does) accepts them.
            # Out-of-range indices raise IndexError here, as dataset[i] would. (Host tensors only: on a GPU
            # only stock samplers are used, whose indices are in range, see _prefetch.choose_mode.)
            rows = self.index[idx] if self.index is not None else idx
            parts = [t[rows] for t in self.tensors]
            if pin:
                parts = [p.pin_memory() for p in parts]
        return self.assemble(parts)


def tensor_source(dataset: Any) -> TensorSource | None:
    """The tensors behind ``dataset`` when ``dataset[i]`` is exactly "row i of each", else None."""
    if type(dataset) is ArrayDataset:
        return TensorSource(dataset.tensors, dataset.assemble)
    if isinstance(dataset, TensorDataset) and _plain(dataset, TensorDataset):
        tensors = list(dataset.tensors)
        if not tensors or not all(isinstance(t, Tensor) and t.is_contiguous() for t in tensors):
            return None  # the rows of a strided view stack into another memory layout: stay exact
        return TensorSource(tensors, list)
    if type(dataset) is Subset:
        inner = tensor_source(dataset.dataset)
        if inner is None:
            return None
        try:
            index = index_tensor(list(dataset.indices))
        except TypeError:
            return None
        n = len(inner.tensors[0]) if inner.index is None else len(inner.index)
        if index.numel() and not (-n <= int(index.min()) and int(index.max()) < n):
            return None  # an out-of-range index: let the loader raise its own error
        index = torch.where(index < 0, index + n, index)
        if inner.index is not None:
            index = inner.index[index]
        return TensorSource(inner.tensors, inner.assemble, index)
    if type(dataset) is CleanedDataset:
        return _cleaned_source(dataset)
    return None


def _target_slot(dataset: Any, where: int | str | None = None) -> int | None:
    """Which of a tensor source's tensors holds the targets: ``where`` (the label's place in an item, as
    ``CleanedDataset.target`` says), else the last of a tuple or a target key of a dict."""
    if type(dataset) is Subset:
        return _target_slot(dataset.dataset, where)
    tensors = getattr(dataset, "tensors", ())
    if type(dataset) is ArrayDataset:
        if dataset.single:
            return None
        if dataset.keys is not None:
            found = where if where is not None else target_position(dict.fromkeys(dataset.keys))
            return dataset.keys.index(found) if isinstance(found, str) and found in dataset.keys else None
    if where is not None:
        return where if isinstance(where, int) and 0 <= where < len(tensors) else None
    return len(tensors) - 1 if len(tensors) >= 2 else None


def _cleaned_source(dataset: CleanedDataset) -> TensorSource | None:
    """A cleaned view of tensors: the base tensors and the kept rows; relabeled targets in one copy of the targets
    (never of the inputs)."""
    inner = tensor_source(dataset.dataset)
    if inner is None:
        return None
    rows = dataset.indices if inner.index is None else inner.index[dataset.indices]
    tensors = list(inner.tensors)
    if dataset.relabel:
        slot = _target_slot(dataset.dataset, dataset.target)
        if slot is None or tensors[slot].ndim != 1:
            return None  # read item by item (CleanedDataset.__getitem__ says what it cannot relabel)
        changed = torch.tensor(list(dataset.relabel), dtype=torch.int64)
        if inner.index is not None:
            changed = inner.index[changed]
        targets = tensors[slot].clone()
        targets[changed] = torch.tensor(list(dataset.relabel.values()), dtype=targets.dtype)
        tensors[slot] = targets
    return TensorSource(tensors, inner.assemble, rows)


def _plain(dataset: Any, base: type) -> bool:
    """A subclass that changes neither how a sample nor how a batch is read."""
    cls: Any = type(dataset)
    same_item = cls.__getitem__ is getattr(base, "__getitem__", None)
    return same_item and getattr(cls, "__getitems__", None) is getattr(base, "__getitems__", None)


def _loader_ok(loader: Any) -> bool:
    if type(loader) is not DataLoader:  # a subclass may iterate differently
        return False
    if loader.num_workers != 0 or loader.timeout != 0 or loader.batch_sampler is None:
        return False
    if loader.collate_fn is not torch.utils.data.default_collate:
        return False
    dataset = loader.dataset
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return False
    from torch.utils.data import datapipes

    pipes = (datapipes.datapipe.IterDataPipe, datapipes.datapipe.MapDataPipe)
    return not isinstance(dataset, pipes)


def _in_range(loader: Any) -> bool:
    """True when the batch sampler can only yield indices in ``range(len(dataset))`` (stock samplers
    over this very dataset): then indices can be used on a GPU, where a bad one is not a clean error."""
    batch_sampler = loader.batch_sampler
    if type(batch_sampler) is not BatchSampler:
        return False
    sampler: Any = batch_sampler.sampler
    if type(sampler) in (SequentialSampler, RandomSampler):
        return sampler.data_source is loader.dataset
    if type(sampler) is DistributedSampler:
        return sampler.dataset is loader.dataset
    return False


class BatchedFetch:
    """The batches of one DataLoader, each fetched with one indexing call (see the module docstring).

    ``source`` is set when the batches are slices of tensors (then they can live on the GPU, see
    ``_prefetch``); else ``read`` is the dataset's ``__getitems__`` + ``default_collate``.
    """

    def __init__(self, loader: Any, source: TensorSource | None) -> None:
        self.loader = loader
        self.source = source
        self.in_range = _in_range(loader)

    def __len__(self) -> int:
        return len(self.loader)

    def read(self, indices: Any) -> Any:
        if self.source is not None:
            return self.source.gather(index_tensor(indices))
        dataset = self.loader.dataset
        return torch.utils.data.default_collate(dataset.__getitems__(indices))

    def indices(self, skip: int = 0) -> Iterator[Any]:
        """The batch sampler's index lists for one epoch, drawn as ``iter(loader)`` draws them."""
        loader = self.loader
        it = iter(loader.batch_sampler)
        # _BaseDataLoaderIter.__init__ draws its workers' base seed right after iter(batch_sampler): the
        # same draw (value unused) keeps the generator, or the global RNG, exactly in step.
        torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        # a resume mid-epoch: the batches already trained on (a dataset's own fetch may have state: fetched as the
        # loader would)
        skip_batches(it, skip, self.read if self.source is None else None)
        return it

    def batches(self, skip: int = 0) -> Iterator[Any]:
        return map(self.read, self.indices(skip))

    def __iter__(self) -> Iterator[Any]:
        return self.batches()


def batched_fetch(loader: Any) -> BatchedFetch | None:
    """A :class:`BatchedFetch` for ``loader`` when its batches can be fetched in one call, else None."""
    if not _loader_ok(loader):
        return None
    source = tensor_source(loader.dataset)
    if source is not None:
        return BatchedFetch(loader, source)
    getitems = getattr(loader.dataset, "__getitems__", None)
    if callable(getitems):
        return BatchedFetch(loader, None)
    return None


def ran_out(skip: int, found: int) -> CheckpointError:
    """The error of a resumed epoch whose loader ends before the saved position."""
    return CheckpointError(
        f"The run resumes {skip} batch(es) into an epoch, and this training loader has only {found}: it is not the "
        "loader the checkpoint was saved with (fewer samples, a larger batch_size, drop_last?), so the rest of that "
        "epoch cannot be found. Resume with the original DataLoader settings, or from a checkpoint saved at an "
        "epoch's end."
    )


def skip_batches(it: Iterator[Any], skip: int, each: Callable[[Any], Any] | None = None) -> None:
    """Draw from ``it`` the ``skip`` batches a resumed epoch already trained on (``each`` called on each)."""
    for found in range(skip):
        try:
            item = next(it)
        except StopIteration:
            raise ran_out(skip, found) from None
        if each is not None:
            each(item)
