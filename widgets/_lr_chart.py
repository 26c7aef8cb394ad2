"""The panel's learning-rate chart: the LR per optimizer step on a log axis, and each change at its new value.

A change is a marker whose tooltip says it in full (``step 120: lr 3.00e-3 → 1.00e-4 (typed)``) and, room
permitting, a label above it with the new value and how it was set (``1.00e-4 typed``). Labels in the chart's
left half run to the right of their marker, the others end at theirs: the newest change sits at the right edge,
where a label running right was cut away by the figure.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import bqplot as bq
import numpy as np

from nbtrainer import format_number
from nbtrainer.plotting import PALETTE, decimate, log_ticks

from ._chart_parts import (
    HOVER_POINTS,
    MARKER,
    Box,
    change_markers,
    figure,
    hover_layer,
    legend_html,
    lin_scale,
    log_scale,
    step_ticks,
)

__all__ = ["LRChart"]

LABEL_GAP = 0.3  # a change's label needs this fraction of the x range from the next labelled change


class LRChart:
    """The LR line, its hover layer, the change markers and their labels, in one titled figure (``box``)."""

    def __init__(self, lr: float | None) -> None:
        # Before any data: a decade each side of the optimizer's LR, ticks at round values only.
        centre = lr if lr is not None and math.isfinite(lr) and lr > 0 else 1e-3
        self.x, self.y = lin_scale(min=0.0, max=1.0), log_scale(min=centre / 10, max=centre * 10)
        sc, e = {"x": self.x, "y": self.y}, np.empty(0)
        self.line = bq.Lines(x=e, y=e, scales=sc, colors=[PALETTE[2]], stroke_width=2, labels=["lr"])
        self.hover = hover_layer(sc, PALETTE[2], ("y", "lr", ".3~e"))
        self.events = change_markers(sc, 60)
        self.labels = {
            align: bq.Label(
                x=e, y=e, text=[], scales=sc, colors=[MARKER], align=align, x_offset=off, y_offset=-9, default_size=11
            )
            for align, off in (("start", 4), ("end", -4))
        }
        self.fig = figure(
            "nbt-chart-lr",
            [self.line, self.hover, self.events, *self.labels.values()],
            self.x,
            self.y,
            "optimizer step",
            "learning rate (log)",
            ".1~e",
            title="learning rate",
        )
        self.fig.axes[1].tick_values = np.asarray(log_ticks(centre / 10, centre * 10))
        self.box = Box(self.fig)

    def render(self, stack: ExitStack, x: np.ndarray, y: np.ndarray, changes: list[dict[str, Any]]) -> None:
        """Draw the LR points ``x, y`` and the ``lr`` changes among ``changes`` (the panel's control events:
        ``step``, ``new``, ``short`` label, full ``label``)."""
        events = [e for e in changes if e["kind"] == "lr"]
        positive = [v for v in [*y.tolist(), *(e["new"] for e in events)] if math.isfinite(v) and v > 0]
        if not positive:
            return
        lo, hi = min(positive), max(positive)
        if hi / lo < 10:  # at least one decade, centred on the data, so a constant LR has ticks
            mid = math.sqrt(lo * hi)
            lo, hi = mid / math.sqrt(10), mid * math.sqrt(10)
        lo, hi = lo / 1.3, hi * 2.0  # headroom above: the change labels sit over their markers
        with self.y.hold_sync():
            self.y.min, self.y.max = lo, hi
        self.fig.axes[1].tick_values = np.asarray(log_ticks(lo, hi))
        y = np.where(np.isfinite(y) & (y > 0), y, lo)  # an LR of 0 (cosine's end) sits on the axis floor
        hx, hy = decimate(x, y, HOVER_POINTS)
        span = max(float(x.max()) if len(x) else 1.0, max((e["step"] for e in events), default=1.0), 1.0)
        with self.x.hold_sync():
            self.x.max = span
        self.fig.axes[0].tick_values = step_ticks(x)
        for mark, xs, ys in ((self.line, x, y), (self.hover, hx, hy)):
            stack.enter_context(mark.hold_sync())
            mark.x, mark.y = xs, ys
        # the newest change is labelled; an older one only with room to the last labelled one
        shown, last_x = [], math.inf
        for ev in reversed(events):
            if (last_x - ev["step"]) / span >= LABEL_GAP:
                shown.append(ev)
                last_x = ev["step"]
        stack.enter_context(self.events.hold_sync())
        self.events.x = np.asarray([e["step"] for e in events], dtype=float)
        self.events.y = np.asarray([min(max(e["new"], lo), hi) for e in events], dtype=float)
        self.events.names = [e["label"] or e["short"] for e in events]
        for align, mark in self.labels.items():
            mine = [e for e in shown if (e["step"] < span / 2) == (align == "start")]
            stack.enter_context(mark.hold_sync())
            mark.x = np.asarray([e["step"] for e in mine], dtype=float)
            mark.y = np.asarray([min(max(e["new"], lo), hi) for e in mine], dtype=float)
            mark.text = [e["short"] for e in mine]
        accum = [e for e in changes if e["kind"] == "grad_accum_steps"]
        extra = (
            f"accumulation changed at step {', '.join(format_number(int(e['step'])) for e in accum)}" if accum else ""
        )
        self.box.legend.value = legend_html(
            [("lr", PALETTE[2], False)] + ([("change", MARKER, False)] if events else []), extra
        )
