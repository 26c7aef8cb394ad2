"""The result of a comparison: one row per strategy, as a pandas frame, text, Markdown and HTML with bars."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

from nbtrainer._report._format import format_bytes, format_duration, format_number

__all__ = ["StrategyComparison"]


def _pct(r: float | None) -> str:
    return "" if r is None else f" ({r:.0%})"


@dataclass
class StrategyComparison:
    """The result of :func:`compare_strategies`: one row per strategy.

    Attributes:
        rows: dicts with ``name, status ("ok" | "failed"), reason, options, steps, step_time_s,
            samples_per_s, train_time_s, peak_memory_bytes, memory_detail, final_loss, metric`` and the ratios
            ``step_time_ratio, samples_per_s_ratio, peak_memory_ratio`` (baseline = 1.0).
        baseline: name of the baseline row.
        metric: the validation metric's key (e.g. ``"val_acc"``).
        memory_kind: what ``peak_memory_bytes`` is (CUDA peak allocated, or measured bytes).
        environment: device, torch version, threads.
    """

    rows: list[dict[str, Any]]
    baseline: str
    metric: str | None
    memory_kind: str
    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> dict[str, Any]:
        for row in self.rows:
            if row["name"] == name:
                return row
        raise KeyError(f"No strategy {name!r}; have {[r['name'] for r in self.rows]}")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def names(self) -> list[str]:
        return [r["name"] for r in self.rows]

    def to_pandas(self) -> Any:
        """One row per strategy (index: name); numbers as numbers, ratios as fractions of the baseline."""
        import pandas as pd

        cols = [
            "status",
            "step_time_s",
            "step_time_ratio",
            "samples_per_s",
            "samples_per_s_ratio",
            "peak_memory_bytes",
            "peak_memory_ratio",
            "final_loss",
            "metric",
            "steps",
            "train_time_s",
            "reason",
        ]
        frame = pd.DataFrame([{c: r.get(c) for c in cols} for r in self.rows], index=self.names, columns=cols)
        frame.index.name = "strategy"
        if self.metric:
            frame = frame.rename(columns={"metric": self.metric})
        frame.attrs.update(memory_kind=self.memory_kind, baseline=self.baseline, **self.environment)
        return frame

    def _metric_text(self, v: Any) -> str:
        if isinstance(v, float) and math.isfinite(v) and self.metric and "acc" in self.metric and 0 <= v <= 1:
            return f"{v:.1%}"  # an accuracy reads best as a percentage
        return format_number(v)

    def _cells(self, row: dict[str, Any]) -> list[str]:
        if row["status"] != "ok":
            return [row["name"], "failed", "", "", "", "", row.get("reason") or ""]  # full reason: to_pandas()
        return [
            row["name"],
            format_duration(row["step_time_s"]) + _pct(row.get("step_time_ratio")),
            format_number(row.get("samples_per_s")) + _pct(row.get("samples_per_s_ratio")),
            format_bytes(row.get("peak_memory_bytes")) + _pct(row.get("peak_memory_ratio")),
            format_number(row.get("final_loss")),
            self._metric_text(row.get("metric")),
            row.get("note", ""),
        ]

    @property
    def _header(self) -> list[str]:
        return [
            "strategy",
            "step time (median)",
            "samples/s",
            "peak memory*",
            "final loss",
            self.metric or "metric",
            "note",
        ]

    def to_markdown(self) -> str:
        """A Markdown table (for RESULTS files)."""
        lines = ["| " + " | ".join(self._header) + " |", "|" + "---|" * len(self._header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in self._cells(r)) + " |" for r in self.rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        table = [self._header] + [self._cells(r) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(self._header))]
        table = [[c if len(c) <= 90 else c[:87] + "..." for c in row] for row in table]
        widths = [max(len(row[i]) for row in table) for i in range(len(self._header))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out) + f"\n(ratios to {self.baseline!r}; {self._where()})"

    def __repr__(self) -> str:
        return f"StrategyComparison({len(self.rows)} strategies, baseline={self.baseline!r})\n{self}"

    def _where(self) -> str:
        env = self.environment
        return f"{env.get('device', '?')}, torch {env.get('torch', '?')}; *peak memory: {self.memory_kind}"

    def _repr_html_(self) -> str:
        def bar(ratio: float | None, color: str) -> str:
            if ratio is None:
                return ""
            width = max(1.0, min(ratio, 2.0) * 50)
            return (
                f"<div style='background:{color};height:4px;width:{width:.0f}px;margin-top:2px' "
                f"title='{ratio:.0%} of baseline'></div>"
            )

        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self._header)
        body = []
        for row in self.rows:
            cells = self._cells(row)
            if row["status"] == "ok":
                cells_html = [
                    html.escape(cells[0]),
                    html.escape(cells[1]) + bar(row.get("step_time_ratio"), "#1f77b4"),
                    html.escape(cells[2]) + bar(row.get("samples_per_s_ratio"), "#2ca02c"),
                    html.escape(cells[3]) + bar(row.get("peak_memory_ratio"), "#ff7f0e"),
                    html.escape(cells[4]),
                    html.escape(cells[5]),
                    html.escape(cells[6]),
                ]
            else:
                cells_html = [
                    html.escape(cells[0]),
                    "<b style='color:#c00'>failed</b>",
                    f"<td colspan='5' style='color:#c00'>{html.escape(cells[6])}</td>",
                ]
                body.append("<tr><td>" + "</td><td>".join(cells_html[:2]) + "</td>" + cells_html[2] + "</tr>")
                continue
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells_html) + "</tr>")
        return (
            f"<div class='nbt-compare'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            f"</table><small>Ratios to {html.escape(self.baseline)!s} (bars: 100% = 50 px). "
            f"{html.escape(self._where())}.</small></div>"
        )
