"""Where a fit's batches come from, and on CUDA how they reach the GPU without waiting for it.

:class:`DataPath` stands between the loop and a loader. Its mode, decided once per fit (:func:`choose_mode`):

* ``"loader"``: the loader's own iterator (``fast_fetch=False``, or nothing :mod:`nbtrainer._data._fetch` can
  prove equivalent). Exactly what the loop did before.
* ``"batched"``: one indexing call per batch (``_fetch``); the batch is on the CPU, the loop moves it.
* ``"device"`` (CUDA): the dataset's tensors are copied to the GPU once and each batch is an
  ``index_select`` there. Taken when they fit in ``data_on_device`` x the free device memory
  (``torch.cuda.mem_get_info``) and the sampler is a stock one (its indices are in range: a bad index
  on a GPU is a device-side assert, not a clean error).
* ``"pinned"`` (CUDA, the data does not fit): rows are gathered straight into page-locked memory and
  copied with ``non_blocking=True``. With a stock sampler the next batch is gathered and copied on a side
  stream while the current step runs (:func:`prefetch`); a custom sampler may draw from the RNG per
  batch, so its batches are not read ahead (the copy is still asynchronous, on the compute stream).

No mode adds a host-device sync per step: the compute stream waits for the side stream on the GPU
(``wait_stream``), each prefetched tensor is ``record_stream``-ed on the compute stream so the caching
allocator does not hand its memory to the next copy while the step still reads it, and page-locked
blocks are reused by PyTorch's host allocator only once their copy has completed (it records an event).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from nbtrainer._data._batch import iter_tensors, move_to_device
from nbtrainer._data._fetch import BatchedFetch, TensorSource, batched_fetch, index_tensor, skip_batches
from nbtrainer._data._item_index import IndexTrack

__all__ = ["DataPath", "check_data_options", "choose_mode", "fits_on_device", "lookahead", "prefetch"]

Tensor = torch.Tensor


def check_data_options(fast_fetch: Any, data_on_device: Any) -> None:
    """``Trainer(fast_fetch=..., data_on_device=...)``, checked when the Trainer is built."""
    if not isinstance(fast_fetch, bool):
        raise TypeError(f"fast_fetch must be True or False, got {fast_fetch!r}.")
    if not isinstance(data_on_device, (int, float)) or isinstance(data_on_device, bool) or not 0 <= data_on_device <= 1:
        raise ValueError(
            f"data_on_device must be a fraction of the free device memory in [0, 1] (0: never copy the dataset "
            f"to the device), got {data_on_device!r}."
        )


def fits_on_device(nbytes: int, free_bytes: int, fraction: float) -> bool:
    """True when ``nbytes`` of data may live on the device: at most ``fraction`` of its free memory."""
    return fraction > 0 and nbytes <= fraction * free_bytes


def choose_mode(
    fetch: BatchedFetch | None, device: torch.device, fraction: float, free_bytes: Callable[[], int]
) -> str:
    """``"loader"``, ``"batched"``, ``"device"`` or ``"pinned"`` (see the module docstring).

    ``free_bytes`` is called only when the answer depends on it (CUDA, tensor data on the CPU).
    """
    if fetch is None:
        return "loader"
    source = fetch.source
    if source is not None and source.device.type != "cpu":
        # data already on a GPU: sliced there only with in-range indices, else the loader's own
        # per-sample reads (a bad index is then a clean IndexError, not a device-side assert)
        return "device" if source.device == device and fetch.in_range else "loader"
    if device.type != "cuda" or source is None:
        return "batched"
    if fetch.in_range and fraction > 0 and fits_on_device(source.nbytes, free_bytes(), fraction):
        return "device"
    return "pinned"


def _free_bytes(device: torch.device) -> Callable[[], int]:
    return lambda: int(torch.cuda.mem_get_info(device)[0])


def _record(batch: Any, stream: torch.cuda.Stream) -> None:
    # every tensor move_to_device copied (any container it rebuilds: Mappings, dataclasses too)
    for tensor in iter_tensors(batch):
        tensor.record_stream(stream)


def prefetch(batches: Iterator[Any], device: torch.device, stream: torch.cuda.Stream) -> Iterator[Any]:
    """Yield ``batches`` (in page-locked CPU memory) on ``device``, each copied on ``stream`` while the
    step before it runs. The compute stream is the device's current stream when each batch is handed out."""

    def load(batch: Any) -> Any:
        with torch.cuda.stream(stream):
            return move_to_device(batch, device, non_blocking=True)

    try:
        ready = load(next(batches))
    except StopIteration:
        return
    while True:
        main = torch.cuda.current_stream(device)
        main.wait_stream(stream)  # on the GPU: this batch's copy (queued before) completes before the step
        _record(ready, main)
        current = ready
        try:
            # queued after the wait above, so the step does not wait for it: it overlaps the step
            ready = load(next(batches))
        except StopIteration:
            yield current
            return
        yield current


class DataPath:
    """One loader's batches for one fit (or one evaluation): see the module docstring.

    Iterating it gives an epoch's batches (what ``_evaluate`` needs); the loop calls :meth:`batches` with
    the number of batches to skip when it resumes mid-epoch.

    Args:
        loader: the (prepared) loader.
        device: where the model runs.
        enabled: ``Trainer(fast_fetch=...)``; False: always the loader's own iterator.
        fraction: ``Trainer(data_on_device=...)``; 0 never copies the dataset to the device.
        free_bytes: the device's free memory, for tests (default: ``torch.cuda.mem_get_info``).
        track: follow each batch's dataset indices (``track.current``, ``_item_index``) for a consumer of items.
    """

    def __init__(
        self,
        loader: Any,
        *,
        device: torch.device,
        enabled: bool,
        fraction: float,
        free_bytes: Callable[[], int] | None = None,
        track: bool = False,
    ) -> None:
        self.loader = loader
        self.track = IndexTrack(loader) if track else None
        self.device = device
        self.fetch = batched_fetch(loader) if enabled else None
        self.fraction = fraction
        self._free_bytes = free_bytes
        self._mode: str | None = None
        self._resident: TensorSource | None = None
        self._stream: Any = None

    @property
    def indices(self) -> Any:
        """The dataset indices of the last batch handed out (``track``), or None."""
        return self.track.current if self.track is not None else None

    @property
    def mode(self) -> str:
        if self._mode is None:
            free = self._free_bytes or _free_bytes(self.device)
            self._mode = choose_mode(self.fetch, self.device, self.fraction, free)
        return self._mode

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self.batches()

    def batches(self, skip: int = 0) -> Iterator[Any]:
        track = self.track if self.track is not None and self.track.kind is not None else None
        if track is None:
            return self._batches(skip)
        if track.kind == "numbered":
            return track.numbered(iter(self.loader), skip)
        if self.mode == "loader" or self.fetch is None:
            return track.loader_iter(skip)
        batches = self._batches(skip, track)
        return batches if self.mode == "batched" else track.handed_out(batches)

    def _batches(self, skip: int, track: IndexTrack | None = None) -> Iterator[Any]:
        mode, fetch = self.mode, self.fetch
        if mode == "loader" or fetch is None:
            it = iter(self.loader)
            skip_batches(it, skip)  # reproduce the data order of a resumed epoch
            return it
        if mode == "batched":  # read in order, none ahead: the indices read are the batch's
            read = fetch.read if track is None else track.reading(fetch.read, as_tensor=fetch.source is not None)
            return map(read, fetch.indices(skip))
        indices = fetch.indices(skip) if track is None else track.tee(fetch.indices(skip))
        source = fetch.source
        assert source is not None
        if mode == "device":
            if self._resident is None:
                self._resident = source if source.device == self.device else source.to(self.device)
            resident, device = self._resident, self.device
            # the indices travel from page-locked memory: an asynchronous copy, no wait for the GPU
            return (resident.gather(index_tensor(i).pin_memory().to(device, non_blocking=True)) for i in indices)
        pinned = (source.gather(index_tensor(i), pin=True) for i in indices)
        if not fetch.in_range:
            device = self.device
            return (move_to_device(b, device, non_blocking=True) for b in pinned)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return prefetch(pinned, self.device, self._stream)


def lookahead(it: Iterator, track: IndexTrack | None = None) -> Iterator[tuple[Any, bool]]:
    """Yield (item, is_last) with one item of lookahead (for loaders without len). ``track``: the batches' dataset
    indices, put back to the yielded batch's: drawing the next batch ahead set them to that one's, and a DataMap
    would have credited each batch's rows to the next batch's items."""
    try:
        current = next(it)
    except StopIteration:
        return
    held = track.current if track is not None else None
    for nxt in it:
        if track is not None:
            held, track.current = track.current, held
        yield current, False
        current = nxt
    if track is not None:
        track.current = held
    yield current, True
