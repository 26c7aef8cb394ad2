"""Small static line charts as SVG text: no plotting library, legible in light and dark themes.

Every text, tick and axis line is drawn in ``currentColor``, so an SVG placed inline in HTML takes the
surrounding text colour (JupyterLab light or dark, GitHub, nbviewer). Data colours are mid-tone and read on
both backgrounds. The legend sits above the plot area, never over the data; markers carry a ``<title>``
with the exact value (a hover tooltip in browsers).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from nbtrainer._report._format import format_lr, format_number

__all__ = ["PALETTE", "log_ticks", "nice_ticks", "svg_chart"]

#: mid-tone colours that keep their contrast on white and on near-black backgrounds
PALETTE = ("#3b82f6", "#f97316", "#22a06b", "#e5484d", "#a16bf2", "#b07d48", "#e460ae", "#14b8c4")


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]`` (steps of 1, 2 or 5 times a power of ten).

    Example:
        >>> nice_ticks(0, 0.93)
        [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks, v = [], first
    while v < hi + step * 0.999:
        ticks.append(float(f"{round(v / step) * step:.12g}"))  # 0.6000000000000001 -> 0.6
        v += step
    return ticks


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks for a log axis over ``[lo, hi]`` (both > 0): powers of ten, with 2x and 5x when that gives
    fewer than three ticks in range; at most 6.

    Example:
        >>> log_ticks(1e-5, 1e-1)
        [1e-05, 0.0001, 0.001, 0.01, 0.1]
        >>> log_ticks(0.001, 0.004)
        [0.001, 0.002]
    """
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    decades = [10.0**e for e in range(a, b + 1)]
    inside = [t for t in decades if lo <= t <= hi]
    if len(inside) < 3:
        inside = [m * t for t in decades for m in (1.0, 2.0, 5.0) if lo <= m * t <= hi]
    stride = max(1, math.ceil(len(inside) / 6))
    return [float(f"{t:.12g}") for t in inside[::stride]]


def _domain(values: list[float], *, log: bool, y_min: float | None, y_max: float | None) -> tuple[float, float]:
    if log:
        pos = [v for v in values if v > 0]
        lo, hi = (min(pos), max(pos)) if pos else (1e-3, 1.0)
        if hi / lo < 10:  # at least one decade, centred on the data
            mid = math.sqrt(lo * hi)
            lo, hi = mid / math.sqrt(10), mid * math.sqrt(10)
        return lo / 1.15, hi * 1.15
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    lo = y_min if y_min is not None else lo
    hi = y_max if y_max is not None else hi
    if hi <= lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = (lo if y_min is not None else lo - pad), hi + pad
    elif y_max is None:
        hi += (hi - lo) * 0.05
    return lo, hi


def svg_chart(
    series: list[dict[str, Any]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    width: int = 340,
    height: int = 230,
    log_y: bool = False,
    y_min: float | None = None,
    y_max: float | None = None,
    vlines: Sequence[tuple[float, str]] = (),
    points: Sequence[tuple[float, float, str]] = (),
    y_format: str = "number",
) -> str:
    """One chart as an SVG string.

    Args:
        series: dicts with ``x``, ``y``, ``label`` and optional ``color``, ``opacity``, ``width`` (stroke),
            ``markers`` (draw each point, with its exact value as a tooltip) and ``dash``.
        title, xlabel, ylabel: every axis is labelled.
        log_y: a log y axis (non-positive values are left out).
        y_min, y_max: fix an end of the y axis (``y_min=0`` for losses, ``(0, 1)`` for accuracies).
        vlines: ``(x, label)`` dashed vertical markers (LR / accumulation changes), label as tooltip.
        points: ``(x, y, label)`` annotated markers drawn on the data (an LR change at its new value).
        y_format: ``"number"`` or ``"lr"`` for tick labels and tooltips.

    Example:
        >>> svg = svg_chart([{"x": [1, 2, 3], "y": [0.9, 0.5, 0.4], "label": "loss"}], title="loss",
        ...                 xlabel="step", ylabel="loss", y_min=0)
        >>> svg.startswith("<svg") and "currentColor" in svg
        True
    """
    fmt = format_lr if y_format == "lr" else format_number
    esc = html.escape
    colors = [s.get("color", PALETTE[i % len(PALETTE)]) for i, s in enumerate(series)]
    labelled = [(s, colors[i]) for i, s in enumerate(series) if s.get("label")]
    legend_rows = _legend_layout([str(s["label"]) for s, _ in labelled], width - 20)
    left, right, bottom = 58, 12, 34
    top = 22 + 14 * len(legend_rows) + 6
    pw, ph = width - left - right, max(height - top - bottom, 40)
    height = top + ph + bottom
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' class='nbt-summary-chart' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' font-family='sans-serif' font-size='10' fill='currentColor'>",
        f"<text x='{left}' y='13' font-size='12' font-weight='bold'>{esc(title)}</text>",
    ]
    for row_i, row in enumerate(legend_rows):  # above the plot area, never over the data
        row_y = 22 + 14 * row_i + 6
        for x, i in row:
            s, color = labelled[i]
            dash = " stroke-dasharray='4,3'" if s.get("dash") else ""
            # the swatch looks like its line: a faint raw series gets a faint swatch, not the smoothed one's
            opacity = f" stroke-opacity='{s['opacity']}'" if s.get("opacity") is not None else ""
            swatch = max(float(s["width"]), 1.5) if s.get("width") is not None else 2.5
            out.append(
                f"<line x1='{x}' x2='{x + 14}' y1='{row_y - 3}' y2='{row_y - 3}' stroke='{color}' "
                f"stroke-width='{swatch:g}'{opacity}{dash}/>"
                f"<text x='{x + 18}' y='{row_y}'>{esc(str(s['label']))}</text>"
            )
    xs = _finite([v for s in series for v in s["x"]]) + _finite([v for v, _ in vlines])
    ys = _finite([v for s in series for v in s["y"]])
    if log_y:
        ys = [v for v in ys if v > 0]
    if not xs or not ys:
        out.append(f"<text x='{left}' y='{top + ph / 2:.0f}' fill-opacity='0.6'>no data</text></svg>")
        return "".join(out)
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = _domain(ys, log=log_y, y_min=y_min, y_max=y_max)
    ly0, ly1 = (math.log10(y0), math.log10(y1)) if log_y else (y0, y1)

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        t = math.log10(v) if log_y else v
        return top + ph - (t - ly0) / (ly1 - ly0) * ph

    # 1. frame, grid and y ticks
    out.append(
        f"<rect x='{left}' y='{top}' width='{pw}' height='{ph}' fill='none' stroke='currentColor' "
        "stroke-opacity='0.35'/>"
    )
    ticks = log_ticks(y0, y1) if log_y else nice_ticks(y0, y1)
    for t in ticks:
        if not (y0 <= t <= y1):
            continue
        y = py(t)
        out.append(
            f"<line x1='{left}' x2='{left + pw}' y1='{y:.1f}' y2='{y:.1f}' stroke='currentColor' "
            f"stroke-opacity='0.12'/><text x='{left - 4}' y='{y + 3:.1f}' text-anchor='end'>{esc(fmt(t))}</text>"
        )
    # 2. x ticks at round values
    for t in nice_ticks(x0, x1, 4):
        if x0 <= t <= x1:
            out.append(f"<text x='{px(t):.1f}' y='{top + ph + 12}' text-anchor='middle'>{esc(format_number(t))}</text>")
    # 3. axis labels
    out.append(f"<text x='{left + pw / 2:.0f}' y='{height - 6}' text-anchor='middle'>{esc(xlabel)}</text>")
    out.append(
        f"<text transform='translate(12,{top + ph / 2:.0f}) rotate(-90)' text-anchor='middle'>{esc(ylabel)}</text>"
    )
    # 4. change markers, then the data, then annotated points on top
    for v, label in vlines:
        if math.isfinite(v):
            out.append(
                f"<line x1='{px(v):.1f}' x2='{px(v):.1f}' y1='{top}' y2='{top + ph}' stroke='currentColor' "
                f"stroke-opacity='0.45' stroke-dasharray='3,3'><title>{esc(label)}</title></line>"
            )
    for s, color in zip(series, colors, strict=True):
        pairs = [
            (float(a), float(b))
            for a, b in zip(s["x"], s["y"], strict=True)
            if isinstance(b, (int, float)) and math.isfinite(b) and (b > 0 or not log_y)
        ]
        pts = [(px(a), py(b), a, b) for a, b in pairs]
        dash = " stroke-dasharray='5,3'" if s.get("dash") else ""
        if len(pts) > 1:
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b, _, _ in pts)
            out.append(
                f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='{s.get('width', 1.6)}' "
                f"stroke-opacity='{s.get('opacity', 1.0)}'{dash}/>"
            )
        if s.get("markers") or len(pts) == 1:
            name = esc(str(s.get("label", "")))
            out += [
                f"<circle cx='{a:.1f}' cy='{b:.1f}' r='2.8' fill='{color}'>"
                f"<title>{name} {esc(format_number(xv))}: {esc(fmt(yv))}</title></circle>"
                for a, b, xv, yv in pts
            ]
    for v, yv, label in points:
        if math.isfinite(v) and math.isfinite(yv) and (yv > 0 or not log_y) and y0 <= yv <= y1:
            out.append(
                f"<path d='M{px(v):.1f},{py(yv) - 7:.1f} l-4,-6 h8 z' fill='currentColor' fill-opacity='0.8'>"
                f"<title>{esc(label)}</title></path>"
            )
    out.append("</svg>")
    return "".join(out)


def _legend_layout(labels: list[str], width: int) -> list[list[tuple[int, int]]]:
    """Legend entries wrapped into rows: ``[[(x, index), ...], ...]`` (about 6 px per character)."""
    rows: list[list[tuple[int, int]]] = []
    row: list[tuple[int, int]] = []
    x = 58
    for i, label in enumerate(labels):
        w = 24 + 6 * len(label)
        if row and x + w > width:
            rows.append(row)
            x, row = 58, []
        row.append((x, i))
        x += w
    if row:
        rows.append(row)
    return rows
