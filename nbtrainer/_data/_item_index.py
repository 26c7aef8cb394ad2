"""Which dataset items each training batch holds, for consumers that follow items across epochs (``DataMap``).

The index lists come from where the batches are drawn, never from the batch itself, and cost no host-device read:

* the batched fetch (``_fetch``): the batch sampler's list is the batch's indices, as drawn;
* a ``DataLoader``'s own iterator (workers, a custom collate): its batch sampler is seen through a recorder while
  the epoch's iterator is made (the iterator keeps the sampler it was made with); each list the iterator draws,
  ahead of its batch when workers prefetch, waits in a queue until its batch is handed out, in order (a loader with
  ``in_order=False`` hands batches out as they come, so its items cannot be told);
* a list (or tuple) of ready batches: the items are numbered in the order the list yields them, the same each
  epoch.

Anything else (an ``IterableDataset``, a generator, a loader without a batch sampler) cannot say which item is
which: :func:`index_note` says so in one sentence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbtrainer._data._batch import first_tensor
from nbtrainer._data._fetch import index_tensor, ran_out, skip_batches

__all__ = ["IndexTrack", "index_note"]


def _sampled(loader: Any) -> bool:
    dataset = getattr(loader, "dataset", None)
    return (
        isinstance(loader, torch.utils.data.DataLoader)
        and getattr(loader, "batch_sampler", None) is not None
        and not isinstance(dataset, torch.utils.data.IterableDataset)
        and callable(getattr(dataset, "__getitem__", None))
    )


def index_note(loader: Any) -> str | None:
    """None when each batch's dataset indices can be known; else why not, in one sentence."""
    if isinstance(loader, (list, tuple)):
        return None
    if not isinstance(loader, torch.utils.data.DataLoader):
        return (
            f"the training data is a {type(loader).__name__}, whose batches carry no dataset index: pass a "
            "DataLoader over a map-style dataset (or arrays) to follow items"
        )
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return "the training DataLoader reads an IterableDataset, whose items have no index to follow"
    if not _sampled(loader):
        return "the training DataLoader has no batch sampler (batch_size=None), so its items cannot be told apart"
    if getattr(loader, "in_order", True) is False:
        return "the training DataLoader has in_order=False: its batches arrive as workers finish, out of sampler order"
    return None


class _Recorder:
    """The loader's batch sampler, telling each index list it yields to a queue."""

    def __init__(self, batch_sampler: Any, sink: deque) -> None:
        self.batch_sampler = batch_sampler
        self.sampler = getattr(batch_sampler, "sampler", None)
        self.sink = sink

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        sink = self.sink
        for indices in self.batch_sampler:
            sink.append(indices)
            yield indices


class IndexTrack:
    """The dataset indices of the batch a training iterator handed out last (:attr:`current`).

    ``current`` is a list of ints (a batch sampler's), a ``range`` (a list of batches, numbered) or an int64
    tensor; None before the first batch or where the indices cannot be known (:attr:`note` says why).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.note = index_note(loader)
        #: "sampler" (a DataLoader's batch sampler), "numbered" (a list of batches) or None (``note`` says why)
        self.kind = None if self.note is not None else "numbered" if isinstance(loader, (list, tuple)) else "sampler"
        self.current: Any = None
        self._queue: deque = deque()

    @property
    def size(self) -> int | None:
        """How many items the indices range over (``len(loader.dataset)``; for a list of batches, None)."""
        try:
            return len(self.loader.dataset)
        except (AttributeError, TypeError):
            return None

    def reading(self, read: Callable[[Any], Any], *, as_tensor: bool) -> Callable[[Any], Any]:
        """``read`` (index list -> batch) telling :attr:`current`, for a fetch that reads nothing ahead. ``as_tensor``:
        the fetch slices tensors by an index tensor anyway: made once here, for both (joining the lists of a refresh
        later costs more than their tensors)."""

        def read_one(indices: Any) -> Any:
            self.current = indices
            return read(indices)

        def read_tensor(indices: Any) -> Any:
            self.current = ix = index_tensor(indices)
            return read(ix)

        return read_tensor if as_tensor else read_one

    def tee(self, lists: Iterator[Any]) -> Iterator[Any]:
        """The batched fetch's index lists, each queued as it is drawn."""
        queue = self._queue
        for indices in lists:
            queue.append(indices)
            yield indices

    def handed_out(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` as they are handed out, :attr:`current` set to each one's indices (queued in draw order)."""
        queue = self._queue
        for batch in batches:
            self.current = queue.popleft()
            yield batch

    def numbered(self, batches: Iterator[Any], skip: int = 0) -> Iterator[Any]:
        """A list of ready batches: items numbered in order, from 0 each epoch (``skip``: batches already seen)."""
        position = found = 0
        for found, batch in enumerate(batches, 1):
            first = first_tensor(batch)
            size = int(first.shape[0]) if first is not None and first.ndim else 1
            self.current = range(position, position + size)
            position += size
            if found > skip:
                yield batch
        if found < skip:
            raise ran_out(skip, found)

    def loader_iter(self, skip: int) -> Iterator[Any]:
        """The loader's own iterator for one epoch (``skip`` batches already trained on), its indices followed."""
        loader, queue = self.loader, self._queue
        queue.clear()
        real = loader.batch_sampler
        recorder = _Recorder(real, queue)
        # DataLoader refuses batch_sampler assignments after __init__ (a guard for users); the recorder is the
        # sampler only while the iterator is made (it draws from the sampler it was made with), then the loader has
        # its own back. A persistent workers' iterator re-reads the sampler it holds at each epoch: it holds the
        # recorder for the same moment.
        object.__setattr__(loader, "batch_sampler", recorder)
        _hold(loader, real, recorder)
        try:
            it = iter(loader)
        finally:
            object.__setattr__(loader, "batch_sampler", real)
            _hold(loader, recorder, real)
        skip_batches(it, skip, lambda _: queue.popleft())
        return self.handed_out(it)


def _hold(loader: Any, old: Any, new: Any) -> None:
    persistent = getattr(loader, "_iterator", None)
    if persistent is not None and getattr(persistent, "_index_sampler", None) is old:
        persistent._index_sampler = new
