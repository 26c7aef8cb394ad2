"""What the measured values mean: drafts of reports (problems, warnings) and the lights' one-line summaries.

Pure functions of host values: :class:`~nbtrainer.Health` measures, these judge, Health files the reports (adding
the learning-rate advice a draft asks for) and acts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from nbtrainer._health._health_report import SignalState
from nbtrainer._report._format import format_lr, format_number

__all__ = ["DEAD_SHARE", "EXPLODE_FACTOR", "UPDATE_RATIO", "VANISH", "Draft", "judge_dead", "judge_norms", "names"]

EXPLODE_FACTOR = 20.0  # a total gradient norm this many times its median so far has exploded
VANISH = 1e-8  # a block's gradient norm below this share of its weights' norm has vanished
UPDATE_RATIO = 0.1  # one step moving the weights by this share of their norm: the LR is too high
DEAD_SHARE = 0.5  # a block with at least this share of dead ReLU units gets a warning


@dataclass
class Draft:
    """A report before Health files it: ``lr_advice`` asks for a concrete learning rate in its advice."""

    kind: str
    step: int
    message: str
    advice: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    level: str = "problem"
    lr_advice: bool = False
    epoch: int | None = None
    clip_advice: bool = False  # asks for a clipping norm from the measured norms
    onset: int | None = None  # the step the damage began (None: the report's step)


def names(blocks: list[str], most: int = 3) -> str:
    """``block a``, ``blocks a, b, c and 2 more``: plain text (it reaches the progress line and the panel as is).

    Example:
        >>> names(["0"]), names(["encoder.layer.0", "head"])
        ('block 0', 'blocks encoder.layer.0, head')
    """
    if not blocks:
        return "no block"
    shown = ", ".join(blocks[:most])
    return (
        ("block " if len(blocks) == 1 else "blocks ")
        + shown
        + (f" and {len(blocks) - most} more" if len(blocks) > most else "")
    )


def judge_norms(
    step: int,
    blocks: list[str],
    grads: list[float],
    ratios: list[float] | None,
    weights: list[float],
    totals: list[float],
    lr: float | None,
) -> tuple[list[Draft], dict[str, SignalState]]:
    """One sample of ``[total, block...]`` vectors (``totals``: the finite total norms before it, extended here)."""
    drafts: list[Draft] = []
    lights: dict[str, SignalState] = {}
    total = grads[0]
    rows = list(zip(blocks, grads[1:], weights[1:], strict=True))
    if not math.isfinite(total):
        bad = [n for n, g, _ in rows if not math.isfinite(g)]
        drafts.append(
            Draft(
                "nonfinite",
                step,
                f"the gradient is non-finite at step {step}, in {names(bad)}",
                "A NaN/inf gradient with a finite loss comes from the backward of an operation at its edge "
                "(sqrt or log at 0, a division by a tiny number) or from fp16 overflow.",
                {"blocks": bad, "where": "gradient"},
                lr_advice=True,
            )
        )
        lights["gradients"] = SignalState("problem", f"non-finite at step {step} in {names(bad)}")
        return drafts, lights
    largest = max(rows, key=lambda r: r[1]) if rows else ("total", total, weights[0])
    typical = statistics.median(totals) if len(totals) >= 3 else None
    if typical is not None:
        exploded = total > EXPLODE_FACTOR * max(typical, 1e-12)
        than = f"{total / max(typical, 1e-12):.0f}x its median {format_number(typical)}"
    else:  # the first samples: against the weights' own norm
        exploded = weights[0] > 0 and total > 10 * weights[0]
        # A gradient's size depends on the loss's scale (reduction="sum" multiplies it by the batch): a healthy
        # AdamW run with a summed loss has a first gradient 14x its weights' norm. Where this step's update is
        # known, it must be large too: a step that moved the weights by under UPDATE_RATIO did no harm.
        if exploded and ratios is not None and math.isfinite(ratios[0]):
            exploded = ratios[0] > UPDATE_RATIO
        than = f"{total / max(weights[0], 1e-12):.0f}x the weights' norm"
    totals.append(total)
    summary = f"norm {format_number(total)} at step {step} · largest block {largest[0]} {format_number(largest[1])}"
    if exploded:
        drafts.append(
            Draft(
                "grad_norm",
                step,
                f"the gradient norm exploded at step {step}: {format_number(total)} ({than}), largest in "
                f"block {largest[0]} ({format_number(largest[1])})",
                "",
                {"grad_norm": total, "block": largest[0]},
                lr_advice=True,
                clip_advice=True,
            )
        )
        lights["gradients"] = SignalState("problem", "exploded: " + summary)
    else:
        vanished = [n for n, g, w in rows if w > 0 and g < VANISH * w]
        if vanished:
            drafts.append(
                Draft(
                    "grad_norm",
                    step,
                    f"the gradient of {names(vanished)} vanishes at step {step} (below {VANISH:g} of its weights)",
                    "Check that the block reaches the loss (a detach, an unused branch), and for saturated "
                    "activations or a missing normalization before it.",
                    {"blocks": vanished},
                    level="warning",
                )
            )
            lights["gradients"] = SignalState("warning", f"vanishing in {names(vanished)} · " + summary)
        else:
            lights["gradients"] = SignalState("ok", summary)
    if ratios is not None and math.isfinite(ratios[0]):
        ratio = ratios[0]
        at = f"lr {format_lr(lr)} · " if lr is not None else ""
        if ratio > UPDATE_RATIO:
            drafts.append(
                Draft(
                    "update_ratio",
                    step,
                    f"step {step} changed the weights by {ratio:.0%} of their norm (healthy steps: about 0.1% to 1%)",
                    "The learning rate is too high for this model.",
                    {"update_ratio": ratio},
                    lr_advice=True,
                )
            )
            lights["learning rate"] = SignalState("problem", f"{at}update/weight {format_number(ratio)}: too high")
        else:
            lights["learning rate"] = SignalState("ok", f"{at}update/weight {format_number(ratio)}")
    return drafts, lights


def judge_dead(
    found: dict[str, tuple[int, int]], step: int, epoch: int, types: dict[str, str] | None = None
) -> tuple[list[Draft], dict[str, SignalState], dict[str, float]]:
    """``found``: ``{module: (dead, units)}`` of one step's batch (``types``: each module's class name). Returns the
    drafts, the light and each module's share. Every unit of a module dead is a problem: nothing before it learns."""
    types = types or {}
    shares = {name: dead / total for name, (dead, total) in found.items() if total}
    if not shares:
        return [], {"dead units": SignalState("ok", "no ReLU modules")}, {}

    def label(name: str) -> str:
        return f"{name} ({types[name]})" if name in types else name

    worst = max(shares, key=lambda b: shares[b])
    all_dead = [b for b, share in shares.items() if share >= 1.0 and found[b][1] >= 2]
    if all_dead:
        first = all_dead[0]
        draft = Draft(
            "dead_units",
            step,
            f"all {found[first][1]} units of {label(first)} are dead at step {step}: zero for every sample of the "
            "batch, so they pass no gradient and the layers before them stop learning",
            "",
            {"modules": {b: shares[b] for b in all_dead}, "module": first},
            level="problem",
            epoch=epoch,
        )
        light = SignalState("problem", ", ".join(f"{label(b)}: 100% dead" for b in all_dead))
        return [draft], {"dead units": light}, shares
    if shares[worst] >= DEAD_SHARE and found[worst][1] >= 8:
        bad = [b for b, s in shares.items() if s >= DEAD_SHARE]
        draft = Draft(
            "dead_units",
            step,
            f"{shares[worst]:.0%} of the units of {label(worst)} stay zero over a whole batch (step {step})",
            "Dead ReLUs no longer learn: a lower LR, LeakyReLU / GELU, or a normalization before the activation "
            "keep them alive.",
            {"modules": {b: shares[b] for b in bad}, "module": worst},
            level="warning",
            epoch=epoch,
        )
        light = SignalState("warning", ", ".join(f"{label(b)}: {shares[b]:.0%} dead" for b in bad))
        return [draft], {"dead units": light}, shares
    return [], {"dead units": SignalState("ok", f"at most {shares[worst]:.0%} dead ({label(worst)})")}, shares
