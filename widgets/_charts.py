"""Live bqplot charts of a run, read at a glance.

* **loss** per optimizer step (raw faint, smoothed) and validation loss per epoch; the y axis starts at 0
  for a non-negative loss, and is logarithmic when the values span more than two decades (``y: auto``) or
  when the user picks ``y: log``;
* **learning rate** per step on a log axis; each mid-run change is a marker at its *new* value, labelled
  unless it would overlap a later label (the tooltip always has the full text);
* **bounded metrics** per epoch (accuracy, F1... in [0, 1]) on their own 0-1 axis, train solid, val dashed;
  clustered values (acc 0.95, val_acc 0.97) zoom it, still inside 0-1 (``y: auto``; ``y: 0-1`` does not);
* **other metrics** per epoch, one at a time (a menu picks which), never on the loss axis;
* **memory**: the peak of each refresh window against the device's capacity.

Every axis is labelled, legends are HTML rows above the plots and point markers have tooltips. Scales have
explicit domains and a chart joins only once it has data (no NaN / negative-size bqplot errors). UI thread
only; per-step series go through ``MinMaxStream`` so each mark receives at most ``max_points`` points.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import format_lr
from nbtrainer.plotting import (
    PALETTE,
    Ema,
    MinMaxStream,
    change_label,
    classify_metrics,
    decimate,
    log_ticks,
    nice_ticks,
    use_log_scale,
)

from ._chart_parts import (
    HOVER_POINTS,
    BoundedChart,
    Box,
    EpochChart,
    MemoryChart,
    change_markers,
    figure,
    hover_layer,
    legend_html,
    lin_scale,
    log_scale,
    step_ticks,
    tooltip,
)
from ._layouts import shared_layout
from ._lr_chart import LRChart

__all__ = ["LiveCharts"]


def _zero_based(lo: float, hi: float) -> tuple[float, float]:
    """A linear axis from 0 for non-negative values (never negative ticks), 5% headroom; values below 0
    get their own range."""
    bottom = 0.0 if lo >= 0 else lo - 0.05 * (hi - lo)
    return bottom, (hi + 0.05 * (hi - bottom) if hi > bottom else bottom + 1.0)


class LiveCharts:
    def __init__(self, max_points: int = 2000, smoothing: float = 0.9, lr: float | None = None) -> None:
        self._raw, self._smooth, self._lr = (MinMaxStream(max_points) for _ in range(3))
        self._ema = Ema(smoothing)
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._last_loss = math.nan
        self._dirty: set[str] = set()
        e = np.empty(0)

        # 1. loss: raw + smoothed per step, val per epoch (Scatter: tooltips), change markers
        sx, self.loss_lin, self.loss_log = lin_scale(min=0.0, max=1.0), lin_scale(min=0.0, max=1.0), log_scale()
        self.loss_x = sx
        sy = self.loss_lin
        sc = {"x": sx, "y": sy}
        self.raw = bq.Lines(
            x=e, y=e, scales=sc, colors=[PALETTE[0]], opacities=[0.3], stroke_width=1, labels=["loss (step)"]
        )
        self.smooth = bq.Lines(x=e, y=e, scales=sc, colors=[PALETTE[0]], stroke_width=2.5, labels=["smoothed"])
        self.loss_hover = hover_layer(sc, PALETTE[0], ("y", "smoothed loss", ".4~g"))
        self.val = bq.Scatter(
            x=e,
            y=e,
            scales=sc,
            colors=[PALETTE[1]],
            default_size=48,
            stroke="white",
            names=[],
            display_names=False,
            interactions={"hover": "tooltip"},
            tooltip=tooltip(("name", "epoch", ""), ("x", "step", ",.0f"), ("y", "val_loss", ".4~g")),
        )
        self.val_line = bq.Lines(x=e, y=e, scales=sc, colors=[PALETTE[1]], stroke_width=1.5, labels=["val_loss"])
        self.loss_events = change_markers(sc, 50)
        self.loss_marks = [self.raw, self.smooth, self.val_line, self.val, self.loss_hover, self.loss_events]
        self.loss_fig = figure(
            "nbt-chart-loss", self.loss_marks, sx, sy, "optimizer step", "loss", ".3~g", title="training loss"
        )
        self.loss_scale = W.Dropdown(
            options=[("y: auto", "auto"), ("y: linear", "linear"), ("y: log", "log")],
            value="auto",
            layout=shared_layout(width="105px"),
        )
        self.loss_scale.add_class("nbt-loss-scale")
        self.loss_scale.observe(lambda _: self._dirty.add("steps"), "value")
        self.loss_box = Box(self.loss_fig, self.loss_scale)
        self.loss_is_log = False

        # 2. learning rate: log axis, changes marked (and labelled) at the new value
        self.lr_chart = c = LRChart(lr)
        self.lr, self.lr_hover, self.lr_events, self.lr_labels = c.line, c.hover, c.events, c.labels
        self.lr_x, self.lr_scale, self.lr_fig, self.lr_box = c.x, c.y, c.fig, c.box

        # 3. bounded metrics per epoch: 0-1 axis; train solid, val dashed; points carry tooltips
        self.metrics_scale = W.Dropdown(
            options=[("y: auto", "auto"), ("y: 0-1", "full")], value="auto", layout=shared_layout(width="105px")
        )
        self.metrics_scale.add_class("nbt-metrics-scale")
        self.metrics_scale.observe(lambda _: self._dirty.add("epochs"), "value")
        self.metrics = BoundedChart(self.metrics_scale)
        self.metrics_box, self.train_metrics, self.val_metrics = self.metrics.box, self.metrics.train, self.metrics.val
        self.metric_points = self.metrics.points
        # 4. other metrics, one at a time
        self.other_choice = W.Dropdown(options=[], layout=W.Layout(width="140px"))
        self.other_choice.add_class("nbt-other-metric")
        self.other_choice.observe(lambda _: self._dirty.add("epochs"), "value")
        self.other = EpochChart(
            "nbt-chart-other", "other metric per epoch", "value", lin_scale(min=0.0, max=1.0), self.other_choice
        )
        self.other_box = self.other.box

        # 5. memory per refresh window, against the device's capacity
        self.mem = MemoryChart(max_points)
        self.mem_box, self.memory = self.mem.box, self.mem.line
        # The "other metric" chart joins only when a run logs one: a hidden figure has a negative plot size.
        self._shown = [self.loss_box, self.lr_box, self.metrics_box, self.mem_box]
        self.box = W.HBox([b.root for b in self._shown], layout=W.Layout(flex_flow="row wrap", width="100%"))
        self.box.add_class("nbt-charts")
        # the other metric's chart and the loss axis not in use: in the tree only at times (closed with the panel)
        self.held: tuple[W.Widget, ...] = (self.other_box.root, self.loss_lin, self.loss_log)
        self._legends()

    # -- data in (UI thread) ------------------------------------------------------------------------
    def clear(self, memory_through: float | None = None) -> None:
        """Empty every series (a new run); ``memory_through``: a rollback to that step, whose memory up to it stays
        drawn (the History keeps no memory to redraw it from)."""
        memory = self.mem.stream.points()
        for s in (self._raw, self._smooth, self._lr, self.mem.stream):
            s.clear()
        if memory_through is not None:
            x, y = memory
            self.mem.stream.extend(x[x <= memory_through], y[x <= memory_through])
        self._ema.clear()
        self.rows, self.events = [], []
        self._last_loss = math.nan
        self._dirty = {"steps", "epochs", "events", "memory"}
        self._show_other(False)

    def _show_other(self, show: bool) -> None:
        charts = [self.loss_box, self.lr_box, self.metrics_box, *([self.other_box] if show else []), self.mem_box]
        if charts != self._shown:
            self._shown = charts
            self.box.children = tuple(b.root for b in charts)

    @property
    def other_shown(self) -> bool:  # a run logged a metric that is not bounded: its chart is in the panel
        return self.other_box in self._shown

    def add_steps(self, points: list[tuple[int, float, float]]) -> int:
        """Append ``(global_step, loss, lr)`` points; returns how many losses were not finite."""
        if not points:
            return 0
        arr = np.asarray(points, dtype=float).reshape(-1, 3)
        x, loss, lr = arr[:, 0], arr[:, 1], arr[:, 2]
        smooth = self._ema.extend(loss.tolist())
        self._raw.extend(x, loss)
        self._smooth.extend(x, smooth)
        self._lr.extend(x, lr)
        finite = [v for v in smooth if math.isfinite(v)]
        if finite:
            self._last_loss = finite[-1]
        self._dirty.add("steps")
        return int((~np.isfinite(loss)).sum())

    def add_memory(self, step: int, used: int | None, capacity: int | None) -> None:
        if self.mem.add(step, used, capacity):
            self._dirty.add("memory")

    def add_epoch(self, logs: dict[str, Any]) -> None:
        self.rows.append(logs)
        self._dirty.add("epochs")

    def add_event(self, event: dict[str, Any]) -> None:
        kind, new, step = event.get("kind"), event.get("new"), event.get("step") or 0
        label = change_label(event)
        if kind == "lr" and isinstance(new, (int, float)):
            # the marker's label: the new value and, from the panel, how it was set ("3.00e-4 typed")
            short = f"{format_lr(new)} {event['source']}" if event.get("source") else format_lr(new)
        elif kind == "grad_accum_steps":
            short = f"accum {new}"
        else:
            return
        self.events.append(
            {"step": float(step), "kind": kind, "new": new, "short": short, "label": label, "loss": self._last_loss}
        )
        self.events = self.events[-200:]
        self._dirty.add("events")

    # -- data out (bounded) -----------------------------------------------------------------------
    def render(self) -> bool:
        """Push what changed to the marks (one message per mark); False if nothing changed."""
        if not self._dirty:
            return False
        dirty, self._dirty = self._dirty, set()
        with ExitStack() as stack:
            if "steps" in dirty or "epochs" in dirty:  # val_loss (per epoch) is drawn on the loss chart
                self._render_loss(stack)
            if "steps" in dirty or "events" in dirty:
                self._render_lr(stack)
            if "events" in dirty:
                self._render_loss_events(stack)
            if "epochs" in dirty:
                self._render_epochs(stack)
            if "memory" in dirty:
                self.mem.render(stack)
        return True

    def _render_loss(self, stack: ExitStack) -> None:
        (rx, ry), (sx, sy) = self._raw.points(), self._smooth.points()
        val = [
            (float(r.get("steps") or 0), float(r["val_loss"]), r.get("epoch"))
            for r in self.rows
            if isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])
        ]
        values = [*ry[np.isfinite(ry)].tolist(), *(v for _, v, _ in val)]
        choice = self.loss_scale.value
        log = use_log_scale(values) if choice == "auto" else choice == "log"
        if log and values and min(values) <= 0:
            log = False  # a loss that reaches 0 or below cannot go on a log axis
        scale = self.loss_log if log else self.loss_lin
        lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
        if log:
            bottom, top = lo / 1.2, hi * 1.2
            ticks, tick_format = list(log_ticks(bottom, top)), ".2~g"
        else:
            bottom, top = _zero_based(lo, hi)
            # round values (bqplot splits the range evenly)
            ticks, tick_format = [t for t in nice_ticks(bottom, top, 5) if bottom <= t <= top], ".3~g"
        # The scale's range first, then the axis's scale, ticks and format in one message: an axis whose scale's
        # range changes while it still holds the other scale's ticks draws them there (a linear 0 on the log scale:
        # "translate(0,NaN)", seen in VS Code when a layout change redrew the axis between two of these messages).
        with scale.hold_sync():
            scale.min, scale.max = bottom, top
        axis = self.loss_fig.axes[1]
        with axis.hold_sync():
            if log != self.loss_is_log or "y" not in self.raw.scales or self.raw.scales["y"] is not scale:
                self.loss_is_log = log
                for mark in self.loss_marks:
                    stack.enter_context(mark.hold_sync())
                    mark.scales = {"x": mark.scales["x"], "y": scale}
                axis.scale, axis.label = scale, "loss (log)" if log else "loss"
            axis.tick_values, axis.tick_format = np.asarray(ticks), tick_format
        hx, hy = decimate(sx, sy, HOVER_POINTS)
        with self.loss_x.hold_sync():
            self.loss_x.max = max(float(rx.max()) if len(rx) else 1.0, max((v[0] for v in val), default=1.0), 1.0)
        self.loss_fig.axes[0].tick_values = step_ticks(rx)
        for mark, x, y in ((self.raw, rx, ry), (self.smooth, sx, sy), (self.loss_hover, hx, hy)):
            stack.enter_context(mark.hold_sync())
            mark.x, mark.y = x, y
        stack.enter_context(self.val.hold_sync())
        self.val.x = np.asarray([v[0] for v in val], dtype=float)
        self.val.y = np.asarray([v[1] for v in val], dtype=float)
        self.val.names = [str(v[2]) for v in val]
        stack.enter_context(self.val_line.hold_sync())
        self.val_line.x, self.val_line.y = self.val.x, self.val.y
        entries = [("loss (step)", PALETTE[0], False), ("smoothed", PALETTE[0], False)]
        if val:
            entries.append(("val_loss", PALETTE[1], False))
        self.loss_box.legend.value = legend_html(entries, "log scale" if log else "")

    def _render_lr(self, stack: ExitStack) -> None:
        x, y = self._lr.points()
        self.lr_chart.render(stack, x, y, self.events)

    def _render_loss_events(self, stack: ExitStack) -> None:
        keep = [e for e in self.events if math.isfinite(e["loss"])]
        stack.enter_context(self.loss_events.hold_sync())
        self.loss_events.x = np.asarray([e["step"] for e in keep], dtype=float)
        self.loss_events.y = np.asarray([e["loss"] for e in keep], dtype=float)
        self.loss_events.names = [e["label"] for e in keep]

    def _render_epochs(self, stack: ExitStack) -> None:
        rows = self.rows
        bounded, other = classify_metrics(rows)
        self.metrics.draw_bounded(stack, rows, bounded, zoom=self.metrics_scale.value == "auto")
        if other:
            if list(self.other_choice.options) != other:
                keep = self.other_choice.value if self.other_choice.value in other else other[0]
                self.other_choice.options, self.other_choice.value = other, keep
            self._show_other(True)
            chosen = [self.other_choice.value]
            values = [
                float(r[k])
                for r in rows
                for k in (chosen[0], f"val_{chosen[0]}")
                if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
            ]
            scale = self.other_box.fig.axes[1].scale
            lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
            with scale.hold_sync():
                scale.min, scale.max = _zero_based(lo, hi)
            self.other_box.fig.axes[1].label = chosen[0]
            self.other_box.fig.title = f"{chosen[0]} per epoch"
            self.other.draw(stack, rows, chosen)

    def _legends(self) -> None:
        self.loss_box.legend.value = legend_html([("loss (step)", PALETTE[0], False), ("smoothed", PALETTE[0], False)])
        self.lr_box.legend.value = legend_html([("lr", PALETTE[2], False)])
        self.metrics_box.legend.value = legend_html([], "0-1 scale")

    def sent_points(self) -> dict[str, int]:
        """How many points each per-step mark currently holds (what a front end received)."""
        return {
            "loss": len(self.raw.x),
            "smoothed": len(self.smooth.x),
            "lr": len(self.lr.x),
            "val_loss": len(self.val.x),
            "epochs": len(self.train_metrics.x),
            "memory": len(self.memory.x),
        }
