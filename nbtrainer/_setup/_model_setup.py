"""Memory- and speed-saving strategies as Trainer switches: optimizer by name, freezing, activation
checkpointing, ``torch.compile`` and ``channels_last``.

Everything here is applied to the user's model in one place (:class:`ModelSetup`), in two phases so a
``Trainer(...)`` that fails validation leaves the model untouched:

1. ``ModelSetup(...)`` checks the options and builds the optimizer when it is given by name (over the
   parameters that will be trainable); nothing on the model changes yet;
2. ``setup.apply()`` (the last thing ``Trainer.__init__`` does) sets ``requires_grad``, converts to
   ``channels_last``, wraps blocks for activation checkpointing and compiles.

Activation checkpointing stays switchable between fits (:meth:`ModelSetup.set_activation_checkpointing`):
our wrapping (``nbtrainer._setup._activation_checkpointing``) is reversible, and models that bring their own switch
(Hugging Face's ``gradient_checkpointing_enable()``) are switched with it.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._options import SWITCH, MemoryOptions, SetupOptions
from nbtrainer._setup._activation_checkpointing import (
    _check_blocks_exist,
    _check_checkpointing_value,
    enable_activation_checkpointing,
)
from nbtrainer._setup._coverage import check_optimizer_covers
from nbtrainer._setup._kbit_optim import KBIT_OPTIMIZERS, build_kbit_optimizer
from nbtrainer._setup._memory_savers import MemorySavers
from nbtrainer._setup._optimizers import Optimizers
from nbtrainer._setup._precision import resolve_device

__all__ = [
    "FUSED_ON_SHARDS",
    "TORCH_OPTIMIZERS",
    "ModelSetup",
    "ParamCounts",
    "build_optimizer",
    "freeze_parameters",
    "optimizer_impl",
    "param_counts",
    "param_numel",
]

# name -> the registry's row, for torch's own optimizers (the others: _kbit_optim)
TORCH_OPTIMIZERS = {name: kind for name, kind in OPTIMIZERS.items() if kind.library == "torch"}


# =============================================================================================
# optimizer by name
# =============================================================================================


def _fused_devices() -> list[str]:
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return list(_get_fused_kernels_supported_devices())
    except ImportError:  # pragma: no cover - older torch
        return ["cuda"]


#: The optimizers whose fused kernels run on sharded (DTensor) parameters: torch registers a DTensor rule for
#: ``_fused_adam_`` / ``_fused_adamw_`` only, so any other fused step under FSDP stops at its first step.
FUSED_ON_SHARDS = frozenset({"Adam", "AdamW"})


def _sharded(tensors: list[torch.Tensor]) -> bool:
    if not torch.distributed.is_available():  # pragma: no cover - a torch built without distributed
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in tensors)


def build_optimizer(
    name: str,
    params: Iterable[torch.Tensor] | nn.Module,
    lr: float | None = None,
    *,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> torch.optim.Optimizer:
    """A torch optimizer from its name, with the fastest implementation the device has.

    Args:
        name: ``"adamw"``, ``"adam"``, ``"sgd"`` or ``"adafactor"`` (``torch.optim.Adafactor``: factored
            second moments, about the size of one row + one column per matrix instead of Adam's 2x the
            parameters); ``"adamw8bit"``, ``"paged_adamw8bit"`` (bitsandbytes), ``"adamw4bit"`` (torchao),
            see ``nbtrainer._setup._kbit_optim``. Case-insensitive.
        params: the parameters (or a module: its parameters with ``requires_grad``).
        lr: learning rate; ``None`` keeps torch's default for that optimizer.
        device: where the parameters will live (default: where they are now). Adam, AdamW and SGD get
            ``fused=True`` when the device has fused kernels (CUDA, CPU, MPS...) and every parameter is
            floating point; otherwise torch picks (foreach on CUDA). SGD over sharded (FSDP, DTensor) parameters
            is not fused: torch has no fused SGD kernel for them. Adafactor keeps torch's default.
        **kwargs: passed to the optimizer (they win over the choices above).

    Example:
        >>> opt = build_optimizer("adafactor", nn.Linear(4, 2), lr=1e-2)
        >>> type(opt).__name__, opt.param_groups[0]["lr"]
        ('Adafactor', 0.01)
    """
    key = str(name).strip().lower()
    if key in KBIT_OPTIMIZERS:
        return build_kbit_optimizer(key, params, lr, **kwargs)
    if key not in TORCH_OPTIMIZERS:
        raise ValueError(
            f"Unknown optimizer name {name!r}: use one of {sorted(OPTIMIZERS)}, or pass an "
            "optimizer instance, e.g. torch.optim.AdamW(model.parameters(), lr=1e-3)."
        )
    cls_name, has_fused = TORCH_OPTIMIZERS[key].cls, TORCH_OPTIMIZERS[key].fused
    cls = getattr(torch.optim, cls_name, None)
    if cls is None:  # pragma: no cover - torch < 2.5 has no Adafactor
        raise ValueError(f"torch {torch.__version__} has no torch.optim.{cls_name}; upgrade torch or pick another.")
    if isinstance(params, nn.Module):
        params = [p for p in params.parameters() if p.requires_grad]
    params = list(params)
    if not params:
        raise ValueError("No trainable parameters to optimize: every parameter is frozen (requires_grad=False).")
    options: dict[str, Any] = {}
    if lr is not None:
        options["lr"] = float(lr)
    if has_fused and "foreach" not in kwargs:
        dev = torch.device(device) if device is not None else None
        tensors = [p for p in params if isinstance(p, torch.Tensor)]
        dev_type = dev.type if dev is not None else (tensors[0].device.type if tensors else "cpu")
        fusable = cls_name in FUSED_ON_SHARDS or not _sharded(tensors)
        if fusable and dev_type in _fused_devices() and all(p.is_floating_point() for p in tensors):
            options["fused"] = True
    options.update(kwargs)
    return cls(params, **options)


def optimizer_impl(optimizer: torch.optim.Optimizer) -> str:
    """``"fused"``, ``"foreach"`` or ``"default"`` (torch decides at the first step) for group 0."""
    group = optimizer.param_groups[0]
    if group.get("fused"):
        return "fused"
    if group.get("foreach"):
        return "foreach"
    return "default"


# =============================================================================================
# freezing
# =============================================================================================


@dataclasses.dataclass
class ParamCounts:
    """Parameter counts of a model (shared parameters counted once).

    Attributes:
        total, trainable, frozen: numbers of scalars.
        trainable_tensors, frozen_tensors: numbers of parameter tensors.
        trainable_names: qualified names of the trainable tensors.
    """

    total: int
    trainable: int
    frozen: int
    trainable_tensors: int
    frozen_tensors: int
    trainable_names: list[str]

    @property
    def trainable_fraction(self) -> float:
        return self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return (
            f"trainable {self.trainable:,} of {self.total:,} parameters ({self.trainable_fraction:.1%}) "
            f"in {self.trainable_tensors} tensors; frozen {self.frozen:,} in {self.frozen_tensors}"
        )

    def _repr_html_(self) -> str:
        return f"<span>{self}</span>"


def param_numel(p: torch.Tensor) -> int:
    """How many weights ``p`` holds: a bitsandbytes 4-bit parameter packs two per byte of its storage, so its
    ``numel()`` is half its weights (as peft's ``get_nb_trainable_parameters`` counts them).

    Example:
        >>> param_numel(nn.Linear(3, 2).weight)
        6
    """
    cls = type(p)  # told by name and module: bitsandbytes is an optional import
    packed = cls.__module__.startswith("bitsandbytes") and cls.__name__ == "Params4bit"
    if not packed or not getattr(p, "bnb_quantized", False):  # not a 4-bit weight, or not quantized yet
        return p.numel()
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    if shape is not None:  # the weight's own shape (a layer repacked for CPU inference changes the storage's)
        return int(torch.Size(shape).numel())
    return p.numel() * 2 * p.element_size()  # pairs packed in a uint8, or in a wider quant_storage


def param_counts(model: nn.Module) -> ParamCounts:
    """Trainable / frozen parameter counts of ``model``.

    Example:
        >>> param_counts(nn.Linear(3, 2)).trainable
        8
    """
    trainable, frozen, names = 0, 0, []
    n_frozen = 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            trainable += param_numel(p)
            names.append(name)
        else:
            frozen += param_numel(p)
            n_frozen += 1
    return ParamCounts(trainable + frozen, trainable, frozen, len(names), n_frozen, names)


def _as_patterns(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what}= takes glob patterns of parameter names, e.g. ['head.*'], got {value!r}.")
    return list(value)


def _matches(name: str, pattern: str) -> bool:
    # "head" also matches everything under the module "head" (head.weight, head.0.bias...).
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")


def plan_trainable(model: nn.Module, trainable: Any = None, freeze: Any = None) -> dict[str, bool]:
    """``{parameter name: requires_grad}`` after the patterns (the model is not changed).

    ``trainable`` patterns: exactly the matching parameters train, all others are frozen. ``freeze``
    patterns: the matching parameters are frozen, the others keep their flag (so a peft/LoRA model keeps
    its own choice). Both: ``trainable`` first, then ``freeze``. A pattern matching nothing is an error
    (a typo would otherwise silently train everything or nothing). A tied tensor answers to each of its names (an
    LM head tied to the embedding: ``"head"`` freezes the embedding too); the plan is keyed by the first name.
    """
    plan = {name: p.requires_grad for name, p in model.named_parameters()}
    every = parameter_aliases(model)
    for option, value in (("trainable", trainable), ("freeze", freeze)):
        if value is None:
            continue
        patterns = _as_patterns(value, option)
        for pattern in patterns:
            if not any(_matches(name, pattern) for name, _ in every):
                sample = ", ".join(name for name, _ in every[:6]) + (" ..." if len(every) > 6 else "")
                raise ValueError(
                    f"{option}= pattern {pattern!r} matches no parameter. Patterns are globs over "
                    f"parameter names such as: {sample}"
                )
        hits = {first for name, first in every if any(_matches(name, pattern) for pattern in patterns)}
        for first in plan:
            if option == "trainable":
                plan[first] = first in hits
            elif first in hits:
                plan[first] = False
    return plan


def parameter_aliases(model: nn.Module) -> list[tuple[str, str]]:
    """Every name of every parameter with the name ``named_parameters()`` gives its tensor (the first one): a tied
    tensor appears once per owner."""
    first = {id(p): name for name, p in model.named_parameters()}
    return [(name, first[id(p)]) for name, p in model.named_parameters(remove_duplicate=False)]


def freeze_parameters(model: nn.Module, trainable: Any = None, freeze: Any = None) -> ParamCounts:
    """Train only a subset of ``model``: set ``requires_grad`` by glob patterns over parameter names.

    Args:
        model: the model (changed in place).
        trainable: patterns of the parameters to train; every other parameter is frozen.
        freeze: patterns of the parameters to freeze; the rest keep their flag.

    Returns:
        The :class:`ParamCounts` afterwards.

    Example:
        >>> model = nn.Sequential()
        >>> model.add_module("body", nn.Linear(4, 4)); model.add_module("head", nn.Linear(4, 2))
        >>> str(freeze_parameters(model, trainable=["head.*"]))
        'trainable 10 of 30 parameters (33.3%) in 2 tensors; frozen 20 in 2'
    """
    plan = plan_trainable(model, trainable, freeze)
    for name, p in model.named_parameters():
        p.requires_grad_(plan[name])
    return param_counts(model)


# =============================================================================================
# activation checkpointing, channels_last, compile
# =============================================================================================


def has_conv2d(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)) for m in model.modules())


def _compile_options(value: Any) -> dict[str, Any] | None:
    if value is False or value is None:
        return None
    if value is True:
        return {}
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, str):
        return {"mode": value}
    raise TypeError(f"compile= takes True/False, a mode string or a dict of torch.compile options, got {value!r}.")


class ModelSetup:
    """What is done to one Trainer's model before the first step, checked up front and applied in one place.

    Args:
        model: the user's model.
        optimizer: an optimizer instance, or a name for :func:`build_optimizer`.
        setup: the Trainer's :class:`~nbtrainer._options.SetupOptions` (its ``device`` resolved): ``lr`` for an
            optimizer given by name, ``trainable`` / ``freeze`` (see :func:`plan_trainable`), ``compile``,
            ``channels_last``, ``save_base``.
        memory: the Trainer's :class:`~nbtrainer._options.MemoryOptions` as given: activation checkpointing is
            checked here, the others by the memory savers (:class:`~nbtrainer._setup._memory_savers.MemorySavers`),
            whose ``memory`` is the checked copy.
    """

    def __init__(self, model: nn.Module, optimizer: Any, *, setup: SetupOptions, memory: MemoryOptions) -> None:
        self.model = model
        lr, device = setup.lr, setup.device
        if lr is not None and not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0):
            raise ValueError(f"lr must be a positive number, got {lr!r}.")
        if lr is not None and not isinstance(optimizer, str):
            raise ValueError(
                "lr= is for an optimizer given by name (optimizer='adamw'); an optimizer instance "
                "already has its learning rate, and optimizer=None trains nothing."
            )
        _check_checkpointing_value(memory.activation_checkpointing)
        _check_blocks_exist(model, memory.activation_checkpointing)
        self.compile_options = _compile_options(setup.compile)
        self.channels_last = bool(setup.channels_last)
        if self.channels_last and not has_conv2d(model):
            warnings.warn("channels_last=True has no effect: the model has no 2-D convolutions.", stacklevel=4)
            self.channels_last = False
        trainable, freeze = setup.trainable, setup.freeze
        self.trainable, self.freeze = trainable, freeze
        self._plan = plan_trainable(model, trainable, freeze) if (trainable is not None or freeze is not None) else None
        self._handle: Any = None
        self.optimizer_name: str | None = None
        plan = self._plan or {n: p.requires_grad for n, p in model.named_parameters()}
        # every name of a tensor that trains: quantize / lora spare a tied head named by trainable= as well
        keep = {n for n, first in parameter_aliases(model) if plan[first]} if trainable is not None else set()
        self.savers = MemorySavers(
            model, optimizer, memory, device=device, save_base=setup.save_base, plan=plan, keep=keep
        )
        self._lr = lr
        if isinstance(optimizer, str):
            params = [p for n, p in model.named_parameters() if plan[n]]
            self.optimizer_name = optimizer.strip().lower()
            if self.savers.deferred:  # built in apply(), over what trains once quantize / lora changed the model
                optimizer = None
            elif not params and self.optimizer_name in OPTIMIZERS:
                raise ValueError(
                    f"optimizer={optimizer!r} has nothing to train: every parameter of the model is frozen "
                    "(requires_grad=False). To evaluate or predict only, pass optimizer=None: "
                    "Trainer(model, criterion, optimizer=None); to train, unfreeze some (trainable=[...])."
                )
            else:
                optimizer = build_optimizer(optimizer, params, lr, device=resolve_device(device))
        self.optimizer = optimizer
        self.applied = False

    @property
    def checkpointed_blocks(self) -> list[str]:
        return list(self._handle.names) if self._handle is not None else []

    def apply(self, *, seed: int | None = None, activation_checkpointing: Any = False) -> nn.Module:
        """Change the model (freeze, quantize, LoRA, channels_last, checkpointing, attention, offload, compile);
        returns the module to train. ``seed``: the LoRA adapters' init (see ``MemorySavers.transform``)."""
        model = self.model
        if self._plan is not None:
            for name, p in model.named_parameters():
                p.requires_grad_(self._plan[name])
        trained = self.savers.transform(model, seed=seed)
        if self.savers.deferred and self.optimizer_name is not None:
            # built here over what trains, so it covers it; and torchao's offloaded optimizer holds host copies of
            # the large parameters, not the model's own tensors, which the check below would call untrained
            self.optimizer = self.savers.build_optimizer(trained, self.optimizer_name, self._lr, build_optimizer)
        elif isinstance(self.optimizer, torch.optim.Optimizer) and not isinstance(self.optimizer, Optimizers):
            # several named optimizers (Optimizers): check_optimizers warns already
            check_optimizer_covers(trained, [self.optimizer], trainable=self._plan)
        if self.channels_last:
            # torch's overloads of Module.to leave out memory_format=, which it documents and accepts
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._handle = enable_activation_checkpointing(model, activation_checkpointing)
        self.savers.attach_hooks(trained)
        self.applied = True
        if self.compile_options is not None:
            compiled = torch.compile(trained, **self.compile_options)
            assert isinstance(compiled, nn.Module)  # an OptimizedModule (typed as the callable it wraps)
            return compiled
        return trained

    def set_activation_checkpointing(self, value: Any) -> list[str]:
        """Switch activation checkpointing (off: the model is restored exactly); returns the wrapped blocks."""
        _check_checkpointing_value(value)
        _check_blocks_exist(self.model, value)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._handle = enable_activation_checkpointing(self.model, value)
        return self.checkpointed_blocks

    def param_counts(self) -> ParamCounts:
        return param_counts(self.model)

    def describe(self) -> dict[str, Any]:
        """The options in effect, as plain data (for reports and the comparison table)."""
        return {
            "optimizer": self.optimizer_name or (type(self.optimizer).__name__ if self.optimizer is not None else None),
            "optimizer_impl": optimizer_impl(self.optimizer) if self.optimizer is not None else None,
            SWITCH.activation_checkpointing: self.checkpointed_blocks,
            "compile": self.compile_options is not None,
            "channels_last": self.channels_last,
            "params": str(self.param_counts()),
            **self.savers.describe(),
        }
