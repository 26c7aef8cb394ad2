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
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._loss import batch_loss
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._stream import Progress
from nbtrainer._keywords import KEYWORDS, checked_keywords
from nbtrainer._loop import _oom
from nbtrainer._loop._control import LiveControl, is_plateau, lr_parts, reference_lr
from nbtrainer._loop._fit_loop import _safe_len
from nbtrainer._loop._metrics import MetricSet, collection_names
from nbtrainer._options import Option, TrainerOptions, keyword_signature
from nbtrainer._resume import _checkpoint_state as _state
from nbtrainer._resume import _continue
from nbtrainer._resume._full_state import full_model_state, load_weights
from nbtrainer._setup._precision import make_scaler, require_precision
from nbtrainer._trainer import _validate
from nbtrainer._trainer._assemble import assemble
from nbtrainer._trainer._batch_steps import BatchSteps
from nbtrainer._trainer._fit_run import FitRun, check_fit_args
from nbtrainer._trainer._loop_host import TrainerHost
from nbtrainer._trainer._memory_budget import MemoryBudget
from nbtrainer._trainer._validate import requires_optimizer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from nbtrainer._data._batch import BatchSpec
    from nbtrainer._dist._placement import Strategy
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import CallbackList
    from nbtrainer._keywords import TrainerKeywords
    from nbtrainer._look._interpretation import Interpretation
    from nbtrainer._loop._nonfinite import NonFiniteGuard
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._plan._result import MemoryPlan
    from nbtrainer._runs._recorder import RunRecorder
    from nbtrainer._setup._model_setup import ModelSetup

__all__ = ["Trainer"]


class Trainer:
    """Train any PyTorch model, headless or in a notebook.

    ``Trainer(model, criterion, optimizer, **options)``: the model, its loss and its optimizer, then keyword options,
    flat as Lightning and Hugging Face users expect. Each keyword is a field of one option group, which documents it
    (``nbtrainer._options``); the Trainer holds the groups as :attr:`options`, and its attributes of the same names
    (``trainer.precision``, ``trainer.grad_accum_steps``...) read them:

    ==================  ==========================================================================================
    ``options.memory``  ``precision``, ``activation_checkpointing``, ``optimizer_in_backward``, ``chunked_loss``,
                        ``quantize``, ``lora``, ``offload_activations``, ``offload_optimizer``, ``attention``
    ``options.setup``   ``device``, ``lr``, ``trainable``, ``freeze``, ``compile``, ``channels_last``, ``save_base``
    ``options.step``    ``grad_accum_steps``, ``max_grad_norm``, ``scheduler_interval``, ``scheduler_monitor``,
                        ``on_nonfinite``
    ``options.batch``   ``num_inputs``, ``target_keys``, ``compute_loss``, ``predict_step``, ``training_step``,
                        ``validation_step``
    ``options.data``    ``fast_fetch``, ``data_on_device``, ``non_blocking``
    ``options.run``     ``seed``, ``deterministic``, ``progress``, ``refresh_interval``, ``timing_every``,
                        ``val_every_n_epochs``, ``run_store``
    ``options.budget``  ``memory_budget_gb``: plan the memory switches to fit a budget at the first fit
    ==================  ==========================================================================================

    An unknown keyword is a ``TypeError`` naming the closest valid one; :attr:`KEYWORDS` lists them.

    Args:
        model: the ``nn.Module``.
        criterion: ``loss = criterion(outputs, targets)``; ``None`` if the model returns ``.loss``. A criterion
            with ``bind_trainer(trainer) -> {name: metric}`` (``DistillationLoss``) is bound once the model is set
            up and its metrics are logged with the others.
        optimizer: an optimizer over the model's parameters; ``{"name": optimizer, ...}`` for several (one loss,
            each steps; or by name in ``training_step``; ``scheduler={"name": sched}``); or a name: ``"adamw"``,
            ``"adam"``, ``"sgd"``, ``"adafactor"``, ``"adamw8bit"``... (built over the trainable parameters, fused
            where the device has kernels; ``lr=``). ``"auto"``: AdamW, or with ``memory_budget_gb`` the kind its plan
            picks. ``None`` (the default): a trainer that only evaluates and predicts; ``fit`` and ``lr_find`` raise.
        scheduler: any LR scheduler bound to ``optimizer`` (OneCycleLR: use :meth:`total_steps`).
        metrics: ``{"acc": torchmetrics.Accuracy(...), "mae": callable(outputs, targets)}``, or a torchmetrics
            ``MetricCollection`` (its keys name the values). A metric that fails on structured outputs (a
            ``ModelOutput``, a tuple) gets their ``.logits`` (else the first tensor).
        callbacks: objects with any of the hooks in ``nbtrainer.EVENTS``.
        strategy: ``"auto"`` (DDP when launched by ``torchrun`` / :func:`nbtrainer.launch` with more than one
            process, else one device), ``"single"``, ``"ddp"``, ``"fsdp"`` (FSDP2: parameters, gradients and
            optimizer state sharded across ranks), or ``nbtrainer.DDP(...)`` / ``nbtrainer.FSDP(...)`` with
            options. Each rank uses its ``LOCAL_RANK`` GPU (or the CPU with gloo); see ``docs/distributed.md``.
        **options: the option groups' fields (above).

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

    #: Every keyword ``Trainer(...)`` takes (a front end that forwards keywords checks its own against these).
    KEYWORDS: ClassVar[frozenset[str]] = frozenset(KEYWORDS)
    # Trainers inside fit() in this process (weak: a trainer that is dropped leaves it).
    _active: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()

    # -- the options, by group: the only copy; the attributes below read (and, assigned, replace) their group --
    options: TrainerOptions
    precision: Option[str] = Option("memory")
    optimizer_in_backward: Option[bool] = Option("memory")  # each parameter updated inside backward (_in_backward)
    device: Option[torch.device] = Option("setup")
    grad_accum_steps: Option[int] = Option("step")
    max_grad_norm: Option[float | None] = Option("step")
    scheduler_interval: Option[str] = Option("step")
    scheduler_monitor: Option[str | None] = Option("step")
    seed: Option[int | None] = Option("run")
    deterministic: Option[bool] = Option("run")
    refresh_interval: Option[float] = Option("run")
    timing_every: Option[int] = Option("run")
    val_every_n_epochs: Option[int] = Option("run")
    fast_fetch: Option[bool] = Option("data")
    data_on_device: Option[float] = Option("data")
    non_blocking: Option[bool] = Option("data")

    # -- the objects it holds and changes, and the parts it delegates to ---------------------------------------
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
    _setup: ModelSetup  # what was done to the model (freezing, quantize / LoRA / offload, checkpointing, compile)
    _run: RunState  # the run's progress across fits (loop position, metrics' state, History, the running loop)
    _steps: BatchSteps  # how a batch becomes a loss / outputs, and evaluation (the overrides, validation metrics)
    _live: LiveControl  # requests from any thread, applied at a step boundary; calls deferred past an event
    _nonfinite: NonFiniteGuard
    _budget: MemoryBudget | None  # memory_budget_gb= (nbtrainer._trainer._memory_budget)
    _run_recorder: RunRecorder
    _metric_spec: dict[str, Any]
    _params: list[torch.Tensor]

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
        self._setup, self._run, self._nonfinite, self._params = a.setup, a.run, a.nonfinite, a.params
        self._metric_spec, self._run_recorder = a.metric_spec, a.recorder
        self._steps = BatchSteps(self, a.options.batch, val_metrics=a.val_metrics, chunked_loss=a.chunked_loss)
        self._live = LiveControl(self)
        self._budget = MemoryBudget(self, a.budget) if a.budget is not None else None
        # A criterion that needs the trainer (DistillationLoss: its teacher sees the model's inputs, on this device)
        # binds itself once the model is final and may bring metrics (its loss parts); the user's win a name clash.
        bind = getattr(criterion, "bind_trainer", None)
        if callable(bind):
            extra = {k: v for k, v in bind(self).items() if k not in self._metric_spec}
            if extra:
                self._metric_spec.update(extra)
                self._run.train_metrics = MetricSet(self._metric_spec, self.device)
                self._steps.val_metrics = self._run.train_metrics.clone(self.device)

    # -- read-only views of its parts --------------------------------------------------------------------------
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
            >>> history = trainer.fit((x, y), val_data=(x[:16], y[:16]), batch_size=16, epochs=2)
            >>> len(history.epochs), "val_loss" in history.epochs[-1]
            (2, True)
        """
        loaders = {"train_loader": train_loader, "val_data": val_data, "batch_size": batch_size, "shuffle": shuffle}
        train, val = check_fit_args(self, data, val_loader, epochs, max_steps=max_steps, **loaders)
        run = FitRun(self, train, val, epochs, max_steps)
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
        more = {"resume_from": resume_from, "scheduler": scheduler, "max_steps": max_steps, "profiler": profiler}
        return _continue.fit_more(self, train_loader, val_loader, epochs=epochs, **more)

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
        self._place()
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
        self._place()
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

        self._place()
        options = {"loss_per_item": loss_per_item, "decode": decode, "feature_names": feature_names}
        return interpret(self, loader, max_items=max_items, classes=classes, batch_size=batch_size, **options)

    def _place(self) -> None:
        """The model on its device (wrapped by DDP / FSDP) for a pass outside ``fit``; inside, the fit placed it."""
        if not self._run.fitting:
            self.model = self.strategy.setup_model(self.model)

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
    @requires_optimizer("save_checkpoint", " To save the weights alone: torch.save(trainer.model_state_dict(), path).")
    def save_checkpoint(self, path: str, *, sharded: bool = False) -> str:
        """Write a full checkpoint atomically (from any thread: applied at the next step boundary).

        ``sharded=True`` (FSDP2 only) writes a directory of each rank's shards instead of gathering the full
        state to rank 0; every rank must call it, and it resumes on the same number of processes."""
        fit_thread = self._run.fit_thread
        if fit_thread is not None and threading.get_ident() != fit_thread:
            return self._live.requests.submit(lambda: self.save_checkpoint(path, sharded=sharded)).result()
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
        if self.strategy.shards_parameters:
            return full_model_state(self.model)
        return unwrap_model(self.model).state_dict()

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.strategy.shards_parameters:  # FSDP: each rank keeps its shard
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

    @requires_optimizer("set_lr")
    def set_lr(self, lr: float, optimizer: str | None = None, *, source: str | None = None) -> None:
        """Set the (reference) learning rate at the next optimizer step; schedules are rescaled. With several
        named optimizers, ``optimizer="name"`` sets that one's (without: each gets ``lr``).

        ``source`` says who changed it (the panel passes ``"typed"``, ``"dragged"`` or ``"lr finder"``): it is
        kept on the ``lr`` event (``event["source"]``), and the panel labels the change's marker with it."""
        if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive finite number, got {lr!r}.")
        if source is not None and not isinstance(source, str):
            raise TypeError(f"source must be a short string (e.g. 'typed') or None, got {source!r}.")
        assert self.optimizer is not None  # requires_optimizer
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
        self.options = self.options.replace("memory", precision=checked)  # what every reader of the switches sees
        self.scaler = make_scaler(checked, self.device)

    def set_scheduler(self, scheduler: Any, interval: str = "step") -> None:
        """Replace the LR scheduler between fits (``None`` removes it)."""
        self._require_idle("The scheduler")
        if scheduler is not None and self.optimizer is None:
            raise _validate.no_optimizer("A scheduler")
        if scheduler is not None and getattr(scheduler, "optimizer", self.optimizer) is not self.optimizer:
            raise ValueError("The scheduler is bound to a different optimizer; build it from trainer.optimizer.")
        if interval not in ("step", "epoch"):
            raise ValueError(f"interval must be 'step' or 'epoch', got {interval!r}.")
        self.scheduler = scheduler
        self.options = self.options.replace("step", scheduler_interval=interval)

    def set_activation_checkpointing(self, value: Any) -> list[str]:
        """Activation checkpointing between fits: ``True``, a list of module types / names, or ``False``
        (the model is restored exactly). Returns the checkpointed blocks."""
        self._require_idle("activation_checkpointing")
        blocks = self._setup.set_activation_checkpointing(value)
        self.options = self.options.replace("memory", activation_checkpointing=value or False)
        return blocks

    @property
    def checkpointed_blocks(self) -> list[str]:
        """The blocks under activation checkpointing now (empty when it is off)."""
        return self._setup.checkpointed_blocks

    @property
    def param_counts(self) -> Any:
        """Trainable / frozen parameter counts of the model (``str()`` gives one line)."""
        return self._setup.param_counts()

    @requires_optimizer("lr_find")
    def lr_find(
        self, train_loader: Iterable, min_lr: float = 1e-7, max_lr: float = 10.0, steps: int = 100, **kwargs: Any
    ) -> Any:
        """LR range test (exponential sweep); model and optimizer are restored afterwards. See
        :func:`nbtrainer._loop._lr_find.lr_find` for the options and the :class:`LRFinderResult`."""
        from nbtrainer._loop._lr_find import lr_find

        host = TrainerHost(self)
        return lr_find(self, train_loader, min_lr=min_lr, max_lr=max_lr, steps=steps, host=host, **kwargs)

    def set_max_grad_norm(self, max_grad_norm: float | None) -> None:
        _validate.check_max_grad_norm(max_grad_norm)
        _validate.check_in_backward_now(self, max_grad_norm=max_grad_norm)
        self.options = self.options.replace("step", max_grad_norm=max_grad_norm)

    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once the current event has reached every callback (used for checkpoint saves)."""
        self._live.defer(fn)


# help(Trainer), IPython's completion and inspect see the flat keywords with their defaults (read from the groups)
Trainer.__init__.__signature__ = keyword_signature()  # type: ignore[attr-defined]
