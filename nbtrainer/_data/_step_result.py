"""What a manual ``training_step`` / ``validation_step`` returns: a dict of named scalar tensors, checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_step_result"]


def check_step_result(result: Any, keys: list[str] | None, name: str = "training_step") -> dict[str, torch.Tensor]:
    """A ``training_step``'s (or ``validation_step``'s) return value: a dict of scalar tensors, the same keys each time.

    Example:
        >>> check_step_result({"loss": torch.tensor(0.5)}, None)
        {'loss': tensor(0.5000)}
    """
    if not isinstance(result, Mapping) or not result:
        raise TypeError(
            f"{name} must return a dict of named scalar tensors, e.g. {{'loss': g_loss, 'd_loss': d_loss}}, "
            f"got {type(result).__name__}."
        )
    for key, value in result.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor) or value.numel() != 1:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise TypeError(
                f"{name} returned {key!r}: {shape}; each value must be a scalar tensor (reduce it with "
                ".mean(); return tensors, not .item(), so nothing waits for the device)."
            )
    if keys is not None and list(result) != keys:
        raise ValueError(f"{name} returned the keys {list(result)}, earlier {keys}: return the same each time.")
    return dict(result)
