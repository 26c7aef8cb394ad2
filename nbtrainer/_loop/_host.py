"""The seam between the fit loop and whatever runs it: :class:`LoopHost`, everything :class:`FitLoop` uses.

The loop does not know the Trainer. It trains the host's model with the host's optimizer, precision, metrics,
control and callbacks, through this Protocol (the Trainer's side is ``nbtrainer._trainer._loop_host.TrainerHost``).
What the host reads of a running loop is the loop's public methods (``pending_points``, ``release_pending``,
``open_window``, ``refresh``...). ``owner`` is the object callbacks receive as ``trainer=``.

Read as a checklist, this is also what another runner (a test harness, a new front end) must provide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._loop._control import Control
    from nbtrainer._loop._fit_loop import LoopState
    from nbtrainer._loop._metrics import MetricSet
    from nbtrainer._loop._nonfinite import NonFiniteGuard

__all__ = ["LoopHost", "ToolTrainer"]


class LoopHost(Protocol):
    """What :class:`~nbtrainer._loop._fit_loop.FitLoop` needs from its owner (read at the moment of use:
    ``grad_accum_steps`` or ``max_grad_norm`` may change between steps)."""

    # -- the run's objects ------------------------------------------------------------------------
    @property
    def owner(self) -> Any: ...  # what callbacks get as ``trainer=``
    @property
    def model(self) -> torch.nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def criterion(self) -> Any: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def strategy(self) -> Any: ...  # placement: set_epoch, no_sync, reduce_sums, any_rank, world_size
    @property
    def callbacks(self) -> CallbackList: ...
    @property
    def progress(self) -> Progress: ...
    @property
    def history(self) -> History: ...
    @property
    def state(self) -> LoopState: ...
    @property
    def control(self) -> Control: ...
    @property
    def train_metrics(self) -> MetricSet: ...
    @property
    def nonfinite(self) -> NonFiniteGuard: ...
    @property
    def params(self) -> list[torch.Tensor]: ...  # what the optimizer steps (clipping, the window rescale)

    # -- settings -----------------------------------------------------------------------------------
    @property
    def status(self) -> str: ...
    @property
    def grad_accum_steps(self) -> int: ...
    @property
    def training_step(self) -> Any: ...  # training_step=fn(step, batch) (manual optimization) or None
    @property
    def deterministic(self) -> bool: ...  # seeded data order: the loader's workers are seeded too
    @property
    def micro_split(self) -> int: ...  # each loader batch as this many forward / backward passes (memory_budget_gb)
    @property
    def max_grad_norm(self) -> float | None: ...
    @property
    def optimizer_in_backward(self) -> bool: ...  # each parameter updated in backward (_in_backward)
    @property
    def timing_every(self) -> int: ...
    @property
    def refresh_interval(self) -> float: ...
    @property
    def val_every_n_epochs(self) -> int: ...
    @property
    def non_blocking(self) -> bool: ...
    @property
    def fast_fetch(self) -> bool: ...
    @property
    def data_on_device(self) -> float: ...
    @property
    def scheduler_per_step(self) -> bool: ...
    @property
    def elapsed_before(self) -> float: ...  # seconds of the run before a resume

    # -- what the loop asks the host to do -------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...
    def default_compute(self) -> bool: ...  # (x, y) batches may take the inlined model(x) / criterion path
    def first_compute(self, batch: Any) -> tuple[Any, Any, Any]: ...  # staged, with clear errors
    def check_first_loss(self, loss: Any, outputs: Any, targets: Any) -> None: ...
    def compute(self, batch: Any) -> tuple[Any, Any, Any]: ...  # the batch protocol's (loss, outputs, targets)
    def evaluate(self, batches: Iterable[Any], prefix: str) -> dict[str, float]: ...
    def apply_control(self) -> None: ...  # requests queued by other threads, at a step boundary
    def has_deferred(self) -> bool: ...
    def run_deferred(self) -> None: ...  # checkpoint saves queued while an event was delivered
    def step_epoch_scheduler(self, logs: dict[str, Any]) -> None: ...
    def take_pending_rng(self) -> dict[str, Any] | None: ...  # RNG of a resumed run, restored once


class ToolTrainer(Protocol):
    """The Trainer as the LR finder and the out-of-memory advice see it (they run around a fit, not inside the loop;
    ``_loop`` is below the Trainer in the floor plan and never imports it, not even for types)."""

    model: torch.nn.Module
    optimizer: Any
    scaler: Any
    grad_accum_steps: int

    @property
    def device(self) -> torch.device: ...
    @property
    def strategy(self) -> Any: ...
    @property
    def precision(self) -> str: ...
    @property
    def non_blocking(self) -> bool: ...
    @property
    def options(self) -> Any: ...
    @property
    def progress(self) -> Any: ...
    @property
    def run_state(self) -> Any: ...
    @property
    def checkpointed_blocks(self) -> list[str]: ...

    def fit(self, *args: Any, **kwargs: Any) -> Any: ...
    def lr_find(self, *args: Any, **kwargs: Any) -> Any: ...
    def set_lr(self, lr: float, optimizer: str | None = ..., *, source: str | None = ...) -> None: ...
