"""The metric points MLflowLogger sends: ``(name, value, step)`` from a refresh's step points, an epoch's row, and
the whole History of a resumed fit (for the new MLflow run it starts, which would otherwise begin at the resume)."""

from __future__ import annotations

import math
from typing import Any

from nbtrainer._events._history import group_lr_key, group_lrs_of
from nbtrainer._events._stream import CONTROL_KINDS

__all__ = ["control_value", "epoch_values", "history_sizes", "history_values", "step_values"]

#: at most this many ``step/*`` points for a resumed History's steps when the logger sends one point per window
BACKFILL_WINDOWS = 1000

Points = list[tuple[int, float, float]]  # (optimizer step, loss, lr)


def step_values(
    points: Points, every_step: bool, group_lrs: dict[int, tuple[float, ...]] | None = None
) -> list[tuple[str, float, int]]:
    """``step/loss`` and ``step/lr`` (with several param groups also ``step/lr_group1``..., from ``group_lrs``, as
    ``Progress.step_group_lrs`` has them): every step's, or one point for the window (the mean finite loss; the LRs
    and the step of its last step)."""
    values: list[tuple[str, float, int]] = []
    if not points:
        return values
    if every_step:
        for step, loss, lr in points:
            if math.isfinite(loss):
                values.append(("step/loss", loss, step))
            values.append(("step/lr", lr, step))
            values += _group_values(group_lrs, step)
        return values
    finite = [loss for _, loss, _ in points if math.isfinite(loss)]
    step, _, lr = points[-1]
    if finite:
        values.append(("step/loss", math.fsum(finite) / len(finite), step))
    values.append(("step/lr", lr, step))
    return values + _group_values(group_lrs, step)


def _group_values(group_lrs: dict[int, tuple[float, ...]] | None, step: int) -> list[tuple[str, float, int]]:
    lrs = group_lrs.get(step, ()) if group_lrs else ()
    return [(f"step/{group_lr_key(i)}", v, step) for i, v in enumerate(lrs[1:], 1) if math.isfinite(v)]


def epoch_values(logs: dict[str, Any], step: int) -> list[tuple[str, float, int]]:
    """An epoch row's finite numbers, at the epoch's last step."""
    return [
        (k, float(v), step)
        for k, v in logs.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    ]


def control_value(event: dict[str, Any]) -> tuple[str, float, int]:
    """An LR or accumulation change (one of ``CONTROL_KINDS``) as ``control/<kind>`` at its step."""
    return f"control/{event['kind']}", float(event["new"]), int(event.get("step") or 0)


def history_sizes(history: Any) -> tuple[int, int, int]:
    """How many steps, epoch rows and events ``history`` holds now: what a resume carries over."""
    return len(history.steps["step"]), len(history.epochs), len(history.events)


def history_values(history: Any, sizes: tuple[int, int, int], every_step: bool) -> list[tuple[str, float, int]]:
    """What a resumed History held at its resume (``sizes``, from :func:`history_sizes`), as the live fit would have
    sent it: its steps (in windows of consecutive steps unless ``every_step``), epoch rows and LR / accumulation
    changes. Read on the logger's thread while the fit appends: only the items before ``sizes``."""
    n_steps, n_epochs, n_events = sizes
    steps = history.steps
    points = list(zip(steps["step"][:n_steps], steps["loss"][:n_steps], steps["lr"][:n_steps], strict=False))
    group_lrs = group_lrs_of({k: v[:n_steps] for k, v in steps.items()})
    size = 1 if every_step else max(1, math.ceil(len(points) / BACKFILL_WINDOWS))
    values: list[tuple[str, float, int]] = []
    for i in range(0, len(points), size):
        values += step_values(points[i : i + size], every_step, group_lrs)
    for row in history.epochs[:n_epochs]:
        values += epoch_values(row, int(row.get("steps") or 0))
    for event in history.events[:n_events]:
        if event.get("kind") in CONTROL_KINDS:
            values.append(control_value(event))
    return values
