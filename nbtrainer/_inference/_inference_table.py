"""The result of ``compare_inference``: one row per variant, as pandas, text, Markdown and HTML with bars."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nbtrainer._report._comparison import ComparisonTable
from nbtrainer._report._format import format_bytes, format_count, format_duration, format_number

__all__ = ["InferenceComparison"]


def _pct(r: Any) -> str:
    return "" if not isinstance(r, (int, float)) or not math.isfinite(r) else f" ({r:.0%})"


def _spread(s: Any) -> str:
    return "-" if not isinstance(s, (int, float)) or not math.isfinite(s) else f"±{s:.0%}"


@dataclass
class InferenceComparison(ComparisonTable):
    """The result of :func:`compare_inference`: one row per variant (a method applied to the model, or a model).

    Attributes:
        rows: dicts with ``name, kind ("method" | "model"), status ("ok" | "failed"), reason, note, params,
            size_bytes`` (the saved state dict, quantized tensors flattened), ``memory_bytes, latency_p50_s,
            latency_p90_s`` (per batch, warm-up excluded), ``latency_spread`` (half the range of the per-round
            medians, relative), ``round_medians_s, samples_per_s, metric, metric_delta, max_abs_diff`` (largest
            output difference from the baseline) and the ratios ``size_ratio, memory_ratio, latency_ratio,
            samples_per_s_ratio`` (baseline = 1.0).
        baseline: name of the baseline row.
        metric: the metric's name (``"acc"``...), ``None`` without one.
        environment: device, torch version, threads, batch size, batches, rounds.
        warnings: what the latency figures cannot tell (variants too close to rank, a noisy machine).

    Example:
        >>> table = compare_inference(model, val_loader, models={"student": student})  # doctest: +SKIP
        >>> print(table)                          # doctest: +SKIP
        >>> table["int8-weight"]["size_ratio"]    # doctest: +SKIP
        0.27
    """

    row_kind: ClassVar[str] = "variant"  # NamedRows: 'No variant ...' for a missing name
    _bars: ClassVar[dict[int, tuple[str, str]]] = {
        1: ("size_ratio", "#ff7f0e"),
        3: ("latency_ratio", "#1f77b4"),
        5: ("samples_per_s_ratio", "#2ca02c"),
    }

    rows: list[dict[str, Any]]
    baseline: str
    metric: str | None
    environment: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    # chart key -> (title, the row's ratio key, the row's value key): what CompareWidget draws as bars
    charts: ClassVar[dict[str, tuple[str, str | None, str]]] = {
        "latency": ("latency vs baseline (lower is faster)", "latency_ratio", "latency_p50_s"),
        "size": ("size on disk vs baseline", "size_ratio", "size_bytes"),
        "metric": ("{metric} vs baseline", None, "metric"),
    }

    def to_pandas(self) -> Any:
        """One row per variant (index: name); numbers as numbers, ratios as fractions of the baseline."""
        import pandas as pd

        cols = [
            "status",
            "kind",
            "params",
            "size_bytes",
            "size_ratio",
            "memory_bytes",
            "memory_ratio",
            "latency_p50_s",
            "latency_p90_s",
            "latency_spread",
            "latency_ratio",
            "samples_per_s",
            "samples_per_s_ratio",
            "metric",
            "metric_delta",
            "max_abs_diff",
            "note",
            "reason",
        ]
        frame = pd.DataFrame([{c: r.get(c) for c in cols} for r in self.rows], index=self.names, columns=cols)
        frame.index.name = "variant"
        if self.metric:
            frame = frame.rename(columns={"metric": self.metric, "metric_delta": f"{self.metric}_delta"})
        frame.attrs.update(baseline=self.baseline, warnings=list(self.warnings), **self.environment)
        return frame

    def _is_fraction(self, v: Any) -> bool:
        return isinstance(v, float) and math.isfinite(v) and bool(self.metric) and "acc" in str(self.metric)

    def _metric_text(self, row: dict[str, Any]) -> str:
        v, d = row.get("metric"), row.get("metric_delta")
        if v is None:
            return "-"
        if self._is_fraction(v) and 0 <= v <= 1:  # an accuracy reads best in percent, its change in points
            delta = "" if d is None or row["name"] == self.baseline else f" ({d * 100:+.1f} pt)"
            return f"{v:.1%}{delta}"
        delta = "" if d is None or row["name"] == self.baseline else f" ({'+' if d >= 0 else ''}{format_number(d)})"
        return format_number(v) + delta

    def _cells(self, row: dict[str, Any]) -> list[str]:
        if row["status"] != "ok":
            return [row["name"], "failed", "", "", "", "", "", "", row.get("reason") or ""]
        return [
            row["name"],
            format_bytes(row.get("size_bytes")) + _pct(row.get("size_ratio")),
            format_bytes(row.get("memory_bytes")),
            format_duration(row.get("latency_p50_s")) + _pct(row.get("latency_ratio")),
            f"{format_duration(row.get('latency_p90_s'))}  {_spread(row.get('latency_spread'))}",
            format_number(row.get("samples_per_s")),
            self._metric_text(row),
            "-" if row["name"] == self.baseline else format_number(row.get("max_abs_diff")),
            format_count(row.get("params")) + (f"; {row['note']}" if row.get("note") else ""),
        ]

    @property
    def _header(self) -> list[str]:
        return [
            "variant",
            "size on disk",
            "memory",
            "latency p50",
            "p90  spread",
            "samples/s",
            self.metric or "metric",
            "max |Δ output|",
            "params; note",
        ]

    def _where(self) -> str:
        env = self.environment
        return (
            f"ratios to {self.baseline!r}; {env.get('device', '?')}, torch {env.get('torch', '?')}, "
            f"{env.get('threads', '?')} threads; latency per batch of {env.get('batch_size', '?')} over "
            f"{env.get('batches', '?')} batches x {env.get('rounds', '?')} rounds, warm-up excluded"
        )

    def to_markdown(self) -> str:
        """A Markdown table (for RESULTS files), warnings below it."""
        return "\n".join([*self._markdown_lines(), "", *(f"*{w}*" for w in self.warnings)])

    def __str__(self) -> str:
        lines = self._text_lines(cut=90)
        return "\n".join([*lines, f"({self._where()})", *(f"warning: {w}" for w in self.warnings)])

    def __repr__(self) -> str:
        return f"InferenceComparison({len(self.rows)} variants, baseline={self.baseline!r})\n{self}"

    def _repr_html_(self) -> str:
        notes = "".join(f"<div style='color:#b35900'>⚠ {html.escape(w)}</div>" for w in self.warnings)
        return (
            f"<div class='nbt-compare nbt-compare-inference'>{self._table_html()}"
            f"<small>{html.escape(self._where())} (bars: 100% = 50 px).</small>{notes}</div>"
        )
