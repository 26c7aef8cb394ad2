"""The static end-of-run summary: a final-metrics table and inline SVG curves (no plotting library).

It is plain HTML, left in the cell output when a run ends, so a notebook reopened without widget
state (or rendered on GitHub / nbviewer) still shows what the run produced.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._decimate import Ema, decimate

__all__ = ["METRIC_SKIP", "fmt", "higher_is_better", "summary_html", "svg_chart"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
#: epoch-log keys that are bookkeeping, not metrics
METRIC_SKIP = ("epoch", "lr", "time", "samples_per_s", "steps", "skipped_steps")
_MAX_HINTS = ("acc", "f1", "auc", "precision", "recall", "iou", "dice", "r2", "score", "map")


def higher_is_better(key: str) -> bool:
    return any(h in key.lower() for h in _MAX_HINTS)


def fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def svg_chart(
    series: list[dict[str, Any]],
    *,
    title: str,
    xlabel: str,
    width: int = 330,
    height: int = 210,
    vlines: Sequence[tuple[float, str]] = (),
) -> str:
    """One chart as an SVG string. ``series``: dicts with ``x``, ``y``, ``label``, optional ``color``,
    ``opacity``, ``width`` (stroke) and ``markers``; ``vlines``: ``(x, label)`` dashed markers."""
    left, right, top, bottom = 52, 10, 34, 30
    xs = _finite([v for s in series for v in s["x"]]) + _finite([v for v, _ in vlines])
    ys = _finite([v for s in series for v in s["y"]])
    esc = html.escape
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='nbt-summary-chart' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='10'>",
        f"<text x='{left}' y='12' font-size='11' font-weight='bold'>{esc(title)}</text>",
    ]
    if not xs or not ys:
        out.append(f"<text x='{left}' y='{height / 2:.0f}' fill='#888'>no data</text></svg>")
        return "".join(out)
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-12, y1 + abs(y1) * 0.1 + 1e-12
    pad = (y1 - y0) * 0.05
    y0, y1 = (y0 - pad if y0 < 0 else max(0.0, y0 - pad)), y1 + pad  # data >= 0 never gets a negative axis
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + (1 - (v - y0) / (y1 - y0)) * ph

    out.append(f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='#ccc'/>")
    for i in range(3):  # y ticks: bottom, middle, top
        v = y0 + (y1 - y0) * i / 2
        out.append(f"<text x='{left - 4}' y='{py(v) + 3:.1f}' text-anchor='end'>{esc(fmt(float(v)))}</text>")
    for v, anchor in ((x0, "start"), (x1, "end")):
        out.append(f"<text x='{px(v):.1f}' y='{top + ph + 12}' text-anchor='{anchor}'>{esc(fmt(float(v)))}</text>")
    out.append(f"<text x='{left + pw / 2:.0f}' y='{height - 4}' text-anchor='middle' fill='#555'>{esc(xlabel)}</text>")
    for v, label in vlines:
        out.append(
            f"<line x1='{px(v):.1f}' x2='{px(v):.1f}' y1='{top}' y2='{top + ph}' stroke='#999' "
            f"stroke-dasharray='3,3'><title>{esc(label)}</title></line>"
        )
    legend_x = left
    for i, s in enumerate(series):
        color = s.get("color", PALETTE[i % len(PALETTE)])
        pts = [
            (px(a), py(b))
            for a, b in zip(s["x"], s["y"], strict=True)
            if isinstance(b, (int, float)) and math.isfinite(b)
        ]
        if len(pts) > 1:
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            out.append(
                f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='{s.get('width', 1.5)}' "
                f"stroke-opacity='{s.get('opacity', 1.0)}'/>"
            )
        if s.get("markers") or len(pts) == 1:
            out += [f"<circle cx='{a:.1f}' cy='{b:.1f}' r='2.5' fill='{color}'/>" for a, b in pts]
        if s.get("label"):
            out.append(
                f"<rect x='{legend_x}' y='18' width='10' height='3' fill='{color}'/>"
                f"<text x='{legend_x + 13}' y='23'>{esc(s['label'])}</text>"
            )
            legend_x += 18 + 6 * len(s["label"])
    out.append("</svg>")
    return "".join(out)


def _curves(history: Any, max_points: int, smoothing: float) -> list[str]:
    steps = history.steps
    x = np.asarray(steps["step"], dtype=float)
    loss = np.asarray(steps["loss"], dtype=float)
    lr = np.asarray(steps["lr"], dtype=float)
    changes = [
        (float(e["step"]), f"{e['kind']}: {fmt(e.get('old'))} -> {fmt(e.get('new'))}")
        for e in history.events
        if e.get("kind") in ("lr", "grad_accum_steps")
    ]
    loss_series: list[dict[str, Any]] = []
    if len(x):
        rx, ry = decimate(x, loss, max_points)
        sx, sy = decimate(x, np.asarray(Ema(smoothing).extend(loss.tolist())), max_points)
        loss_series += [
            {"x": rx, "y": ry, "label": "loss (step)", "color": PALETTE[0], "opacity": 0.3, "width": 1},
            {"x": sx, "y": sy, "label": "smoothed", "color": PALETTE[0], "width": 2},
        ]
    rows = history.epochs
    val = [(r.get("steps"), r.get("val_loss")) for r in rows if r.get("val_loss") is not None]
    if val:
        loss_series.append(
            {
                "x": [float(s or 0) for s, _ in val],
                "y": [v for _, v in val],
                "label": "val_loss",
                "color": PALETTE[1],
                "markers": True,
            }
        )
    charts = [svg_chart(loss_series, title="loss", xlabel="optimizer step", vlines=changes)]
    if len(x):
        dx, dy = decimate(x, lr, max_points)
        charts.append(
            svg_chart(
                [{"x": dx, "y": dy, "label": "lr", "color": PALETTE[2]}],
                title="learning rate",
                xlabel="optimizer step",
                vlines=changes,
            )
        )
    keys = [
        k for k in history.keys() if k not in METRIC_SKIP and k not in ("loss", "val_loss") and not k.startswith("lr_")
    ]
    if keys:
        ep = [float(r.get("epoch", i + 1)) for i, r in enumerate(rows)]
        series = [
            {
                "x": ep,
                "y": [r.get(k, math.nan) if isinstance(r.get(k), (int, float)) else math.nan for r in rows],
                "label": k,
                "markers": True,
            }
            for k in keys
        ]
        charts.append(svg_chart(series, title="metrics per epoch", xlabel="epoch"))
    return charts


def summary_html(
    history: Any,
    *,
    title: str = "nbtrainer run",
    max_points: int = 400,
    smoothing: float = 0.9,
    extra: dict[str, str] | None = None,
) -> str:
    """The whole summary: header line, final / best metrics table and the SVG curves."""
    esc = html.escape
    rows = history.epochs
    last = rows[-1] if rows else {}
    total_time = sum(r.get("time", 0.0) or 0.0 for r in rows)
    n_steps = len(history.steps["step"])
    head = [f"<b>{esc(title)}</b>", f"status <b>{esc(str(history.status))}</b>"]
    if history.stop_reason:
        head.append(esc(str(history.stop_reason)))
    head += [f"{len(rows)} epoch(s)", f"{n_steps:,} optimizer step(s)", f"{total_time:.1f} s"]
    head += [f"{esc(k)} {esc(v)}" for k, v in (extra or {}).items()]
    table = ""
    metric_keys = [k for k in last if k not in ("epoch",)]
    if metric_keys:
        body = []
        for k in metric_keys:
            best = ""
            if k not in METRIC_SKIP and not k.startswith("lr_"):
                pick = max if higher_is_better(k) else min
                good = [
                    (r[k], r.get("epoch")) for r in rows if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
                ]
                if good:
                    v, e = pick(good, key=lambda t: t[0])
                    best = f"{fmt(v)} (epoch {e})"
            body.append(
                f"<tr><td style='padding:1px 8px'>{esc(k)}</td><td style='padding:1px 8px'>"
                f"{esc(fmt(last[k]))}</td><td style='padding:1px 8px'>{esc(best)}</td></tr>"
            )
        table = (
            "<table class='nbt-summary-table' style='border-collapse:collapse;margin:4px 0'>"
            "<tr><th style='text-align:left;padding:1px 8px'>metric</th><th style='text-align:left;"
            f"padding:1px 8px'>final (epoch {esc(fmt(last.get('epoch')))})</th><th style='text-align:left;"
            "padding:1px 8px'>best</th></tr>" + "".join(body) + "</table>"
        )
    charts = "".join(
        f"<div style='display:inline-block;margin-right:8px'>{c}</div>" for c in _curves(history, max_points, smoothing)
    )
    return (
        f"<div class='nbt-summary' style='font-family:sans-serif;font-size:12px'>"
        f"<div>{' · '.join(head)}</div>{table}<div>{charts}</div></div>"
    )
