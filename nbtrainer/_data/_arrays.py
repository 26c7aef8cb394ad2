"""Arrays like Keras: ``fit((X, y), batch_size=32)`` with tensors or NumPy arrays, as a real DataLoader.

``fit``, ``evaluate``, ``predict`` and ``total_steps`` accept, instead of a loader:

* a tuple of arrays ``(x, y)`` / ``(x1, x2, y)``: batches are lists ``[xb, yb]``, as a
  ``DataLoader(TensorDataset(x, y))`` yields them (the last element is the target, see ``_batch``);
* a dict of arrays ``{"input_ids": ..., "labels": ...}``: dict batches (``model(**inputs)``, targets from
  ``labels`` / ``target_keys``);
* one array ``x``: inputs-only batches (``predict(x)``, or ``compute_loss=``);
* a map-style ``Dataset`` (``dm.cleaned()``'s view, a ``TensorDataset``...) with ``batch_size=``: a
  ``DataLoader`` over it, as for arrays.

Arrays are ``torch.Tensor``, ``numpy.ndarray`` or anything with ``__array__`` (a pandas frame), all with
one row per sample. NumPy ``float64`` becomes ``float32`` (torch's default dtype; a float64 array is
almost always NumPy's default, not a choice); every other dtype and every tensor is kept as given.
The data becomes ``DataLoader(ArrayDataset(...), batch_size, shuffle)``, so shuffling is seeded by the
Trainer, resumes exactly, is sharded under DDP, and goes through the batched fetch (``_fetch``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

__all__ = [
    "ArrayDataset",
    "as_loader",
    "as_loaders",
    "describe",
    "eval_loader",
    "fit_loaders",
    "is_array_data",
    "is_map_dataset",
]

Tensor = torch.Tensor
EVAL_BATCH_SIZE = 256  # evaluate / predict on arrays without batch_size= (no gradients: larger is fine)


def _is_array(obj: Any) -> bool:
    if isinstance(obj, Tensor):
        return True
    np = sys.modules.get("numpy")  # no ndarray can exist unless numpy is imported
    if np is not None and isinstance(obj, np.ndarray):
        return True
    return hasattr(obj, "__array__") and not isinstance(obj, (str, bytes, type))


def is_array_data(obj: Any) -> bool:
    """True for one array, a tuple of arrays or a dict of arrays (not a list: a list is a list of batches)."""
    if _is_array(obj):
        return True
    if type(obj) is tuple:
        return len(obj) > 0 and all(_is_array(a) for a in obj)
    if isinstance(obj, Mapping):
        return len(obj) > 0 and all(isinstance(k, str) and _is_array(v) for k, v in obj.items())
    return False


def _rows(array: Any) -> int | None:
    shape = getattr(array, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 0 else None


def is_map_dataset(obj: Any) -> bool:
    """A map-style ``Dataset`` (``dataset[i]`` and ``len``): a DataLoader over it batches it, as arrays are batched."""
    return (
        isinstance(obj, torch.utils.data.Dataset)
        and not isinstance(obj, torch.utils.data.IterableDataset)
        and callable(getattr(obj, "__len__", None))
    )


def _numbers(obj: Any, depth: int = 0) -> bool:
    """A (nested) Python list / tuple of numbers, judged by its first elements (a list of rows is one too)."""
    if isinstance(obj, (int, float, bool)) and depth:
        return True
    if not isinstance(obj, (list, tuple)) or not obj or depth > 3:
        return False
    return all(_numbers(v, depth + 1) for v in obj[:3])


def _lists_for_arrays(data: Any) -> tuple[str, str] | None:
    """When ``data`` is meant as arrays but holds Python lists of numbers: what it is and the fix."""
    if type(data) is tuple and data and all(_is_array(a) or _numbers(a) for a in data):
        lists = [i for i, a in enumerate(data) if not _is_array(a)]
        if lists:
            return (
                f"a tuple of {len(data)} whose element(s) {lists} are Python {type(data[lists[0]]).__name__}s",
                "(torch.tensor(x), torch.tensor(y)) or (np.asarray(x), np.asarray(y))",
            )
    if isinstance(data, Mapping) and data and all(_is_array(v) or _numbers(v) for v in data.values()):
        lists = [k for k, v in data.items() if not _is_array(v)]
        if lists:
            return (
                f"a dict whose entries {lists} are Python {type(data[lists[0]]).__name__}s",
                "{name: torch.tensor(values) for name, values in data.items()}",
            )
    if isinstance(data, list) and _numbers(data):  # a list is a list of batches: never of plain numbers
        return "a Python list", "torch.tensor(x) or np.asarray(x)"
    return None


def check_not_lists(data: Any, name: str) -> None:
    """Arrays given as Python lists: refused with the fix (as a loader they would be iterated as batches)."""
    found = _lists_for_arrays(data)
    if found:
        problem, fix = found
        raise TypeError(
            f"{name} is {problem} of numbers. Arrays must be tensors or NumPy arrays: pass {fix} with "
            "batch_size= (e.g. fit((torch.tensor(x), torch.tensor(y)), batch_size=32)), or a DataLoader."
        )


def describe(obj: Any) -> str:
    """'a tuple of 2 arrays' etc., for error messages."""
    if type(obj) is tuple:
        return f"a tuple of {len(obj)} arrays"
    if isinstance(obj, Mapping):
        return f"a dict of arrays {list(obj)}"
    return f"an array ({type(obj).__name__})"


def _to_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        tensor = value.detach()
    else:
        import numpy as np

        array = np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        elif not array.flags.writeable:  # torch.from_numpy warns on read-only memory
            array = array.copy()
        try:
            tensor = torch.from_numpy(array)
        except TypeError as exc:
            raise TypeError(
                f"{name} has dtype {array.dtype}, which torch cannot hold ({exc}). Convert it to a numeric "
                f"dtype first, e.g. np.asarray({name.split()[-1]}, dtype=np.float32)."
            ) from None
    if tensor.ndim == 0:
        raise ValueError(
            f"{name} is 0-dimensional (a single number); arrays need one row per sample along the first dimension."
        )
    return tensor if tensor.is_contiguous() else tensor.contiguous()


class ArrayDataset(torch.utils.data.Dataset):
    """Rows of equal-length tensors, kept as one tuple / dict / tensor (the batched fetch slices them).

    ``dataset[i]`` gives one sample (what a DataLoader with ``fast_fetch=False`` collates), so both paths
    yield the same batches.

    Example:
        >>> import torch
        >>> ds = ArrayDataset((torch.arange(6).reshape(3, 2), torch.tensor([0, 1, 0])))
        >>> len(ds), ds[1]
        (3, (tensor([2, 3]), tensor(1)))
    """

    def __init__(self, data: Any) -> None:
        if type(data) is tuple:
            self.keys: tuple[str, ...] | None = None
            self.single = False
            named = [(f"array {i} of the tuple", a) for i, a in enumerate(data)]
        elif isinstance(data, Mapping):
            self.keys = tuple(data)
            self.single = False
            named = [(f"array {k!r}", data[k]) for k in self.keys]
        else:
            self.keys, self.single = None, True
            named = [("the array", data)]
        self.tensors = [_to_tensor(name, value) for name, value in named]
        lengths = {name: t.shape[0] for (name, _), t in zip(named, self.tensors, strict=True)}
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"{name}: {n}" for name, n in lengths.items())
            raise ValueError(
                f"The arrays have different numbers of rows ({listed}). Pass inputs and targets with one "
                "row per sample (the same length along the first dimension)."
            )
        self.length = int(self.tensors[0].shape[0])
        if self.length == 0:
            raise ValueError("The arrays are empty (0 rows): pass at least one sample.")

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        rows = [t[index] for t in self.tensors]
        if self.single:
            return rows[0]
        if self.keys is not None:
            return dict(zip(self.keys, rows, strict=True))
        return tuple(rows)

    def assemble(self, parts: list[Tensor]) -> Any:
        """A batch from its sliced tensors, shaped as ``default_collate`` shapes this dataset's samples."""
        if self.single:
            return parts[0]
        if self.keys is not None:
            return dict(zip(self.keys, parts, strict=True))
        return parts  # default_collate turns tuples of samples into a list


def as_loader(
    data: Any,
    *,
    batch_size: int | None,
    shuffle: bool | None = None,
    default_shuffle: bool = False,
    name: str = "train_loader",
    caller: str = "fit",
) -> Any:
    """``data`` itself when it is not array data; else a ``DataLoader`` over it (checked first).

    ``name`` names the argument in errors (``"train_loader"``, ``"val_data"``...), ``caller`` the call.

    Example:
        >>> import torch
        >>> loader = as_loader((torch.randn(10, 3), torch.zeros(10)), batch_size=4)
        >>> [len(xb) for xb, yb in loader]
        [4, 4, 2]
    """
    dataset_given = is_map_dataset(data)
    if not dataset_given and not is_array_data(data):
        _check_unbatched(data, name)
        return data
    # the example puts the arrays where the call takes its data (these take a model or a trainer first)
    before = "..., " if caller in ("TrainerWidget", "compare_strategies", "profile_training") else ""
    example = f"{caller}({before}{'dataset' if dataset_given else '(x, y)'}, batch_size=32)"
    if batch_size is None and dataset_given:
        raise TypeError(
            f"{name} is a Dataset ({type(data).__name__}), not a loader: iterating it yields single samples without "
            f"a batch dimension. Pass batch_size= (e.g. {example}), or wrap it: DataLoader(dataset, batch_size=32, "
            "shuffle=True)."
        )
    if batch_size is None:
        if _is_array(data):  # most likely a loader was meant
            kind = "tensor" if isinstance(data, Tensor) else type(data).__name__
            raise TypeError(
                f"{name} is a {kind}, not a loader (iterating it would yield single rows). Pass batch_size= to "
                f"train on arrays, e.g. {example}, or wrap the data: "
                "DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)."
            )
        raise TypeError(
            f"{name} is {describe(data)} but no batch_size was given: pass batch_size= (e.g. {example}), or a "
            "DataLoader. (For a sequence of ready batches, pass a list.)"
        )
    check_batch_size(batch_size)
    if shuffle is not None and not isinstance(shuffle, bool):
        raise TypeError(f"shuffle must be True, False or None, got {shuffle!r}.")
    dataset = data if dataset_given else ArrayDataset(data)
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=default_shuffle if shuffle is None else shuffle
    )


def _check_unbatched(loader: Any, name: str) -> None:
    """``DataLoader(dataset, batch_size=None)`` turns batching off: it yields the items one by one, the mistake a
    bare Dataset is refused for. Told apart from a dataset whose items are batches already by item 0's target
    (read by index: iterating the loader would draw its seed from the RNG)."""
    if not isinstance(loader, torch.utils.data.DataLoader) or loader.batch_size is not None:
        return
    dataset: Any = loader.dataset  # map-style checked below: it has __len__
    if loader.batch_sampler is not None or not is_map_dataset(dataset) or len(dataset) == 0:
        return
    item = dataset[0]
    target = item[-1] if isinstance(item, (tuple, list)) and len(item) > 1 else None
    if isinstance(target, (int, float)) or (isinstance(target, Tensor) and target.ndim == 0):
        raise TypeError(
            f"{name} is a DataLoader with batch_size=None, which yields the items one by one without a batch "
            "dimension (item 0's target is a single number): each optimizer step would train on one item. Give it "
            "a batch size: DataLoader(dataset, batch_size=32, shuffle=True). (batch_size=None is for datasets whose "
            "items are batches already.)"
        )


def fit_loaders(
    data: Any,
    val_loader: Any,
    *,
    val_data: Any,
    batch_size: int | None,
    shuffle: bool | None,
    caller: str = "fit",
) -> tuple[Any, Any]:
    """``fit``'s (and ``fit_more``'s) training and validation loaders from what was passed (arrays become
    DataLoaders)."""
    if val_data is not None and val_loader is not None:
        raise TypeError(f"{caller}() got both val_loader and val_data: pass one of them (val_data= for arrays).")
    val = val_data if val_data is not None else val_loader
    val_name = "val_data" if val_data is not None else "val_loader"
    check_not_lists(data, "the training data")
    check_not_lists(val, val_name)
    train_arrays = is_array_data(data) or is_map_dataset(data)
    val_arrays = val is not None and (is_array_data(val) or is_map_dataset(val))
    if batch_size is not None and not (train_arrays or val_arrays):
        raise TypeError(
            f"batch_size={batch_size!r} applies to array data (a tuple or dict of tensors / NumPy arrays) and "
            f"datasets, but {caller}() got {_what(data)}, which batches itself. Drop batch_size=, or pass arrays."
        )
    if shuffle is not None and not train_arrays:
        raise TypeError(
            f"shuffle={shuffle!r} applies to training arrays and datasets, but {caller}() got a "
            f"{type(data).__name__}. Set shuffle on the DataLoader itself (DataLoader(..., shuffle=True)), or pass "
            "arrays."
        )
    if val_data is None and _is_array(data) and _is_array(val_loader) and _rows(data) == _rows(val_loader):
        # Keras' fit(x, y, batch_size=...): here the second argument is the validation data
        raise TypeError(
            f"{caller}(x, y) took y as the validation data ({caller}'s second argument is val_loader), leaving the "
            f"training data without targets. Pass the training arrays together: {caller}((x, y), batch_size=32), "
            "and validation arrays as val_data=(x_val, y_val). (If the second array really holds validation "
            "inputs, pass it as val_data=.)"
        )
    train = as_loader(
        data, batch_size=batch_size, shuffle=shuffle, default_shuffle=True, name="train_loader", caller=caller
    )
    if val is not None:
        val = as_loader(val, batch_size=batch_size, default_shuffle=False, name=val_name, caller=caller)
    return train, val


def as_loaders(
    train_data: Any,
    val_data: Any = None,
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    caller: str = "fit",
) -> tuple[Any, Any]:
    """The training and validation loaders ``Trainer.fit`` would train on: arrays (``(x, y)``, a dict of arrays)
    become DataLoaders of ``batch_size`` (the training one shuffled unless ``shuffle=False``; the Trainer seeds
    it), loaders and lists of batches are returned as they are. ``caller`` names the call in errors.

    Raises:
        TypeError: arrays without ``batch_size``, ``batch_size`` or ``shuffle`` where no arrays take them.

    Example:
        >>> import torch
        >>> from nbtrainer import as_loaders
        >>> train, val = as_loaders((torch.randn(10, 3), torch.zeros(10)), batch_size=4)
        >>> [len(xb) for xb, yb in train], val
        ([4, 4, 2], None)
    """
    return fit_loaders(train_data, None, val_data=val_data, batch_size=batch_size, shuffle=shuffle, caller=caller)


def eval_loader(data: Any, batch_size: int | None, *, name: str) -> Any:
    """``evaluate`` / ``predict``: arrays become a loader in order (``batch_size`` default 256)."""
    check_not_lists(data, f"the {name}")
    if batch_size is not None and not is_array_data(data) and not is_map_dataset(data):
        raise TypeError(
            f"batch_size={batch_size!r} applies to array data, but the {name} is a {type(data).__name__}, "
            "which batches itself. Drop batch_size=, or pass arrays."
        )
    return as_loader(data, batch_size=EVAL_BATCH_SIZE if batch_size is None else batch_size, name=name)


def predict_loader(data: Any, batch_size: int | None) -> Any:
    """``predict``: as :func:`eval_loader`, and a DataLoader that draws its items in a random order refused (its
    outputs would line up with no row of the dataset, and the mismatch would show nowhere)."""
    loader = eval_loader(data, batch_size, name="predict() loader")
    sampler = _shuffling_sampler(loader)
    if sampler is not None:
        raise ValueError(
            f"The predict() loader draws its items in a random order (a {type(sampler).__name__}), so the outputs "
            "would come back in that order and match no row of the dataset. Predict on a loader in order: "
            "DataLoader(dataset, batch_size=..., shuffle=False) (not the training loader, which shuffles), or pass "
            "the dataset or arrays themselves with batch_size=."
        )
    return loader


def _shuffling_sampler(loader: Any) -> Any:
    """The sampler of a DataLoader that visits its items in a random order, else None (an order the loader does
    not show, such as a sampler of the user's own or an IterableDataset, is taken as it comes)."""
    from torch.utils.data import DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

    if not isinstance(loader, DataLoader):
        return None
    # DataLoader(batch_sampler=...) keeps a SequentialSampler as .sampler: the order is its batch sampler's
    sampler = getattr(loader.batch_sampler, "sampler", None)
    sampler = loader.sampler if sampler is None else sampler
    if isinstance(sampler, (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)):
        return sampler
    return sampler if getattr(sampler, "shuffle", False) is True else None  # DistributedSampler(shuffle=True)


def _what(loader: Any) -> str:
    """'a DataLoader', 'a list of 3 batches'... for errors about what was passed."""
    if isinstance(loader, list):
        return "a list of batches"
    return f"a {type(loader).__name__}"


def check_batch_size(batch_size: Any) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
