"""Cleaning a dataset for the next fit: items dropped or relabeled by index, as a view that copies no data.

:class:`DataEdits` holds the decisions (keep, drop, relabel per dataset index) made in the panel's cleaner or in
code; ``DataMap.cleaned`` and ``Interpretation.cleaned`` turn them, plus those given, into a
:class:`CleanedDataset`: the base dataset seen through a list of kept positions, with the relabeled items' targets
replaced as they are read. Inputs are never copied; over tensors (``TensorDataset``, ``fit((x, y))``'s arrays, a
``Subset`` of either) the Trainer's batched fetch still slices the base tensors with one ``index_select`` per batch
(``_fetch``), a relabeled view holding one copy of the targets (not of the inputs). A view of a view is flattened into
one view of the base, so its :attr:`CleanedDataset.changes` are the whole story relative to the data as given (the
run store records them with the run that trains on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["CleanedDataset", "DataEdits", "cleaned", "data_changes", "target_position"]

_TARGET_KEYS = ("labels", "label", "targets", "target", "y")


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or (not isinstance(value, (int, torch.Tensor)) and not hasattr(value, "__index__")):
        raise TypeError(f"{what} must be an int dataset index, got {value!r}.")
    try:
        return int(value.__index__() if not isinstance(value, torch.Tensor) else value.item())
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{what} must be an int dataset index, got {value!r}.") from None


def _label(value: Any, index: int) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            return int(value.item())
        raise TypeError(f"relabel={{{index}: {value!r}}}: a new label must be an int class number.")
    return int(value.__index__())


class DataEdits:
    """Per-item decisions for the next fit: ``drop`` or ``relabel`` by dataset index (``keep`` undoes either).

    The panel's cleaner writes here; :meth:`cleaned` makes the dataset view. Thread-safe enough for one writer
    (the kernel's thread) and readers elsewhere: each change replaces one dict entry.

    Example:
        >>> edits = DataEdits()
        >>> edits.drop(3); edits.relabel(5, 1); edits.keep(3)
        >>> edits.dropped, edits.relabeled
        ([], {5: 1})
    """

    def __init__(self) -> None:
        self._decisions: dict[int, int | None] = {}  # index -> new label, or None for dropped

    def drop(self, *indices: Any) -> None:
        """Leave these items out of the cleaned dataset (``drop(3, 7)`` or ``drop(*[3, 7])``)."""
        for i in indices:
            self._decisions[_index(i, "drop")] = None

    def relabel(self, index: Any, label: Any) -> None:
        """Give item ``index`` the class ``label`` in the cleaned dataset."""
        i = _index(index, "relabel")
        self._decisions[i] = _label(label, i)

    def keep(self, *indices: Any) -> None:
        """Undo a drop or relabel: the item as it is."""
        for i in indices:
            self._decisions.pop(_index(i, "keep"), None)

    def clear(self) -> None:
        self._decisions.clear()

    def decision(self, index: int) -> str | int:
        """``"keep"``, ``"drop"`` or the new label of item ``index``."""
        if index not in self._decisions:
            return "keep"
        label = self._decisions[index]
        return "drop" if label is None else label

    @property
    def dropped(self) -> list[int]:
        return sorted(i for i, v in self._decisions.items() if v is None)

    @property
    def relabeled(self) -> dict[int, int]:
        return {i: v for i, v in sorted(self._decisions.items()) if v is not None}

    def __len__(self) -> int:
        return len(self._decisions)

    def __repr__(self) -> str:
        return f"DataEdits(dropped={len(self.dropped)}, relabeled={len(self.relabeled)})"

    def cleaned(
        self, dataset: Any, *, drop: Iterable[Any] | None = None, relabel: Mapping[Any, Any] | None = None
    ) -> CleanedDataset:
        """``dataset`` without the dropped items and with the relabeled ones' new labels: these decisions plus
        ``drop`` (indices) and ``relabel`` (``{index: label}``) given here (which win where both speak)."""
        decisions = dict(self._decisions)
        for i in drop or ():
            decisions[_index(i, "drop")] = None
        for i, label in (relabel or {}).items():
            j = _index(i, "relabel")
            decisions[j] = _label(label, j)
        return cleaned(
            dataset,
            drop=[i for i, v in decisions.items() if v is None],
            relabel={i: v for i, v in decisions.items() if v is not None},
        )


def target_position(sample: Any) -> int | str | None:
    """Where an item's target is: the last element of a tuple / list, a target key of a dict, else None."""
    if isinstance(sample, (tuple, list)) and len(sample) >= 2:
        return len(sample) - 1
    if isinstance(sample, Mapping):
        return next((k for k in _TARGET_KEYS if k in sample), None)
    return None


def _with_target(sample: Any, label: int) -> Any:
    where = target_position(sample)
    if where is None:
        raise TypeError(
            f"Cannot relabel an item of type {type(sample).__name__}: relabeling needs items (inputs..., target) or "
            f"dicts with one of the keys {list(_TARGET_KEYS)}."
        )
    old = sample[where]
    new: Any = torch.tensor(label, dtype=old.dtype) if isinstance(old, torch.Tensor) else type(old)(label)
    if isinstance(sample, Mapping):
        return {**sample, where: new}
    items = list(sample)
    items[where] = new  # type: ignore[index]
    return type(sample)(items) if isinstance(sample, tuple) and not hasattr(sample, "_fields") else items


class CleanedDataset(torch.utils.data.Dataset):
    """A dataset seen without some items and with others relabeled (see the module docstring).

    Attributes:
        dataset: the base dataset (never a view: views of views are flattened).
        indices: the base positions of the items kept, in order (``self[i]`` is ``dataset[indices[i]]``).
        relabel: ``{base index: new label}``.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> base = TensorDataset(torch.arange(5.0), torch.tensor([0, 1, 0, 1, 0]))
        >>> view = cleaned(base, drop=[1], relabel={4: 1})
        >>> len(view), view[3]
        (4, (tensor(4.), tensor(1)))
    """

    def __init__(self, dataset: Any, indices: torch.Tensor, relabel: dict[int, int]) -> None:
        self.dataset = dataset
        self.indices = indices
        self.relabel = relabel
        self.base_len = len(dataset)

    @classmethod
    def of(cls, dataset: Any, *, drop: Iterable[Any] = (), relabel: Mapping[Any, Any] | None = None) -> CleanedDataset:
        """``dataset`` without ``drop`` (indices) and with ``relabel`` (``{index: label}``) applied: a view."""
        return cleaned(dataset, drop=drop, relabel=relabel)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        j = int(self.indices[i])
        sample = self.dataset[j]
        label = self.relabel.get(j)
        return sample if label is None else _with_target(sample, label)

    @property
    def changes(self) -> dict[str, Any]:
        """What this view changed of its base: ``{"items": n of the base, "dropped": [...], "relabeled": {...}}``."""
        kept = torch.zeros(self.base_len, dtype=torch.bool)
        kept[self.indices] = True
        dropped = (~kept).nonzero().flatten().tolist()
        return {"items": self.base_len, "dropped": dropped, "relabeled": dict(sorted(self.relabel.items()))}

    def _repr_html_(self) -> str:
        import html

        c = self.changes
        dropped, relabeled = c["dropped"], list(c["relabeled"].items())
        more = " ..." if len(dropped) > 20 or len(relabeled) > 20 else ""
        return (
            f"<div class='nbt-cleaned' style='font-size:12px'><b>CleanedDataset</b> · {len(self):,} of {c['items']:,} "
            f"items of a {html.escape(type(self.dataset).__name__)} · dropped {html.escape(str(dropped[:20]))} · "
            f"relabeled {html.escape(str(dict(relabeled[:20])))}{more}</div>"
        )

    def __repr__(self) -> str:
        c = self.changes
        return (
            f"CleanedDataset({type(self.dataset).__name__} of {c['items']:,} items: {len(c['dropped']):,} dropped, "
            f"{len(c['relabeled']):,} relabeled)"
        )


def cleaned(dataset: Any, *, drop: Iterable[Any] = (), relabel: Mapping[Any, Any] | None = None) -> CleanedDataset:
    """The view of ``dataset`` without ``drop`` and with ``relabel`` applied (indices are ``dataset``'s own)."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not callable(getattr(dataset, "__getitem__", None)):
        raise TypeError(
            f"cleaned() needs a dataset that can be indexed (dataset[i]), got {type(dataset).__name__}. Pass the "
            "training DataLoader's .dataset (a map-style dataset)."
        )
    try:
        n = len(dataset)
    except TypeError:
        raise TypeError(f"cleaned() needs a dataset with len(), got {type(dataset).__name__}.") from None
    drops = {_index(i, "drop") for i in drop}
    labels = {_index(i, "relabel"): _label(v, int(i)) for i, v in (relabel or {}).items()}
    bad = sorted(i for i in drops | set(labels) if not 0 <= i < n)
    if bad:
        raise IndexError(f"cleaned(): indices {bad[:10]} are outside the dataset's {n:,} items (0..{n - 1}).")
    both = sorted(drops & set(labels))
    if both:
        raise ValueError(f"cleaned(): items {both[:10]} are both dropped and relabeled: choose one for each.")
    keep = torch.ones(n, dtype=torch.bool)
    if drops:
        keep[torch.tensor(sorted(drops))] = False
    positions = keep.nonzero().flatten()
    if isinstance(dataset, CleanedDataset):  # a view of a view: one view of the base
        base = dataset.indices
        merged = dict(dataset.relabel)
        merged.update({int(base[i]): v for i, v in labels.items()})
        return CleanedDataset(dataset.dataset, base[positions], merged)
    return CleanedDataset(dataset, positions, labels)


def data_changes(loader: Any) -> dict[str, Any] | None:
    """The cleaning a training loader's dataset carries (``CleanedDataset.changes``), for the run store; else None."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, CleanedDataset):
        return dataset.changes
    return None
