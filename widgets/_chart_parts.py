"""Building blocks of the live charts: a figure with labelled axes, tooltips, and an HTML legend above it.

Legends are HTML rows above each plot (bqplot's own legend box sits over the data); every axis has a
label and an explicit tick format.
"""

from __future__ import annotations

import html
import math
from contextlib import ExitStack
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import format_bytes
from nbtrainer.plotting import PALETTE, MinMaxStream, minmax_indices, nice_ticks

from ._layouts import plain_html, shared_layout
from ._theme import FG, FG2

__all__ = [
    "EPOCH_POINTS",
    "HOVER_EPOCHS",
    "HOVER_POINTS",
    "MARKER",
    "BoundedChart",
    "Box",
    "EpochChart",
    "MemoryChart",
    "bounded_range",
    "change_markers",
    "figure",
    "hover_layer",
    "legend_html",
    "lin_scale",
    "log_scale",
    "step_ticks",
    "tooltip",
]

# top: room for the figure title (each chart says what it is, as a screen reader and a screenshot read it)
_MARGIN = {"top": 30, "bottom": 42, "left": 64, "right": 14}
_BOX = {"flex": "1 1 330px", "min_width": "300px", "max_width": "560px", "margin": "0 4px 4px 0"}
_FIG = {"width": "100%", "height": "250px"}
EPOCH_POINTS = 600  # per epoch chart's lines (all series together), however many epochs the run has
HOVER_POINTS = 300  # per per-step hover layer: enough to read values along the curve, cheap to redraw
HOVER_EPOCHS = 150  # hover points per series (each with its name: the costliest payload of a long run)
MARKER = "#8b949e"  # change markers: mid grey, visible on light and dark backgrounds


def hover_layer(scales: dict[str, Any], color: str, value: tuple[str, str, str]) -> bq.Scatter:
    """Invisible points over a line (a Lines mark has one tooltip per line): hovering one shows the step and
    its exact ``value`` (``(field, label, d3 format)``)."""
    e = np.empty(0)
    return bq.Scatter(
        x=e,
        y=e,
        scales=scales,
        colors=[color],
        opacities=[0.0],
        default_size=40,
        interactions={"hover": "tooltip"},
        tooltip=tooltip(("x", "step", ",.0f"), value),
    )


def bounded_range(values: list[float], zoom: bool) -> tuple[float, float, list[float]]:
    """The y range and round ticks of the 0-1 metrics axis: all of 0-1, or (``zoom``) the data with some room,
    still inside 0-1, once the values cluster in less than a third of it (acc 0.95 and val_acc 0.97 would
    otherwise merge into one band at the top)."""
    full = (0.0, 1.0, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    finite = [v for v in values if math.isfinite(v)]
    if not zoom or not finite or min(finite) < 0 or max(finite) > 1:
        return full
    lo, hi = min(finite), max(finite)
    if hi - lo > 0.3:
        return full
    pad = max((hi - lo) * 0.25, 0.005)
    ticks = nice_ticks(max(0.0, lo - pad), min(1.0, hi + pad), 4)
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 0.1
    bottom = max(0.0, float(f"{math.floor((lo - pad) / step + 1e-9) * step:.12g}"))
    top = min(1.0, float(f"{math.ceil((hi + pad) / step - 1e-9) * step:.12g}"))
    return bottom, top, [t for t in ticks if bottom - 1e-9 <= t <= top + 1e-9]


def step_ticks(x: np.ndarray, lo: float = 0.0) -> np.ndarray:
    """Round, whole-step tick values from ``lo`` to the last step (bqplot's own split 487 into 121.75s); every
    axis of optimizer steps or epochs takes its ticks from here (never bqplot's even split)."""
    top = float(np.max(x)) if len(x) else lo + 1.0
    ticks = [t for t in nice_ticks(lo, max(top, lo + 1.0), 5) if t == int(t) and lo <= t <= top]
    return np.asarray(ticks or [lo])


def lin_scale(**kw: Any) -> bq.LinearScale:
    # No padding: bqplot otherwise widens the domain to fit markers, which put negative ticks under a loss.
    return bq.LinearScale(allow_padding=False, **kw)


def log_scale(**kw: Any) -> bq.LogScale:
    return bq.LogScale(allow_padding=False, **kw)


def legend_html(entries: list[tuple[str, str, bool]], extra: str = "") -> str:
    """A legend row: a swatch (dashed when ``dash``) and a label per entry, then ``extra`` text."""
    items = []
    for label, color, dash in entries:
        style = "dashed" if dash else "solid"
        items.append(
            f"<span style='margin-right:10px;white-space:nowrap'><span style='display:inline-block;width:16px;"
            f"border-top:3px {style} {color};vertical-align:middle;margin-right:4px'></span>"
            f"{html.escape(label)}</span>"
        )
    tail = f"<span style='color:{FG2};margin-left:4px;white-space:nowrap'>{html.escape(extra)}</span>" if extra else ""
    return f"<div style='font-size:11px;color:{FG};min-height:16px'>{''.join(items)}{tail}</div>"


def figure(css: str, marks: list, x: Any, y: Any, xlabel: str, ylabel: str, y_format: str, *, title: str) -> bq.Figure:
    # An explicit x tick format: bqplot's automatic one is built from the tick spacing, which is NaN while the
    # domain has zero width (the first step or epoch), and the axis never recovered from that error.
    # Axis titles and the figure title take the theme's text colour from _style.THEME_CSS (never a trait: see there).
    axes = [  # x: whole steps or epochs from the first draw (bqplot would split the empty 0..1 into 0.2s)
        bq.Axis(scale=x, label=xlabel, tick_format=",~g", num_ticks=5, tick_values=step_ticks(np.empty(0))),
        bq.Axis(scale=y, side="left", label=ylabel, tick_format=y_format, num_ticks=5, label_offset="48px"),
    ]
    fig = bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        fig_margin=dict(_MARGIN),
        animation_duration=0,
        layout=shared_layout(**_FIG),
    )
    fig.add_class(css)
    return fig


def change_markers(scales: dict[str, Any], size: int) -> bq.Scatter:
    """Grey down-triangles where a control change took effect; hovering one shows the change in full (its name)."""
    e = np.empty(0)
    return bq.Scatter(
        x=e,
        y=e,
        scales=scales,
        marker="triangle-down",
        colors=[MARKER],
        default_size=size,
        names=[],
        display_names=False,
        interactions={"hover": "tooltip"},
        tooltip=tooltip(("name", "change", "")),
    )


def tooltip(*fields: tuple[str, str, str]) -> bq.Tooltip:
    return bq.Tooltip(
        fields=[f for f, _, _ in fields],
        labels=[lab for _, lab, _ in fields],
        formats=[fmt for _, _, fmt in fields],
        layout=shared_layout(),
    )


class Box:
    """A figure with its legend row above it (``root``)."""

    def __init__(self, fig: bq.Figure, *controls: W.Widget) -> None:
        self.fig = fig
        self.legend = plain_html(flex="1 1 auto")
        self.legend.add_class("nbt-legend")
        header = W.HBox([self.legend, *controls], layout=shared_layout(align_items="center"))
        self.root = W.VBox([header, fig], layout=shared_layout(**_BOX))


class EpochChart:
    """Metrics per epoch on one axis: train solid, validation dashed, every point with a tooltip (``box``)."""

    def __init__(self, css: str, title: str, ylabel: str, y: Any, *controls: W.Widget) -> None:
        x, e = lin_scale(min=0.75, max=1.25), np.empty(0)
        self.x = x
        sc = {"x": x, "y": y}
        self.train = bq.Lines(x=e, y=e, scales=sc, colors=list(PALETTE), stroke_width=2)
        self.val = bq.Lines(x=e, y=e, scales=sc, colors=list(PALETTE), stroke_width=2, line_style="dashed")
        self.points = bq.Scatter(
            x=e,
            y=e,
            scales=sc,
            colors=[PALETTE[0]],
            default_size=36,
            names=[],
            display_names=False,
            interactions={"hover": "tooltip"},
            tooltip=tooltip(("name", "", ""), ("y", "value", ".4~g")),
        )
        self.fig = figure(css, [self.train, self.val, self.points], x, y, "epoch", ylabel, ".3~g", title=title)
        self.fig.axes[0].tick_values = np.asarray([1.0])  # the first epoch, alone on its 0.75..1.25 before data
        self.box = Box(self.fig, *controls)

    def draw(self, stack: ExitStack, rows: list[dict[str, Any]], bases: list[str], extra: str = "") -> None:
        """Draw the metrics ``bases`` (train ``k`` and ``val_k``) of the epoch ``rows``.

        A run of thousands of epochs sends a bounded chart: at most ``EPOCH_POINTS`` epochs per line (each
        series' lowest and highest of a bucket, so a dip survives) and ``HOVER_EPOCHS`` hover points per series.
        """
        epochs = np.asarray([float(r.get("epoch", i + 1)) for i, r in enumerate(rows)])
        colors = {b: PALETTE[(i + 3) % len(PALETTE)] for i, b in enumerate(bases)}
        series = {
            prefix: [(prefix + b, colors[b]) for b in bases if any(prefix + b in r for r in rows)]
            for prefix in ("", "val_")
        }
        ys = {
            prefix: np.asarray(
                [[float(r[k]) if isinstance(r.get(k), (int, float)) else math.nan for r in rows] for k, _ in keys]
            ).reshape(len(keys), len(rows))
            for prefix, keys in series.items()
        }
        every = np.vstack([ys[""], ys["val_"]])
        # bqplot squeezes a 2-D y: k series over one epoch, (k, 1), would arrive as one series of k points
        # (and (1, 1) as a 0-d array). Drawing the lone epoch twice keeps the shape (k, 2).
        if len(epochs) <= 1:
            idx = np.zeros(2, dtype=int)
        elif len(every) and len(epochs) > EPOCH_POINTS:  # ...and the line still reaches the newest epoch
            idx = np.union1d(minmax_indices(every, EPOCH_POINTS - 2), [0, len(epochs) - 1])
        else:
            idx = np.arange(len(epochs))
        px: list[float] = []
        py: list[float] = []
        pc: list[str] = []
        pn: list[str] = []
        entries = []
        for mark, prefix in ((self.train, ""), (self.val, "val_")):
            keys, y = series[prefix], ys[prefix]
            stack.enter_context(mark.hold_sync())
            if not keys or not len(epochs):
                mark.x, mark.y = np.empty(0), np.empty(0)
                continue
            mark.x, mark.y = epochs[idx], y[:, idx]
            mark.colors = [c for _, c in keys]
            for (k, c), row in zip(keys, y, strict=True):
                entries.append((k, c, prefix == "val_"))
                hover = np.union1d(minmax_indices(row, HOVER_EPOCHS - 1), [len(row) - 1])
                for e, v in zip(epochs[hover], row[hover], strict=True):
                    if math.isfinite(v):
                        px.append(float(e))
                        py.append(float(v))
                        pc.append(c)
                        pn.append(f"{k} · epoch {int(e)}")
        stack.enter_context(self.points.hold_sync())
        self.points.x, self.points.y = np.asarray(px, dtype=float), np.asarray(py, dtype=float)
        self.points.colors, self.points.names = pc or [PALETTE[0]], pn
        self.box.legend.value = legend_html(entries, extra)
        if len(epochs):  # whole epochs with a little room at both ends (a lone first epoch too)
            with self.x.hold_sync():
                self.x.min, self.x.max = float(epochs.min()) - 0.25, float(epochs.max()) + 0.25
        n = len(rows)  # ticks on whole epochs only (at most ~8 of them)
        self.fig.axes[0].tick_values = np.unique(epochs[:: max(1, math.ceil(n / 8))]) if n else np.asarray([1.0])


class BoundedChart(EpochChart):
    """The 0-1 metrics per epoch, zoomed to the data once it clusters (``bounded_range``)."""

    def __init__(self, *controls: W.Widget) -> None:
        super().__init__(
            "nbt-chart-metrics", "metrics per epoch", "value (0-1)", lin_scale(min=0.0, max=1.0), *controls
        )
        self.fig.axes[1].tick_values = np.asarray(bounded_range([], False)[2])

    def draw_bounded(self, stack: ExitStack, rows: list[dict[str, Any]], bases: list[str], *, zoom: bool) -> None:
        values = [
            float(r[k])
            for r in rows
            for b in bases
            for k in (b, f"val_{b}")
            if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
        ]
        lo, hi, ticks = bounded_range(values, zoom)
        zoomed = (lo, hi) != (0.0, 1.0)
        axis = self.fig.axes[1]
        with axis.scale.hold_sync():
            axis.scale.min, axis.scale.max = lo, hi
        axis.tick_values = np.asarray(ticks)
        axis.label = "value (zoomed)" if zoomed else "value (0-1)"
        self.draw(stack, rows, bases, f"y {lo:.3g}-{hi:.3g}, zoomed" if zoomed else "")


class MemoryChart:
    """The peak memory of each refresh window against the device's capacity (``box``)."""

    def __init__(self, max_points: int) -> None:
        self.stream = MinMaxStream(max_points)
        self.capacity_bytes: int | None = None
        x, self.y = lin_scale(min=0.0, max=1.0), lin_scale(min=0.0, max=1.0)
        self.x = x
        sc, e = {"x": x, "y": self.y}, np.empty(0)
        self.line = bq.Lines(x=e, y=e, scales=sc, colors=[PALETTE[4]], stroke_width=2, labels=["memory"])
        self.capacity = bq.Lines(x=e, y=e, scales=sc, colors=[MARKER], line_style="dashed", stroke_width=1)
        self.fig = figure(
            "nbt-chart-memory",
            [self.line, self.capacity],
            x,
            self.y,
            "optimizer step",
            "memory (MiB)",
            ",~g",
            title="memory",
        )
        self.box = Box(self.fig)
        self.box.legend.value = legend_html([("peak per window", PALETTE[4], False)])

    def add(self, step: int, used: int | None, capacity: int | None) -> bool:
        if used is None:
            return False
        self.stream.extend([float(step)], [float(used)])
        self.capacity_bytes = capacity
        return True

    def render(self, stack: ExitStack) -> None:
        x, y = self.stream.points()
        if not len(x):
            return
        cap = self.capacity_bytes
        unit, div = ("GiB", 2**30) if float(y.max()) >= 2**30 else ("MiB", 2**20)
        top = float(y.max()) * 1.25
        show_cap = cap is not None and cap <= top * 4  # the capacity line only when it is within reach
        cap_x = np.array([x.min(), max(x.max(), x.min() + 1)])
        for mark, xs, ys in ((self.line, x, y / div), (self.capacity, cap_x, np.full(2, (cap or 0) / div))):
            stack.enter_context(mark.hold_sync())
            keep = mark is self.line or show_cap
            mark.x, mark.y = (xs, ys) if keep else (np.empty(0), np.empty(0))
        self.y.max = (max(top, cap * 1.05) if show_cap and cap else top) / div
        with self.x.hold_sync():  # an explicit domain: a lone point would give it zero width (NaN ticks)
            self.x.min, self.x.max = 0.0, max(float(x.max()), 1.0)
        self.fig.axes[0].tick_values = step_ticks(x)
        self.fig.axes[1].tick_values = np.asarray(nice_ticks(0.0, self.y.max, 4))
        self.fig.axes[1].label = f"memory ({unit})"
        used = float(y[-1])
        share = f" · {used / cap:.1%} of {format_bytes(cap)}" if cap else ""
        entries = [("peak per window", PALETTE[4], False)] + ([("capacity", MARKER, True)] if show_cap else [])
        self.box.legend.value = legend_html(entries, f"now {format_bytes(used)}{share}")
