"""The Trainer facade: one class (no mixins), its configuration checked up front, and the public verbs over the
parts it builds and owns.

The Trainer's state is declared once, at the top of the class: the configuration, and the parts it delegates to,
the run's progress (``nbtrainer._loop._run_state.RunState``), the batch steps (``_batch_steps``), the live control
(``nbtrainer._loop._control.LiveControl``), the model's setup (``nbtrainer._setup._model_setup``) and the memory budget
(``_memory_budget``). The verbs follow, by concept: running a fit (the loop is ``nbtrainer._loop._fit_loop``, driven
through ``_host.TrainerHost``), evaluation and prediction, checkpoints (their content is
``nbtrainer._resume._checkpoint_state``, their files ``_checkpoint_io``), and control (requests applied by
``LiveControl`` at a step boundary). This module is the one allowed past the 500-line rule
(``tests/test_architecture.py``): its length is the public API's docstrings and examples.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._batch import BatchSpec
from nbtrainer._data._loss import batch_loss
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._data._prefetch import check_data_options
from nbtrainer._dist._launch_monitor import launched_callbacks
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._history import History
from nbtrainer._events._progress import ProgressBar, progress_callback, start_progress
from nbtrainer._events._stream import CallbackList, Progress
from nbtrainer._loop import _oom
from nbtrainer._loop._closure import check_closure
from nbtrainer._loop._control import LiveControl, is_plateau, lr_parts, reference_lr
from nbtrainer._loop._fit_loop import FitLoop, _safe_len
from nbtrainer._loop._in_backward import check_in_backward
from nbtrainer._loop._metrics import MetricSet, collection_names
from nbtrainer._loop._nonfinite import NonFiniteGuard
from nbtrainer._loop._run_state import RunState
from nbtrainer._options import MemoryOptions, TrainerOptions, lora_settings, optimizer_kind
from nbtrainer._resume import _checkpoint_state as _state
from nbtrainer._resume import _continue
from nbtrainer._resume._full_state import full_model_state, load_weights, shards_parameters
from nbtrainer._runs._recorder import RunRecorder
from nbtrainer._setup._chunked_loss import check_chunked_loss
from nbtrainer._setup._model_setup import ModelSetup
from nbtrainer._setup._optim import move_optimizer_state
from nbtrainer._setup._optimizers import check_optimizers, check_schedulers
from nbtrainer._setup._precision import make_scaler, require_precision, resolve_device
from nbtrainer._setup._seed import seed_everything, set_deterministic
from nbtrainer._trainer import _validate
from nbtrainer._trainer._batch_steps import BatchSteps
from nbtrainer._trainer._interrupt import INTERRUPT_REASON, StopOnInterrupt, reraise_in_script, save_on_interrupt
from nbtrainer._trainer._loop_host import TrainerHost
from nbtrainer._trainer._memory_budget import MemoryBudget, check_budget

if TYPE_CHECKING:
    from torchmetrics import MetricCollection

    from nbtrainer._data._batch import BatchSpec
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList, Progress
    from nbtrainer._know._data_report import DataReport
    from nbtrainer._look._interpretation import Interpretation
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._options import TrainerOptions
    from nbtrainer._plan._result import MemoryPlan
    from nbtrainer._setup._model_setup import ModelSetup
    from nbtrainer._trainer._batch_steps import BatchSteps
    from nbtrainer._trainer._memory_budget import MemoryBudget

__all__ = ["Trainer"]


class Trainer:
    """Train any PyTorch model, headless or in a notebook.

    Args:
        model: the ``nn.Module``.
        criterion: ``loss = criterion(outputs, targets)``; ``None`` if the model returns ``.loss``. A criterion
            with ``bind_trainer(trainer) -> {name: metric}`` (``DistillationLoss``) is bound once the model is set
            up and its metrics are logged with the others.
        optimizer: an optimizer over the model's parameters; ``{"name": optimizer, ...}`` for several (one loss,
            each steps; or by name in ``training_step``; ``scheduler={"name": sched}``); or a name: ``"adamw"``,
            ``"adam"``, ``"sgd"``,
            ``"adafactor"`` (built over the trainable parameters, fused where the device has kernels; ``lr=``).
            ``"auto"``: AdamW, or with ``memory_budget_gb`` the kind its plan picks (8-bit, 4-bit, Adafactor).
            ``None`` (the default): a trainer that only evaluates and predicts (a frozen model, a PEFT
            adapter loaded for inference); ``fit`` and ``lr_find`` then raise.
        scheduler: any LR scheduler bound to ``optimizer`` (OneCycleLR: use :meth:`total_steps`).
        scheduler_interval: ``"step"`` (once per optimizer step, never when fp16 skipped the step) or
            ``"epoch"``. ``ReduceLROnPlateau`` always steps per epoch on ``scheduler_monitor``.
        scheduler_monitor: the log key ReduceLROnPlateau watches (default ``val_loss``, else ``loss``).
        metrics: ``{"acc": torchmetrics.Accuracy(...), "mae": callable(outputs, targets)}``, or a torchmetrics
            ``MetricCollection`` (its keys name the values). A metric that fails on structured outputs (a
            ``ModelOutput``, a tuple) gets their ``.logits`` (else the first tensor).
        callbacks: objects with any of the hooks in ``nbtrainer.EVENTS``.
        precision: ``"fp32"``, ``"fp16-mixed"`` or ``"bf16-mixed"`` (aliases ``"32"``, ``"16"``, ``"bf16"``...).
            ``None`` (the default): fp32, or with ``memory_budget_gb`` the precision its plan picks.
        grad_accum_steps: micro-batches per optimizer step.
        max_grad_norm: clip the global grad norm (after unscaling) once per optimizer step.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        seed: seed everything at the start of ``fit``; with ``lora=``, also the adapters' random init (so
            two Trainers built with one seed start from the same adapters).
        deterministic: deterministic algorithms and seeded data order.
        progress: ``True`` / ``"auto"``: a :class:`~nbtrainer.ProgressBar` that picks at run time (notebook
            bars, console bars on a terminal, plain epoch lines when the output is a file or pipe);
            ``"bars"`` or ``"lines"`` to force one; a ``ProgressBar(...)`` of your own; ``False``: none.
        num_inputs: how many leading elements of a tuple batch are model inputs (default all but the last;
            also turns off the unpacking of ``((x1, x2), y)``).
        target_keys: keys of a dict / Mapping / dataclass batch that hold targets; several: the criterion
            and metrics get a tuple of them in this order.
        compute_loss: ``fn(model, batch) -> loss | (loss, outputs, targets)`` overrides how a batch
            becomes a loss in fit and evaluate (subclasses can override :meth:`compute_loss` instead).
        predict_step: ``fn(model, batch) -> outputs`` overrides how :meth:`predict` gets a batch's outputs
            (or override :meth:`predict_step`). Without it, a customised ``compute_loss`` that returns
            ``(loss, outputs, targets)`` gives predict its outputs; otherwise the model is called on the batch.
        refresh_interval: seconds between reads of running values (progress, history, widget).
        timing_every: sample the step-time breakdown every n micro-batches (0: off).
        val_every_n_epochs: validate every n epochs.
        on_nonfinite: a NaN/inf training loss: ``"raise"`` (default; detected at the throttled read,
            no extra sync), ``"skip"`` the optimizer step of that window, or ``"stop"`` the fit
            (both: no extra sync under fp16, else one read per optimizer step; see ``_nonfinite``).
        lr: learning rate of an optimizer given by name (default: torch's default for it).
        activation_checkpointing: ``True`` (the model's own ``activation_checkpointing_enable()`` /
            ``gradient_checkpointing_enable()``, else its repeated blocks), an int k / a float share in (0, 1) of
            those blocks (evenly spaced) or a list of module types / names; :meth:`set_activation_checkpointing`.
        trainable / freeze: glob patterns of parameter names to train only / to freeze (``["head.*"]``);
            counts in :attr:`param_counts`.
        compile: ``torch.compile`` the model (``True``, a mode string or a dict of its options).
        channels_last: convert a conv net to ``torch.channels_last`` memory format.
        strategy: ``"auto"`` (DDP when launched by ``torchrun`` / :func:`nbtrainer.launch` with more than one
            process, else one device), ``"single"``, ``"ddp"``, ``"fsdp"`` (FSDP2: parameters, gradients and
            optimizer state sharded across ranks), or ``nbtrainer.DDP(...)`` / ``nbtrainer.FSDP(...)`` with
            options. Each rank uses its ``LOCAL_RANK`` GPU (or the CPU with gloo); see ``docs/distributed.md``.
        fast_fetch: fetch each batch of a ``DataLoader`` over in-memory data (``TensorDataset``, arrays,
            ``Subset`` of them, a dataset with ``__getitems__``; ``num_workers=0``, default collate) with one
            indexing call, same indices and order, bit-identical results. Anything else uses the loader as
            it is. ``False``: always the loader's own iterator.
        data_on_device: on CUDA, copy such a dataset to the GPU once when it fits in this fraction of the
            free device memory, and slice batches there; otherwise batches are gathered into pinned memory
            and copied on a side stream one step ahead. ``0``: never copy the dataset.
        quantize: ``"nf4"``, ``"nf4-dq"``, ``"fp4"`` or ``"int8"``: the ``nn.Linear`` (and GPT-2 ``Conv1D``) layers
            (but the output head and trainable ones) become frozen bitsandbytes layers, computing in the precision's
            dtype.
        lora: LoRA adapters through PEFT, base frozen: ``dict(r=8, alpha=16, dropout=0.05,
            target_modules="all-linear")`` or a ``peft.LoraConfig`` (with ``quantize=``: QLoRA). Give the optimizer
            by name with these two. Merge with :meth:`merge_lora`.
        save_base: with ``lora=`` / ``quantize=``, checkpoints also hold the frozen base (default: what trains,
            the optimizer and the loop state; a resume takes the base from the model it is given).
        offload_activations: saved activations wait in CPU memory (pinned on CUDA) for the backward.
        offload_optimizer: optimizer state and step in CPU RAM (CUDA only; torchao ``CPUOffloadOptimizer``).
        optimizer_in_backward: update each parameter as soon as its gradient is complete, inside backward,
            and free that gradient: saves about the trainable parameters' size in memory. Same weights as a
            plain step; refused with max_grad_norm, fp16-mixed, accumulation, DDP/FSDP (see ``_in_backward``).
        chunked_loss: a Hugging Face causal LM's training loss with the head and cross-entropy run ``True``
            (1024) or N tokens at a time under checkpointing, so its full logits never exist; the model's own
            loss otherwise (see ``_setup/_chunked_loss``).
        attention: the SDPA backend of the forward: ``"auto"``, ``"flash"``, ``"efficient"``, ``"cudnn"`` or
            ``"math"``, checked on this device and dtype up front (Hugging Face models switch to ``"sdpa"``).
        training_step: manual optimization (GANs, several updates per batch): ``fn(step, batch) -> {name: scalar
            tensor}`` with ``optimizer={"name": opt, ...}`` and no criterion; ``step.model``,
            ``step.backward(loss, optimizer="name")``, ``step.step("name")`` (see ``nbtrainer._loop._manual``).
        validation_step: with ``training_step``: ``fn(model, batch) -> {name: scalar tensor}``, what ``evaluate``
            and validation log (``val_`` + name).
        run_store: where each fit is recorded as a run (``nbtrainer.Runs``): a SQLite file (``"runs.db"``),
            ``None`` (``$NBTRAINER_RUNS`` if set, else this session's memory) or ``False`` (nothing).
        memory_budget_gb: keep the training step within this many GiB of device memory. At the first ``fit``,
            :func:`~nbtrainer.plan_memory` plans for its first batch on this device and the fastest row that fits
            is applied: precision, activation checkpointing, the optimizer kind (with ``optimizer="auto"``), and
            each batch split into micro-batches when the whole batch does not fit (same gradient). The switches you
            set yourself (a precision, checkpointing, an optimizer by name or instance, the step in backward...) are
            kept. One progress line says what was chosen; it is in the History's events, the run store and
            :attr:`memory_plan`. The peak of the first optimizer steps is measured; above the budget the next row
            is applied at the next step boundary (and said). Nothing fits: a ``ValueError`` before the first step.
            Not with ``quantize=`` / ``lora=`` / ``compile=`` / DDP (plan those with ``plan_memory``).
        check_data: check the data at the start of each fresh fit (:meth:`check_data`: duplicates, leaks between
            training and validation, NaN / Inf, scale, constant features, class balance), one progress line per
            finding; labels the model has no output for refuse the fit before its first step. ``True``: every
            item; an int: a seeded sample of that many items per split. A report made by :meth:`check_data` on
            the same loaders is reused (the panel checks before Start).

    Batch shapes (the same for fit, evaluate and predict; details in ``nbtrainer._data._batch``):

    ================================================  ==============================  ======================
    batch                                             model call                      targets
    ================================================  ==============================  ======================
    ``x`` or ``(x,)``                                 ``model(x)``                    none
    ``(x, y)`` / ``(x1, ..., xk, y)``                 ``model(x)`` / ``(x1..xk)``     ``y``
    ``(x1, ..., xk, y1, y2)``, ``num_inputs=k``       ``model(x1, ..., xk)``          ``(y1, y2)``
    ``((x1, x2), y)`` / ``((x1, x2), (y1, y2))``      ``model(x1, x2)``               ``y`` / ``(y1, y2)``
    ``({"a": a, "b": b}, y)``                         ``model(a=a, b=b)``             ``y``
    ``{"a": a, "labels": y}`` (any Mapping)           ``model(a=a)``                  ``y``
    the same with ``criterion=None``                  ``model(a=a, labels=y)``        ``y`` (metrics)
    a dataclass (fields ``a``, ``labels``)            like the dict of its fields     ``y``
    a namedtuple                                      like a tuple                    like a tuple
    ================================================  ==============================  ======================

    Target keys: ``target_keys=``, else the first of ``labels``, ``label``, ``targets``, ``target``, ``y``;
    several ``target_keys`` reach the criterion as a tuple in key order. Anything else: ``compute_loss=`` and
    ``predict_step=`` (or the methods of those names in a subclass).

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(3, 1)
        >>> trainer = Trainer(model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1),
        ...                   progress=False, seed=0)
        >>> data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
        >>> history = trainer.fit(data, epochs=3)
        >>> history.status, len(history.epochs)
        ('finished', 3)
    """

    # Trainers inside fit() in this process (weak: a trainer that is dropped leaves it).
    _active: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()

    # -- configuration (checked by __init__; the setters of _control change some between fits) --
    model: torch.nn.Module
    criterion: Callable[..., Any] | None
    optimizer: torch.optim.Optimizer | None
    scheduler: Any  # any LR scheduler (torch has no common base for ReduceLROnPlateau and the others)
    scheduler_interval: str
    scheduler_monitor: str | None
    precision: str
    device: torch.device
    strategy: Any  # placement (_dist): SingleDevice, DDP or FSDP (duck-typed: only the distributed ones gather)
    scaler: torch.amp.GradScaler | None
    grad_accum_steps: int
    micro_split: int  # each loader batch as this many forward / backward passes (memory_budget_gb's plan)
    options: TrainerOptions
    _budget: MemoryBudget | None  # memory_budget_gb= (nbtrainer._trainer._memory_budget)
    max_grad_norm: float | None
    optimizer_in_backward: bool  # each parameter updated inside backward (nbtrainer._loop._in_backward)
    seed: int | None
    deterministic: bool
    batch_spec: BatchSpec
    refresh_interval: float
    timing_every: int
    val_every_n_epochs: int
    non_blocking: bool
    fast_fetch: bool
    data_on_device: float
    _check_data: bool | int  # check_data= (nbtrainer._know._check.check_at_fit)
    _setup: ModelSetup
    _steps: BatchSteps  # how a batch becomes a loss / outputs, and evaluation (the overrides, validation metrics)
    _metric_spec: dict[str, Any]
    _params: list[torch.Tensor]

    # -- the run ----------------------------------------------------------------------------------
    callbacks: CallbackList
    progress: Progress
    status: str
    _run: RunState  # the run's progress across fits (loop position, metrics' state, History, the running loop)
    _live: LiveControl  # requests from any thread, applied at a step boundary; calls deferred past an event
    _nonfinite: NonFiniteGuard
    data_report: DataReport | None  # the last check of the data (check_data, or a fit with check_data=True)

    # -- read-only views of that state ------------------------------------------------------------
    @property
    def run_state(self) -> RunState:
        """The run's progress from one ``fit`` to the next (:class:`~nbtrainer._loop._run_state.RunState`): where
        the loop is (``loop_state``), the training metrics' running state, the seconds trained, the History being
        fed and, while a fit runs, its loop. What a checkpoint saves and a resume or ``fit_more`` continues.

        Example:
            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(3, 1), torch.nn.MSELoss(), "sgd", progress=False)
            >>> _ = trainer.fit([(torch.randn(4, 3), torch.randn(4, 1))] * 2, epochs=1)
            >>> trainer.run_state.loop_state.global_step, trainer.run_state.fitting
            (2, False)
        """
        return self._run

    @property
    def batch_steps(self) -> BatchSteps:
        """How this trainer turns a batch into a loss or outputs, and evaluates
        (:class:`~nbtrainer._trainer._batch_steps.BatchSteps`): the ``compute_loss=`` / ``predict_step=`` functions,
        the autocast and inference contexts, the validation metrics."""
        return self._steps

    @property
    def model_setup(self) -> ModelSetup:
        """What was done to the model before the first step (:class:`~nbtrainer._setup._model_setup.ModelSetup`):
        freezing, quantize / LoRA / offload (its ``savers``, which also decide what of the model a checkpoint
        holds), activation checkpointing, ``channels_last``, compile; ``describe()`` says it in one line."""
        return self._setup

    @property
    def history(self) -> History:
        """The History of the current (or last) fit: the object ``fit`` returns."""
        return self._run.history

    @history.setter
    def history(self, history: History) -> None:
        self._run.history = history

    @property
    def global_step(self) -> int:
        return self._run.loop_state.global_step

    @property
    def current_epoch(self) -> int:
        """1-based number of the epoch running (or last run)."""
        return self._run.loop_state.epoch + 1

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def has_validation(self) -> bool:
        return self._run.has_validation

    @property
    def lr(self) -> float:
        """The reference learning rate: OneCycle's ``max_lr``, else the base (initial) LR of group 0."""
        if self.optimizer is None:
            raise _validate.no_optimizer("lr")
        return reference_lr(self.optimizer)

    @property
    def lrs(self) -> dict[str, float]:
        """With several named optimizers (``optimizer={"name": opt}``): each one's reference LR; else empty."""
        children = getattr(self.optimizer, "optimizers", None) or {}
        return {name: reference_lr(opt) for name, opt in children.items()}

    @property
    def current_lr(self) -> float:
        if self.optimizer is None:
            raise _validate.no_optimizer("current_lr")
        return float(self.optimizer.param_groups[0]["lr"])

    def __init__(
        self,
        model: torch.nn.Module,
        criterion: Callable | None,
        optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer] | str | None = None,
        *,
        scheduler: Any = None,
        scheduler_interval: str = "step",
        scheduler_monitor: str | None = None,
        metrics: Mapping[str, Any] | MetricCollection | None = None,
        callbacks: Iterable[Any] = (),
        precision: str | None = None,
        grad_accum_steps: int = 1,
        max_grad_norm: float | None = None,
        device: str | torch.device = "auto",
        seed: int | None = None,
        deterministic: bool = False,
        progress: bool | str | ProgressBar = True,
        num_inputs: int | None = None,
        target_keys: Sequence[str] | str | None = None,
        compute_loss: Callable | None = None,
        predict_step: Callable | None = None,
        refresh_interval: float = 0.25,
        timing_every: int = 50,
        val_every_n_epochs: int = 1,
        non_blocking: bool = True,
        lr: float | None = None,
        activation_checkpointing: Any = False,
        trainable: Any = None,
        freeze: Any = None,
        compile: Any = False,
        channels_last: bool = False,
        on_nonfinite: str = "raise",
        strategy: Any = "auto",
        fast_fetch: bool = True,
        data_on_device: float = 0.5,
        quantize: str | None = None,
        lora: Any = None,
        save_base: bool = False,
        offload_activations: bool = False,
        offload_optimizer: bool = False,
        optimizer_in_backward: bool = False,
        chunked_loss: bool | int = False,
        attention: str = "auto",
        run_store: str | os.PathLike[str] | bool | None = None,
        memory_budget_gb: float | None = None,
        training_step: Callable | None = None,
        validation_step: Callable | None = None,
        check_data: bool | int = False,
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        precision_given = precision is not None  # memory_budget_gb keeps a precision given, else chooses
        precision = "fp32" if precision is None else precision
        auto_optimizer = isinstance(optimizer, str) and optimizer.strip().lower() == "auto"
        if auto_optimizer:  # AdamW, or the lower-memory kind memory_budget_gb's plan picks at the first fit
            optimizer = "adamw"
        if isinstance(optimizer, Mapping):  # several named optimizers, stepped as one (or by name in training_step)
            optimizer = check_optimizers(model, optimizer)
            if isinstance(scheduler, Mapping):
                scheduler = check_schedulers(scheduler, optimizer)
        elif isinstance(scheduler, Mapping):
            raise TypeError("scheduler={...} names schedulers of named optimizers: pass optimizer={'name': opt, ...}.")
        requested_optimizer = optimizer  # a name is built later with quantize= / lora=
        _validate.check_args(
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            metrics=metrics,
            callbacks=callbacks,
            device=device,
            seed=seed,
            refresh_interval=refresh_interval,
            on_nonfinite=on_nonfinite,
        )
        callbacks = list(callbacks)  # read more than once (checks, then the CallbackList)
        if criterion is not None and not callable(criterion):
            raise TypeError(f"criterion must be callable (e.g. nn.CrossEntropyLoss()), got {type(criterion).__name__}.")
        # Where the model runs: one device, or DDP under torchrun (nbtrainer._dist._ddp). First, so that
        # under DDP nothing touches a CUDA device before this rank's device is set.
        from nbtrainer._dist._fsdp import make_strategy  # DDP / FSDP machinery only once a Trainer is built

        self.strategy = make_strategy(strategy, device, seed)
        device = self.strategy.device
        _validate.check_manual(
            training_step,
            validation_step,
            criterion=criterion,
            compute_loss=compute_loss,
            optimizer=optimizer,
            metrics=metrics,
            strategy=self.strategy,
            options={
                "optimizer_in_backward": optimizer_in_backward,
                "chunked_loss": chunked_loss,
                "memory_budget_gb": memory_budget_gb,
            },
        )
        budget = check_budget(  # None without memory_budget_gb; the model as given is kept (on meta) for the plan
            memory_budget_gb,
            model=model,
            quantize=quantize,
            lora=lora,
            compile=compile,
            strategy=self.strategy,
            auto_optimizer=auto_optimizer,
            lr=lr,
            keep_precision=precision_given,
        )
        # Strategy options (nbtrainer._setup._model_setup): checked, and a named optimizer built, now; applied last.
        self._setup = ModelSetup(
            model,
            optimizer,
            lr=lr,
            device=device,
            trainable=trainable,
            freeze=freeze,
            activation_checkpointing=activation_checkpointing,
            compile=compile,
            channels_last=channels_last,
            precision=precision,
            quantize=quantize,
            lora=lora,
            save_base=save_base,
            offload_activations=offload_activations,
            offload_optimizer=offload_optimizer,
            attention=attention,
        )
        steps = {"scheduler_interval": scheduler_interval, "val_every_n_epochs": val_every_n_epochs}
        steps |= {"grad_accum_steps": grad_accum_steps, "max_grad_norm": max_grad_norm, "predict_step": predict_step}
        steps |= {"optimizer_in_backward": optimizer_in_backward}
        optimizer = _validate.check_optimization(model, self._setup.optimizer, scheduler, **steps)
        check_data_options(fast_fetch, data_on_device)
        self.device = resolve_device(device)
        self.precision = require_precision(precision, self.device)
        self.model = model
        self.criterion = criterion
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scheduler_interval = scheduler_interval
        self.scheduler_monitor = scheduler_monitor
        self.grad_accum_steps = grad_accum_steps
        self.max_grad_norm = max_grad_norm
        self.optimizer_in_backward = optimizer_in_backward
        if optimizer_in_backward:
            check_in_backward(
                optimizer=optimizer if optimizer is not None else requested_optimizer,
                grad_accum_steps=grad_accum_steps,
                max_grad_norm=max_grad_norm,
                precision=self.precision,
                distributed=bool(self.strategy.distributed),
                offload_optimizer=offload_optimizer,
                callbacks=callbacks,
            )
        check_closure(
            optimizer,
            grad_accum_steps=grad_accum_steps,
            precision=self.precision,
            optimizer_in_backward=optimizer_in_backward,
            on_nonfinite=on_nonfinite,
            memory_budget=memory_budget_gb is not None,
        )
        savers = self._setup.savers
        # the memory switches, stored once and validated (precision resolved, quantize / attention normalized)
        self.options = TrainerOptions(
            memory=MemoryOptions(
                precision=self.precision,
                activation_checkpointing=activation_checkpointing,
                optimizer=optimizer_kind(requested_optimizer),
                optimizer_in_backward=optimizer_in_backward,
                chunked_loss=chunked_loss,
                quantize=savers.quantize,
                lora=lora_settings(lora, savers.lora_config),
                offload_activations=savers.offload_activations,
                offload_optimizer=savers.offload_optimizer,
                attention=savers.attention,
            )
        )
        self.micro_split = 1  # each loader batch as this many forward / backward passes (memory_budget_gb's plan)
        self.seed = seed
        self.deterministic = deterministic
        self.batch_spec = BatchSpec(
            num_inputs=num_inputs, target_keys=target_keys, pass_targets_to_model=criterion is None
        )
        self.refresh_interval = float(refresh_interval)
        self.timing_every = int(timing_every)
        self.val_every_n_epochs = val_every_n_epochs
        self.non_blocking = non_blocking and self.device.type == "cuda"
        self.fast_fetch = fast_fetch
        self.data_on_device = float(data_on_device)
        self.scaler = make_scaler(self.precision, self.device)
        self._metric_spec = dict((metrics or {}).items())  # a MetricCollection: its members by key
        self._run = RunState(MetricSet(self._metric_spec, self.device))
        val_metrics = self._run.train_metrics.clone(self.device)
        chunked = check_chunked_loss(
            chunked_loss,
            model=model,
            criterion=criterion,
            compute_loss=compute_loss,
            metrics=self._metric_spec,
            distributed=bool(self.strategy.distributed),
        )
        self._steps = BatchSteps(
            self,
            compute_loss=compute_loss,
            predict_step=predict_step,
            val_metrics=val_metrics,
            chunked_loss=chunked,
            training_step=training_step,
            validation_step=validation_step,
        )
        user_callbacks = list(callbacks)
        if progress is not False and progress is not None:
            user_callbacks.append(progress_callback(progress))
        # last: it opens (and checks) the store now, before any step, and callback indices (checkpoint keys) keep
        self._run_recorder = RunRecorder(run_store)
        self.run_id: str | None = None  # the id of this trainer's run in the store (nbtrainer.Runs), set by fit
        # after it: nbtrainer.launch(view=...)'s progress/stop channel (launched ranks only; no state, no index)
        self.callbacks = CallbackList([self._run.recorder, *user_callbacks, self._run_recorder, *launched_callbacks()])
        self.progress = Progress()
        self.status = "idle"
        from nbtrainer._know._option import check_option

        self._check_data = check_option(check_data)
        self.data_report: DataReport | None = None  # the last check_data's (a fit with check_data=True reuses it)
        self._live = LiveControl(self)
        self._nonfinite = NonFiniteGuard(on_nonfinite)
        self._params = [p for g in optimizer.param_groups for p in g["params"]] if optimizer is not None else []
        # freeze, quantize, lora (its adapters' init from seed=), channels_last, checkpointing, compile
        self.model = self._setup.apply(seed=seed)
        if self._setup.optimizer is not self.optimizer:  # named, built once quantize= / lora= changed the model
            self.optimizer = self._setup.optimizer
            self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        attach = getattr(self.strategy, "attach", None)
        if attach is not None:  # FSDP: shard the model now, rebind the optimizer to the sharded parameters
            attach(self)
            if self.optimizer is not None:  # what the optimizer steps now: the sharded parameters
                self._params = [p for g in self.optimizer.param_groups for p in g["params"]]
        # A criterion that needs the trainer (DistillationLoss: its teacher sees the model's inputs, on this device)
        # binds itself once the model is final and may bring metrics (its loss parts); the user's win a name clash.
        self._budget = MemoryBudget(self, budget) if budget is not None else None
        bind = getattr(criterion, "bind_trainer", None)
        if callable(bind):
            extra = {k: v for k, v in bind(self).items() if k not in self._metric_spec}
            if extra:
                self._metric_spec.update(extra)
                self._run.train_metrics = MetricSet(self._metric_spec, self.device)
                self._steps.val_metrics = self._run.train_metrics.clone(self.device)

    # -- the trainers of this process, log keys, repr ------------------------------------------------
    @classmethod
    def active(cls) -> list[Trainer]:
        """Trainers currently inside ``fit`` in this process (for ``%nbtrainer status/stop``)."""
        return list(cls._active)

    @property
    def run_recorder(self) -> RunRecorder:
        """The callback that records each fit of this trainer as a run in the run store (``run_store=``,
        read with :class:`nbtrainer.Runs`); the run's id is :attr:`run_id`."""
        return self._run_recorder

    @property
    def memory_plan(self) -> MemoryPlan | None:
        """With ``memory_budget_gb``: the :class:`~nbtrainer.MemoryPlan` made at the first fit (its ``best`` row is
        what was applied), else None."""
        return self._budget.plan if self._budget is not None else None

    @property
    def _scheduler_per_step(self) -> bool:
        return self.scheduler_interval == "step" and not is_plateau(self.scheduler)

    def merge_lora(self) -> torch.nn.Module:
        """A plain copy of the model for inference: LoRA adapters merged into full-precision weights (a
        quantized base dequantized first), no PEFT wrapper; this trainer's model is unchanged.

        Example:
            >>> # trainer = Trainer(model, None, "adamw", quantize="nf4", lora=dict(r=8)); trainer.fit(...)
            >>> # merged = trainer.merge_lora()
        """
        return self._setup.savers.merge_lora(self.model)

    def expected_log_keys(self) -> set[str]:
        names = set(self._run.train_metrics.names) | collection_names(self._metric_spec)
        keys = {"epoch", "lr", "loss", "time", "samples_per_s", "steps", "skipped_steps"} | names
        if self._run.has_validation:
            keys |= {"val_loss"} | {f"val_{n}" for n in names}
        return keys

    def __repr__(self) -> str:
        return (
            f"Trainer(model={type(unwrap_model(self.model)).__name__}, device={self.device}, "
            f"precision={self.precision!r}, grad_accum_steps={self.grad_accum_steps}, status={self.status!r})"
        )

    # == running a fit =======================================================================================
    def total_steps(self, train_loader: Any, epochs: int, *, batch_size: int | None = None) -> int:
        """Optimizer steps of ``fit(train_loader, epochs=epochs)``: ``ceil(batches / accum) * epochs``.

        ``train_loader`` may be arrays, as in :meth:`fit` (then with their ``batch_size``).

        Example:
            >>> # OneCycleLR(optimizer, max_lr=1e-2, total_steps=trainer.total_steps(loader, epochs=5))
        """
        train_loader = _arrays.as_loader(train_loader, batch_size=batch_size)
        n = _safe_len(self.strategy.prepare_loader(train_loader, train=True))  # this rank's share under DDP
        if n is None:
            raise TypeError("The loader has no len(); pass total_steps to your scheduler yourself.")
        return math.ceil(n / self.grad_accum_steps) * epochs

    # -- the three verbs -----------------------------------------------------------------------
    def fit(
        self,
        data: Any = None,
        val_loader: Any = None,
        epochs: int = 1,
        *,
        train_loader: Any = None,
        val_data: Any = None,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        max_steps: int | None = None,
        resume_from: str | None = None,
        profiler: Any = None,
    ) -> History:
        """Train; returns the :class:`History` (also when stopped; re-raises errors).

        Ctrl-C stops at the next optimizer step (a second one at once) and writes ``last.ckpt`` there when a
        ``ModelCheckpoint`` has ``save_on_interrupt`` (on with ``save_last``). Then, once the run is closed, a
        notebook gets the History marked ``interrupted``; a script gets the ``KeyboardInterrupt`` back (exit 130).

        Args:
            data: any iterable of batches (DataLoader, list...), or arrays like Keras: a tuple ``(x, y)`` /
                ``(x1, x2, y)`` or a dict of tensors or NumPy arrays, or one array, with ``batch_size``
                (NumPy float64 becomes float32). Arrays are batched by a seeded, resumable DataLoader.
            val_loader: validated every ``val_every_n_epochs``; keys get a ``val_`` prefix.
            epochs: total epochs (a resumed fit continues up to this number; to train N *more* epochs
                with a fresh LR schedule, use :meth:`fit_more`).
            train_loader: the same as ``data``, by its former name (``fit(train_loader=loader)`` keeps working).
            val_data: validation arrays (or a loader); the same ``batch_size``, never shuffled.
            batch_size: the batch size for array data (required with arrays, refused with loaders).
            shuffle: shuffle training arrays each epoch (default True).
            max_steps: end after this many optimizer steps in total (counted from the start of the run,
                also across resumes). Reaching it is a planned end: status ``"finished"``, with
                ``history.stop_reason`` saying ``max_steps=N reached``. ``Progress.epochs`` and the epoch
                bar count the epochs it reaches; an epoch it cuts short has its steps in ``history.steps``
                but no row in ``history.epochs`` (so a resume continues it exactly).
            resume_from: a checkpoint path or ``"last"`` (the ``last.ckpt`` of a ModelCheckpoint callback);
                ``"last-if-exists"`` (alias ``"auto"``, for preemptible jobs): that ``last.ckpt`` when there is
                one, else a fresh start, said in one progress line and a ``resume_from`` event. Refused before
                anything is loaded: a checkpoint already past ``epochs`` (use :meth:`fit_more` for more
                epochs) and a saved OneCycleLR too short for ``epochs``.
            profiler: a ``torch.profiler.profile``; phases get ``nbt.*`` ranges and ``step()`` is called.

        Example:
            >>> import torch
            >>> model = torch.nn.Linear(3, 2)
            >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", progress=False, seed=0)
            >>> x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
            >>> history = trainer.fit((x, y), val_data=(x[:16], y[:16]), batch_size=16, epochs=2)
            >>> len(history.epochs), "val_loss" in history.epochs[-1]
            (2, True)
        """
        if self.optimizer is None:
            raise _validate.no_optimizer("fit")
        if train_loader is not None and data is not None:
            raise TypeError("fit() got the training data twice (data and train_loader=): pass it once.")
        data = train_loader if data is None else data
        if data is None:
            raise TypeError("fit() needs training data: a DataLoader or list of batches, or arrays with batch_size=.")
        train_loader, val_loader = _arrays.fit_loaders(
            data, val_loader, val_data=val_data, batch_size=batch_size, shuffle=shuffle
        )
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
            raise ValueError(f"epochs must be an int >= 1, got {epochs!r}.")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be an int >= 1 or None, got {max_steps!r}.")
        run = self._run
        if run.fitting:
            raise RuntimeError(
                "This trainer is already fitting (in another thread?). Call request_stop() "
                "and wait for it to end before starting another fit."
            )
        n = _safe_len(train_loader)
        if n == 0:
            raise ValueError("train_loader is empty (len 0): check the dataset size, batch_size and drop_last.")
        if val_loader is not None and _safe_len(val_loader) == 0:
            raise ValueError("val_loader is empty (len 0): pass None to skip validation or fix the dataset.")
        run.has_validation = val_loader is not None
        _validate.check_fit(self, train_loader, val_loader, epochs, max_steps)
        if self._budget is not None:  # planned for the first batch; nothing fits: a ValueError before any step
            self._budget.prepare(train_loader)
        control = self._live.requests
        control.reset()
        self._nonfinite.reset()
        plan = _continue.Plan(train_loader, epochs, max_steps)
        resume_note: tuple[str, str] | None = None
        if isinstance(resume_from, str) and resume_from in _continue.IF_EXISTS:
            requested = resume_from
            resume_from, note = _continue.resolve_if_exists(self, resume_from)
            resume_note = (requested, note)
        if resume_from is not None:
            _continue.resume_fit(self, resume_from, plan)  # refuses a saved schedule too short for this fit
        else:
            _continue.check_schedule(self, plan)  # e.g. a OneCycleLR a previous fit used up
            if self.seed is not None:
                seed_everything(self.seed)
            run.start_fresh()  # each fit gets its own History (the returned object)
        if self.deterministic:
            set_deterministic(True)
        self.model = self.strategy.setup_model(self.model)
        move_optimizer_state(self.optimizer, self.device)
        train_loader = self.strategy.prepare_loader(train_loader, train=True)
        if val_loader is not None:
            val_loader = self.strategy.prepare_loader(val_loader, train=False)
        n = _safe_len(train_loader)  # this rank's share under DDP
        self.progress = start_progress(run.loop_state, n, self.grad_accum_steps, epochs, max_steps)
        loop = FitLoop(TrainerHost(self), train_loader, val_loader, epochs, max_steps, profiler)
        run.loop, run.fit_thread = loop, threading.get_ident()
        self._active.add(self)
        self.status = self.history.status = "running"
        self.history.stop_reason = None
        # Ctrl-C: the first one stops at the next optimizer step (_interrupt), a second one raises at once
        ctrl_c = StopOnInterrupt(control, enabled=not self.strategy.distributed)
        interrupted: BaseException | None = None
        try:
            # Hugging Face models build no key/value cache while training (nothing reads it; it only costs memory)
            with ctrl_c, no_cache(self.model):
                self.callbacks.call("on_fit_start", trainer=self)
                if self._budget is not None:  # what the plan chose (one progress line), then measure the first steps
                    self._budget.start()
                if resume_from is None and self._check_data:  # labels past the outputs: refused before any step
                    from nbtrainer._know._check import check_at_fit

                    check_at_fit(self, self._check_data, train_loader, val_loader)
                if resume_note is not None:  # say whether it resumed (one line in the progress, an event)
                    st = run.loop_state
                    event = {"step": st.global_step, "epoch": st.epoch + 1, "kind": "resume_from"}
                    self.callbacks.call(
                        "on_control", trainer=self, event={**event, "old": resume_note[0], "new": resume_note[1]}
                    )
                if val_loader is not None and resume_from is None:
                    # its first batch, now, under restored RNG; after on_fit_start, so a stateful compute_loss
                    # (reset by its callbacks) never sees a batch before the fit has started
                    _validate.check_val_loader(self, val_loader)
                loop.run()
            st, reason = run.loop_state, control.stop_reason
            completed = st.epoch_complete and st.epoch + 1 >= epochs
            at_max_steps = (reason or "").startswith("max_steps")
            # A stop that lands after the last epoch (EarlyStopping firing at epoch N of N) changed nothing:
            # a normal finish, with no reason that would read as if the run had been cut short.
            if reason and (at_max_steps or not completed):
                self.history.stop_reason = reason
            if ctrl_c.received and not completed:
                self.status = "interrupted"
                save_on_interrupt(self)
            elif control.stop_requested and not completed and not at_max_steps:
                self.status = "stopped"
            else:
                self.status = "finished"
        except KeyboardInterrupt as exc:
            # Ctrl-C raised inside a step (a second Ctrl-C, or no handler could be installed): drop the
            # half-accumulated window; last.ckpt only when the loop was between optimizer steps.
            self.optimizer.zero_grad(set_to_none=True)
            self.status = "interrupted"
            self.history.stop_reason = INTERRUPT_REASON
            interrupted = exc
            if loop.at_step_boundary() and not self.strategy.distributed:
                save_on_interrupt(self)
        except BaseException as exc:
            self.status = "failed"
            self.history.stop_reason = f"{type(exc).__name__}: {exc}"
            self.history.status = "failed"
            self.optimizer.zero_grad(set_to_none=True)
            _oom.handle(self, exc, "fit")  # out of memory: free the step's tensors, advice in the message
            try:
                self.callbacks.call("on_exception", trainer=self, exception=exc)
            finally:
                self._end_fit()
            raise
        self._end_fit()
        if interrupted is not None or ctrl_c.received:
            try:
                reraise_in_script(interrupted)  # a script stops (exit 130); a notebook gets the History
            finally:
                interrupted = None  # no frame holds the exception it raises
        return self.history

    def fit_more(
        self,
        train_loader: Iterable,
        val_loader: Iterable | None = None,
        *,
        epochs: int,
        resume_from: str | None = None,
        scheduler: str | Callable[[torch.optim.Optimizer, int], Any] | None = "keep",
        max_steps: int | None = None,
        profiler: Any = None,
    ) -> History:
        """Continue a run for ``epochs`` more epochs: after a finished or stopped ``fit`` of this trainer, or
        from a checkpoint (``resume_from=path | "last"``), optionally with a fresh LR schedule for them.

        Epoch numbers, the global step and the History continue (the History gets a ``fit_more`` event
        where the extension starts); a run stopped mid-epoch first finishes that epoch, which counts as
        the first of the ``epochs`` more.

        Args:
            train_loader / val_loader: as for :meth:`fit`.
            epochs: how many epochs *more* (the run ends at epochs done + ``epochs``).
            resume_from: a checkpoint of the run to continue (default: this trainer's own state).
            scheduler: ``"keep"`` (default) continues the run's scheduler, refused before any step when it
                cannot cover the extension (a OneCycleLR ends where it was built to end); a function
                ``fn(optimizer, total_steps) -> scheduler`` builds a fresh one for the extension, called
                after the state is loaded with the extension's optimizer steps (epochs when
                ``scheduler_interval="epoch"``) and the optimizer's LRs back at the run's reference LR
                (OneCycle's ``max_lr``, else where the old schedule started); ``None``: no schedule, that
                reference LR constant.
            max_steps: optimizer steps of the extension at most.
            profiler: as for :meth:`fit`.

        Example:
            >>> import torch
            >>> from torch.optim.lr_scheduler import OneCycleLR
            >>> model = torch.nn.Linear(3, 1)
            >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
            >>> trainer = Trainer(model, torch.nn.MSELoss(), opt, progress=False, seed=0)
            >>> trainer.set_scheduler(OneCycleLR(opt, max_lr=0.1, total_steps=trainer.total_steps(data, 2)))
            >>> len(trainer.fit(data, epochs=2))
            2
            >>> more = trainer.fit_more(data, epochs=3,  # epochs 3-5, on a fresh one-cycle of their own
            ...     scheduler=lambda optimizer, steps: OneCycleLR(optimizer, max_lr=0.05, total_steps=steps))
            >>> [row["epoch"] for row in more], more.status
            ([1, 2, 3, 4, 5], 'finished')
        """
        return _continue.fit_more(
            self,
            train_loader,
            val_loader,
            epochs=epochs,
            resume_from=resume_from,
            scheduler=scheduler,
            max_steps=max_steps,
            profiler=profiler,
        )

    def _end_fit(self) -> None:
        run = self._run
        if run.loop is not None:
            try:
                run.loop.flush()
            except Exception:
                pass
            run.elapsed_before += run.loop.fit_elapsed()
            run.loop.read_memory()  # the last window (validation, the final steps) counts in the fit's peak
        self.history.status = self.status
        self.progress.status = self.status
        self._live.drop_deferred()
        try:
            self.callbacks.call("on_fit_end", trainer=self, history=self.history)
        finally:
            run.loop = run.fit_thread = None  # drop references to batches/outputs held by the loop
            self._active.discard(self)
            self.strategy.barrier()

    # == evaluation and prediction ===========================================================================
    @_oom.on_oom("evaluate")
    def evaluate(self, loader: Any, *, prefix: str = "val_", batch_size: int | None = None) -> dict[str, float]:
        """Loss and metrics over ``loader`` (sample-weighted), keys prefixed (``val_loss``, ``val_acc``).

        Runs in eval mode under ``torch.inference_mode`` and the trainer's precision; needs no optimizer.
        Fires ``on_validation_start`` / ``on_validation_end(logs)``, as the validation inside :meth:`fit` does.
        ``loader`` may be arrays as in :meth:`fit` (``batch_size`` default 256).

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> model = torch.nn.Linear(3, 2)
            >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False)  # evaluation only
            >>> sorted(trainer.evaluate([(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]))
            ['val_loss']
        """
        loader = _arrays.eval_loader(loader, batch_size, name="evaluate() loader")
        if _safe_len(loader) == 0:
            raise ValueError("The evaluation loader is empty (len 0).")
        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        # the same events as fit's validation: a stateful compute_loss resets its state on them
        self.callbacks.call("on_validation_start", trainer=self)
        batches = self._batches(self.strategy.prepare_loader(loader, train=False))
        logs = self._steps.evaluate(batches, prefix=prefix)
        self.callbacks.call("on_validation_end", trainer=self, logs=logs)
        return logs

    @_oom.on_oom("predict")
    def predict(
        self,
        loader: Any,
        *,
        batch_size: int | None = None,
        per_batch: bool = False,
        pad_index: float = -100,
        keep_dtype: bool = False,
        keep: Iterable[str] | str = (),
        to_cpu: bool = True,
    ) -> Any:
        """Model outputs for the whole loader, concatenated along the batch dimension, structure kept.

        Outputs come from ``predict_step=`` / :meth:`predict_step` (see the class docstring for the rule
        when only ``compute_loss`` is customised). Runs in eval mode under ``torch.no_grad`` and the
        trainer's precision.

        Args:
            loader: any iterable of batches (targets, if present, are not needed by the default step), or
                arrays as in :meth:`fit` (``predict(x)`` for inputs only; ``batch_size`` default 256).
            batch_size: the batch size when ``loader`` is arrays.
            per_batch: return a list with each batch's outputs instead of concatenating them.
            pad_index: fills the dimensions that vary between batches (sequence length under dynamic
                padding) when concatenating, like Hugging Face's Trainer (-100).
            keep_dtype: keep autocast's bfloat16 / float16 outputs; by default they come back as float32
                (so ``.numpy()`` works under ``precision="bf16-mixed"``).
            keep: entries of mapping / ``ModelOutput`` outputs to keep that are left out by default because
                they grow with the data set: ``"loss"`` (one per batch), ``"cache"`` (alias
                ``"past_key_values"``: every cache, whatever it is called, see ``nbtrainer._data._predict_collect``;
                Hugging Face models then also run with ``use_cache=False``), ``"hidden_states"``, ``"attentions"``
                (with their encoder/decoder/cross variants).
            to_cpu: move each batch's outputs to the CPU as they come (device memory stays bounded);
                ``False`` keeps them on the trainer's device.

        Returns:
            A tensor, or the model's structure (tuple, dict, ``ModelOutput``, dataclass) of concatenated
            tensors (only tensors whose first dimension is the batch's size; others, such as an LSTM's
            ``(h, c)``, as a list per batch); a list per batch with ``per_batch=True``.

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> trainer = Trainer(torch.nn.Linear(3, 2), None, progress=False)  # no optimizer: predict only
            >>> out = trainer.predict([torch.randn(4, 3), torch.randn(2, 3)])
            >>> tuple(out.shape), out.dtype
            ((6, 2), torch.float32)
        """
        from nbtrainer._data._predict_collect import run_predict

        loader = self._batches(_arrays.eval_loader(loader, batch_size, name="predict() loader"))
        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        return run_predict(
            self,
            loader,
            per_batch=per_batch,
            pad_index=pad_index,
            keep_dtype=keep_dtype,
            keep=keep,
            to_cpu=to_cpu,
        )

    def interpret(
        self,
        loader: Any,
        *,
        max_items: int | None = None,
        loss_per_item: Callable[[Any, Any], torch.Tensor] | None = None,
        classes: Sequence[Any] | None = None,
        decode: Any = None,
        feature_names: Sequence[str] | None = None,
        batch_size: int | None = None,
    ) -> Interpretation:
        """Error analysis over ``loader`` (arrays too): one streamed pass keeping each item's loss (the criterion
        on that item alone; ``loss_per_item=fn(outputs, targets)`` where it has no ``reduction="none"``),
        prediction, target and dataset index, never its inputs; the model, its mode and the RNG are left as they
        were. ``classes`` names the classes, ``decode`` (a function or tokenizer) and ``feature_names`` show
        inputs in :meth:`Interpretation.show <nbtrainer.Interpretation.show>` (details: ``nbtrainer._look``).

        Example:
            >>> # interp = trainer.interpret(val_loader); interp.top_losses(9); interp.confusion_matrix(); interp
        """
        from nbtrainer._look._interpret import interpret

        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        options = {"loss_per_item": loss_per_item, "decode": decode, "feature_names": feature_names}
        return interpret(self, loader, max_items=max_items, classes=classes, batch_size=batch_size, **options)

    def check_data(
        self, train_loader: Any, val_loader: Any = None, *, max_items: int | None = None, batch_size: int | None = None
    ) -> DataReport:
        """Check the data before training: one streamed pass per split (memory: some bytes per item, never the
        items), the run's random generators and the model left as they were. Finds exact duplicates inside a split
        and between training and validation (a leak), NaN / Inf in inputs or targets (which field, feature or
        channel, how many items), inputs far from normalized and constant features, class counts and imbalance,
        labels outside the model's outputs (run once on the first batch) and validation classes that training
        lacks. Each finding is a :class:`~nbtrainer._know._data_report.DataProblem` (``kind``, ``message``,
        ``advice``, ``data`` with the dataset indices concerned) in ``report.problems``. ``max_items``: a seeded
        sample of that many items per split (said in ``report.notes``). Arrays are read with ``batch_size``
        (default 256). Nothing is changed: clean with ``nbtrainer.DataMap().cleaned`` or ``CleanedDataset``.

        Example:
            >>> import torch
            >>> model = torch.nn.Linear(4, 3)
            >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
            >>> x, y = torch.randn(100, 4) * 1000, torch.randint(0, 3, (100,))
            >>> sorted(p.kind for p in trainer.check_data((x, y)).problems)
            ['scale']
        """
        from nbtrainer._know._check import check_data

        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        self.data_report = check_data(self, train_loader, val_loader, max_items=max_items, batch_size=batch_size)
        return self.data_report

    def show_batch(self, loader: Any, n: int = 16, *, decode: Any = None, **options: Any) -> Any:
        """The first ``n`` items of ``loader``'s first batch as the model receives them (``nbtrainer.show_batch``),
        split by this trainer's batch protocol (``num_inputs=``, ``target_keys=``).

        Example:
            >>> # trainer.show_batch(train_loader, 8, decode=tokenizer.decode)
        """
        from nbtrainer._know._show_batch import show_batch

        return show_batch(loader, n, decode=decode, spec=self.batch_spec, **options)

    def _batches(self, loader: Any) -> Any:
        """``loader``'s batches by the fastest equivalent path (``_prefetch``); one pass of evaluate or
        predict does not copy the dataset to the device (``fraction=0``)."""
        from nbtrainer._data._prefetch import DataPath

        return DataPath(loader, device=self.device, enabled=self.fast_fetch, fraction=0.0)

    # -- how a batch becomes a loss / outputs ----------------------------------------------------
    def compute_loss(self, batch: Any) -> tuple[torch.Tensor | None, Any, Any]:
        """Override in a subclass to change how a batch becomes ``(loss, outputs, targets)``.

        The default splits the batch by the batch protocol (class docstring), calls the model and the
        criterion (or takes the model's ``.loss`` when ``criterion=None``).
        """
        return batch_loss(self.model, batch, spec=self.batch_spec, criterion=self.criterion)

    def predict_step(self, batch: Any) -> Any:
        """A batch's outputs for :meth:`predict`; override in a subclass (or pass ``predict_step=``).

        The default calls the model on the batch's inputs, split by the batch protocol.

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> class Probabilities(Trainer):
            ...     def predict_step(self, batch):
            ...         return self.model(batch[0]).softmax(-1)
            >>> trainer = Probabilities(torch.nn.Linear(3, 2), None, progress=False)
            >>> trainer.predict([(torch.randn(4, 3), torch.zeros(4))]).sum(1).allclose(torch.ones(4))
            True
        """
        args, kwargs, _ = self.batch_spec.split(batch)
        return self.model(*args, **kwargs)

    # == checkpoints =========================================================================================
    def save_checkpoint(self, path: str, *, sharded: bool = False) -> str:
        """Write a full checkpoint atomically (from any thread: applied at the next step boundary).

        ``sharded=True`` (FSDP2 only) writes a directory of each rank's shards instead of gathering the full
        state to rank 0; every rank must call it, and it resumes on the same number of processes."""
        fit_thread = self._run.fit_thread
        if fit_thread is not None and threading.get_ident() != fit_thread:
            return self._live.requests.submit(lambda: self.save_checkpoint(path, sharded=sharded)).result()
        if self.optimizer is None:
            raise _validate.no_optimizer(
                "save_checkpoint", " To save the weights alone: torch.save(trainer.model_state_dict(), path)."
            )
        return _state.save_trainer_checkpoint(self, path, sharded=sharded)

    def rollback(self, path: str = "last") -> str:
        """Go back to a checkpoint and train on from there: model, optimizer, scheduler, scaler and the loop's
        position are restored at a step boundary (the epoch's data order replayed up to the saved batch), and the
        running fit continues from that position. Between fits, the state is loaded in place (``fit_more`` goes on
        from it). Returns the checkpoint's path.

        ``path``: ``"last"`` (the ``last.ckpt`` of a ``ModelCheckpoint``) or a file. From another thread the fit
        must be paused first (:meth:`pause`, then ``rollback``, then :meth:`resume`); the panel's health card does
        that. Refused up front: no checkpoint to roll back to, a running fit that is not paused, DDP / FSDP.

        Example:
            >>> # trainer = Trainer(..., callbacks=[ModelCheckpoint("ckpt", save_last=True, every_n_steps=200)])
            >>> # trainer.pause(); trainer.rollback(); trainer.set_lr(trainer.lr / 3); trainer.resume()
        """
        from nbtrainer._resume._rollback import rollback

        return rollback(self, path, self._live)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain data (loads with ``weights_only=True``)."""
        return _state.trainer_state_dict(self)

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        _state.load_trainer_state(self, checkpoint)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights (under FSDP: gathered in full, on the CPU; call it on every rank)."""
        if shards_parameters(self.strategy):
            return full_model_state(self.model)
        return unwrap_model(self.model).state_dict()

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if shards_parameters(self.strategy):  # FSDP: each rank keeps its shard
            load_weights(self, state, None)
        else:
            unwrap_model(self.model).load_state_dict(state)

    # == control from any thread, and settings between fits ==================================================
    # -- control from any thread ---------------------------------------------------------------
    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop at the next optimizer-step boundary (thread-safe); ``fit`` returns normally."""
        self._live.requests.request_stop(reason)

    def pause(self) -> None:
        """Hold at the next optimizer-step boundary until :meth:`resume` (thread-safe)."""
        self._live.requests.pause()

    def resume(self) -> None:
        self._live.requests.resume()

    def set_lr(self, lr: float, optimizer: str | None = None, *, source: str | None = None) -> None:
        """Set the (reference) learning rate at the next optimizer step; schedules are rescaled. With several
        named optimizers, ``optimizer="name"`` sets that one's (without: each gets ``lr``).

        ``source`` says who changed it (the panel passes ``"typed"``, ``"dragged"`` or ``"lr finder"``): it is
        kept on the ``lr`` event (``event["source"]``), and the panel labels the change's marker with it."""
        if self.optimizer is None:
            raise _validate.no_optimizer("set_lr")
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive finite number, got {lr!r}.")
        if source is not None and not isinstance(source, str):
            raise TypeError(f"source must be a short string (e.g. 'typed') or None, got {source!r}.")
        lr_parts(self.optimizer, self.scheduler, optimizer)  # an unknown name is refused now, not at the step
        pending = dict(self._live.requests.peek("lr") or {})
        pending[optimizer] = (float(lr), source)
        self._live.apply_or_queue("lr", pending)

    def set_grad_accum_steps(self, steps: int) -> None:
        """Change accumulation at the next optimizer-step boundary (thread-safe)."""
        _validate.check_accum(steps)
        _validate.check_in_backward_now(self, grad_accum_steps=int(steps))
        _validate.check_closure_now(self, grad_accum_steps=int(steps))
        self._live.apply_or_queue("grad_accum_steps", int(steps))

    def add_callback(self, callback: Any) -> None:
        """Attach a callback (any object with some ``nbtrainer.EVENTS`` hooks); also mid-fit."""
        _validate.check_callback(callback)
        _validate.check_in_backward_now(self, callbacks=[*self.callbacks.callbacks, callback])
        self.callbacks.append(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callbacks.remove(callback)

    def _require_idle(self, what: str) -> None:
        if self._run.fitting:
            raise RuntimeError(f"{what} cannot change while fit() is running; stop the run first.")

    def set_precision(self, precision: str) -> None:
        """Change precision between fits (checked against the device; never silently downgraded)."""
        self._require_idle("precision")
        checked = require_precision(precision, self.device)
        _validate.check_in_backward_now(self, precision=checked)
        _validate.check_closure_now(self, precision=checked)
        self.precision = checked
        self.scaler = make_scaler(self.precision, self.device)

    def set_scheduler(self, scheduler: Any, interval: str = "step") -> None:
        """Replace the LR scheduler between fits (``None`` removes it)."""
        self._require_idle("The scheduler")
        if scheduler is not None and self.optimizer is None:
            raise _validate.no_optimizer("A scheduler")
        if scheduler is not None and getattr(scheduler, "optimizer", self.optimizer) is not self.optimizer:
            raise ValueError("The scheduler is bound to a different optimizer; build it from trainer.optimizer.")
        if interval not in ("step", "epoch"):
            raise ValueError(f"interval must be 'step' or 'epoch', got {interval!r}.")
        self.scheduler, self.scheduler_interval = scheduler, interval

    def set_activation_checkpointing(self, value: Any) -> list[str]:
        """Activation checkpointing between fits: ``True``, a list of module types / names, or ``False``
        (the model is restored exactly). Returns the checkpointed blocks."""
        self._require_idle("activation_checkpointing")
        return self._setup.set_activation_checkpointing(value)

    @property
    def checkpointed_blocks(self) -> list[str]:
        """The blocks under activation checkpointing now (empty when it is off)."""
        return self._setup.checkpointed_blocks

    @property
    def param_counts(self) -> Any:
        """Trainable / frozen parameter counts of the model (``str()`` gives one line)."""
        return self._setup.param_counts()

    def lr_find(
        self, train_loader: Iterable, min_lr: float = 1e-7, max_lr: float = 10.0, steps: int = 100, **kwargs: Any
    ) -> Any:
        """LR range test (exponential sweep); model and optimizer are restored afterwards. See
        :func:`nbtrainer._loop._lr_find.lr_find` for the options and the :class:`LRFinderResult`."""
        from nbtrainer._loop._lr_find import lr_find

        if self.optimizer is None:
            raise _validate.no_optimizer("lr_find")
        from nbtrainer._trainer._loop_host import TrainerHost

        host = TrainerHost(self)
        return lr_find(self, train_loader, min_lr=min_lr, max_lr=max_lr, steps=steps, host=host, **kwargs)

    def set_max_grad_norm(self, max_grad_norm: float | None) -> None:
        _validate.check_max_grad_norm(max_grad_norm)
        _validate.check_in_backward_now(self, max_grad_norm=max_grad_norm)
        self.max_grad_norm = max_grad_norm

    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once the current event has reached every callback (used for checkpoint saves)."""
        self._live.defer(fn)
