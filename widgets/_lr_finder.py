"""``LRFinderView``: an ``LRFinderResult`` as an interactive chart; clicking the curve picks the LR.

The smoothed loss is drawn twice: as a line (what the eye follows) and as small clickable points. bqplot
0.13 only lets Scatter/Bars marks react to clicks (a Lines mark can only show a tooltip), so the points
carry ``interactions={"click": "select"}``: a click in the browser sets the mark's ``selected`` trait
to ``[index]`` and that change is what picks the LR. Buttons offer each rule's suggestion for users who
would rather not aim at a 6-pixel point.

Readable at any width: round y ticks (1-2-5 steps), x ticks at whole decades (every other one when the sweep
spans many, so a 370 px panel does not smear them together), both axes framing every marker, the rules named
in a legend row above the plot (a label on the plot sat on the curve), axis titles in the theme's text colour.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import format_lr
from nbtrainer.plotting import PALETTE, nice_ticks

from ._chart_parts import legend_html
from ._fallback import html_view
from ._markup import text_html
from ._style import theme_style
from ._theme import FG, FG2, WARN

__all__ = ["LRFinderView"]

RULE_COLORS = {"valley": PALETTE[3], "steepest": PALETTE[2], "minimum/10": PALETTE[4]}
_CHOSEN = PALETTE[1]  # the chosen-LR marker: orange reads on light and dark backgrounds
_MARGIN = {"top": 12, "bottom": 45, "left": 72, "right": 15}
_MAX_X_TICKS = 5


def _x_range(values: list[float]) -> tuple[float, float, list[float]]:
    """A log range around every LR drawn (the curve and each rule's marker), and whole-decade ticks, at most
    ``_MAX_X_TICKS`` of them."""
    lo, hi = min(values) / 1.5, max(values) * 1.5
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [e for e in range(first, last + 1) if lo <= 10.0**e <= hi]
    stride = max(1, math.ceil(len(decades) / _MAX_X_TICKS))
    return lo, hi, [10.0**e for e in decades[::stride]]


def y_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) inside ``[lo, hi]``."""
    return [t for t in nice_ticks(lo, hi, 4) if lo <= t <= hi]


def _y_range(smoothed: list[float]) -> tuple[float, float]:
    """From the minimum to the plateau before it (as ``LRFinderResult.to_svg``): the divergence is clipped."""
    i_min = int(np.argmin(smoothed))
    lo, hi = smoothed[i_min], max(smoothed[: i_min + 1])
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        hi = lo + max(1e-3, abs(lo) * 0.1)
    pad = (hi - lo) * 0.08
    return lo - pad, hi + 3 * pad


class LRFinderView:
    """The LR range test's curve; click a point (or a "use ..." button) to choose the learning rate.

    Args:
        result: an ``LRFinderResult`` (from ``Trainer.lr_find`` or ``TrainerWidget.lr_find``).
        on_choose: called with the chosen LR (the panel passes its LR control's setter).
        lr: the LR marked on the chart at first (e.g. the current one).

    Example:
        >>> view = LRFinderView(trainer.lr_find(train_loader, steps=50), on_choose=trainer.set_lr)  # doctest: +SKIP
        >>> view                    # in a notebook: the chart; click it, then view.chosen  # doctest: +SKIP
    """

    def __init__(
        self,
        result: Any,
        on_choose: Callable[[float], None] | None = None,
        lr: float | None = None,
        warning: str | None = None,
    ) -> None:
        self.result, self.on_choose = result, on_choose
        self.chosen: float | None = None
        self.previous = lr  # the LR before the finder: "restore" puts it back
        pts = [
            (x, r, s)
            for x, r, s in zip(result.lrs, result.losses, result.smoothed, strict=True)
            if x > 0 and math.isfinite(s) and math.isfinite(r)
        ]
        self.lrs = np.array([p[0] for p in pts], dtype=float)
        self.smoothed = np.array([p[2] for p in pts], dtype=float)
        y_lo, y_hi = _y_range(list(self.smoothed)) if pts else (0.0, 1.0)
        self._y = (y_lo, y_hi)
        rules = [(k, v) for k, v in result.suggestions.items() if v is not None and math.isfinite(v) and v > 0]
        x_lo, x_hi, x_ticks = _x_range([*self.lrs.tolist(), *(v for _, v in rules), *([lr] if lr else [])] or [1e-3])
        sx = bq.LogScale(min=x_lo, max=x_hi, allow_padding=False)
        sy = bq.LinearScale(min=y_lo, max=y_hi, allow_padding=False)
        scales = {"x": sx, "y": sy}
        self.raw = bq.Lines(
            x=self.lrs,
            y=np.array([p[1] for p in pts], dtype=float),
            scales=scales,
            colors=["#9ecae1"],
            opacities=[0.6],
            stroke_width=1,
            labels=["loss"],
        )
        self.line = bq.Lines(
            x=self.lrs, y=self.smoothed, scales=scales, colors=["#1f77b4"], stroke_width=2, labels=["smoothed loss"]
        )
        tooltip = bq.Tooltip(fields=["x", "y"], formats=[".2e", ".4g"], labels=["lr", "smoothed loss"])
        self.points = bq.Scatter(
            x=self.lrs,
            y=self.smoothed,
            scales=scales,
            colors=["#1f77b4"],
            default_size=36,
            opacities=[0.5],
            interactions={"click": "select", "hover": "tooltip"},
            tooltip=tooltip,
        )
        self.suggested = bq.Scatter(
            x=np.array([v for _, v in rules], dtype=float),
            y=np.array([self._loss_at(v) for _, v in rules], dtype=float),
            scales=scales,
            colors=[RULE_COLORS.get(k, "#555") for k, _ in rules] or ["#555"],
            marker="diamond",
            default_size=90,
            names=[f"{k} {format_lr(v)}" for k, v in rules],
            display_names=False,  # named in the legend row: a label drawn on the plot covered the curve
            interactions={"hover": "tooltip"},
            tooltip=bq.Tooltip(fields=["name"], labels=["rule"]),
        )
        self.marker = bq.Lines(
            x=np.empty(0), y=np.empty(0), scales=scales, colors=[_CHOSEN], line_style="dashed", stroke_width=2
        )
        axes = [
            bq.Axis(scale=sx, label="learning rate (log)", tick_format=".0e", tick_values=x_ticks),
            bq.Axis(
                scale=sy,
                side="left",
                label="loss",
                tick_format=".3~g",
                tick_values=y_ticks(y_lo, y_hi),
                label_offset="56px",  # clear of the widest tick label ("0.0015")
            ),
        ]
        self.figure = bq.Figure(
            marks=[self.raw, self.line, self.points, self.suggested, self.marker],
            axes=axes,
            fig_margin=dict(_MARGIN),
            animation_duration=0,
            layout=W.Layout(width="100%", max_width="720px", height="300px"),
        )
        self.figure.add_class("nbt-lrfinder-chart")
        self.use_buttons: dict[str, W.Button] = {}
        for rule, value in rules:
            b = W.Button(
                description=f"use {rule} {format_lr(value)}",
                tooltip=f"set the LR to the {rule} suggestion",
                layout=W.Layout(width="auto"),
            )
            b.add_class("nbt-lrfinder-use")
            b.on_click(lambda _, v=value, r=rule: self.choose(v, r))
            self.use_buttons[rule] = b
        sug = result.suggestion
        self.head = W.HTML(
            f"<span style='color:{FG}'><b>LR finder</b> · {len(result.lrs)} of {result.steps} steps, "
            f"{text_html(result.stop_reason)} · suggestion ({html.escape(result.rule)}): "
            f"<b>{format_lr(sug) if sug is not None else 'none'}</b> · model and optimizer restored. "
            f"<span style='color:{FG2}'>Click the curve to set the learning rate.</span></span>"
        )
        self.warning = W.HTML(
            f"<div style='color:{WARN};font-size:12px'><b>warning</b>: {text_html(warning)}</div>" if warning else ""
        )
        self.warning.add_class("nbt-lrfinder-warning")
        self.choice = W.HTML()
        self.choice.add_class("nbt-lrfinder-choice")
        self.restore = W.Button(
            description="restore",
            icon="undo",
            layout=W.Layout(width="auto", display="none"),
            tooltip="put back the learning rate set before the LR finder",
        )
        self.restore.add_class("nbt-lrfinder-restore")
        self.restore.on_click(lambda _: self.undo())
        if self.previous is not None:
            self.restore.description = f"restore {format_lr(self.previous)}"
        self.legend = W.HTML(  # wraps in a narrow panel (each entry stays whole)
            "<div style='white-space:normal'>"
            + legend_html([("smoothed loss", "#1f77b4", False)])[:-6]
            + "".join(
                f"<span style='margin-left:10px;white-space:nowrap'><span style='color:{RULE_COLORS.get(k, '#555')}'>"
                f"&#9670;</span> {html.escape(k)} {format_lr(v)}</span>"
                for k, v in rules
            )
            + "</div></div>",
            layout=W.Layout(width="100%"),
        )
        self.legend.add_class("nbt-lrfinder-legend")
        self.root = W.VBox(
            [
                self.head,
                self.warning,
                self.legend,
                self.figure,
                W.HBox([*self.use_buttons.values(), self.restore], layout=W.Layout(flex_flow="row wrap")),
                self.choice,
                theme_style(),
            ]
        )
        self.root.add_class("nbt-lrfinder")
        self.points.observe(self._on_select, "selected")
        if lr is not None:
            self._mark(float(lr), "current LR")

    def _loss_at(self, lr: float) -> float:
        """The smoothed loss at ``lr``, interpolated on the log axis (``minimum/10`` is between points)."""
        if not len(self.lrs):
            return math.nan
        return float(np.interp(math.log10(lr), np.log10(self.lrs), self.smoothed))

    def _mark(self, lr: float, what: str) -> None:
        with self.marker.hold_sync():
            self.marker.x, self.marker.y = np.array([lr, lr]), np.array(self._y)
        self.choice.value = (
            f"<span style='font-size:12px;color:{FG}'>{html.escape(what)}: <b>{format_lr(lr)}</b></span>"
        )

    def choose(self, lr: float, source: str = "chosen") -> None:
        """Pick ``lr``: mark it on the chart, show it, and hand it to ``on_choose``."""
        lr = float(lr)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning rate must be a positive number, got {lr!r}")
        self.chosen = lr
        self._mark(lr, f"learning rate set ({source})")
        if self.previous is not None:
            self.restore.layout.display = "flex"
        if self.on_choose is not None:
            self.on_choose(lr)

    def undo(self) -> None:
        """Put back the learning rate that was set before the finder (the panel's LR when it opened)."""
        if self.previous is None:
            return
        self.chosen = None
        self._mark(self.previous, "learning rate restored")
        self.restore.layout.display = "none"
        if self.on_choose is not None:
            self.on_choose(self.previous)

    def _on_select(self, change: Any) -> None:
        """A click on a point (the front end set ``selected``): choose that point's LR."""
        picked = change["new"]
        if picked is None or len(picked) == 0:
            return
        i = int(picked[-1])
        self.points.selected = None  # so that clicking the same point again is a change again
        if 0 <= i < len(self.lrs):
            self.choose(float(self.lrs[i]), "clicked on the curve")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # with text/plain and text/html where widgets cannot render
        return html_view(self.root, "LR finder", self.head, self.legend, self.choice)._repr_mimebundle_(**kwargs)
