"""How a batch becomes model inputs, targets and a loss; moving nested batches; concatenating outputs.

Batch shapes understood by default:

* ``(x, y)`` -> ``model(x)``, targets ``y``
* ``(x1, ..., xk, y)`` -> ``model(x1, ..., xk)``; with ``num_inputs=k`` the rest are the targets
  (one tensor, or a tuple if several)
* ``{"a": ..., "b": ..., "labels": ...}`` -> ``model(a=..., b=...)``, targets from ``target_keys``
  (default: the first of ``labels``, ``label``, ``targets``, ``target``, ``y`` present). When there is
  no criterion the whole dict goes to the model (Hugging Face style: the model returns ``.loss``).
* a lone tensor, or a 1-tuple -> inputs only (no targets).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["BatchSpec", "batch_size_of", "concat_outputs", "loss_from_outputs", "move_to_device"]

_DEFAULT_TARGET_KEYS = ("labels", "label", "targets", "target", "y")


def move_to_device(obj: Any, device: torch.device, non_blocking: bool = False) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        moved = [move_to_device(o, device, non_blocking) for o in obj]
        return type(obj)(*moved) if hasattr(obj, "_fields") else type(obj)(moved)
    if isinstance(obj, dict):
        return type(obj)((k, move_to_device(v, device, non_blocking)) for k, v in obj.items())
    return obj


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def batch_size_of(targets: Any, inputs: Any) -> int:
    t = _first_tensor(targets)
    if t is None or t.ndim == 0:
        t = _first_tensor(inputs)
    if t is None or t.ndim == 0:
        return 1
    return int(t.shape[0])


@dataclasses.dataclass
class BatchSpec:
    """Splits a batch into (args, kwargs, targets) for the model and criterion."""

    num_inputs: int | None = None
    target_keys: Sequence[str] | str | None = None
    pass_targets_to_model: bool = False

    def split(self, batch: Any) -> tuple[tuple, dict, Any]:
        if isinstance(batch, torch.Tensor):
            return (batch,), {}, None
        if isinstance(batch, dict):
            keys = self._target_keys(batch)
            targets: Any
            if not keys:
                targets = None
            elif len(keys) == 1:
                targets = batch[keys[0]]
            else:
                targets = tuple(batch[k] for k in keys)
            if self.pass_targets_to_model:
                kwargs = dict(batch)
            else:
                kwargs = {k: v for k, v in batch.items() if k not in keys}
            return (), kwargs, targets
        if isinstance(batch, (list, tuple)):
            n = len(batch)
            if n == 0:
                raise ValueError("The loader yielded an empty batch (). Yield (inputs, targets) or a dict.")
            k = self.num_inputs if self.num_inputs is not None else max(n - 1, 1)
            if k > n:
                raise ValueError(
                    f"num_inputs={k} but the batch has only {n} elements. Set num_inputs to the "
                    "number of model inputs at the front of each batch."
                )
            rest = tuple(batch[k:])
            targets = None if not rest else (rest[0] if len(rest) == 1 else rest)
            return tuple(batch[:k]), {}, targets
        raise TypeError(
            f"Cannot use a batch of type {type(batch).__name__}. The loader must yield tensors, tuples/lists "
            "(inputs..., targets) or dicts of tensors; convert the data in your Dataset or collate_fn."
        )

    def _target_keys(self, batch: dict) -> list[str]:
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
            if key in batch:
                return [key]
        return []


def _get_loss_attr(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return getattr(outputs, "loss", None)


def loss_from_outputs(criterion: Callable | None, outputs: Any, targets: Any) -> torch.Tensor:
    if criterion is None:
        loss = _get_loss_attr(outputs)
        if loss is None:
            raise ValueError(
                "No criterion was given and the model output has no 'loss'. Pass a criterion "
                "(e.g. nn.CrossEntropyLoss()) or return a loss from the model."
            )
        return loss
    if targets is None:
        raise ValueError(
            "The batch has no targets for the criterion. Yield (inputs, targets), set "
            "num_inputs=/target_keys=, or use compute_loss= for unsupervised losses."
        )
    return criterion(outputs, targets)


def concat_outputs(chunks: list[Any]) -> Any:
    """Concatenate per-batch outputs along dim 0, keeping tuples/dicts/dataclasses as such."""
    if not chunks:
        return []
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        if first.ndim == 0:
            return torch.stack(chunks)
        return torch.cat(chunks, dim=0)
    if isinstance(first, dict):
        merged = {k: concat_outputs([c[k] for c in chunks]) for k in first}
        try:
            return type(first)(**merged) if type(first) is not dict else merged
        except TypeError:
            return merged
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        fields = {f.name: concat_outputs([getattr(c, f.name) for c in chunks]) for f in dataclasses.fields(first)}
        return type(first)(**fields)
    if isinstance(first, tuple):
        parts = [concat_outputs([c[i] for c in chunks]) for i in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    if isinstance(first, list):
        return [concat_outputs([c[i] for c in chunks]) for i in range(len(first))]
    if first is None:
        return None
    return chunks
