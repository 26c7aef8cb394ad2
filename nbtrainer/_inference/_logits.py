"""The logits of a model's outputs, whatever their container (a tensor, ``.logits``, a dict, a tuple)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["logits_of"]


def logits_of(outputs: Any, *, who: str = "The model") -> torch.Tensor:
    """``outputs`` itself when it is a tensor, else its ``logits`` (Hugging Face ``ModelOutput``, a dict), else
    the first tensor of a tuple or list."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, (tuple, list)) and outputs and isinstance(outputs[0], torch.Tensor):
        return outputs[0]
    raise TypeError(
        f"{who} returned a {type(outputs).__name__} without logits: return a tensor of logits, an object with "
        "a .logits tensor (Hugging Face style), a dict with 'logits', or a tuple whose first item is the logits."
    )
