"""The Trainer facade: one class (no mixins) whose verbs delegate to the parts it owns.

Reading order for a newcomer (``docs/architecture.md`` draws it): ``Trainer.__init__`` parses the keywords into option
groups (``nbtrainer._options``) and builds the parts (``_assemble``); ``Trainer.fit`` checks its arguments and runs one
``FitRun`` (``_fit_run``), which drives the loop (``nbtrainer._loop._fit_loop``) over this Trainer as its ``LoopHost``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._batch import safe_len
from nbtrainer._data._loss import batch_loss
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._stream import Progress
from nbtrainer._keywords import KEYWORDS, Option, checked_keywords
from nbtrainer._loop import _oom
from nbtrainer._loop._batch_steps import BatchSteps
from nbtrainer._loop._control import ForeignStop, LiveControl, reference_lr
from nbtrainer._options import SWITCH, TrainerOptions, keyword_signature
from nbtrainer._resume import _checkpoint_state as _state
from nbtrainer._resume import _continue
from nbtrainer._resume._full_state import load_model_state, model_state
from nbtrainer._setup._precision import make_scaler, require_precision
from nbtrainer._trainer import _validate
from nbtrainer._trainer._assemble import assemble, bind_criterion
from nbtrainer._trainer._fit_run import FitParts, FitRun, check_fit_args
from nbtrainer._trainer._memory_budget import MemoryBudget
from nbtrainer._trainer._validate import between_fits, requires_optimizer

if TYPE_CHECKING:
    import threading

    from typing_extensions import Unpack

    from nbtrainer._data._batch import BatchSpec
    from nbtrainer._dist._placement import Strategy
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList
    from nbtrainer._keywords import TrainerKeywords
    from nbtrainer._know._data_report import DataReport
    from nbtrainer._look._interpretation import Interpretation
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._plan._result import MemoryPlan
    from nbtrainer._runs._recorder import RunRecorder
    from nbtrainer._setup._model_setup import ModelSetup, ParamCounts

__all__ = ["Trainer"]


class Trainer:
    """Train any PyTorch model, headless or in a notebook.

    ``Trainer(model, criterion, optimizer, **options)``: the model, its loss and its optimizer, then keyword options,
    flat as Lightning and Hugging Face users expect. Each keyword belongs to one group, which documents it
    (``nbtrainer._options``); the Trainer holds the groups as :attr:`options`, and its attributes of the same names
    (``trainer.precision``, ``trainer.grad_accum_steps``...) read them. An unknown keyword is a ``TypeError`` naming
    the closest; :attr:`KEYWORDS` lists them all.

    ==================  ==========================================================================================
    ``options.memory``  ``precision``, ``activation_checkpointing``, ``optimizer_in_backward``, ``chunked_loss``,
                        ``quantize``, ``lora``, ``offload_activations``, ``offload_optimizer``, ``attention``
    ``options.setup``   ``device``, ``lr``, ``trainable``, ``freeze``, ``compile``, ``channels_last``, ``save_base``
    ``options.step``    ``grad_accum_steps``, ``max_grad_norm``, ``scheduler_interval``, ``scheduler_monitor``,
                        ``on_nonfinite``
    ``options.batch``   ``num_inputs``, ``target_keys``, ``compute_loss``, ``predict_step``, ``training_step``,
                        ``validation_step`` (and the table of batch shapes the Trainer takes)
    ``options.data``    ``fast_fetch``, ``data_on_device``, ``non_blocking``
    ``options.run``     ``seed``, ``deterministic``, ``progress``, ``refresh_interval``, ``timing_every``,
                        ``val_every_n_epochs``, ``run_store``, ``check_data``
    ``options.budget``  ``memory_budget_gb``: the memory switches planned to fit a budget at the first fit
    (the parts)         ``scheduler``, ``metrics``, ``callbacks``, ``strategy`` (``TrainerParts``)
    ==================  ==========================================================================================

    Args:
        model: the ``nn.Module``.
        criterion: ``loss = criterion(outputs, targets)``; ``None`` if the model returns ``.loss``. A criterion with
            ``bind_trainer(trainer) -> {name: metric}`` (``DistillationLoss``) is bound once the model is set up.
        optimizer: an optimizer over the model's parameters; ``{"name": optimizer, ...}`` for several (one loss,
            each steps; or by name in ``training_step``); or a name: ``"adamw"``, ``"adam"``, ``"sgd"``,
            ``"adafactor"``, ``"adamw8bit"``... (built over the trainable parameters, fused where the device has
            kernels; ``lr=``). ``"auto"``: AdamW, or with ``memory_budget_gb`` the kind its plan picks. ``None`` (the
            default): a trainer that only evaluates and predicts; ``fit`` and ``lr_find`` raise.

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

    #: Every keyword ``Trainer(...)`` takes (a front end that forwards keywords checks its own against these).
    KEYWORDS: ClassVar[frozenset[str]] = frozenset(KEYWORDS)
    _active: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()  # those inside fit() (weak: a dropped one leaves)
    should_stop, stop_training = ForeignStop("Lightning"), ForeignStop("Keras")  # request_stop

    # -- the options, by group: the only copy; the attributes below read them; assigned: their setter, if any --
    options: TrainerOptions
    precision: Option[str] = Option("memory", via="set_precision")
    optimizer_in_backward: Option[bool] = Option("memory")  # each parameter updated inside backward (_in_backward)
    device: Option[torch.device] = Option("setup", via=_validate.device_is_fixed)
    grad_accum_steps: Option[int] = Option("step", via="set_grad_accum_steps")
    max_grad_norm: Option[float | None] = Option("step", via="set_max_grad_norm")
    scheduler_interval: Option[str] = Option("step", via=lambda t, interval: t.set_scheduler(t.scheduler, interval))
    scheduler_monitor: Option[str | None] = Option("step")
    seed: Option[int | None] = Option("run")
    deterministic: Option[bool] = Option("run")
    refresh_interval: Option[float] = Option("run")
    timing_every: Option[int] = Option("run")
    val_every_n_epochs: Option[int] = Option("run")
    fast_fetch: Option[bool] = Option("data")
    data_on_device: Option[float] = Option("data")
    non_blocking: Option[bool] = Option("data")

    # -- the objects it holds and changes (model, optimizer...), and its parts, each with its own state ------------
    model: torch.nn.Module
    criterion: Callable[..., Any] | None
    optimizer: torch.optim.Optimizer | None
    scheduler: Any  # any LR scheduler (torch has no common base for ReduceLROnPlateau and the others)
    strategy: Strategy  # placement (_dist): SingleDevice, DDP or FSDP
    scaler: torch.amp.GradScaler | None
    batch_spec: BatchSpec
    callbacks: CallbackList
    progress: Progress
    status: str
    run_id: str | None  # the id of this trainer's run in the store (nbtrainer.Runs), set by fit
    data_report: DataReport | None = None  # the last check of the data (check_data; a fit with check_data reuses it)
    fresh_fit: bool = True  # the current (or last) fit started a new run: not a resume_from= one, not fit_more
    # Its parts, each with its own state: _setup (ModelSetup), _run (RunState: the run across fits), _steps
    # (BatchSteps: a batch's loss / outputs), _live (LiveControl: requests from any thread, applied at a step
    # boundary), _nonfinite (the NaN/inf gate), _budget (MemoryBudget or None), _run_recorder (the run store's writer).

    def __init__(
        self,
        model: torch.nn.Module,
        criterion: Callable[..., Any] | None,
        optimizer: torch.optim.Optimizer | Mapping[str, torch.optim.Optimizer] | str | None = None,
        **keywords: Unpack[TrainerKeywords],
    ) -> None:
        options, given = TrainerOptions.parse(keywords, optimizer=optimizer)  # unknown: TypeError naming the closest
        a = assemble(model, criterion, optimizer, options, given)  # every check first; the model changes last
        self.options, self.strategy, self.model, self.criterion = a.options, a.strategy, a.model, a.criterion
        self.optimizer, self.scheduler, self.scaler, self.batch_spec = a.optimizer, a.scheduler, a.scaler, a.batch_spec
        self.callbacks, self.progress, self.status, self.run_id = a.callbacks, Progress(), "idle", None
        self._setup, self._run, self._nonfinite = a.setup, a.run, a.nonfinite
        self._metric_spec, self._run_recorder = a.metric_spec, a.recorder
        self._steps = BatchSteps(self, a.run, a.options.batch, val_metrics=a.val_metrics, chunked_loss=a.chunked_loss)
        self._live = LiveControl(self)
        self._budget = MemoryBudget(self, a.budget, self._live) if a.budget is not None else None
        bind_criterion(self, self._metric_spec)  # DistillationLoss: bound to the finished trainer, brings metrics

    # -- read-only views of its parts --------------------------------------------------------------------------
    @property
    def run_state(self) -> RunState:
        """The run's progress across fits (:class:`~nbtrainer._loop._run_state.RunState`): ``loop_state``, the training
        metrics' state, seconds trained, the History fed, a running fit's loop; what a checkpoint saves and resumes."""
        return self._run

    @property
    def batch_steps(self) -> BatchSteps:
        """How a batch becomes a loss or outputs (:class:`~nbtrainer._loop._batch_steps.BatchSteps`): ``compute_loss=``
        and ``predict_step=``, the autocast and inference contexts, the validation metrics."""
        return self._steps

    @property
    def model_setup(self) -> ModelSetup:
        """What was done to the model before the first step (:class:`~nbtrainer._setup._model_setup.ModelSetup`):
        freezing, quantize / LoRA / offload (``savers``: also what a checkpoint holds), activation checkpointing,
        ``channels_last``, compile; ``describe()`` says it in one line."""
        return self._setup

    @property
    def micro_split(self) -> int:
        """Each loader batch as this many forward / backward passes (``memory_budget_gb``'s plan; else 1)."""
        return self._budget.micro_split if self._budget is not None else 1

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
    @requires_optimizer("lr")
    def lr(self) -> float:
        """The reference learning rate: OneCycle's ``max_lr``, else the base (initial) LR of group 0."""
        assert self.optimizer is not None  # requires_optimizer
        return reference_lr(self.optimizer)

    @property
    def lrs(self) -> dict[str, float]:
        """With several named optimizers (``optimizer={"name": opt}``): each one's reference LR; else empty."""
        children = getattr(self.optimizer, "optimizers", None) or {}
        return {name: reference_lr(opt) for name, opt in children.items()}

    @property
    @requires_optimizer("current_lr")
    def current_lr(self) -> float:
        assert self.optimizer is not None  # requires_optimizer
        return float(self.optimizer.param_groups[0]["lr"])

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

    def merge_lora(self) -> torch.nn.Module:
        """A plain copy of the model for inference: LoRA adapters merged into full-precision weights (a quantized base
        dequantized first), no PEFT wrapper; this trainer's model is unchanged. Example: ``trainer.merge_lora()``."""
        return self._setup.savers.merge_lora(self.model)

    def expected_log_keys(self) -> set[str]:
        return self._run.expected_log_keys(self._metric_spec)

    def __repr__(self) -> str:
        return (
            f"Trainer(model={type(unwrap_model(self.model)).__name__}, device={self.device}, "
            f"precision={self.precision!r}, grad_accum_steps={self.grad_accum_steps}, status={self.status!r})"
        )

    def total_steps(self, train_loader: Any, epochs: int, *, batch_size: int | None = None) -> int:
        """Optimizer steps of ``fit(train_loader, epochs=epochs)``: ``ceil(batches / accum) * epochs`` (arrays too,
        with their ``batch_size``). Example: ``OneCycleLR(opt, 1e-2, total_steps=trainer.total_steps(loader, 5))``."""
        return _continue.total_steps(self, train_loader, epochs, batch_size=batch_size)

    # == fit, evaluate, predict ==============================================================================
    @requires_optimizer("fit")
    @checked_keywords
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
        """Train; returns the :class:`History` (also when stopped; re-raises errors). Ctrl-C stops at the next
        optimizer step; a notebook then gets the History marked ``interrupted``, a script the ``KeyboardInterrupt``.
        ``data``: batches (a DataLoader, a list...) or arrays like Keras (``(x, y)``, ``(x1, x2, y)``, a dict, one
        array) with ``batch_size`` (``train_loader=`` is its former name; ``shuffle`` training arrays, default True);
        ``val_loader`` / ``val_data``: the same for validation, every ``val_every_n_epochs`` (keys get ``val_``).
        ``epochs``: the run's total (a resume continues up to it; :meth:`fit_more` trains N *more*). ``max_steps``:
        optimizer steps of the run at most (a planned end: ``finished``). ``resume_from``: a checkpoint, ``"last"``
        (a ModelCheckpoint's ``last.ckpt``) or ``"last-if-exists"`` / ``"auto"`` (that, else a fresh start); refused
        before loading when past ``epochs``. ``profiler``: a ``torch.profiler.profile`` (``nbt.*`` ranges).

        Example:
            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(3, 2), torch.nn.CrossEntropyLoss(), "adamw", progress=False, seed=0)
            >>> x, y = torch.randn(64, 3), torch.randint(0, 2, (64,))
            >>> len(trainer.fit((x, y), val_data=(x[:16], y[:16]), batch_size=16, epochs=2).epochs)
            2
        """
        loaders = {"train_loader": train_loader, "val_data": val_data, "batch_size": batch_size, "shuffle": shuffle}
        train, val = check_fit_args(self, data, val_loader, epochs, max_steps=max_steps, **loaders)
        parts = FitParts(self._live, self._nonfinite, self._budget, self._active)
        run = FitRun(self, parts, train, val, epochs, max_steps)
        run.begin(resume_from, profiler)
        return run.run()

    @checked_keywords
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
        val_data: Any = None,
        batch_size: int | None = None,
        shuffle: bool | None = None,
    ) -> History:
        """Continue a run for ``epochs`` more epochs: after a finished or stopped ``fit`` of this trainer, or
        from a checkpoint (``resume_from=path | "last"``), optionally with a fresh LR schedule for them.
        Epoch numbers, the global step and the History continue (a ``fit_more`` event where the extension starts);
        a run stopped mid-epoch first finishes that epoch, the first of the ``epochs`` more. ``train_loader`` (batches
        or arrays) / ``val_loader`` / ``val_data`` / ``batch_size`` / ``shuffle`` / ``profiler``: as for :meth:`fit`;
        ``max_steps``: of the extension; ``resume_from``: a checkpoint of the run (default: this trainer's state).
        ``scheduler``: ``"keep"`` (default) continues the run's scheduler, refused before any step when it cannot
        cover the extension (a OneCycleLR ends where it was built to end); ``fn(optimizer, total_steps) ->
        scheduler`` builds a fresh one for the extension's optimizer steps (epochs with ``scheduler_interval=
        "epoch"``), the LRs back at the run's reference LR; ``None``: no schedule, that reference LR constant.

        Example:
            >>> import torch
            >>> from torch.optim.lr_scheduler import OneCycleLR
            >>> trainer = Trainer(torch.nn.Linear(3, 1), torch.nn.MSELoss(), "sgd", lr=0.1, progress=False, seed=0)
            >>> data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
            >>> _ = trainer.fit(data, epochs=2)
            >>> more = trainer.fit_more(data, epochs=3,  # epochs 3-5, on a fresh one-cycle of their own
            ...     scheduler=lambda optimizer, steps: OneCycleLR(optimizer, max_lr=0.05, total_steps=steps))
            >>> [row["epoch"] for row in more], more.status
            ([1, 2, 3, 4, 5], 'finished')
        """
        more = {"resume_from": resume_from, "scheduler": scheduler, "max_steps": max_steps, "profiler": profiler}
        return _continue.fit_more(self, train_loader, val_loader, epochs=epochs, **more, val_data=val_data,
                                  batch_size=batch_size, shuffle=shuffle)  # fmt: skip

    @_oom.on_oom("evaluate")
    def evaluate(self, loader: Any, *, prefix: str = "val_", batch_size: int | None = None) -> dict[str, float]:
        """Loss and metrics over ``loader`` (sample-weighted), keys prefixed (``val_loss``, ``val_acc``); arrays as in
        :meth:`fit` (``batch_size`` default 256). In eval mode under ``torch.inference_mode`` and the trainer's
        precision; needs no optimizer; fires ``on_validation_start`` / ``on_validation_end(logs)`` as fit does. Example:

            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(3, 2), torch.nn.CrossEntropyLoss(), progress=False)  # no optimizer
            >>> sorted(trainer.evaluate([(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]))
            ['val_loss']
        """
        loader = _arrays.eval_loader(loader, batch_size, name="evaluate() loader")
        if safe_len(loader) == 0:
            raise ValueError("The evaluation loader is empty (len 0).")
        self._place()
        return self._steps.evaluate_loader(self.strategy.prepare_loader(loader, train=False), prefix=prefix)

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
        """Model outputs for the whole loader, concatenated along the batch dimension, structure kept: a tensor, or
        the model's structure (tuple, dict, ``ModelOutput``, dataclass) of concatenated tensors (others, such as an
        LSTM's ``(h, c)``, as a list per batch), from ``predict_step=`` / :meth:`predict_step` (the rule when only
        ``compute_loss`` is customised: ``nbtrainer._data._predict_collect``), in eval mode under ``torch.no_grad``
        and the trainer's precision. ``loader``: batches in order (a DataLoader that shuffles is refused), or arrays
        as in :meth:`fit` (``batch_size`` default 256). ``per_batch``: a list of each batch's outputs. ``pad_index``:
        fills the dimensions that vary between batches (-100). ``keep_dtype``: keep autocast's half-precision outputs
        (default: float32, so ``.numpy()`` works). ``keep``: entries left out by default as they grow with the data:
        ``"loss"``, ``"cache"`` (Hugging Face models then run with ``use_cache=False``), ``"hidden_states"``,
        ``"attentions"``. ``to_cpu``: each batch's outputs moved to the CPU as they come (``False``: kept on device).

        Example:
            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(3, 2), None, progress=False)  # no optimizer: predict only
            >>> out = trainer.predict([torch.randn(4, 3), torch.randn(2, 3)])
            >>> tuple(out.shape), out.dtype
            ((6, 2), torch.float32)
        """
        loader = self._steps.batches(_arrays.predict_loader(loader, batch_size))
        self._place()
        return self._steps.predict(
            loader, per_batch=per_batch, pad_index=pad_index, keep_dtype=keep_dtype, keep=keep, to_cpu=to_cpu
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
        """Error analysis over ``loader`` (arrays too): one streamed pass keeping each item's loss (the criterion on
        that item alone; ``loss_per_item=fn(outputs, targets)`` where it has no ``reduction="none"``), prediction,
        target and dataset index, never its inputs; the model, its mode and the RNG are left as they were. ``classes``
        names the classes, ``decode`` (a function or tokenizer) and ``feature_names`` show inputs in
        :meth:`Interpretation.show <nbtrainer.Interpretation.show>` (details: ``nbtrainer._look``). Example:
        ``interp = trainer.interpret(val_loader); interp.top_losses(9); interp.confusion_matrix()``."""
        from nbtrainer._look._interpret import interpret

        self._place()
        options = {"loss_per_item": loss_per_item, "decode": decode, "feature_names": feature_names}
        return interpret(self, loader, max_items=max_items, classes=classes, batch_size=batch_size, **options)

    def check_data(self, train_loader: Any, val_loader: Any = None, *, max_items: int | None = None,
                   batch_size: int | None = None, cancel: threading.Event | None = None) -> DataReport:  # fmt: skip
        """Check the data in one streamed pass per split that keeps no items: duplicates (inside a split, between
        training and validation), NaN / Inf, scale, constant features, class balance, labels past the model's outputs
        (``nbtrainer._know._check``). ``max_items``: a seeded sample per split; arrays: ``batch_size``; ``cancel``: an
        Event set from another thread ends the pass before its next batch (``CancelledError``). Example:
            >>> import torch
            >>> trainer = Trainer(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), "sgd", progress=False)
            >>> x, y = torch.randn(100, 4) * 1000, torch.randint(0, 3, (100,))
            >>> [p.kind for p in trainer.check_data((x, y)).problems]
            ['scale']
        """
        from nbtrainer._know._check import check_data

        self._place()
        report = check_data(self, train_loader, val_loader, max_items=max_items, batch_size=batch_size, cancel=cancel)
        self.data_report = report
        return report

    def show_batch(self, loader: Any, n: int = 16, *, decode: Any = None, **options: Any) -> Any:
        """The first ``n`` items of ``loader``'s first batch as the model receives them (``nbtrainer.show_batch``),
        split by this trainer's batch protocol. Example: ``trainer.show_batch(train_loader, 8, decode=tok.decode)``."""
        from nbtrainer._know._show_batch import show_batch

        return show_batch(loader, n, decode=decode, spec=self.batch_spec, **options)

    def _place(self) -> None:
        """The model on its device (wrapped by DDP / FSDP) for a pass outside ``fit``; inside, the fit placed it."""
        if not self._run.fitting:
            self.model = self.strategy.setup_model(self.model)

    # -- how a batch becomes a loss / outputs ----------------------------------------------------
    def compute_loss(self, batch: Any) -> tuple[torch.Tensor | None, Any, Any]:
        """Override in a subclass to change how a batch becomes ``(loss, outputs, targets)``; the default splits it by
        the batch protocol, calls the model and the criterion (or takes the model's ``.loss`` with no criterion)."""
        return batch_loss(self.model, batch, spec=self.batch_spec, criterion=self.criterion)

    def predict_step(self, batch: Any) -> Any:
        """A batch's outputs for :meth:`predict`; override in a subclass (or pass ``predict_step=``). The default calls
        the model on the batch's inputs, split by the batch protocol. Example:
            >>> import torch
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
    @requires_optimizer("save_checkpoint", " To save the weights alone: torch.save(trainer.model_state_dict(), path).")
    def save_checkpoint(self, path: str, *, sharded: bool = False) -> str:
        """Write a full checkpoint atomically (from any thread: applied at the next step boundary). ``sharded=True``
        (FSDP2 only) writes a directory of each rank's shards instead of gathering the full state to rank 0; every
        rank must call it, and it resumes on the same number of processes."""
        return self._live.on_fit_thread(lambda: _state.save_trainer_checkpoint(self, path, sharded=sharded))

    def rollback(self, path: str = "last") -> str:
        """Go back to a checkpoint (``"last"``: a ``ModelCheckpoint``'s ``last.ckpt``, or a file) and train on from
        there: model, optimizer, scheduler, scaler and the loop's position restored at a step boundary (the epoch's
        data order replayed up to the saved batch). Between fits, loaded in place (``fit_more`` goes on from it).
        Refused up front: no checkpoint, a running fit not paused (from another thread: pause first, as the health
        card does), DDP / FSDP. Returns the path. Example, with ``ModelCheckpoint(dir, save_last=True)``:
        ``trainer.pause(); trainer.rollback(); trainer.set_lr(trainer.lr / 3); trainer.resume()``."""
        from nbtrainer._resume._rollback import rollback

        return rollback(self, path, self._live)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain data (loads with ``weights_only=True``)."""
        return _state.trainer_state_dict(self)

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        _state.load_trainer_state(self, checkpoint)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights (under FSDP: gathered in full, on the CPU; call it on every rank)."""
        return model_state(self)

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_model_state(self, state)  # under FSDP each rank keeps its shard

    # == control from any thread, and settings between fits ==================================================
    def request_stop(self, reason: str = "stop requested") -> None:
        """Stop at the next optimizer-step boundary (thread-safe); ``fit`` returns normally."""
        self._live.requests.request_stop(reason)

    def pause(self) -> None:
        """Hold at the next optimizer-step boundary until :meth:`resume` (thread-safe)."""
        self._live.requests.pause()

    def resume(self) -> None:
        self._live.requests.resume()

    @requires_optimizer("set_lr")
    def set_lr(self, lr: float, optimizer: str | None = None, *, source: str | None = None) -> None:
        """Set the (reference) learning rate at the next optimizer step; schedules are rescaled. With several named
        optimizers, ``optimizer="name"`` sets that one's (without: each gets ``lr``). ``source`` says who changed it
        (the panel's ``"typed"``, ``"dragged"``, ``"lr finder"``): kept on the ``lr`` event, it labels its marker."""
        _validate.check_lr(lr, source)
        self._live.request_lr(float(lr), optimizer, source)

    def set_grad_accum_steps(self, steps: int) -> None:
        """Change accumulation at the next optimizer-step boundary (thread-safe)."""
        _validate.check_accum(steps)
        _validate.check_change(self, grad_accum_steps=int(steps))
        self._live.apply_or_queue("grad_accum_steps", int(steps))

    def add_callback(self, callback: Any) -> None:
        """Attach a callback (any object with some ``nbtrainer.EVENTS`` hooks); also mid-fit."""
        _validate.check_callback(callback)
        _validate.check_in_backward_now(self, callbacks=[*self.callbacks.callbacks, callback])
        self.callbacks.append(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callbacks.remove(callback)

    @between_fits("precision")
    def set_precision(self, precision: str) -> None:
        """Change precision between fits (checked against the device; never silently downgraded)."""
        checked = require_precision(precision, self.device)
        _validate.check_change(self, precision=checked)
        self.options = self.options.replace("memory", precision=checked)  # what every reader of the switches sees
        self.scaler = make_scaler(checked, self.device)

    @between_fits("The scheduler")
    def set_scheduler(self, scheduler: Any, interval: str = "step") -> None:
        """Replace the LR scheduler between fits (``None`` removes it)."""
        _validate.check_scheduler(scheduler, interval, self.optimizer)
        self.scheduler = scheduler
        self.options = self.options.replace("step", scheduler_interval=interval)

    @between_fits(SWITCH.activation_checkpointing)
    def set_activation_checkpointing(self, value: Any) -> list[str]:
        """Activation checkpointing between fits: ``True``, a list of module types / names, or ``False``
        (the model is restored exactly). Returns the checkpointed blocks."""
        blocks = self._setup.set_activation_checkpointing(value)
        self.options = self.options.replace("memory", activation_checkpointing=value or False)
        return blocks

    @property
    def checkpointed_blocks(self) -> list[str]:
        """The blocks under activation checkpointing now (empty when it is off)."""
        return self._setup.checkpointed_blocks

    @property
    def param_counts(self) -> ParamCounts:
        """Trainable / frozen parameter counts of the model (``str()`` gives one line)."""
        return self._setup.param_counts()

    @requires_optimizer("lr_find")
    def lr_find(
        self, train_loader: Iterable, min_lr: float = 1e-7, max_lr: float = 10.0, steps: int = 100, **kwargs: Any
    ) -> Any:
        """LR range test (exponential sweep) on a loader, or arrays with ``batch_size=`` as in :meth:`fit`; the model
        and optimizer are restored. Options: :func:`nbtrainer._loop._lr_find.lr_find`; :class:`LRFinderResult`."""
        from nbtrainer._loop._lr_find import lr_find

        return lr_find(self, train_loader, min_lr, max_lr, steps, nonfinite=self._nonfinite, **kwargs)

    def set_max_grad_norm(self, max_grad_norm: float | None) -> None:
        _validate.check_max_grad_norm(max_grad_norm)
        _validate.check_in_backward_now(self, max_grad_norm=max_grad_norm)
        self.options = self.options.replace("step", max_grad_norm=max_grad_norm)

    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once the current event has reached every callback (used for checkpoint saves)."""
        self._live.defer(fn)


# help(Trainer), IPython's completion and inspect see the flat keywords with their defaults (read from the groups)
Trainer.__init__.__signature__ = keyword_signature()  # type: ignore[attr-defined]
