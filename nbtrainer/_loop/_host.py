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

    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._loop._run_state import RunState

__all__ = ["LoopHost", "LoopSettings", "LoopSteps", "ToolTrainer"]


class LoopSteps(Protocol):
    """How a batch becomes a loss, as the loop calls it (the Trainer's ``BatchSteps``): the batch protocol,
    ``compute_loss=``, the first batch's staged checks, evaluation, and a manual ``training_step=``."""

    @property
    def training_step_fn(self) -> Any: ...  # training_step=fn(step, batch) (manual optimization) or None

    def autocast(self) -> contextlib.AbstractContextManager[Any]: ...
    def default_compute(self) -> bool: ...  # (x, y) batches may take the inlined model(x) / criterion path
    def first_compute(self, batch: Any) -> tuple[Any, Any, Any]: ...  # staged, with clear errors
    def check_first_loss(self, loss: Any, outputs: Any, targets: Any) -> None: ...
    def compute(self, batch: Any) -> tuple[Any, Any, Any]: ...  # the batch protocol's (loss, outputs, targets)
    def evaluate(self, batches: Iterable[Any], *, prefix: str) -> dict[str, float]: ...


class LoopSettings(Protocol):
    """The settings the loop reads, each at the moment of use (a change between steps is seen at once): the
    Trainer's own public attributes."""

    @property
    def status(self) -> str: ...
    @property
    def grad_accum_steps(self) -> int: ...
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


class LoopHost(Protocol):
    """What :class:`~nbtrainer._loop._fit_loop.FitLoop` needs from its owner: the run's objects, three parts the
    owner holds (the run's state, its live control, its batch steps: the loop calls them directly) and its settings
    (:class:`LoopSettings`, read at the moment of use: ``grad_accum_steps`` or ``max_grad_norm`` may change between
    steps)."""

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
    def nonfinite(self) -> NonFiniteGuard: ...
    @property
    def params(self) -> list[torch.Tensor]: ...  # what the optimizer steps (clipping, the window rescale)

    # -- the owner's parts ------------------------------------------------------------------------------
    @property
    def run(self) -> RunState: ...  # position, training metrics, History, seconds before, a resumed RNG
    @property
    def live(self) -> LiveControl: ...  # requests from other threads, applied at a step boundary; deferred calls
    @property
    def steps(self) -> LoopSteps: ...

    # -- settings, read at the moment of use --------------------------------------------------------------
    @property
    def settings(self) -> LoopSettings: ...
    @property
    def scheduler_per_step(self) -> bool: ...

    def step_epoch_scheduler(self, logs: dict[str, Any]) -> None: ...


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
