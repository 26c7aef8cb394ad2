"""The Trainer as :class:`~nbtrainer.Health` sees it (``_health`` sits below the Trainer and never imports it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["HealthTrainer"]


class HealthTrainer(Protocol):
    """What Health reads (the run's objects, where it is) and does (pause, stop, defer a save; apply its advice)."""

    callbacks: Any  # CallbackList: Health tells the others with on_health
    options: Any
    criterion: Any  # a cross-entropy gives the chance level
    timing_every: int
    fast_fetch: bool
    status: str

    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def optimizer(self) -> Any: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def strategy(self) -> Any: ...
    @property
    def max_grad_norm(self) -> float | None: ...
    @property
    def history(self) -> Any: ...
    @property
    def run_state(self) -> Any: ...  # loop_state (where), loop (the running FitLoop), lr_finder
    @property
    def batch_steps(self) -> Any: ...  # compute(batch), autocast(), training_step_fn
    @property
    def progress(self) -> Any: ...
    @property
    def global_step(self) -> int: ...

    @property
    def lrs(self) -> dict[str, float]: ...

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def request_stop(self, reason: str = ...) -> None: ...
    def defer(self, fn: Callable[[], Any]) -> None: ...
    # what Health.apply_advice does (the panel's button)
    def set_lr(self, lr: float, optimizer: str | None = ..., *, source: str | None = ...) -> None: ...
    def set_max_grad_norm(self, max_grad_norm: float | None) -> None: ...
    def rollback(self, path: str = ...) -> str: ...
