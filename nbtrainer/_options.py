"""The Trainer's options in typed groups: each switch declared once, as a field, and read from here.

``Trainer(...)`` keeps its keyword arguments flat for users; it stores them at once on ``trainer.options``.
:class:`MemoryOptions` are the switches that decide what a training step keeps in memory and where (precision,
activation checkpointing, the optimizer kind, the optimizer step in backward, chunked loss, a quantized base, LoRA,
offloading, the attention kernel). Everything that reasons about memory (``profile_model(...).fits``, the memory
planner, the OOM advice, the compare presets, the panel's savers, the run store) takes or gives this one object,
so a new switch is one new field here, not a string in six lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OPTIMIZERS",
    "OPTIMIZER_KINDS",
    "QUANTIZE",
    "MemoryOptions",
    "TrainerOptions",
    "lora_settings",
    "optimizer_kind",
]

#: The optimizers a memory switch can name, whose state the memory arithmetic knows (``fits``, the planner).
OPTIMIZERS = ("adamw", "adam", "adafactor", "adamw8bit", "paged_adamw8bit", "adamw4bit")
#: ``quantize=``: the base's weight formats.
QUANTIZE = ("nf4", "nf4-dq", "fp4", "int8")

#: The optimizers a memory switch can name (``Trainer(optimizer="adamw8bit")``), by the class each builds.
OPTIMIZER_KINDS: dict[str, str] = {
    "AdamW": "adamw",
    "Adam": "adam",
    "Adafactor": "adafactor",
    "AdamW8bit": "adamw8bit",
    "PagedAdamW8bit": "paged_adamw8bit",
    "AdamW4bit": "adamw4bit",
    "SGD": "sgd",
}


def optimizer_kind(optimizer: Any) -> str | None:
    """The switch name of an optimizer given by name or as an instance (None: none, or a kind not listed).

    Example:
        >>> import torch
        >>> optimizer_kind(torch.optim.AdamW([torch.zeros(1, requires_grad=True)])), optimizer_kind("PagedAdamW8bit")
        ('adamw', 'paged_adamw8bit')
    """
    if optimizer is None:
        return None
    if isinstance(optimizer, str):  # a switch name, or a class name as the profile records it
        return OPTIMIZER_KINDS.get(optimizer.strip(), optimizer.strip().lower())
    inner = getattr(optimizer, "optimizer", None)  # an adapter around a library optimizer (offload_optimizer)
    kind = OPTIMIZER_KINDS.get(type(optimizer).__name__)
    if kind is None and inner is not None and inner is not optimizer:
        return optimizer_kind(inner)
    return kind


@dataclass(frozen=True)
class MemoryOptions:
    """The memory switches of one run, each under the name of the ``Trainer`` keyword that sets it.

    Frozen: a different combination is a new object (``dataclasses.replace``). ``changed()`` gives the switches
    that differ from a plain fp32 run, as keyword arguments for ``Trainer(...)``, ``fits(...)`` or a comparison.

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

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The switches' names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> MemoryOptions:
        """The switches found in a dict of Trainer keyword arguments (the other keys are ignored)."""
        names = set(cls.names())
        return cls(**{k: v for k, v in kwargs.items() if k in names})

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


@dataclass(frozen=True)
class TrainerOptions:
    """The options a Trainer was built with, by group (``trainer.options.memory``)."""

    memory: MemoryOptions = field(default_factory=MemoryOptions)


def lora_settings(given: Any, config: Any) -> dict[str, Any] | None:
    """``lora=`` as plain settings: the user's dict, or a ``peft.LoraConfig``'s rank, alpha, dropout and targets."""
    if config is None:
        return None
    if isinstance(given, Mapping):
        return dict(given)
    targets = config.target_modules
    return {
        "r": config.r,
        "alpha": config.lora_alpha,
        "dropout": config.lora_dropout,
        "target_modules": targets if isinstance(targets, str) else sorted(targets or ()),
    }
