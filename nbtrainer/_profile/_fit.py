"""Does a training step fit a memory budget? If not, which micro-batch x accumulation split does.

Works from one :func:`nbtrainer._profile._memory.measure_training_memory` breakdown: the fixed parts
(parameters, buffers, gradients, optimizer state) plus activations and inputs on the measured
``fixed + per_sample * batch_size`` lines.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nbtrainer._report._format import format_bytes

__all__ = ["FitResult", "plan_fit"]

_GIB = 2**30


@dataclass(frozen=True)
class FitResult:
    """Whether one training step fits a memory budget (what :meth:`ModelProfile.fits` returns).

    Truthy when it fits. ``needed_bytes`` is parameters + buffers + gradients + optimizer state +
    activations + inputs at ``batch_size`` (activations and inputs extrapolated linearly from the
    measured batch); the CUDA context and allocator fragmentation are not included (use ``headroom``).
    When it doesn't fit, ``micro_batch_size`` x ``accumulation_steps`` (= ``batch_size``) is the
    largest micro-batch that fits, split evenly; both are ``None`` when even one sample doesn't fit.
    """

    fits: bool
    needed_bytes: int
    budget_bytes: int
    batch_size: int
    device: str
    precision: str
    checkpointing: bool
    micro_batch_size: int | None
    accumulation_steps: int | None
    suggestion: str
    breakdown: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.fits

    def to_dict(self) -> dict[str, Any]:
        """Plain-data copy (JSON-serialisable)."""
        return asdict(self)


def _needed(memory: dict[str, Any], batch_size: int, checkpointing: bool) -> dict[str, int]:
    line = memory["scaling"]["activations_checkpointed" if checkpointing else "activations"]
    inputs = memory["scaling"]["inputs"]
    parts = {key: int(memory[key]) for key in ("parameters", "buffers", "gradients", "optimizer_state")}
    parts["activations"] = round(line["fixed"] + line["per_sample"] * batch_size)
    parts["inputs"] = round(inputs["fixed"] + inputs["per_sample"] * batch_size)
    return parts


def plan_fit(
    memory: dict[str, Any], *, budget_gb: float, batch_size: int, checkpointing: bool = False, headroom: float = 0.0
) -> FitResult:
    """Check one measured memory breakdown against ``budget_gb`` GiB (2**30 bytes) and suggest a split.

    Args:
        memory: One ``measure_training_memory`` result.
        budget_gb: Memory budget in GiB.
        batch_size: The batch size to train with.
        checkpointing: Evaluate with activation checkpointing (the model must have repeated blocks).
        headroom: Fraction of the budget kept free (e.g. 0.1 for the CUDA context and fragmentation).
    """
    if checkpointing and memory["scaling"]["activations_checkpointed"] is None:
        raise ValueError("checkpointing=True, but the model has no repeated blocks to checkpoint")
    budget = int(budget_gb * _GIB * (1.0 - headroom))
    parts = _needed(memory, batch_size, checkpointing)
    needed = sum(parts.values())
    common = {
        "needed_bytes": needed,
        "budget_bytes": budget,
        "batch_size": batch_size,
        "device": memory["device"],
        "precision": memory["precision"],
        "checkpointing": checkpointing,
        "breakdown": parts,
    }
    if needed <= budget:
        return FitResult(
            fits=True,
            micro_batch_size=batch_size,
            accumulation_steps=1,
            suggestion=(f"Fits: {format_bytes(needed)} of {format_bytes(budget)} at batch size {batch_size}."),
            **common,
        )
    alternative = ""
    if not checkpointing and memory["scaling"]["activations_checkpointed"] is not None:
        with_ckpt = sum(_needed(memory, batch_size, True).values())
        if with_ckpt <= budget:
            alternative = f" Or enable activation checkpointing: {format_bytes(with_ckpt)} at batch size {batch_size}."

    def total(micro: int) -> int:
        return sum(_needed(memory, micro, checkpointing).values())

    if total(1) > budget:
        fixed = sum(parts[k] for k in ("parameters", "buffers", "gradients", "optimizer_state"))
        return FitResult(
            fits=False,
            micro_batch_size=None,
            accumulation_steps=None,
            suggestion=(
                f"Does not fit even at micro-batch 1: {format_bytes(total(1))} of {format_bytes(budget)}, of which "
                f"parameters, buffers, gradients and optimizer state take {format_bytes(fixed)}. Use an optimizer with "
                f"less state, freeze layers or a device with more memory." + alternative
            ),
            **common,
        )
    largest = max(m for m in range(1, batch_size + 1) if total(m) <= budget)
    micro = max(m for m in range(1, largest + 1) if batch_size % m == 0)  # even split: same effective batch
    steps = batch_size // micro
    uneven = ""
    if micro < largest:
        n = -(-batch_size // largest)
        uneven = f" (Micro-batches of {largest} also fit: {n} steps give an effective batch of {largest * n}.)"
    return FitResult(
        fits=False,
        micro_batch_size=micro,
        accumulation_steps=steps,
        suggestion=(
            f"Needs {format_bytes(needed)} > {format_bytes(budget)} at batch size {batch_size}. Use micro-batches of "
            f"{micro} with {steps} accumulation steps ({format_bytes(total(micro))}, same effective batch "
            f"{batch_size}).{uneven}" + alternative
        ),
        **common,
    )
