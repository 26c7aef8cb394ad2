"""Does a training step fit a memory budget? If not, which micro-batch x accumulation split does.

Works from one :func:`nbtrainer._memory._breakdown.measure_training_memory` breakdown: the fixed parts
(parameters, buffers, gradients, optimizer state) plus activations and inputs on the measured
``fixed + per_sample * batch_size`` lines. The memory switches (``quantize=``, ``lora=``, ``optimizer=``,
``offload_activations=``, ``offload_optimizer=``) change those parts by arithmetic (:mod:`._switches`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from nbtrainer._options import MemoryOptions
from nbtrainer._plan._result import check_batch_size, check_budget_gb, check_share
from nbtrainer._profile._switches import Switched, apply_switches
from nbtrainer._report._format import format_bytes

__all__ = ["FitResult", "plan_fit", "planned_fit"]

_GIB = 2**30


@dataclass(frozen=True)
class FitResult:
    """Whether one training step fits a memory budget (what :meth:`ModelProfile.fits` returns).

    Truthy when it fits. ``needed_bytes`` is parameters + buffers + gradients + optimizer state +
    activations + inputs at ``batch_size`` (activations and inputs extrapolated linearly from the
    measured batch); the CUDA context and allocator fragmentation are not included (use ``headroom``).
    When it doesn't fit, ``micro_batch_size`` x ``accumulation_steps`` (= ``batch_size``) is the
    largest micro-batch that fits, split evenly; both are ``None`` when even one sample doesn't fit.
    ``switches`` are the memory switches assumed (the Trainer's option names), ``savings`` says which switch
    saved how many bytes of which part (``{"quantize='nf4'": {"parameters": ...}, ...}``; negative: it costs,
    as LoRA's adapters cost parameters), ``host_bytes`` what offloading moved to host RAM (not in
    ``needed_bytes``).
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
    switches: dict[str, Any] = field(default_factory=dict)
    savings: dict[str, dict[str, int]] = field(default_factory=dict)
    host_bytes: int = 0

    def __bool__(self) -> bool:
        return self.fits

    def to_dict(self) -> dict[str, Any]:
        """Plain-data copy (JSON-serialisable)."""
        return asdict(self)

    def _parts(self) -> list[tuple[str, str]]:
        parts = [(k.replace("_", " "), format_bytes(v)) for k, v in self.breakdown.items()]
        return parts + ([("in host RAM (offloaded)", format_bytes(self.host_bytes))] if self.host_bytes else [])

    def __str__(self) -> str:
        head = (
            f"{'fits' if self.fits else 'does not fit'}: {format_bytes(self.needed_bytes)} needed of "
            f"{format_bytes(self.budget_bytes)} on {self.device} ({self.precision}, batch size {self.batch_size})"
        )
        parts = ", ".join(f"{name} {value}" for name, value in self._parts())
        return f"{head}\n  {parts}\n  {self.suggestion}" if parts else f"{head}\n  {self.suggestion}"

    def _repr_html_(self) -> str:
        import html

        verdict = "fits" if self.fits else "does not fit"
        rows = "".join(
            f"<tr><td style='padding:1px 8px'>{html.escape(k)}</td><td style='padding:1px 8px;text-align:right'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in [*self._parts(), ("needed", format_bytes(self.needed_bytes))]
        )
        return (
            f"<div class='nbtrainer-fit'><b>{verdict}</b>: {html.escape(format_bytes(self.needed_bytes))} of "
            f"{html.escape(format_bytes(self.budget_bytes))} on {html.escape(self.device)} "
            f"({html.escape(self.precision)}, batch size {self.batch_size})"
            f"<table style='border-collapse:collapse;margin:4px 0'>{rows}</table>"
            f"<div>{html.escape(self.suggestion)}</div></div>"
        )


def _needed(memory: dict[str, Any], batch_size: int, checkpointing: bool, switched: Switched) -> dict[str, int]:
    line = memory["scaling"]["activations_checkpointed" if checkpointing else "activations"]
    inputs = memory["scaling"]["inputs"]
    parts = dict(switched.parts)
    activations = line["fixed"] + line["per_sample"] * batch_size
    parts["activations"] = round(activations * switched.activation_scale)
    parts["inputs"] = round(inputs["fixed"] + inputs["per_sample"] * batch_size)
    return parts


def _savings_text(switched: Switched, activations_moved: int) -> str:
    said = []
    for switch, saved in switched.savings.items():
        gains = [f"{format_bytes(v)} of {k.replace('_', ' ')}" for k, v in saved.items() if v > 0]
        costs = [f"{format_bytes(-v)} of {k.replace('_', ' ')}" for k, v in saved.items() if v < 0]
        text = f"{switch} saves {', '.join(gains) or 'nothing'}" + (f" and costs {', '.join(costs)}" if costs else "")
        said.append(text)
    if activations_moved:
        said.append(f"offload_activations moves {format_bytes(activations_moved)} of activations to host RAM")
    if switched.host.get("optimizer_state"):
        said.append(f"offload_optimizer keeps {format_bytes(switched.host['optimizer_state'])} in host RAM")
    said += switched.notes
    return (" " + "; ".join(said) + ".") if said else ""


def _check_fit_args(budget_gb: Any, batch_size: Any, headroom: Any) -> None:
    check_budget_gb(budget_gb, "fits")
    check_batch_size(batch_size, "fits", "the batch size (None: the profiled one)")
    check_share(headroom, "fits", "headroom")


def plan_fit(
    memory: dict[str, Any],
    *,
    budget_gb: float,
    batch_size: int,
    switches: MemoryOptions,
    headroom: float = 0.0,
    structure: dict[str, Any] | None = None,
) -> FitResult:
    """Check one measured memory breakdown against ``budget_gb`` GiB (2**30 bytes) and suggest a split.

    Args:
        memory: One ``measure_training_memory`` result.
        budget_gb: Memory budget in GiB.
        batch_size: The batch size to train with.
        switches: the memory switches, checked (:func:`nbtrainer._profile._switches.normalize_switches`): with
            ``activation_checkpointing`` the model must have repeated blocks.
        headroom: Fraction of the budget kept free (e.g. 0.1 for the CUDA context and fragmentation).
        structure: The profiled model's layer table (:func:`nbtrainer._profile._switches.model_structure`),
            needed by ``quantize`` / ``lora`` / ``optimizer``.
    """
    _check_fit_args(budget_gb, batch_size, headroom)
    checkpointing = bool(switches.activation_checkpointing)
    if checkpointing and memory["scaling"]["activations_checkpointed"] is None:
        raise ValueError("checkpointing=True, but the model has no repeated blocks to checkpoint")
    chosen = switches
    switched = apply_switches(memory, structure, chosen)
    budget = int(budget_gb * _GIB * (1.0 - headroom))
    parts = _needed(memory, batch_size, checkpointing, switched)
    needed = sum(parts.values())
    moved = 0  # activations offloading sends to host RAM
    if chosen.offload_activations:
        moved = _needed(memory, batch_size, checkpointing, Switched(parts={}))["activations"] - parts["activations"]
    host = moved + switched.host.get("optimizer_state", 0)
    said = _savings_text(switched, moved)
    common = {
        "needed_bytes": needed,
        "budget_bytes": budget,
        "batch_size": batch_size,
        "device": memory["device"],
        "precision": memory["precision"],
        "breakdown": parts,
        "switches": _assumed(chosen),
        "savings": switched.savings,
        "host_bytes": host,
    }
    if needed <= budget:
        return FitResult(
            checkpointing=checkpointing,
            fits=True,
            micro_batch_size=batch_size,
            accumulation_steps=1,
            suggestion=(f"Fits: {format_bytes(needed)} of {format_bytes(budget)} at batch size {batch_size}." + said),
            **common,
        )
    alternative = ""
    if not checkpointing and memory["scaling"]["activations_checkpointed"] is not None:
        ckpt_switched = apply_switches(memory, structure, dataclasses.replace(chosen, activation_checkpointing=True))
        with_ckpt = sum(_needed(memory, batch_size, True, ckpt_switched).values())
        if with_ckpt <= budget:
            alternative = f" Or enable activation checkpointing: {format_bytes(with_ckpt)} at batch size {batch_size}."

    def total(micro: int) -> int:
        return sum(_needed(memory, micro, checkpointing, switched).values())

    if total(1) > budget:
        fixed = sum(parts[k] for k in ("parameters", "buffers", "gradients", "optimizer_state"))
        return FitResult(
            checkpointing=checkpointing,
            fits=False,
            micro_batch_size=None,
            accumulation_steps=None,
            suggestion=(
                f"Does not fit even at micro-batch 1: {format_bytes(total(1))} of {format_bytes(budget)}, of which "
                f"parameters, buffers, gradients and optimizer state take {format_bytes(fixed)}. Use an optimizer with "
                f"less state, freeze layers or a device with more memory." + alternative + said
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
        checkpointing=checkpointing,
        fits=False,
        micro_batch_size=micro,
        accumulation_steps=steps,
        suggestion=(
            f"Needs {format_bytes(needed)} > {format_bytes(budget)} at batch size {batch_size}. Use micro-batches of "
            f"{micro} with {steps} accumulation steps ({format_bytes(total(micro))}, same effective batch "
            f"{batch_size}).{uneven}" + alternative + said
        ),
        **common,
    )


def _assumed(switches: MemoryOptions) -> dict[str, Any]:
    """``FitResult.switches``: the switches assumed besides the precision and checkpointing (its own fields)."""
    return dataclasses.replace(switches, precision="fp32", activation_checkpointing=False).changed()


def planned_fit(
    plan: Any, budget_gb: float, *, batch_size: int, example_size: int, switches: MemoryOptions, headroom: float
) -> FitResult:
    """``fits()`` of a planned profile: the plan's row for these switches against ``budget_gb`` (less ``headroom``);
    not fitting, the largest micro-batch of the plan's that does (same switches, accumulation)."""
    _check_fit_args(budget_gb, batch_size, headroom)
    if batch_size != example_size:
        raise ValueError(
            f"fits(batch_size={batch_size}): this profile was planned for its example's {example_size} samples (the "
            "model has no weights to measure). Profile an example of that size, or plan_memory(model, batch, "
            f"batch_size={batch_size}, ...) for an effective batch reached with accumulation."
        )
    chosen = switches.changed()  # the plan's row for these switches, as Trainer keywords
    row = plan.predict(**chosen)
    budget = int(budget_gb * 2**30 * (1.0 - headroom))
    needed = row.needed_bytes
    common = {
        "needed_bytes": needed,
        "budget_bytes": budget,
        "batch_size": batch_size,
        "device": plan.device,
        "precision": switches.precision,
        "breakdown": dict(row.parts),
        "switches": dict(row.switches),
        "host_bytes": row.host_bytes,
    }
    what = f"{format_bytes(needed)} (planned: {row.describe()})"
    if needed <= budget:
        return FitResult(
            checkpointing=bool(switches.activation_checkpointing),
            fits=True, micro_batch_size=batch_size, accumulation_steps=1,
            suggestion=f"Fits: {what} of {format_bytes(budget)}.", **common,
        )  # fmt: skip
    micro = batch_size // 2
    while micro >= 1:
        if batch_size % micro == 0:
            smaller = plan.predict(
                grad_accum_steps=batch_size // micro,
                **chosen,
            )  # fmt: skip
            if smaller.needed_bytes <= budget:
                return FitResult(
                    checkpointing=bool(switches.activation_checkpointing),
                    fits=False, micro_batch_size=micro, accumulation_steps=batch_size // micro,
                    suggestion=(
                        f"Needs {what} > {format_bytes(budget)}. Use micro-batches of {micro} with "
                        f"{batch_size // micro} accumulation steps ({format_bytes(smaller.needed_bytes)})."
                    ),
                    **common,
                )  # fmt: skip
        micro //= 2
    return FitResult(
        checkpointing=bool(switches.activation_checkpointing),
        fits=False, micro_batch_size=None, accumulation_steps=None,
        suggestion=f"Does not fit at micro-batch 1 either: {what} > {format_bytes(budget)}; see plan_memory.",
        **common,
    )  # fmt: skip
