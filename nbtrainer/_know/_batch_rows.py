"""Which row of a training batch is which dataset item, as far as a ``DataMap`` can check it.

The loop knows each batch's dataset indices from its sampler (``_data._item_index``); a ``collate_fn`` can still
sort a batch's items (by length, before packing) or drop some (broken ones), and then row ``i`` is not
``indices[i]``. A dropped item shows in the row count, checked every step for free; a reordered batch only in its
labels, checked once on the first batch against the dataset's own, on the device.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from nbtrainer._data._cleaned import label_field

__all__ = ["order_check", "same_data"]

log = logging.getLogger(__name__)

Tensor = torch.Tensor
_CHECKED = 64  # items of the first batch read back from the dataset


def order_check(dataset: Any, layout: tuple[Any, bool], targets: Any, indices: Any) -> Tensor | None:
    """A device flag, True when the first batch's class labels differ from the dataset's items at its indices
    (read with the map, never in the fit); None where that cannot be checked (no class labels, items that do not
    say where their label is, a dataset that cannot be read twice)."""
    if not isinstance(targets, Tensor) or targets.ndim != 1:
        return None
    spec, custom = layout
    listed = indices.tolist() if isinstance(indices, Tensor) else list(indices)
    if targets.shape[0] != len(listed):  # items dropped or added: the reduction says so, from the row counts
        return None
    picked = listed[:_CHECKED]
    expected = []
    for i in picked:
        try:
            item = dataset[i]
        except Exception:  # a dataset that cannot be read twice (a stream behind an index): no check
            log.debug("DataMap: item %s could not be read back to check the batch's order", i, exc_info=True)
            return None
        where = label_field(item, spec, custom=custom)
        value = item[where] if where is not None else None
        if isinstance(value, Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        expected.append(value)
    got = targets[: len(expected)]
    want = torch.tensor(expected, dtype=got.dtype).to(got.device, non_blocking=True)
    return (got != want).any()


def same_data(new: Any, old: Any) -> bool:
    """The same training data as the last fit's: the same dataset, or fit()'s arrays wrapped again (the same
    tensors)."""
    if new is old or old is None:
        return True
    a, b = getattr(new, "tensors", None), getattr(old, "tensors", None)
    if type(new) is not type(old) or a is None or b is None or len(a) != len(b):
        return False
    return all(x.data_ptr() == y.data_ptr() and x.shape == y.shape for x, y in zip(a, b, strict=True))
