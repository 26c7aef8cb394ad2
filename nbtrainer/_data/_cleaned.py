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
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import _DEFAULT_TARGET_KEYS

if TYPE_CHECKING:
    from nbtrainer._data._batch import BatchSpec

__all__ = ["CleanedDataset", "DataEdits", "cleaned", "data_changes", "label_field", "target_position"]


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool) or (not isinstance(value, (int, torch.Tensor)) and not hasattr(value, "__index__")):
        raise TypeError(f"{what} must be an int dataset index, got {value!r}.")
    try:
        return int(value.__index__() if not isinstance(value, torch.Tensor) else value.item())
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{what} must be an int dataset index, got {value!r}.") from None


def _indices(values: Any, what: str) -> list[int]:
    """Dataset indices from a list, a range, a tensor or a NumPy array of them, or a boolean mask (``dm.confidence <
    0.2``): ``for i in tensor`` would give 0-d tensors, and ``tensor or ()`` raises (or, with one element, is False)."""
    if values is None:
        return []
    if isinstance(values, (int, str)) or (hasattr(values, "__index__") and not hasattr(values, "__len__")):
        raise TypeError(f"{what} must be a list of dataset indices (or a boolean mask), got {values!r}.")
    if hasattr(values, "tolist") and hasattr(values, "dtype"):  # a tensor or an array: flat, a mask as its positions
        flat = torch.as_tensor(values).reshape(-1)
        if flat.dtype == torch.bool:
            flat = flat.nonzero().reshape(-1)
        elif flat.is_floating_point():
            raise TypeError(f"{what} must hold int dataset indices (or be a boolean mask), got {flat.dtype} values.")
        return [int(i) for i in flat.tolist()]
    return [_index(i, what) for i in values]


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
        self,
        dataset: Any,
        *,
        drop: Iterable[Any] | None = None,
        relabel: Mapping[Any, Any] | None = None,
        target: int | str | None = None,
        spec: BatchSpec | None = None,
        custom: bool = False,
        classes: int | None = None,
    ) -> CleanedDataset:
        """``dataset`` without the dropped items and with the relabeled ones' new labels: these decisions plus
        ``drop`` (indices, or a boolean mask) and ``relabel`` (``{index: label}``) given here (which win over the
        decisions where both speak; an item both dropped and relabeled here is refused). ``target``, ``spec`` and
        ``custom``: where each item's label is (:func:`cleaned`). ``classes``: the model's number of outputs, when
        known: a new label outside ``0..classes - 1`` is refused here (the next fit would fail at the batch holding
        it, after the steps before it)."""
        given_drop = _indices(drop, "drop")
        given_labels = {_index(i, "relabel"): _label(v, _index(i, "relabel")) for i, v in (relabel or {}).items()}
        both = sorted(set(given_drop) & set(given_labels))
        if both:
            raise ValueError(f"cleaned(): items {both[:10]} are both dropped and relabeled: choose one for each.")
        decisions = dict(self._decisions)
        decisions.update(dict.fromkeys(given_drop))
        decisions.update(given_labels)
        if classes is not None:
            _check_classes({i: v for i, v in decisions.items() if v is not None}, classes)
        return cleaned(
            dataset,
            drop=[i for i, v in decisions.items() if v is None],
            relabel={i: v for i, v in decisions.items() if v is not None},
            target=target,
            spec=spec,
            custom=custom,
        )


def _check_classes(labels: dict[int, int], classes: int) -> None:
    bad = sorted((i, v) for i, v in labels.items() if not 0 <= v < classes)
    if bad:
        said = ", ".join(f"item {i} the class {v}" for i, v in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise ValueError(
            f"cleaned(): relabel gives {said}, outside the model's {classes} outputs (0..{classes - 1}): a fit on "
            f"the view would fail at the batch holding {'it' if len(bad) == 1 else 'them'}, after the steps before. "
            f"Relabel to a class in 0..{classes - 1} (label_issues().suggestions are), or drop the item; in the "
            "panel's cleaner, edits.keep(index) undoes a relabel."
        )


def target_position(sample: Any) -> int | str | None:
    """Where an item's target is by default: the last element of a tuple / list, a target key of a dict, else None."""
    return label_field(sample)


def label_field(sample: Any, spec: BatchSpec | None = None, *, custom: bool = False) -> int | str | None:
    """Where an item's label is, read as the Trainer that trained on it splits a batch (``spec``: its ``num_inputs``
    and ``target_keys``), or None where that cannot be told: several targets, or ``custom`` (a ``compute_loss=``
    reads the batch its own way) with items other than ``(inputs, target)`` pairs or dicts with a target key.

    Example:
        >>> from nbtrainer._data._batch import BatchSpec
        >>> label_field((1, 2, 3)), label_field((1, 2, 3), BatchSpec(num_inputs=1)), label_field((1, 2, 3), custom=True)
        (2, None, None)
        >>> label_field({"x": 1, "y": 0.5, "class_id": 2}, BatchSpec(target_keys="class_id"))
        'class_id'
    """
    if isinstance(sample, (tuple, list)):
        n = len(sample)
        if n < 2:
            return None
        if custom:
            return 1 if n == 2 else None
        k = spec.num_inputs if spec is not None and spec.num_inputs is not None else n - 1
        return k if n - k == 1 else None  # the targets are what follows the inputs: one field, or a tuple of them
    if isinstance(sample, Mapping):
        if spec is not None and spec.target_keys is not None:
            try:  # the keys the fit reads as its targets: one names the label, several cannot be told apart
                named = spec.target_keys_of(sample)
            except KeyError:
                return None
            return named[0] if len(named) == 1 else None
        # by key alone (an ArrayDataset's key names, without values): the first default target key present
        return next((k for k in _DEFAULT_TARGET_KEYS if k in sample), None)
    return None


def _describe(sample: Any) -> str:
    if isinstance(sample, Mapping):
        return f"dicts with the keys {list(sample)}"
    if isinstance(sample, (tuple, list)):
        return f"{type(sample).__name__}s of {len(sample)}"
    return type(sample).__name__


def _with_target(sample: Any, label: int, where: int | str | None) -> Any:
    if where is None:  # a view made before relabels knew where (CleanedDataset built by hand)
        where = label_field(sample)
    if where is None:
        raise TypeError(
            f"Cannot relabel an item of type {type(sample).__name__}: relabeling needs items (inputs..., target) or "
            f"dicts with one of the keys {list(_DEFAULT_TARGET_KEYS)}, or cleaned(..., target=) naming the label's "
            "place."
        )
    old = sample[where]
    new: Any
    if isinstance(old, torch.Tensor) and old.ndim == 1 and old.is_floating_point() and old.numel() > 1:
        # class probabilities (a one-hot row): the new label's row, not a scalar a collate cannot stack with the rest
        if not 0 <= label < old.numel():
            raise ValueError(f"relabel: class {label} is outside the item's {old.numel()} class probabilities.")
        new = torch.zeros_like(old)
        new[label] = 1
    elif isinstance(old, torch.Tensor):
        new = torch.tensor(label, dtype=old.dtype).reshape(old.shape)
    else:
        new = type(old)(label)
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
        target: where each item's label is (a tuple position or a dict key) for the relabeled items, or None.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> base = TensorDataset(torch.arange(5.0), torch.tensor([0, 1, 0, 1, 0]))
        >>> view = cleaned(base, drop=[1], relabel={4: 1})
        >>> len(view), view[3]
        (4, (tensor(4.), tensor(1)))
    """

    def __init__(
        self, dataset: Any, indices: torch.Tensor, relabel: dict[int, int], target: int | str | None = None
    ) -> None:
        self.dataset = dataset
        self.indices = indices
        self.relabel = relabel
        self.target = target
        self.base_len = len(dataset)

    @classmethod
    def of(
        cls,
        dataset: Any,
        *,
        drop: Iterable[Any] = (),
        relabel: Mapping[Any, Any] | None = None,
        target: int | str | None = None,
    ) -> CleanedDataset:
        """``dataset`` without ``drop`` (indices, or a boolean mask) and with ``relabel`` (``{index: label}``)
        applied: a view. ``target``: the label's position in each item (or its key), where it is not the last."""
        return cleaned(dataset, drop=drop, relabel=relabel, target=target)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        j = int(self.indices[i])
        sample = self.dataset[j]
        label = self.relabel.get(j)
        return sample if label is None else _with_target(sample, label, self.target)

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


def cleaned(
    dataset: Any,
    *,
    drop: Iterable[Any] | None = (),
    relabel: Mapping[Any, Any] | None = None,
    target: int | str | None = None,
    spec: BatchSpec | None = None,
    custom: bool = False,
) -> CleanedDataset:
    """The view of ``dataset`` without ``drop`` and with ``relabel`` applied (indices are ``dataset``'s own).

    Where each item's label is: ``target`` (a position in the item, or a key), else as the Trainer that trained on
    the data reads it (``spec``, ``custom``: :func:`label_field`), read from one relabeled item now, so that a layout
    it cannot tell is refused here, not in the next fit."""
    if isinstance(dataset, torch.utils.data.IterableDataset) or not callable(getattr(dataset, "__getitem__", None)):
        raise TypeError(
            f"cleaned() needs a dataset that can be indexed (dataset[i]), got {type(dataset).__name__}. Pass the "
            "training DataLoader's .dataset (a map-style dataset)."
        )
    try:
        n = len(dataset)
    except TypeError:
        raise TypeError(f"cleaned() needs a dataset with len(), got {type(dataset).__name__}.") from None
    drops = set(_indices(drop, "drop"))
    labels = {_index(i, "relabel"): _label(v, _index(i, "relabel")) for i, v in (relabel or {}).items()}
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
    where = _where(dataset, labels, target, spec, custom) if labels else None
    if isinstance(dataset, CleanedDataset):  # a view of a view: one view of the base
        base = dataset.indices
        merged = dict(dataset.relabel)
        merged.update({int(base[i]): v for i, v in labels.items()})
        return CleanedDataset(dataset.dataset, base[positions], merged, where if labels else dataset.target)
    return CleanedDataset(dataset, positions, labels, where)


def _where(
    dataset: Any, labels: dict[int, int], target: int | str | None, spec: BatchSpec | None, custom: bool
) -> int | str:
    """The label's place in the items, checked on the first relabeled one."""
    first = min(labels)
    sample = dataset.dataset[int(dataset.indices[first])] if isinstance(dataset, CleanedDataset) else dataset[first]
    if target is None and isinstance(dataset, CleanedDataset) and dataset.target is not None:
        target = dataset.target
    where = target if target is not None else label_field(sample, spec, custom=custom)
    if where is None:
        why = "the Trainer's compute_loss= decides what the label is" if custom else "the items hold several targets"
        raise TypeError(
            f"cleaned(relabel=...): cannot tell which field of the items ({_describe(sample)}) is the label to change: "
            f"{why}. Pass target= (the label's position in each item, e.g. target=1, or its key)."
        )
    ok = (isinstance(where, str) and isinstance(sample, Mapping) and where in sample) or (
        isinstance(where, int)
        and not isinstance(where, bool)
        and isinstance(sample, (tuple, list))
        and 0 <= where < len(sample)
    )
    if not ok:
        raise ValueError(
            f"cleaned(target={where!r}): the items are {_describe(sample)}; name a position or key in them."
        )
    return where


def data_changes(loader: Any) -> dict[str, Any] | None:
    """The cleaning a training loader's dataset carries (``CleanedDataset.changes``), for the run store; else None."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, CleanedDataset):
        return dataset.changes
    return None
