"""A run's report as plain HTML + SVG: header, per-epoch table and charts (History.to_html / to_svg / plot).

Plain HTML and inline SVG, so it renders wherever outputs render (JupyterLab, Voila, GitHub, nbviewer, an
nbconvert export without JavaScript) and follows the page's text colour (light and dark themes). The panel
leaves it behind when a run ends; scripts get it from ``history.to_html()`` or ``history.plot().save(path)``.

Charts:

* **loss** per optimizer step (raw, faint; smoothed) with validation loss per epoch; the y axis starts at 0
  for a non-negative loss and becomes logarithmic when the values span more than two decades;
* **learning rate** per optimizer step, on a log axis, with each mid-run change marked at its new value;
* **bounded metrics** (accuracy, F1... whose values stay in [0, 1]) on their own 0-1 axis;
* every other metric on its own axis (never on the loss axis), train solid and validation dashed.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from nbtrainer._report._decimate import Ema, decimate
from nbtrainer._report._format import format_duration, format_lr, format_number, format_value
from nbtrainer._report._png import png_img
from nbtrainer._report._svg import PALETTE, svg_chart

__all__ = [
    "METRIC_SKIP",
    "HistoryPlot",
    "change_label",
    "classify_metrics",
    "combined_svg",
    "epoch_columns",
    "epoch_table_html",
    "format_cell",
    "higher_is_better",
    "history_charts",
    "resolve_mode",
    "summary_html",
    "use_log_scale",
]

#: epoch-log keys that are bookkeeping, not metrics
METRIC_SKIP = ("epoch", "lr", "time", "sample_time", "samples_per_s", "steps", "skipped_steps")
#: words of a log key that say a larger value is better, matched as whole words (``acc5``: a word and its number)
_MAX_HINTS = (
    "acc",
    "accuracy",
    "f1",
    "auc",
    "precision",
    "recall",
    "iou",
    "dice",
    "r2",
    "score",
    "map",
    "jaccard",
    "agreement",
)
#: parts of a log key that say it is a loss or an error, lower is better whatever else it says (``val_dice_loss``,
#: ``val_brier_score``, ``smape``): found anywhere in the key, as ``rmse`` holds ``mse``
_MIN_PARTS = ("loss", "error", "mae", "mse", "mape", "msle", "nll", "brier", "perplexity")
#: ... and as whole words only, too short to be looked for inside others (word / character error rate)
_MIN_WORDS = ("err", "wer", "cer", "ppl")
_BOUNDED_HINTS = ("acc", "f1", "auc", "precision", "recall", "iou", "dice", "jaccard", "specificity", "agreement")


def higher_is_better(key: str) -> bool:
    """Whether a larger value of this log key is better: an accuracy-like word in it (:data:`_MAX_HINTS`), unless it
    names a loss or an error (:data:`_MIN_PARTS`). Words are split at ``_`` (and other non-alphanumerics) and at
    camel case (``MulticlassAccuracy``: a torchmetrics collection's keys).

    Example:
        >>> higher_is_better("val_acc"), higher_is_better("val_loss"), higher_is_better("val_dice_loss")
        (True, False, False)
        >>> higher_is_better("val_map"), higher_is_better("val_mape"), higher_is_better("val_brier_score")
        (True, False, False)
    """
    lowered = key.lower()
    words = _words(key)
    if any(part in lowered for part in _MIN_PARTS) or any(word in _MIN_WORDS for word in words):
        return False
    return any(word in _MAX_HINTS or word.rstrip("0123456789") in _MAX_HINTS for word in words)


def resolve_mode(monitor: str, mode: str) -> str:
    """``"min"`` or ``"max"`` for ``monitor``: ``mode`` itself, or for ``"auto"`` what :func:`higher_is_better` says
    (the names the report and the panel bold as best, EarlyStopping, ModelCheckpoint and ``History.best``: one
    rule, so they never disagree)."""
    if mode == "auto":
        return "max" if higher_is_better(monitor) else "min"
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min', 'max' or 'auto', got {mode!r}.")
    return mode


def _words(key: str) -> list[str]:
    """``key``'s words, lower case: split at non-alphanumerics and where a capitalized word starts (``F1Score``:
    ``f1``, ``score``; ``mAP`` stays one word)."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", key)
    return [word for word in re.split(r"[^0-9a-zA-Z]+", spaced.lower()) if word]


def _numbers(rows: Iterable[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]


def classify_metrics(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Metric base names (``acc`` for ``acc``/``val_acc``) split into (bounded, other), in first-seen order.

    Bounded: an accuracy-like name whose finite values all lie in [0, 1] (an accuracy in percent is not).
    Losses and bookkeeping keys (``lr``, ``time``...) are in neither list.

    Example:
        >>> classify_metrics([{"loss": 1.0, "acc": 0.5, "val_acc": 0.4, "mae": 3.0, "time": 1.0}])
        (['acc'], ['mae'])
    """
    seen: dict[str, None] = {}
    for r in rows:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in METRIC_SKIP:
                seen.setdefault(k[4:] if k.startswith("val_") else k, None)
    bounded: list[str] = []
    other: list[str] = []
    for base in seen:
        if base == "loss" or base.startswith("lr_"):
            continue
        values = [v for v in _numbers(rows, base) + _numbers(rows, f"val_{base}") if math.isfinite(v)]
        is_bounded = any(h in base.lower() for h in _BOUNDED_HINTS) and all(0.0 <= v <= 1.0 for v in values)
        (bounded if is_bounded else other).append(base)
    return bounded, other


def use_log_scale(values: Iterable[float]) -> bool:
    """Log axis when every finite value is positive and they span more than two decades."""
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 100.0


def change_label(event: Mapping[str, Any]) -> str | None:
    """How a control change reads in the report and the panel (``step 120: lr 3.00e-3 → 1.00e-4``);
    ``None`` for events that are not an LR or accumulation change."""
    kind, step = event.get("kind"), event.get("step")
    if kind == "lr":
        source = f" ({event['source']})" if event.get("source") else ""
        return f"step {step}: lr {format_lr(event.get('old'))} → {format_lr(event.get('new'))}{source}"
    if kind == "grad_accum_steps":
        return f"step {step}: accumulation {event.get('old')} → {event.get('new')}"
    return None


def _changes(history: Any) -> tuple[list[tuple[float, str]], list[tuple[float, float, str]]]:
    """Control changes as dashed lines (all) and LR changes as points at the new LR."""
    lines, points = [], []
    for e in history.events:
        label = change_label(e)
        if label is None:
            continue
        lines.append((float(e["step"]), label))
        if e.get("kind") == "lr" and isinstance(e.get("new"), (int, float)):
            points.append((float(e["step"]), float(e["new"]), label))
    return lines, points


def history_charts(history: Any, *, max_points: int = 400, smoothing: float = 0.9, width: int = 340) -> list[str]:
    """The report's charts as SVG strings: loss, learning rate, bounded metrics, then one per other metric."""
    steps, rows = history.steps, history.epochs
    x = np.asarray(steps["step"], dtype=float)
    loss = np.asarray(steps["loss"], dtype=float)
    lines, lr_points = _changes(history)
    charts = []
    series: list[dict[str, Any]] = []
    if len(x):
        rx, ry = decimate(x, loss, max_points)
        sx, sy = decimate(x, np.asarray(Ema(smoothing).extend(loss.tolist())), max_points)
        series += [
            {"x": rx, "y": ry, "label": "loss (step)", "color": PALETTE[0], "opacity": 0.3, "width": 1},
            {"x": sx, "y": sy, "label": "smoothed", "color": PALETTE[0], "width": 2},
        ]
    val = [(float(r.get("steps") or 0), float(r["val_loss"])) for r in rows if isinstance(r.get("val_loss"), float)]
    if val:
        series.append(
            {
                "x": [s for s, _ in val],
                "y": [v for _, v in val],
                "label": "val_loss",
                "color": PALETTE[1],
                "markers": True,
            }
        )
    all_losses = [v for s in series for v in s["y"] if math.isfinite(v)]
    log = use_log_scale(all_losses)
    non_negative = bool(all_losses) and min(all_losses) >= 0
    charts.append(
        svg_chart(
            series,
            title="loss" + (" (log scale)" if log else ""),
            xlabel="optimizer step",
            ylabel="loss",
            log_y=log,
            y_min=0.0 if non_negative and not log else None,
            vlines=lines,
            width=width,
        )
    )
    if len(x):
        dx, dy = decimate(x, np.asarray(steps["lr"], dtype=float), max_points)
        charts.append(
            svg_chart(
                [{"x": dx, "y": dy, "label": "lr", "color": PALETTE[2]}],
                title="learning rate",
                xlabel="optimizer step",
                ylabel="learning rate (log)",
                log_y=True,
                vlines=lines,
                points=lr_points,
                y_format="lr",
                width=width,
            )
        )
    bounded, other = classify_metrics(rows)
    epochs = [float(r.get("epoch", i + 1)) for i, r in enumerate(rows)]

    def metric_series(bases: list[str]) -> list[dict[str, Any]]:
        out = []
        for i, base in enumerate(bases):
            color = PALETTE[(i + 3) % len(PALETTE)]
            for key, dash in ((base, False), (f"val_{base}", True)):
                if any(key in r for r in rows):
                    ys = [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in rows]
                    out.append({"x": epochs, "y": ys, "label": key, "color": color, "markers": True, "dash": dash})
        return out

    if bounded:
        charts.append(
            svg_chart(
                metric_series(bounded),
                title="metrics per epoch",
                xlabel="epoch",
                ylabel="value (0-1)",
                y_min=0.0,
                y_max=1.0,
                width=width,
            )
        )
    for base in other:
        series = metric_series([base])
        values = [v for s in series for v in s["y"] if math.isfinite(v)]
        charts.append(
            svg_chart(
                series,
                title=f"{base} per epoch",
                xlabel="epoch",
                ylabel=base,
                y_min=0.0 if values and min(values) >= 0 else None,
                width=width,
            )
        )
    return charts


_CELL = "padding:1px 8px;text-align:right;white-space:nowrap"
_HEAD = "padding:1px 8px;text-align:right;border-bottom:1px solid currentColor;white-space:nowrap"


def epoch_columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The per-epoch table's columns: epoch, loss, val_loss, each metric (train then val), lr, time."""
    bounded, other = classify_metrics(rows)
    cols = ["epoch", "loss", "val_loss"]
    for base in bounded + other:
        cols += [base, f"val_{base}"]
    cols += ["lr", "time"]
    return [c for c in cols if any(c in r for r in rows)]


def format_cell(key: str, value: Any) -> str:
    """One table cell in the common number format (LR scientific, time as a duration)."""
    return format_duration(value) if key == "time" else format_value(key, value)


def epoch_table_html(rows: Sequence[dict[str, Any]], *, css: str = "nbt-epoch-table", best: bool = True) -> str:
    """One row per epoch (epoch, loss, val_loss, each metric, lr, time); the best value of a column is bold."""
    if not rows:
        return f"<table class='{css}'></table>"
    esc = html.escape
    cols = epoch_columns(rows)
    best_at: dict[str, int] = {}
    if best:
        for c in cols:
            if c in ("epoch", "lr", "time"):
                continue
            vals = [(v, i) for i, r in enumerate(rows) for v in [r.get(c)] if isinstance(v, float) and math.isfinite(v)]
            if vals:  # on a tie the first epoch, as History.best and the summary's header pick it
                sign = -1.0 if higher_is_better(c) else 1.0
                best_at[c] = min(vals, key=lambda vi: (sign * vi[0], vi[1]))[1]
    head = "".join(f"<th style='{_HEAD}'>{esc(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        cells = []
        for c in cols:
            text = esc(format_cell(c, r.get(c)) if c in r else "")
            cells.append(f"<td style='{_CELL}'>{f'<b>{text}</b>' if best_at.get(c) == i else text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<table class='{css}' style='border-collapse:collapse;font-variant-numeric:tabular-nums'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def summary_html(history: Any, *, title: str = "nbtrainer run", extra: dict[str, str] | None = None) -> str:
    """Header line, per-epoch table and charts, as one HTML fragment (class ``nbt-summary``)."""
    esc = html.escape
    rows = history.epochs
    steps = history.steps["step"]
    total_time = sum(float(r.get("time") or 0.0) for r in rows)
    head = [f"<b>{esc(title)}</b>", f"status <b>{esc(str(history.status))}</b>"]
    if history.stop_reason:
        head.append(esc(str(history.stop_reason)))
    # The optimizer steps actually taken (a stop mid-epoch takes steps after the last epoch row).
    head += [f"{len(rows)} epoch(s)", f"{format_number(int(steps[-1]) if steps else 0)} optimizer steps"]
    if total_time:
        head.append(format_duration(total_time))
    head += [f"{esc(k)} {esc(v)}" for k, v in (extra or {}).items()]
    charts = HistoryPlot(history)._repr_html_()
    table = epoch_table_html(rows, css="nbt-summary-table") if rows else ""
    return (
        "<div class='nbt-summary' style='font-family:sans-serif;font-size:12px'>"
        f"<div style='margin-bottom:4px'>{' · '.join(head)}</div>"
        f"<div style='overflow-x:auto;margin-bottom:6px'>{table}</div><div>{charts}</div>"
        f"{latest_samples_html(getattr(history, 'samples', None) or [])}</div>"
    )


def latest_samples_html(samples: list[dict[str, Any]]) -> str:
    """The latest sample of each name (``History.samples``): text as preformatted text, images as PNG pictures
    inline, so a notebook saved and opened without widgets (GitHub, nbviewer) still shows them."""
    latest: dict[str, dict[str, Any]] = {}
    for sample in samples:
        latest[sample["name"]] = sample
    if not latest:
        return ""
    cells = []
    for name, s in latest.items():
        value = s["value"]
        if s["kind"] == "image" and isinstance(value, (bytes, str)):
            body = png_img(value, alt=name, style="max-width:100%")
        else:
            body = f"<pre style='white-space:pre-wrap;margin:0;max-width:480px'>{html.escape(str(value))}</pre>"
        cells.append(
            f"<div class='nbt-summary-sample' style='margin:0 12px 6px 0'><div><b>{html.escape(name)}</b> "
            f"step {format_number(s['step'])}</div>{body}</div>"
        )
    return (
        "<div class='nbt-summary-samples' style='margin-top:6px'><div><b>latest samples</b></div>"
        f"<div style='display:flex;flex-flow:row wrap;align-items:flex-start'>{''.join(cells)}</div></div>"
    )


def combined_svg(charts: list[str], *, columns: int = 2, color: str | None = None) -> str:
    """Several chart SVGs as one SVG (a grid), e.g. to save as a ``.svg`` file."""
    sizes = []
    for c in charts:
        w = float(c.split("width='", 1)[1].split("'", 1)[0])
        h = float(c.split("height='", 1)[1].split("'", 1)[0])
        sizes.append((w, h))
    cols = max(1, min(columns, len(charts)))
    col_w = max((w for w, _ in sizes), default=0.0)
    rows = [sizes[i : i + cols] for i in range(0, len(sizes), cols)]
    row_h = [max(h for _, h in r) for r in rows]
    width, height = col_w * cols, sum(row_h)
    style = f" style='color:{color}'" if color else ""
    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' "
        f"viewBox='0 0 {width:.0f} {height:.0f}'{style}>"
    ]
    y = 0.0
    for r, (row, h) in enumerate(zip(rows, row_h, strict=True)):
        for c_i in range(len(row)):
            svg = charts[r * cols + c_i]
            out.append(f"<g transform='translate({c_i * col_w:.0f},{y:.0f})'>{svg}</g>")
        y += h
    out.append("</svg>")
    return "".join(out)


class HistoryPlot:
    """The charts of a :class:`~nbtrainer.History` (loss, LR, metrics): displays in a notebook, saves to a file.

    Example:
        >>> from nbtrainer import History
        >>> h = History()
        >>> h.add_steps([(1, 0.9, 1e-3), (2, 0.7, 1e-3)], epoch=1)
        >>> h.add_epoch({"epoch": 1, "loss": 0.8, "acc": 0.6, "steps": 2})
        >>> plot = h.plot()
        >>> plot.save("run.svg").endswith("run.svg")
        True
    """

    def __init__(self, history: Any, *, max_points: int = 400, smoothing: float = 0.9, columns: int = 2) -> None:
        self.charts = history_charts(history, max_points=max_points, smoothing=smoothing)
        self.columns = columns

    def to_svg(self, *, color: str | None = None) -> str:
        """All charts as one SVG document (text in ``currentColor``, or ``color`` when given)."""
        return combined_svg(self.charts, columns=self.columns, color=color)

    def _repr_html_(self) -> str:
        # Inline SVG in HTML (not an <img>): the text takes the notebook's colour in light and dark themes.
        return "".join(f"<div style='display:inline-block;margin:0 8px 4px 0'>{c}</div>" for c in self.charts)

    def _repr_svg_(self) -> str:
        return self.to_svg(color="#24292f")

    def save(self, path: str | os.PathLike) -> str:
        """Write the charts to ``path`` atomically: ``.svg`` (dark text, for any viewer) or ``.html``."""
        from nbtrainer._atomic import atomic_write_bytes

        path = os.fspath(path)
        if path.lower().endswith((".html", ".htm")):
            text = f"<!doctype html><meta charset='utf-8'><title>nbtrainer run</title>{self._repr_html_()}"
        elif path.lower().endswith(".svg"):
            text = self.to_svg(color="#24292f")
        else:
            raise ValueError(f"Cannot tell the format of {path!r}: save to a path ending in .svg or .html.")
        atomic_write_bytes(path, text.encode("utf-8"))
        return path
