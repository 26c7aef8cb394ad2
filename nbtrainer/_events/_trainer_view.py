"""What the event stream's consumers read of the Trainer: :class:`TrainerView`, a typed view it satisfies structurally.

The callbacks, loggers and progress bars here (``_events``), the launched ranks' channel, and the batch steps are below
the Trainer in the floor plan and never import it, not even for types. A user's callback may be given the whole
Trainer; the built-in ones need only this. What the tools around a run need besides (its state, its batch steps, the
verbs that change it) is the view's extension, ``nbtrainer._loop._host.LoopHost``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from nbtrainer._data._batch import BatchSpec
    from nbtrainer._dist._placement import Strategy
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._options import TrainerOptions
    from nbtrainer._setup._model_setup import ModelSetup, ParamCounts

__all__ = ["TrainerView"]


class TrainerView(Protocol):
    """The Trainer as the built-in callbacks, loggers, run trackers and its batch steps see it.

    Attributes:
        options: the option groups (``nbtrainer._options``): the only copy of the settings.
        callbacks: the event stream's consumers (a tracker adds or removes itself).
        status: ``"idle"``, ``"running"``, ``"paused"``, ``"finished"``...; a tracker may mark a planned end.
        run_id: the id of the current run in the run store (set by its recorder).
        fresh_fit: whether the current (or last) fit started a new run (a new History, epochs from 1), not a
            continuation (``fit_more``, ``resume_from=``): a callback with state of its own across epochs (the best
            value so far) starts it over in ``on_fit_start`` when this is True, and keeps it for a continuation.
    """

    model: torch.nn.Module
    criterion: Callable[..., Any] | None
    optimizer: torch.optim.Optimizer | None
    scheduler: Any  # any LR scheduler (torch has no common base for ReduceLROnPlateau and the others)
    scaler: torch.amp.GradScaler | None
    strategy: Strategy
    options: TrainerOptions
    callbacks: CallbackList
    progress: Progress
    batch_spec: BatchSpec
    status: str
    run_id: str | None
    fresh_fit: bool

    @property
    def device(self) -> torch.device: ...
    @property
    def precision(self) -> str: ...
    @property
    def grad_accum_steps(self) -> int: ...
    @property
    def max_grad_norm(self) -> float | None: ...
    @property
    def history(self) -> History: ...
    @property
    def model_setup(self) -> ModelSetup: ...
    @property
    def param_counts(self) -> ParamCounts: ...
    @property
    def global_step(self) -> int: ...
    @property
    def current_epoch(self) -> int: ...
    @property
    def has_validation(self) -> bool: ...
    @property
    def is_global_zero(self) -> bool: ...

    def request_stop(self, reason: str = ...) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def defer(self, fn: Callable[[], Any]) -> None: ...
    def save_checkpoint(self, path: str, *, sharded: bool = ...) -> str: ...
    def model_state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
    def expected_log_keys(self) -> set[str]: ...
    def compute_loss(self, batch: Any) -> tuple[torch.Tensor | None, Any, Any]: ...
    def predict_step(self, batch: Any) -> Any: ...
