"""What the data code needs of the Trainer (:class:`DataTrainer`): the first-batch checks and predict's collection are
below the Trainer in the floor plan and never import it, not even for types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["DataTrainer"]


class DataTrainer(Protocol):
    """The Trainer as the first-batch checks and ``predict`` see it."""

    model: torch.nn.Module

    @property
    def device(self) -> torch.device: ...
    @property
    def non_blocking(self) -> bool: ...
    @property
    def criterion(self) -> Any: ...
    @property
    def batch_spec(self) -> Any: ...
    @property
    def batch_steps(self) -> Any: ...
    @property
    def run_state(self) -> Any: ...
    def compute_loss(self, batch: Any) -> Any: ...
    def predict_step(self, batch: Any) -> Any: ...
