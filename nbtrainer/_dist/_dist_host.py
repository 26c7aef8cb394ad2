"""What the distributed code needs of the Trainer (:class:`DistTrainer`), so that ``_dist`` never imports it, not even
for types: the placement sits below the Trainer in the floor plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["DistTrainer"]


class DistTrainer(Protocol):
    """The Trainer as the placement (FSDP's checkpoints, the launch monitor) sees it."""

    status: str
    model: torch.nn.Module
    optimizer: Any

    @property
    def strategy(self) -> Any: ...
    @property
    def precision(self) -> str: ...
    @property
    def model_setup(self) -> Any: ...
    @property
    def progress(self) -> Any: ...
    def request_stop(self, reason: str = ...) -> None: ...
    def save_checkpoint(self, path: str, *, sharded: bool = ...) -> str: ...
