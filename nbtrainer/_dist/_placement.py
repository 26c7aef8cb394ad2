"""Where the model runs: :class:`Strategy`, the seam every placement implements, and the single-device one.

The loop talks to a strategy for everything that differs between one process and many: wrapping the
model, ``no_sync`` for non-final micro-steps, preparing loaders, reducing epoch sums, rank-0-only work
and barriers. Keeping that here means the hot loop has no ``if distributed`` branches. ``SingleDevice``,
``DDP`` and ``FSDP`` (``_ddp``, ``_fsdp``) implement it; nothing asks a strategy what it is by its class.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

__all__ = ["SingleDevice", "Strategy", "unwrap_model"]


class Strategy(Protocol):
    """A placement, as the Trainer, the loop, the checkpoints and the tools call it.

    Attributes:
        device: this process's device.
        distributed: more than one process may take part (DDP, FSDP): the loop reduces, the placement wraps.
        shards_parameters: each parameter lives in shards across ranks (FSDP2): DTensor parameters (evaluation under
            ``no_grad``), checkpoints gathered by every rank or written as shards, loaded shard by shard.
        casts_params: a mixed-precision policy casts the parameters in forward: the Trainer's autocast stays off.
    """

    device: torch.device
    distributed: bool
    world_size: int
    rank: int
    local_rank: int
    shards_parameters: bool
    casts_params: bool

    @property
    def is_global_zero(self) -> bool: ...
    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module: ...
    def attach(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, precision: str, *, by_name: bool = False
    ) -> None: ...
    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager[Any]: ...
    def prepare_loader(self, loader: Any, *, train: bool) -> Any: ...
    def set_epoch(self, loader: Any, epoch: int) -> None: ...
    def reduce_sums(self, values: list[float]) -> list[float]: ...
    def any_rank(self, flag: bool) -> bool: ...
    def any_rank_flag(self, flag: torch.Tensor | None, device: torch.device) -> torch.Tensor: ...
    def all_gather_object(self, obj: Any) -> list[Any]: ...
    def barrier(self) -> None: ...
    def teardown(self) -> None: ...


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
    """One process, one device (the :class:`Strategy` of every Trainer not launched on several ranks)."""

    distributed = False
    world_size = 1
    rank = 0
    local_rank = 0
    is_global_zero = True
    shards_parameters = False
    casts_params = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def attach(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, precision: str, *, by_name: bool = False
    ) -> None:
        pass  # nothing to shard

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

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

    def any_rank_flag(self, flag: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        return flag if flag is not None else torch.zeros((), dtype=torch.bool, device=device)

    def barrier(self) -> None:
        pass

    def teardown(self) -> None:
        pass
