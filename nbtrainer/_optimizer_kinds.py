"""The one registry of optimizers by name (:data:`OPTIMIZERS`): what ``Trainer(optimizer="adamw8bit")`` builds, how
the memory planner counts its state, what its step costs. A new optimizer by name is one row here; the code that
builds it (``nbtrainer._setup._model_setup.build_optimizer``, ``_setup/_kbit_optim``), offloads it
(``_setup/_offload``), counts its state (``_plan/_arithmetic``) and ranks its cost (``_plan/_cost``) reads the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["OPTIMIZERS", "OptimizerKind", "counted_kind", "optimizer_kind"]


@dataclass(frozen=True)
class OptimizerKind:
    """One optimizer a Trainer builds by name (``Trainer(optimizer="adamw8bit")``), with everything the rest of the
    package needs to know of it: the class it builds (and by which an instance is recognised), where that class lives,
    how its state is counted, and what it costs. A new optimizer by name is one row of :data:`OPTIMIZERS`.

    Attributes:
        name: the name ``Trainer(optimizer=...)``, ``fits(optimizer=...)`` and the planner take.
        cls: the class it builds, in ``library``'s optimizers (``torch.optim``, ``bitsandbytes.optim``,
            ``torchao.optim``).
        library: ``"torch"``, ``"bitsandbytes"`` or ``"torchao"``.
        fused: torch has a fused kernel for it (chosen where the device has one).
        state: how the memory arithmetic counts its state (``nbtrainer._plan._arithmetic``): ``"moments"`` (two per
            trained value), ``"adafactor"`` (a row and a column per matrix), ``"kbit"`` (blocks of ``kbit``),
            ``"stateless"`` (none: SGD as built by name, momentum 0), or None (not known: neither ``fits`` nor the
            planner names it).
        kbit: a k-bit state's bytes per value and block size.
        planned: a kind ``memory_budget_gb``'s plan may choose (in this order).
        offloadable: ``offload_optimizer`` runs its step on the CPU (torchao's ``CPUOffloadOptimizer`` wraps it).
        paged: its state lives in CUDA unified memory, paged to host RAM (CUDA only; not with the step in backward).
        time: its step time relative to AdamW, on CUDA and on a CPU (the planner's cost model, ``_plan/_cost``).
        why: why this library implements it (reports).
    """

    name: str
    cls: str
    library: str = "torch"
    fused: bool = False
    state: str | None = "moments"
    kbit: tuple[int, int] = (0, 0)
    planned: bool = False
    offloadable: bool = False
    paged: bool = False
    time: tuple[float, float] = (1.0, 1.0)
    why: str = ""


#: The one registry of optimizers by name (see :class:`OptimizerKind`).
OPTIMIZERS: dict[str, OptimizerKind] = {
    kind.name: kind
    for kind in (
        OptimizerKind("adamw", "AdamW", fused=True, planned=True, offloadable=True),
        OptimizerKind("adam", "Adam", fused=True, offloadable=True),
        OptimizerKind("sgd", "SGD", fused=True, state="stateless", offloadable=True),
        OptimizerKind(
            "adamw8bit",
            "AdamW8bit",
            "bitsandbytes",
            state="kbit",
            kbit=(2, 256),
            planned=True,
            time=(1.1, 1.6),
            why="bitsandbytes: block-wise 8-bit state, no compile step, plain-tensor state",
        ),
        OptimizerKind(
            "paged_adamw8bit",
            "PagedAdamW8bit",
            "bitsandbytes",
            state="kbit",
            kbit=(2, 256),
            planned=True,
            paged=True,
            time=(1.15, 1.6),
            why="bitsandbytes: 8-bit state in CUDA unified memory, paged to CPU RAM under pressure",
        ),
        OptimizerKind(
            "adamw4bit",
            "AdamW4bit",
            "torchao",
            state="kbit",
            kbit=(1, 128),
            planned=True,
            time=(1.15, 1.6),
            why="torchao: bitsandbytes has no 4-bit optimizer; compiled on its first step",
        ),
        OptimizerKind("adafactor", "Adafactor", state="adafactor", planned=True, offloadable=True, time=(1.3, 1.3)),
    )
}


def optimizer_kind(optimizer: Any) -> str | None:
    """The name in :data:`OPTIMIZERS` of an optimizer given by name or as an instance (None: none, or not listed).

    Example:
        >>> import torch
        >>> optimizer_kind(torch.optim.AdamW([torch.zeros(1, requires_grad=True)])), optimizer_kind("PagedAdamW8bit")
        ('adamw', 'paged_adamw8bit')
    """
    if optimizer is None:
        return None
    by_class = {kind.cls: kind.name for kind in OPTIMIZERS.values()}
    if isinstance(optimizer, str):  # a name, or a class name as the profile records it
        return by_class.get(optimizer.strip(), optimizer.strip().lower())
    inner = getattr(optimizer, "optimizer", None)  # an adapter around a library optimizer (offload_optimizer)
    kind = by_class.get(type(optimizer).__name__)
    if kind is None and inner is not None and inner is not optimizer:
        return optimizer_kind(inner)
    return kind


def counted_kind(optimizer: Any) -> str | None:
    """:func:`optimizer_kind`, or None where the memory arithmetic's rule for that kind does not hold for this
    instance: an SGD with momentum keeps a buffer per parameter, where the rule for ``"sgd"`` (as built by name,
    momentum 0) counts none."""
    kind = optimizer_kind(optimizer)
    if kind == "sgd" and not isinstance(optimizer, str):
        groups = getattr(optimizer, "param_groups", None) or [getattr(optimizer, "defaults", {})]
        if any(g.get("momentum", 0) for g in groups):
            return None
    return kind
