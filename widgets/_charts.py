"""Live bqplot charts: loss per step (raw, faint + smoothed) with val loss per epoch, LR per step,
metrics per epoch (train solid, val dashed), and markers where LR / accumulation changed mid-run.

Everything here runs on the panel's UI thread (never the training thread). Per-step series go
through :class:`MinMaxStream`, so each mark receives at most ``max_points`` points.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from ._decimate import Ema, MinMaxStream, minmax_indices
from ._summary import METRIC_SKIP, PALETTE, fmt

__all__ = ["LiveCharts"]

_MARGIN = {"top": 40, "bottom": 40, "left": 60, "right": 12}
_LAYOUT = {"flex": "1 1 320px", "min_width": "300px", "height": "270px"}
_EVENT_KINDS = {"lr": "lr", "grad_accum_steps": "accum"}


def _figure(title: str, css: str, marks: list, x: Any, y: Any, xlabel: str) -> bq.Figure:
    # An explicit x tick format: bqplot's automatic one is built from the tick spacing, which is NaN while the
    # domain has zero width (the first step or epoch), and the axis never recovered from that error.
    axes = [
        bq.Axis(scale=x, label=xlabel, tick_format=",~g"),
        bq.Axis(scale=y, side="left", tick_format=".3g", num_ticks=5),
    ]
    fig = bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        fig_margin=dict(_MARGIN),
        legend_location="top-right",
        animation_duration=0,
        layout=W.Layout(**_LAYOUT),
    )
    fig.add_class(css)
    return fig


class LiveCharts:
    def __init__(self, max_points: int = 2000, smoothing: float = 0.9) -> None:
        self.max_points = max_points
        self._raw, self._smooth, self._lr = (MinMaxStream(max_points) for _ in range(3))
        self._ema = Ema(smoothing)
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._last = {"loss": math.nan, "lr": math.nan}
        self._dirty: set[str] = set()
        empty = np.empty(0)

        sx, sy = bq.LinearScale(), bq.LinearScale()
        self.raw = bq.Lines(
            x=empty,
            y=empty,
            scales={"x": sx, "y": sy},
            colors=[PALETTE[0]],
            opacities=[0.3],
            stroke_width=1,
            labels=["loss (step)"],
            display_legend=True,
        )
        self.smooth = bq.Lines(
            x=empty,
            y=empty,
            scales={"x": sx, "y": sy},
            colors=[PALETTE[0]],
            stroke_width=2.5,
            labels=["smoothed"],
            display_legend=True,
        )
        self.val = bq.Lines(
            x=empty,
            y=empty,
            scales={"x": sx, "y": sy},
            colors=[PALETTE[1]],
            marker="circle",
            marker_size=30,
            stroke_width=2,
            labels=["val_loss"],
            display_legend=True,
        )
        self.loss_events = bq.Scatter(
            x=empty,
            y=empty,
            scales={"x": sx, "y": sy},
            marker="triangle-down",
            colors=["#444"],
            default_size=60,
            names=[],
            display_names=True,
        )
        self.loss_fig = _figure(
            "loss", "nbt-chart-loss", [self.raw, self.smooth, self.val, self.loss_events], sx, sy, "optimizer step"
        )

        lx, ly = bq.LinearScale(), bq.LinearScale(min=0.0)  # from 0: a constant LR still has a y range
        self.lr = bq.Lines(
            x=empty, y=empty, scales={"x": lx, "y": ly}, colors=[PALETTE[2]], stroke_width=2, labels=["lr"]
        )
        self.lr_events = bq.Scatter(
            x=empty,
            y=empty,
            scales={"x": lx, "y": ly},
            marker="triangle-down",
            colors=["#444"],
            default_size=60,
            names=[],
            display_names=True,
        )
        self.lr_fig = _figure("learning rate", "nbt-chart-lr", [self.lr, self.lr_events], lx, ly, "optimizer step")

        ex, ey = bq.LinearScale(), bq.LinearScale()
        self.train_metrics = bq.Lines(
            x=empty,
            y=empty,
            scales={"x": ex, "y": ey},
            marker="circle",
            marker_size=24,
            display_legend=True,
            labels=[],
            colors=list(PALETTE),
        )
        self.val_metrics = bq.Lines(
            x=empty,
            y=empty,
            scales={"x": ex, "y": ey},
            marker="square",
            marker_size=24,
            line_style="dashed",
            display_legend=True,
            labels=[],
            colors=list(PALETTE),
        )
        self.metrics_fig = _figure(
            "metrics per epoch", "nbt-chart-metrics", [self.train_metrics, self.val_metrics], ex, ey, "epoch"
        )
        self.box = W.HBox(
            [self.loss_fig, self.lr_fig, self.metrics_fig], layout=W.Layout(flex_flow="row wrap", width="100%")
        )
        self.box.add_class("nbt-charts")

    # -- data in (UI thread) ------------------------------------------------------------------------
    def clear(self) -> None:
        for s in (self._raw, self._smooth, self._lr):
            s.clear()
        self._ema.clear()
        self.rows, self.events = [], []
        self._last = {"loss": math.nan, "lr": math.nan}
        self._dirty = {"steps", "epochs", "events"}

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
            self._last["loss"] = finite[-1]
        self._last["lr"] = float(lr[-1])
        self._dirty.add("steps")
        return int((~np.isfinite(loss)).sum())

    def add_epoch(self, logs: dict[str, Any]) -> None:
        self.rows.append(logs)
        self._dirty.add("epochs")

    def add_event(self, event: dict[str, Any]) -> None:
        kind = _EVENT_KINDS.get(event.get("kind"))
        if kind is None:
            return
        new = event.get("new")
        label = f"{kind} {fmt(new)}" if kind == "lr" else f"accum {new}"
        self.events.append(
            {"step": float(event.get("step") or 0), "label": label, "loss": self._last["loss"], "lr": self._last["lr"]}
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
            if "steps" in dirty:
                for mark, stream in ((self.raw, self._raw), (self.smooth, self._smooth), (self.lr, self._lr)):
                    x, y = stream.points()
                    stack.enter_context(mark.hold_sync())
                    mark.x, mark.y = x, y
            if "epochs" in dirty:
                self._render_epochs(stack)
            if "events" in dirty:
                ev = self.events
                for mark, key in ((self.loss_events, "loss"), (self.lr_events, "lr")):
                    keep = [e for e in ev if math.isfinite(e[key])]
                    stack.enter_context(mark.hold_sync())
                    mark.x = np.asarray([e["step"] for e in keep], dtype=float)
                    mark.y = np.asarray([e[key] for e in keep], dtype=float)
                    mark.names = [e["label"] for e in keep]
        return True

    def _render_epochs(self, stack: ExitStack) -> None:
        rows = self.rows
        val_pts = [
            (float(r.get("steps") or 0), float(r["val_loss"]))
            for r in rows
            if isinstance(r.get("val_loss"), (int, float))
        ]
        stack.enter_context(self.val.hold_sync())
        self.val.x = np.asarray([p[0] for p in val_pts], dtype=float)
        self.val.y = np.asarray([p[1] for p in val_pts], dtype=float)
        seen: dict[str, None] = {}
        for r in rows:
            seen.update(
                dict.fromkeys(
                    k
                    for k, v in r.items()
                    if isinstance(v, (int, float)) and k not in METRIC_SKIP and not k.startswith("lr_")
                )
            )
        bases = list(dict.fromkeys(k[4:] if k.startswith("val_") else k for k in seen))
        epochs = np.asarray([float(r.get("epoch", i + 1)) for i, r in enumerate(rows)])
        colors = [PALETTE[i % len(PALETTE)] for i in range(len(bases))]
        for mark, prefix in ((self.train_metrics, ""), (self.val_metrics, "val_")):
            keys = [prefix + b for b in bases]
            present = [(k, c) for k, c in zip(keys, colors, strict=True) if k in seen]
            stack.enter_context(mark.hold_sync())
            if not present or not len(epochs):
                mark.x, mark.y, mark.labels = np.empty(0), np.empty(0), []
                continue
            y = np.asarray(
                [[float(r[k]) if isinstance(r.get(k), (int, float)) else math.nan for r in rows] for k, _ in present]
            )
            # bqplot squeezes a 2-D y: k series over one epoch, (k, 1), would arrive as one series of k points
            # (and (1, 1) as a 0-d array). Drawing the lone epoch twice keeps the shape (k, 2).
            idx = minmax_indices(y, self.max_points) if len(epochs) > 1 else np.zeros(2, dtype=int)
            mark.x, mark.y = epochs[idx], y[:, idx]
            mark.labels, mark.colors = [k for k, _ in present], [c for _, c in present]
        # ticks on whole epochs only (at most ~8 of them)
        n = len(rows)
        self.metrics_fig.axes[0].tick_values = np.unique(epochs[:: max(1, math.ceil(n / 8))]) if n else None

    def sent_points(self) -> dict[str, int]:
        """How many points each per-step mark currently holds (what a front end received)."""
        return {
            "loss": len(self.raw.x),
            "smoothed": len(self.smooth.x),
            "lr": len(self.lr.x),
            "val_loss": len(self.val.x),
            "epochs": len(self.train_metrics.x),
        }
