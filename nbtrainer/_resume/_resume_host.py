"""What checkpoints and continuing a run need of the Trainer (:class:`ResumableTrainer`): ``_resume`` sits below the
Trainer in the floor plan and never imports it, not even for types."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["ResumableTrainer"]


class ResumableTrainer(Protocol):
    """The Trainer as its checkpoint state, ``fit_more`` and the sharded checkpoints see it."""

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    scaler: Any
    grad_accum_steps: int
    callbacks: Any
    history: Any
    status: str

    @property
    def strategy(self) -> Any: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def precision(self) -> str: ...
    @property
    def scheduler_interval(self) -> str: ...
    @property
    def run_state(self) -> Any: ...
    @property
    def model_setup(self) -> Any: ...
    @property
    def batch_steps(self) -> Any: ...
    @property
    def progress(self) -> Any: ...
    def request_stop(self, reason: str = ...) -> None: ...
    def fit(self, *args: Any, **kwargs: Any) -> Any: ...
    def total_steps(self, train_loader: Any, epochs: int, *, batch_size: int | None = ...) -> int: ...
    def set_scheduler(self, scheduler: Any, interval: str = ...) -> None: ...
    def save_checkpoint(self, path: str, *, sharded: bool = ...) -> str: ...
    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
