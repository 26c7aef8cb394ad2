"""The batch protocol: how a batch becomes model inputs, targets and a loss, in fit, evaluate and predict.

One rule set for the three verbs (``BatchSpec.split``). Shapes understood by default:

================================================  =================================  =========================
batch the loader yields                           the model is called as             targets (criterion, metrics)
================================================  =================================  =========================
``x`` (a tensor), or ``(x,)``                     ``model(x)``                       none
``(x, y)``                                        ``model(x)``                       ``y``
``(x1, ..., xk, y)``                              ``model(x1, ..., xk)``             ``y``
``(x1, ..., xk, y1, y2)`` with ``num_inputs=k``   ``model(x1, ..., xk)``             ``(y1, y2)``
``((x1, x2), y)`` or ``((x1, x2), (y1, y2))``     ``model(x1, x2)``                  ``y`` or ``(y1, y2)``
``({"a": a, "b": b}, y)``                         ``model(a=a, b=b)``                ``y``
``{"a": a, "b": b, "labels": y}`` (any Mapping)   ``model(a=a, b=b)``                ``y``
the same with ``criterion=None``                  ``model(a=a, b=b, labels=y)``      ``y`` (metrics only)
a dataclass with fields ``a, b, labels``          like the dict of its fields        ``y``
a namedtuple                                      like a tuple (positional)          like a tuple
================================================  =================================  =========================

* Lists are tuples (a DataLoader's default collate turns tuple samples into lists).
* ``((x1, x2), y)``: a batch of two whose first element is itself a sequence, a mapping or a dataclass is
  ``(inputs, targets)``; the inputs are unpacked (positional, or keywords for a mapping / dataclass).
  With ``num_inputs=k`` that rule is off and the first ``k`` elements go to the model as they are
  (``num_inputs=1`` passes a list of tensors as one argument).
* Target keys of a mapping / dataclass: ``target_keys=`` (a name, or several: the criterion then gets a
  tuple in that order), else the first of ``labels``, ``label``, ``targets``, ``target``, ``y`` present.
  Without a criterion the whole mapping goes to the model (Hugging Face models compute their loss from
  ``labels``) and the targets still reach the metrics.
* Anything else: ``compute_loss=fn(model, batch)`` / ``predict_step=fn(model, batch)`` (or the
  ``Trainer`` methods of the same names in a subclass).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import torch

__all__ = [
    "BatchSpec",
    "as_mapping",
    "batch_size_of",
    "first_tensor",
    "is_record",
    "iter_tensors",
    "loss_attribute",
    "loss_from_outputs",
    "move_to_device",
    "overridden",
    "rebuild_record",
    "rebuild_sequence",
    "safe_len",
]

log = logging.getLogger(__name__)

_DEFAULT_TARGET_KEYS = ("labels", "label", "targets", "target", "y")


def safe_len(loader: Any) -> int | None:
    """``len(loader)``, or None for a loader without one (a stream, a generator)."""
    try:
        return len(loader)
    except TypeError:
        return None


def is_record(obj: Any) -> bool:
    """A dataclass instance (a batch or output whose fields are read by name)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def rebuild_sequence(obj: list | tuple, items: Sequence[Any]) -> Any:
    """A list, tuple or namedtuple of ``obj``'s type holding ``items``."""
    return type(obj)(*items) if _is_namedtuple(obj) else type(obj)(items)


def rebuild_record(obj: Any, values: Mapping[str, Any]) -> Any:
    """A shallow copy of the dataclass ``obj`` with the fields in ``values`` replaced (frozen ones too;
    no ``__init__`` / ``__post_init__`` runs again)."""
    new = copy.copy(obj)
    for name, value in values.items():
        object.__setattr__(new, name, value)
    return new


def as_mapping(obj: Any) -> Mapping[str, Any] | None:
    """A mapping view of ``obj`` (itself, or a dataclass's fields by name), else None."""
    if isinstance(obj, Mapping):
        return obj
    if is_record(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def move_to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """``obj`` with every tensor on ``device``; containers keep their type (tuple, namedtuple, list, dict,
    other mappings such as Hugging Face's ``BatchEncoding``, dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        return rebuild_sequence(obj, [move_to_device(o, device, non_blocking) for o in obj])
    if type(obj) is dict:
        return {k: move_to_device(v, device, non_blocking) for k, v in obj.items()}
    if isinstance(obj, Mapping):
        items = {k: move_to_device(v, device, non_blocking) for k, v in obj.items()}
        if isinstance(obj, MutableMapping):
            # A shallow copy keeps the class and its extra state (BatchEncoding's encodings, a
            # defaultdict's factory); only the values are replaced.
            try:
                new = copy.copy(obj)
                for k, v in items.items():
                    new[k] = v
                return new
            except Exception:
                log.debug(
                    "this Mapping cannot be copied and updated in place: rebuilt from a dict instead", exc_info=True
                )
        cls: Any = type(obj)  # an immutable Mapping: rebuilt from a dict when its class allows it
        try:
            return cls(items)
        except Exception:
            log.debug(
                "this Mapping class cannot be built from a dict: the batch goes on as a plain dict", exc_info=True
            )
            return items
    if is_record(obj):
        return rebuild_record(
            obj, {f.name: move_to_device(getattr(obj, f.name), device, non_blocking) for f in dataclasses.fields(obj)}
        )
    return obj


def iter_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, depth first, in order: through tuples, lists, mappings and dataclasses."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from iter_tensors(item)
    else:
        mapping = as_mapping(obj)
        for item in mapping.values() if mapping is not None else ():
            yield from iter_tensors(item)


def first_tensor(obj: Any) -> torch.Tensor | None:
    return next(iter_tensors(obj), None)


def batch_size_of(targets: Any, inputs: Any) -> int:
    t = first_tensor(targets)
    if t is None or t.ndim == 0:
        t = first_tensor(inputs)
    if t is None or t.ndim == 0:
        return 1
    return int(t.shape[0])


def _expand_inputs(inputs: Any) -> tuple[tuple, dict]:
    """The ``inputs`` half of an ``(inputs, targets)`` batch as ``(args, kwargs)`` for the model."""
    mapping = as_mapping(inputs)
    if mapping is not None:
        return (), dict(mapping)
    if isinstance(inputs, (list, tuple)):
        return tuple(inputs), {}
    return (inputs,), {}


def _structured(obj: Any) -> bool:
    return isinstance(obj, (list, tuple, Mapping)) or is_record(obj)


@dataclasses.dataclass
class BatchSpec:
    """Splits a batch into ``(args, kwargs, targets)`` for the model and criterion (see the module docstring).

    Example:
        >>> import torch
        >>> spec = BatchSpec()
        >>> args, kwargs, y = spec.split(((torch.ones(2, 3), torch.ones(2, 4)), torch.zeros(2)))
        >>> [a.shape[1] for a in args], kwargs, y.shape
        ([3, 4], {}, torch.Size([2]))
    """

    num_inputs: int | None = None
    target_keys: Sequence[str] | str | None = None
    pass_targets_to_model: bool = False

    def split(self, batch: Any) -> tuple[tuple, dict, Any]:
        if isinstance(batch, torch.Tensor):
            return (batch,), {}, None
        if isinstance(batch, (list, tuple)):
            return self._split_sequence(batch)
        mapping = as_mapping(batch)
        if mapping is not None:
            return self._split_mapping(mapping)
        raise TypeError(
            f"Cannot use a batch of type {type(batch).__name__}. The loader must yield tensors, tuples/lists "
            "(inputs..., targets), ((inputs...), targets), dicts / Mappings or dataclasses of tensors; convert "
            "the data in your Dataset or collate_fn, or pass compute_loss=fn(model, batch) and "
            "predict_step=fn(model, batch) to handle it yourself."
        )

    def check_applies(self, batch: Any, where: str) -> None:
        """Refuse ``num_inputs=`` / ``target_keys=`` on the first batch when the batch is of the kind the option never
        reads (``split`` would go on without it, and the user would think it took effect)."""
        mapping = as_mapping(batch)
        if self.target_keys is not None and mapping is None:
            kind = "a tensor" if isinstance(batch, torch.Tensor) else f"a {type(batch).__name__} (not a dict)"
            raise ValueError(
                f"target_keys={self.target_keys!r} names entries of dict (Mapping / dataclass) batches, but the first "
                f"{where} batch is {kind}, whose targets are its last element: target_keys= would be silently "
                "ignored. Drop target_keys= (num_inputs= says how many leading elements of a tuple are inputs), or "
                "have the loader yield dicts."
            )
        if self.num_inputs is not None and mapping is not None:
            raise ValueError(
                f"num_inputs={self.num_inputs} counts the leading elements of tuple batches, but the first {where} "
                f"batch is a {type(batch).__name__} (keys {list(mapping)}), whose entries reach the model by name: "
                "num_inputs= would be silently ignored. Drop num_inputs=; target_keys= names a dict batch's target "
                "entries."
            )

    def _split_sequence(self, batch: Sequence[Any]) -> tuple[tuple, dict, Any]:
        n = len(batch)
        if n == 0:
            raise ValueError("The loader yielded an empty batch (). Yield (inputs, targets) or a dict.")
        if self.num_inputs is None and n <= 2 and _structured(batch[0]):
            args, kwargs = _expand_inputs(batch[0])
            return args, kwargs, (batch[1] if n == 2 else None)
        k = self.num_inputs if self.num_inputs is not None else max(n - 1, 1)
        if k > n:
            raise ValueError(
                f"num_inputs={k} but the batch has only {n} elements. Set num_inputs to the "
                "number of model inputs at the front of each batch."
            )
        rest = tuple(batch[k:])
        targets = None if not rest else (rest[0] if len(rest) == 1 else rest)
        return tuple(batch[:k]), {}, targets

    def _split_mapping(self, batch: Mapping[str, Any]) -> tuple[tuple, dict, Any]:
        keys = self.target_keys_of(batch)
        targets: Any
        if not keys:
            targets = None
        elif len(keys) == 1:
            targets = batch[keys[0]]
        else:
            targets = tuple(batch[k] for k in keys)  # several target_keys: a tuple in key order
        if self.pass_targets_to_model:
            kwargs = dict(batch)
        else:
            kwargs = {k: v for k, v in batch.items() if k not in keys}
        return (), kwargs, targets

    def target_keys_of(self, batch: Mapping[str, Any]) -> list[str]:
        """The keys of a mapping batch taken as targets (``target_keys=``, else the first default present)."""
        if self.target_keys is not None:
            keys = [self.target_keys] if isinstance(self.target_keys, str) else list(self.target_keys)
            missing = [k for k in keys if k not in batch]
            if missing:
                raise KeyError(
                    f"target_keys {missing} not in the batch; it has keys {list(batch)}. "
                    "Set target_keys= to the names of the target entries."
                )
            return keys
        for key in _DEFAULT_TARGET_KEYS:
            if batch.get(key) is not None:
                return [key]
        return []


def loss_attribute(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return getattr(outputs, "loss", None)


def _missing_loss(outputs: Any, batch: Any, spec: BatchSpec | None) -> ValueError:
    """Why a model returned no loss with ``criterion=None``, and the fix."""
    head = f"No criterion was given and the model output has no 'loss' (it is a {type(outputs).__name__})."
    mapping = as_mapping(batch) if batch is not None else None
    if mapping is not None and spec is not None:
        try:
            keys = spec.target_keys_of(mapping)
        except KeyError:
            keys = []
        if keys and keys != ["labels"]:
            taken = ", ".join(repr(k) for k in keys)
            return ValueError(
                f"{head} nbtrainer took the batch key {taken} as the targets (they reach the metrics) and passed "
                "the whole batch to the model, which computed no loss from it: Hugging Face models compute "
                "their loss only from a 'labels' argument. Rename the key to 'labels' (datasets: "
                f"dataset.rename_column({keys[0]!r}, 'labels')), or pass a criterion, e.g. "
                "criterion=lambda out, y: torch.nn.functional.cross_entropy(out.logits, y)."
            )
        if not keys:
            return ValueError(
                f"{head} The batch has no 'labels' entry (keys {list(mapping)}), so the model could not "
                "compute one. Add 'labels' to the batch, or pass a criterion (e.g. nn.CrossEntropyLoss()) "
                "and target_keys= naming the target entry."
            )
    return ValueError(
        f"{head} Pass a criterion (e.g. nn.CrossEntropyLoss()) or return a loss from the model "
        "(Hugging Face models do when the batch has 'labels')."
    )


def loss_from_outputs(
    criterion: Callable | None,
    outputs: Any,
    targets: Any,
    *,
    batch: Any = None,
    spec: BatchSpec | None = None,
) -> torch.Tensor:
    """``criterion(outputs, targets)``, or the model's own ``.loss`` when there is no criterion.

    ``batch`` and ``spec`` only make the error clearer when no loss can be found.
    """
    if criterion is None:
        loss = loss_attribute(outputs)
        if loss is None:
            raise _missing_loss(outputs, batch, spec)
        return loss
    if targets is None:
        mapping = as_mapping(batch) if batch is not None else None
        if mapping is not None:
            raise ValueError(
                f"The dict batch (keys {list(mapping)}) has no targets for the criterion: nbtrainer takes the first "
                f"entry named {', '.join(_DEFAULT_TARGET_KEYS)}, and it has none. Name the target entry with "
                "target_keys= (e.g. Trainer(..., target_keys='label_ids')), or use compute_loss= for unsupervised "
                "losses."
            )
        raise ValueError(
            "The batch has no targets for the criterion. Yield (inputs, targets), set "
            "num_inputs=/target_keys=, or use compute_loss= for unsupervised losses."
        )
    return criterion(outputs, targets)


def overridden(trainer: object, name: str) -> bool:
    """A subclass redefines the batch-protocol method ``name`` (``compute_loss``, ``predict_step``): more than one
    class of the MRO defines it. Read from the class hierarchy, so no module needs to import the Trainer."""
    return sum(name in vars(cls) for cls in type(trainer).__mro__) > 1
