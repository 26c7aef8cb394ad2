"""Where the model runs: the single-device strategy and the seam the DDP strategy plugs into.

The loop talks to a strategy for everything that differs between one process and many: wrapping the
model, ``no_sync`` for non-final micro-steps, preparing loaders, reducing epoch sums, rank-0-only work
and barriers. Keeping that here means the hot loop has no ``if distributed`` branches.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["SingleDevice", "unwrap_model"]

_NULL = contextlib.nullcontext()


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under DDP / torch.compile wrappers (so state_dict keys never carry 'module.')."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            model = inner
        else:
            return model


class SingleDevice:
    distributed = False
    world_size = 1
    rank = 0
    local_rank = 0
    is_global_zero = True

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager:
        return _NULL

    def prepare_loader(self, loader: Any, *, train: bool) -> Any:
        return loader

    def set_epoch(self, loader: Any, epoch: int) -> None:
        sampler = getattr(loader, "sampler", None)
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def reduce_sums(self, values: list[float]) -> list[float]:
        return values

    def any_rank(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass

    def teardown(self) -> None:
        pass
