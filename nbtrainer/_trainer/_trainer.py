"""The Trainer facade: configuration checked up front, the parts it owns, and the mixins of its public verbs.

The verbs are grouped in mixins: running a fit (``_fit``), evaluate / predict and the batch protocol's override
points (``_eval``), the control surface (``_control``) and checkpoints (``_checkpoints``). The state they share is
declared once in ``_base``: the configuration, and the parts the Trainer owns and delegates to, the run's progress
(``nbtrainer._loop._run_state.RunState``), the batch steps (``_batch_steps``), the live control (``_live_control``)
and the model's setup (``nbtrainer._setup._model_setup``). Mechanics live in their concept folders: the loop
(``_loop``), precision and setup (``_setup``), batches (``_data``), checkpoints (``_resume``), placement (``_dist``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import BatchSpec
from nbtrainer._data._prefetch import check_data_options
from nbtrainer._dist._launch_monitor import launched_callbacks
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._progress import ProgressBar, progress_callback
from nbtrainer._events._stream import CallbackList, Progress
from nbtrainer._loop._closure import check_closure
from nbtrainer._loop._in_backward import check_in_backward
from nbtrainer._loop._metrics import MetricSet, collection_names
from nbtrainer._loop._nonfinite import NonFiniteGuard
from nbtrainer._loop._run_state import RunState
from nbtrainer._options import MemoryOptions, TrainerOptions, lora_settings, optimizer_kind
from nbtrainer._runs._recorder import RunRecorder
from nbtrainer._setup._chunked_loss import check_chunked_loss
from nbtrainer._setup._model_setup import ModelSetup
from nbtrainer._setup._optimizers import check_optimizers, check_schedulers
from nbtrainer._setup._precision import make_scaler, require_precision, resolve_device
from nbtrainer._trainer import _validate
from nbtrainer._trainer._batch_steps import BatchSteps
from nbtrainer._trainer._checkpoints import TrainerCheckpoints
from nbtrainer._trainer._control import TrainerControl
from nbtrainer._trainer._eval import TrainerEval
from nbtrainer._trainer._fit import TrainerFit, is_plateau
from nbtrainer._trainer._live_control import LiveControl
from nbtrainer._trainer._memory_budget import MemoryBudget, check_budget

if TYPE_CHECKING:
    from torchmetrics import MetricCollection

    from nbtrainer._plan._result import MemoryPlan

__all__ = ["Trainer"]


class Trainer(TrainerFit, TrainerCheckpoints, TrainerEval, TrainerControl):
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
            ``gradient_checkpointing_enable()``, else its repeated blocks) or a list of module types / names;
            switch later with :meth:`set_activation_checkpointing`.
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
        check_budget(
            memory_budget_gb,
            quantize=quantize,
            lora=lora,
            compile=compile,
            strategy_distributed=bool(self.strategy.distributed),
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
        optimizer = self._setup.optimizer
        if optimizer is not None:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}. "
                    "Build it from the model's parameters, e.g. torch.optim.AdamW(model.parameters())."
                )
            _validate.check_optimizer_params(model, optimizer)
        elif scheduler is not None:
            raise ValueError(
                "A scheduler was given without an optimizer (optimizer=None). Pass the optimizer the scheduler "
                "was built from: Trainer(model, criterion, optimizer, scheduler=...)."
            )
        if predict_step is not None and not callable(predict_step):
            raise TypeError(f"predict_step must be a function fn(model, batch) -> outputs, got {predict_step!r}.")
        if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
            raise ValueError(
                "The scheduler is bound to a different optimizer than the one given to the Trainer. "
                "Create the scheduler from this trainer's optimizer."
            )
        if scheduler_interval not in ("step", "epoch"):
            raise ValueError(f"scheduler_interval must be 'step' or 'epoch', got {scheduler_interval!r}.")
        _validate.check_accum(grad_accum_steps)
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}.")
        if not isinstance(val_every_n_epochs, int) or val_every_n_epochs < 1:
            raise ValueError(f"val_every_n_epochs must be an int >= 1, got {val_every_n_epochs!r}.")
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
        if not isinstance(optimizer_in_backward, bool):
            raise TypeError(f"optimizer_in_backward= takes True or False, got {optimizer_in_backward!r}.")
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
        self._budget = (
            MemoryBudget(self, memory_budget_gb, auto_optimizer=auto_optimizer, lr=lr, keep_precision=precision_given)
            if memory_budget_gb is not None
            else None
        )
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
