"""The Trainer's options in typed groups: each option declared once, as a field, and read from here.

``Trainer(...)`` keeps its keyword arguments flat for users (what Lightning and Hugging Face users expect). They are
parsed once, by :meth:`TrainerOptions.parse`, into frozen groups that the Trainer holds as ``trainer.options``; each
group documents its own fields:

============================  ==============================================================================
``trainer.options.memory``    :class:`MemoryOptions`: the switches that decide what a step keeps in memory
``trainer.options.setup``     :class:`SetupOptions`: the device and what is done to the model before the first step
``trainer.options.step``      :class:`StepOptions`: the optimizer step (accumulation, clipping, the schedule's clock)
``trainer.options.batch``     :class:`BatchOptions`: how a batch becomes a loss or outputs
``trainer.options.data``      :class:`DataOptions`: how batches reach the device
``trainer.options.run``       :class:`RunOptions`: seeding, reporting and recording
``trainer.options.budget``    :class:`BudgetOptions` or None: ``memory_budget_gb`` and what its plan may choose
============================  ==============================================================================

The groups are the only copy of what they hold: ``trainer.precision`` or ``trainer.grad_accum_steps`` read them, and a
setter (``set_precision``, ``set_grad_accum_steps``...) replaces its group (``dataclasses.replace``), so whatever reads
the group (the run store, the memory planner, the OOM advice, the panel) sees the change. The other keywords are the
objects the Trainer holds and changes (the model, the optimizer, the scheduler, the metrics, the callbacks).
:class:`MemoryOptions` are the switches that decide what a training step keeps in memory and where (precision,
activation checkpointing, the optimizer kind, the optimizer step in backward, chunked loss, a quantized base, LoRA,
offloading, the attention kernel). Everything that reasons about memory (``profile_model(...).fits``, the memory
planner, the OOM advice, the compare presets, the panel's savers, the run store) takes or gives this one object,
so a new switch is one new field here, not a string in six lists.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from nbtrainer._keywords import KEYWORDS, TrainerKeywords, unknown_keyword
from nbtrainer._optimizer_kinds import optimizer_kind

if TYPE_CHECKING:
    import os

__all__ = [
    "LABELS",
    "QUANTIZE",
    "SWITCH",
    "BatchOptions",
    "BudgetOptions",
    "DataOptions",
    "MemoryOptions",
    "RunOptions",
    "SetupOptions",
    "StepOptions",
    "SwitchNames",
    "TrainerOptions",
    "TrainerParts",
    "keyword_signature",
    "lora_settings",
]

#: ``quantize=``: the base's weight formats.
QUANTIZE = ("nf4", "nf4-dq", "fp4", "int8")


@dataclass(frozen=True)
class MemoryOptions:
    """The memory switches of one run, each under the name of the ``Trainer`` keyword that sets it.

    Frozen: a different combination is a new object (``dataclasses.replace``). ``changed()`` gives the switches
    that differ from a plain fp32 run, as keyword arguments for ``Trainer(...)``, ``fits(...)`` or a comparison.

    Attributes:
        precision: ``"fp32"``, ``"fp16-mixed"`` or ``"bf16-mixed"`` (aliases ``"32"``, ``"16"``, ``"bf16"``...;
            stored resolved). ``Trainer(precision=None)`` (the default): fp32, or with ``memory_budget_gb`` the
            precision its plan picks. ``Trainer.set_precision`` changes it between fits.
        activation_checkpointing: ``True`` (the model's own ``activation_checkpointing_enable()`` /
            ``gradient_checkpointing_enable()``, else its repeated blocks), an int k / a float share in (0, 1) of
            those blocks (evenly spaced) or a list of module types / names; ``Trainer.set_activation_checkpointing``.
        optimizer: the optimizer's kind by name (``"adamw"``, ``"adamw8bit"``, ...; the Trainer's third argument
            by name, or the kind of the instance given); None: an optimizer whose state the planner does not know.
        optimizer_in_backward: update each parameter as soon as its gradient is complete, inside backward, and free
            that gradient: saves about the trainable parameters' size in memory. Same weights as a plain step;
            refused with max_grad_norm, fp16-mixed, accumulation, DDP/FSDP (see ``nbtrainer._loop._in_backward``).
        chunked_loss: a Hugging Face causal LM's training loss with the head and cross-entropy run ``True`` (1024)
            or N tokens at a time under checkpointing, so its full logits never exist (``_setup/_chunked_loss``).
        quantize: ``"nf4"``, ``"nf4-dq"``, ``"fp4"`` or ``"int8"``: the ``nn.Linear`` (and GPT-2 ``Conv1D``) layers
            (but the output head and trainable ones) become frozen bitsandbytes layers, computing in the
            precision's dtype.
        lora: LoRA adapters through PEFT, base frozen: ``dict(r=8, alpha=16, dropout=0.05,
            target_modules="all-linear")`` or a ``peft.LoraConfig`` (with ``quantize=``: QLoRA; stored as plain
            settings). Give the optimizer by name with these two. Merge with ``Trainer.merge_lora``.
        offload_activations: saved activations wait in CPU memory (pinned on CUDA) for the backward.
        offload_optimizer: optimizer state and step in CPU RAM (CUDA only; torchao ``CPUOffloadOptimizer``).
        attention: the SDPA backend of the forward: ``"auto"``, ``"flash"``, ``"efficient"``, ``"cudnn"`` or
            ``"math"``, checked on this device and dtype up front, with the model's attention dropout when it has one
            (Hugging Face models switch to ``"sdpa"``).

    Example:
        >>> from nbtrainer import MemoryOptions
        >>> MemoryOptions(precision="bf16-mixed", activation_checkpointing=True).changed()
        {'precision': 'bf16-mixed', 'activation_checkpointing': True}
    """

    precision: str = "fp32"
    activation_checkpointing: Any = False
    #: an optimizer kind by name (``"adamw"``, ``"adamw8bit"``, ...); None: the optimizer the user built
    optimizer: str | None = None
    optimizer_in_backward: bool = False
    chunked_loss: bool | int = False
    quantize: str | None = None
    #: LoRA's settings (``{"r": 8, ...}``) or None
    lora: Mapping[str, Any] | None = None
    offload_activations: bool = False
    offload_optimizer: bool = False
    attention: str = "auto"
    #: the switches' names as attributes (``MemoryOptions.SWITCH.quantize == "quantize"``): see :data:`SWITCH`
    SWITCH: ClassVar[SwitchNames]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The switches' names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> MemoryOptions:
        """The switches found in a dict of Trainer keyword arguments (the other keys are ignored)."""
        names = set(cls.names())
        return cls(**{k: v for k, v in kwargs.items() if k in names})

    def check_flags(self, call: str = "") -> None:
        """The on / off switches hold True or False (``offload_optimizer="yes"`` is refused, naming the switch, as a
        keyword of ``call`` when given: ``fits(offload_optimizer=)``)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                keyword = f"{call}({f.name}=)" if call else f"{f.name}="
                raise TypeError(f"{keyword} takes True or False, got {value!r}.")

    def changed(self) -> dict[str, Any]:
        """The switches that differ from their defaults, as ``Trainer`` keyword arguments."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default and not (f.name == "lora" and not self.lora)
        }

    def replace(self, **changes: Any) -> MemoryOptions:
        """A copy with ``changes`` applied (unknown names raise ``TypeError``)."""
        return dataclasses.replace(self, **changes)


class SwitchNames:
    """The memory switches' names as attributes (``SWITCH.quantize == "quantize"``), read from :class:`MemoryOptions`'
    fields: code that must name a switch as data (a key of a report, a record or a table of labels) names it through
    :data:`SWITCH`, so a switch renamed or removed fails where it is named, and no switch name is written twice."""

    def __getattr__(self, name: str) -> str:
        if name in _SWITCHES:
            return name
        raise AttributeError(f"{name!r} is no memory switch; they are {sorted(_SWITCHES)}")


_SWITCHES = frozenset(f.name for f in dataclasses.fields(MemoryOptions))
#: The memory switches' names (see :class:`SwitchNames`); public as ``MemoryOptions.SWITCH``.
SWITCH = SwitchNames()
MemoryOptions.SWITCH = SWITCH

#: How each switch reads in a few words (a plan row's ``describe()``, reports): the one table of display labels.
LABELS: dict[str, str] = {
    SWITCH.activation_checkpointing: "checkpointing",
    SWITCH.optimizer_in_backward: "in-backward",
    SWITCH.chunked_loss: "chunked loss",
    SWITCH.offload_activations: "offload activations",
    SWITCH.offload_optimizer: "offload optimizer",
    SWITCH.quantize: "quantize",
    SWITCH.lora: "LoRA",
    SWITCH.attention: "attention",
}


@dataclass(frozen=True)
class SetupOptions:
    """The device and what is done to the model before the first step, besides the memory switches
    (``nbtrainer._setup._model_setup.ModelSetup`` applies them).

    Attributes:
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; the Trainer stores the ``torch.device`` it
            resolved (under DDP: this rank's ``LOCAL_RANK`` GPU, or the CPU with gloo).
        lr: learning rate of an optimizer given by name (default: torch's default for it).
        trainable / freeze: glob patterns of parameter names to train only / to freeze (``["head.*"]``); counts in
            ``Trainer.param_counts``.
        compile: ``torch.compile`` the model (``True``, a mode string or a dict of its options).
        channels_last: convert a conv net to ``torch.channels_last`` memory format.
        save_base: with ``lora=`` / ``quantize=``, checkpoints also hold the frozen base (default: what trains, the
            optimizer and the loop state; a resume takes the base from the model it is given).
    """

    device: Any = "auto"
    lr: float | None = None
    trainable: str | Sequence[str] | None = None
    freeze: str | Sequence[str] | None = None
    compile: bool | str | dict[str, Any] = False
    channels_last: bool = False
    save_base: bool = False


@dataclass(frozen=True)
class StepOptions:
    """The optimizer step (``nbtrainer._loop._step.TrainStep``); ``set_grad_accum_steps`` / ``set_max_grad_norm`` /
    ``set_scheduler`` replace this group.

    Attributes:
        grad_accum_steps: micro-batches per optimizer step.
        max_grad_norm: clip the global grad norm (after unscaling) once per optimizer step; None: no clipping.
        scheduler_interval: ``"step"`` (once per optimizer step, never when fp16 skipped the step) or ``"epoch"``.
            ``ReduceLROnPlateau`` always steps per epoch on ``scheduler_monitor``.
        scheduler_monitor: the log key ReduceLROnPlateau watches (default ``val_loss`` when the fit validates,
            else ``loss``: one key for the whole fit); an epoch that does not log it does not step the plateau. Set
            with another scheduler or none, ``fit`` refuses it (nothing would read it).
        on_nonfinite: a NaN/inf training loss: ``"raise"`` (detected at the throttled read, no extra sync),
            ``"skip"`` the optimizer step of that window, or ``"stop"`` the fit (see ``nbtrainer._loop._nonfinite``).
    """

    grad_accum_steps: int = 1
    max_grad_norm: float | None = None
    scheduler_interval: str = "step"
    scheduler_monitor: str | None = None
    on_nonfinite: str = "raise"


@dataclass(frozen=True)
class BatchOptions:
    """How a batch becomes a loss or outputs: the batch protocol (``nbtrainer._data._batch``), the same for fit,
    evaluate and predict:

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

    Target keys: ``target_keys=``, else the first of ``labels``, ``label``, ``targets``, ``target``, ``y``; several
    ``target_keys`` reach the criterion as a tuple in key order. Anything else: ``compute_loss=`` and
    ``predict_step=`` (or the methods of those names in a subclass).

    Attributes:
        num_inputs: how many leading elements of a tuple batch are model inputs (default all but the last; also turns
            off the unpacking of ``((x1, x2), y)``). Refused at the first batch when it is a dict.
        target_keys: keys of a dict / Mapping / dataclass batch that hold targets; several: the criterion and metrics
            get a tuple of them in this order. Refused at the first batch when it is not a dict.
        compute_loss: ``fn(model, batch) -> loss | (loss, outputs, targets)`` overrides how a batch becomes a loss in
            fit and evaluate (subclasses can override ``Trainer.compute_loss`` instead).
        predict_step: ``fn(model, batch) -> outputs`` overrides how ``predict`` gets a batch's outputs (or override
            ``Trainer.predict_step``). Without it, a customised ``compute_loss`` that returns ``(loss, outputs,
            targets)`` gives predict its outputs; otherwise the model is called on the batch.
        training_step: manual optimization (GANs, several updates per batch): ``fn(step, batch) -> {name: scalar
            tensor}`` with ``optimizer={"name": opt, ...}`` and no criterion; ``step.model``,
            ``step.backward(loss, optimizer="name")``, ``step.step("name")`` (see ``nbtrainer._loop._manual``).
        validation_step: with ``training_step``: ``fn(model, batch) -> {name: scalar tensor}``, what ``evaluate`` and
            validation log (``val_`` + name).
    """

    num_inputs: int | None = None
    target_keys: Sequence[str] | str | None = None
    compute_loss: Callable[..., Any] | None = None
    predict_step: Callable[..., Any] | None = None
    training_step: Callable[..., Any] | None = None
    validation_step: Callable[..., Any] | None = None


@dataclass(frozen=True)
class DataOptions:
    """How batches reach the device (``nbtrainer._data._prefetch``).

    Attributes:
        fast_fetch: fetch each batch of a ``DataLoader`` over in-memory data (``TensorDataset``, arrays, ``Subset`` of
            them, a dataset with ``__getitems__``; ``num_workers=0``, default collate) with one indexing call, same
            indices and order, bit-identical results. Anything else uses the loader as it is. ``False``: always the
            loader's own iterator.
        data_on_device: on CUDA, copy such a dataset to the GPU once when it fits in this fraction of the free device
            memory, and slice batches there; otherwise batches are gathered into pinned memory and copied on a side
            stream one step ahead. ``0``: never copy the dataset.
        non_blocking: asynchronous host-to-device copies (stored as what runs: False off CUDA).
    """

    fast_fetch: bool = True
    data_on_device: float = 0.5
    non_blocking: bool = True


@dataclass(frozen=True)
class RunOptions:
    """Seeding, reporting and recording of each fit.

    Attributes:
        seed: seed everything at the start of ``fit``; with ``lora=``, also the adapters' random init (so two Trainers
            built with one seed start from the same adapters).
        deterministic: deterministic algorithms and seeded data order.
        progress: ``True`` / ``"auto"``: a ``ProgressBar`` that picks at run time (notebook bars, console bars on a
            terminal, plain epoch lines when the output is a file or pipe); ``"bars"`` or ``"lines"`` to force one;
            a ``ProgressBar(...)`` of your own; ``False``: none.
        refresh_interval: seconds between reads of running values (progress, history, widget).
        timing_every: sample the step-time breakdown every n micro-batches (0: off); under accumulation the
            micro-batch that closes the window at or after each.
        val_every_n_epochs: validate every n epochs. The epochs in between log no ``val_`` keys: what monitors one
            (``EarlyStopping``, ``ModelCheckpoint``, ``ReduceLROnPlateau``) skips them.
        run_store: where each fit is recorded as a run (``nbtrainer.Runs``): a SQLite file (``"runs.db"``), ``None``
            (``$NBTRAINER_RUNS`` if set, else this session's memory) or ``False`` (nothing).
        check_data: check the data at the start of each fresh fit (``Trainer.check_data``: duplicates, leaks between
            training and validation, NaN / Inf, scale, constant features, class balance), one progress line per
            finding; labels the model has no output for refuse the fit before its first step. ``True``: every item;
            an int: a seeded sample of that many items per split. A report made by ``Trainer.check_data`` on the same
            loaders is reused (the panel checks before Start).
    """

    seed: int | None = None
    deterministic: bool = False
    progress: Any = True
    refresh_interval: float = 0.25
    timing_every: int = 50
    val_every_n_epochs: int = 1
    run_store: str | os.PathLike[str] | bool | None = None
    check_data: bool | int = False


@dataclass(frozen=True)
class BudgetOptions:
    """``memory_budget_gb``: the budget, and which switches its plan may choose (those not given).

    ``Trainer(memory_budget_gb=X)`` keeps the training step within X GiB of device memory. At the first ``fit``,
    ``nbtrainer.plan_memory`` plans for its first batch on this device and the fastest row that fits is applied:
    precision, activation checkpointing, the optimizer kind (with ``optimizer="auto"``), and each batch split into
    micro-batches when the whole batch does not fit (same gradient). The switches you set yourself (a precision,
    checkpointing, an optimizer by name or instance, the step in backward...) are kept. One progress line says what was
    chosen; it is in the History's events, the run store and ``Trainer.memory_plan``. The peak of the first optimizer
    steps is measured; above the budget the next row is applied at the next step boundary (and said). Nothing fits: a
    ``ValueError`` before the first step. Not with ``compile=`` (plan that with ``plan_memory``).

    Attributes:
        budget_gb: the budget in GiB.
        choose_precision: no ``precision=`` was given: the plan picks it.
        choose_optimizer: ``optimizer="auto"``: the plan picks the optimizer's kind.
    """

    budget_gb: float
    choose_precision: bool = True
    choose_optimizer: bool = False


@dataclass(frozen=True)
class TrainerParts:
    """The keywords that are objects the Trainer holds and changes, not options: taken apart when it is built.

    Attributes:
        scheduler: any LR scheduler bound to the optimizer (OneCycleLR: use ``Trainer.total_steps``);
            ``{"name": sched}`` with several named optimizers. ``Trainer.set_scheduler`` replaces it.
        metrics: ``{"acc": torchmetrics.Accuracy(...), "mae": callable(outputs, targets)}``, or a torchmetrics
            ``MetricCollection`` (its keys name the values). A metric that fails on structured outputs (a
            ``ModelOutput``, a tuple) gets their ``.logits`` (else the first tensor).
        callbacks: objects with any of the hooks in ``nbtrainer.EVENTS`` (``Trainer.add_callback`` /
            ``remove_callback`` change them, also mid-fit).
        strategy: ``"auto"`` (DDP when launched by ``torchrun`` / ``nbtrainer.launch`` with more than one process,
            else one device), ``"single"``, ``"ddp"``, ``"fsdp"`` (FSDP2: parameters, gradients and optimizer state
            sharded across ranks), or ``nbtrainer.DDP(...)`` / ``nbtrainer.FSDP(...)`` with options. Each rank uses
            its ``LOCAL_RANK`` GPU (or the CPU with gloo); see ``docs/distributed.md``.
    """

    scheduler: Any = None
    metrics: Any = None
    callbacks: Iterable[Any] = ()
    strategy: Any = "auto"


_GROUPS: dict[str, type] = {
    "memory": MemoryOptions,
    "setup": SetupOptions,
    "step": StepOptions,
    "batch": BatchOptions,
    "data": DataOptions,
    "run": RunOptions,
}
#: Keywords that are no field of their group under the same name: ``optimizer`` (an object; the memory group keeps
#: its kind), ``precision`` (None: fp32, or the budget's choice) and ``memory_budget_gb`` (the budget group).
_SPECIAL = {"optimizer", "precision", "memory_budget_gb"}


def keyword_signature() -> inspect.Signature:
    """``Trainer.__init__``'s signature, flat (what ``help(Trainer)``, IPython's completion and ``inspect`` show):
    ``self, model, criterion, optimizer=None``, then every keyword with its default, read from the groups."""
    defaults: dict[str, Any] = {"precision": None, "memory_budget_gb": None}
    for group in (*_GROUPS.values(), TrainerParts):
        for f in dataclasses.fields(group):
            default = f.default_factory() if callable(f.default_factory) else f.default
            defaults.setdefault(f.name, default)
    kind, keyword = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
    parameters = [
        inspect.Parameter("self", kind),
        inspect.Parameter("model", kind, annotation="torch.nn.Module"),
        inspect.Parameter("criterion", kind, annotation="Callable[..., Any] | None"),
        inspect.Parameter("optimizer", kind, default=None, annotation="torch.optim.Optimizer | str | None"),
    ]
    parameters += [
        inspect.Parameter(name, keyword, default=defaults[name], annotation=getattr(hint, "__forward_arg__", hint))
        for name, hint in TrainerKeywords.__annotations__.items()
    ]
    return inspect.Signature(parameters, return_annotation="None")


@dataclass(frozen=True)
class TrainerOptions:
    """The options of one Trainer, by group (see the module docstring): ``trainer.options.memory``, ``.setup``,
    ``.step``, ``.batch``, ``.data``, ``.run`` and ``.budget``. Frozen: a change is a new object.

    Example:
        >>> options, parts = TrainerOptions.parse({"precision": "bf16-mixed", "grad_accum_steps": 4}, optimizer="sgd")
        >>> options.memory.precision, options.step.grad_accum_steps, options.memory.optimizer
        ('bf16-mixed', 4, 'sgd')
    """

    memory: MemoryOptions = field(default_factory=MemoryOptions)
    setup: SetupOptions = field(default_factory=SetupOptions)
    step: StepOptions = field(default_factory=StepOptions)
    batch: BatchOptions = field(default_factory=BatchOptions)
    data: DataOptions = field(default_factory=DataOptions)
    run: RunOptions = field(default_factory=RunOptions)
    budget: BudgetOptions | None = None

    @classmethod
    def parse(cls, keywords: Mapping[str, Any], *, optimizer: Any = None) -> tuple[TrainerOptions, TrainerParts]:
        """``Trainer(...)``'s keywords as given (values unchecked: the Trainer checks each where it applies it), into
        the groups and the parts; an unknown keyword raises ``TypeError`` naming the closest valid one.
        ``optimizer``: the Trainer's third argument, whose kind the memory group keeps."""
        for name in keywords:
            if name not in TrainerKeywords.__annotations__:
                raise unknown_keyword("Trainer", name, KEYWORDS)
        precision = keywords.get("precision")
        auto = isinstance(optimizer, str) and optimizer.strip().lower() == "auto"
        given = {k: v for k, v in keywords.items() if k not in _SPECIAL}
        groups = {
            name: group(**{f.name: given[f.name] for f in dataclasses.fields(group) if f.name in given})
            for name, group in _GROUPS.items()
        }
        memory = groups["memory"]
        groups["memory"] = dataclasses.replace(
            memory,
            precision="fp32" if precision is None else precision,
            optimizer=optimizer_kind("adamw" if auto else optimizer),  # "auto": AdamW, or the kind a budget picks
        )
        budget_gb = keywords.get("memory_budget_gb")
        budget = None if budget_gb is None else BudgetOptions(budget_gb, precision is None, auto)
        parts = TrainerParts(**{f.name: given[f.name] for f in dataclasses.fields(TrainerParts) if f.name in given})
        return cls(**groups, budget=budget), parts

    def replace(self, group: str, **changes: Any) -> TrainerOptions:
        """A copy with the group named ``group`` replaced by a copy with ``changes`` (unknown names: ``TypeError``).

        Example:
            >>> TrainerOptions().replace("step", grad_accum_steps=4).step.grad_accum_steps
            4
        """
        return dataclasses.replace(self, **{group: dataclasses.replace(getattr(self, group), **changes)})


def lora_settings(given: Any, config: Any, keep: Iterable[str] = ()) -> dict[str, Any] | None:
    """``lora=`` as plain settings: the user's dict, or a ``peft.LoraConfig``'s rank, alpha, dropout, targets, bias
    and ``modules_to_save`` (the planner counts a saved module as trained in full: without it, a plan under
    ``memory_budget_gb`` left out that module's copy, gradient and optimizer state). ``keep``: the parameters
    ``trainable=`` trains in full beside the adapters, as ``"trainable"`` (sorted names), for the planner as well:
    without them a plan left out their gradients and optimizer state (and counted a task head PEFT does not save
    once ``trainable=`` is given)."""
    if config is None:
        return None
    kept = {"trainable": sorted(keep)} if keep else {}
    if isinstance(given, Mapping):
        return {**given, **kept}
    targets = config.target_modules
    settings = {
        "r": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "target_modules": targets if isinstance(targets, str) else sorted(targets or ()),
        "bias": config.bias,
    }
    # the user's, not ``config``'s: that one has a Hugging Face task head added, which the planner adds on its own
    saved = getattr(given, "modules_to_save", None)
    if saved is not None:
        settings["modules_to_save"] = list(saved)
    return {**settings, **kept}
