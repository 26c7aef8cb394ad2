"""Example inputs for profiling: a tensor, a tuple/list of tensors (positional) or a dict (keywords)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import iter_tensors

__all__ = ["call_model", "infer_batch_size", "iter_tensors", "make_loss", "scalar_loss", "slice_batch", "to_device"]


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor moved to ``device`` (containers rebuilt, other values kept)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, Mapping):
        return {key: to_device(value, device) for key, value in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(value, device) for value in obj)
    return obj


def slice_batch(obj: Any, batch_size: int, n: int) -> Any:
    """``obj`` with every tensor whose first dimension is ``batch_size`` cut to its first ``n`` rows (views)."""
    if isinstance(obj, torch.Tensor):
        return obj[:n] if obj.dim() > 0 and obj.shape[0] == batch_size else obj
    if isinstance(obj, Mapping):
        return {key: slice_batch(value, batch_size, n) for key, value in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(slice_batch(value, batch_size, n) for value in obj)
    return obj


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple/list, else ``model(inputs)``."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def infer_batch_size(inputs: Any) -> int:
    """First dimension of the first tensor in ``inputs``.

    Example:
        >>> infer_batch_size({"x": torch.zeros(4, 3), "mask": torch.ones(4, 3)})
        4
    """
    for tensor in iter_tensors(inputs):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    raise ValueError("Can't infer batch_size: no tensor with a batch dimension in example_inputs; pass batch_size=")


def scalar_loss(output: Any) -> torch.Tensor:
    """A stand-in loss: the sum of the means of every floating-point tensor in ``output``."""
    terms = [t.float().mean() for t in iter_tensors(output) if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise ValueError("The model's output has no floating-point tensor that requires grad: nothing to backpropagate")
    return torch.stack(terms).sum()


def make_loss(criterion: Callable[..., torch.Tensor] | None, targets: Any) -> Callable[[Any], torch.Tensor]:
    """``criterion(output, targets)`` (or ``criterion(output)`` without targets); default :func:`scalar_loss`."""
    if criterion is None:
        return scalar_loss
    if targets is None:
        return criterion
    return lambda output: criterion(output, targets)
