"""The result of a comparison: one row per strategy, as a pandas frame, text, Markdown and HTML with bars."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nbtrainer._report._comparison import ComparisonTable
from nbtrainer._report._format import format_bytes, format_duration, format_number

__all__ = ["StrategyComparison"]


#: A row whose step time spreads more than ± this around its median gets a warning under the table.
SPREAD_WARNING = 0.15
SPLIT = ("parameters", "gradients", "optimizer_state", "activations")
SPLIT_LABELS = ("params", "grads", "optim state", "activations")


def _pct(r: float | None) -> str:
    return "" if r is None else f" ({r:.0%})"


def _split(row: dict[str, Any]) -> dict[str, int | None]:
    """The measured split of a row's peak: the four parts and the rest (buffers, inputs)."""
    detail = row.get("memory_detail") or {}
    if not detail:
        return {f"memory_{k}": None for k in (*SPLIT, "other")}
    out: dict[str, int | None] = {f"memory_{k}": int(detail.get(k, 0)) for k in SPLIT}
    out["memory_other"] = int(sum(v for k, v in detail.items() if k not in SPLIT and isinstance(v, int)))
    return out


@dataclass
class StrategyComparison(ComparisonTable):
    """The result of :func:`compare_strategies`: one row per strategy.

    Attributes:
        rows: dicts with ``name, status ("ok" | "failed"), reason, options, steps, step_time_s,
            samples_per_s, train_time_s, peak_memory_bytes, memory_detail`` (the peak's split: ``parameters,
            buffers, gradients, optimizer_state, inputs, activations``), ``memory_resident`` (the same
            categories still allocated after the measured step: e.g. the optimizer's state without the
            step's temporaries), ``step_time_spread, note, final_loss, metric`` and the ratios
            ``step_time_ratio, samples_per_s_ratio, peak_memory_ratio`` (baseline = 1.0).
        baseline: name of the baseline row.
        metric: the validation metric's key (e.g. ``"val_acc"``).
        memory_kind: what ``peak_memory_bytes`` is (CUDA peak allocated, or measured bytes).
        environment: device, torch version, threads.
        left_out: the default strategies left out because they cannot apply to the model (``{name: reason}``),
            said in one line under the table.
    """

    row_kind: ClassVar[str] = "strategy"  # NamedRows: 'No strategy ...' for a missing name
    _bars: ClassVar[dict[int, tuple[str, str]]] = {
        1: ("step_time_ratio", "#1f77b4"),
        2: ("samples_per_s_ratio", "#2ca02c"),
        3: ("peak_memory_ratio", "#ff7f0e"),
    }

    rows: list[dict[str, Any]]
    baseline: str
    metric: str | None
    memory_kind: str
    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)

    def to_pandas(self) -> Any:
        """One row per strategy (index: name); numbers as numbers, ratios as fractions of the baseline.

        ``step_time_spread`` is the step time's relative spread (see :data:`SPREAD_WARNING`); the
        ``memory_*`` columns split the peak into parameters, gradients, optimizer state, activations and
        the rest (buffers, inputs), as measured at the peak.
        """
        import pandas as pd

        cols = [
            "status",
            "step_time_s",
            "step_time_spread",
            "step_time_ratio",
            "samples_per_s",
            "samples_per_s_ratio",
            "peak_memory_bytes",
            "peak_memory_ratio",
            *(f"memory_{part}" for part in SPLIT),
            "memory_other",
            "final_loss",
            "metric",
            "steps",
            "train_time_s",
            "note",
            "reason",
        ]
        records = []
        for r in self.rows:
            record = {c: r.get(c) for c in cols}
            record.update(_split(r))
            records.append(record)
        frame = pd.DataFrame(records, index=self.names, columns=cols)
        frame.index.name = "strategy"
        if self.metric:
            frame = frame.rename(columns={"metric": self.metric})
        frame.attrs.update(memory_kind=self.memory_kind, baseline=self.baseline, **self.environment)
        return frame

    def _metric_text(self, v: Any) -> str:
        if isinstance(v, float) and math.isfinite(v) and self.metric and "acc" in self.metric and 0 <= v <= 1:
            return f"{v:.1%}"  # an accuracy reads best as a percentage
        return format_number(v)

    def _noisy(self, row: dict[str, Any]) -> bool:
        spread = row.get("step_time_spread")
        return row["status"] == "ok" and spread is not None and spread > SPREAD_WARNING

    def _cells(self, row: dict[str, Any]) -> list[str]:
        if row["status"] != "ok":  # the whole reason: it ends with the fix
            return [row["name"], "failed", *[""] * (len(self._header) - 3), row.get("reason") or ""]
        spread = row.get("step_time_spread")
        time_text = format_duration(row["step_time_s"]) + ("" if spread is None else f" ±{spread:.0%}")
        split = _split(row)
        return [
            row["name"],
            time_text + _pct(row.get("step_time_ratio")) + (" !" if self._noisy(row) else ""),
            format_number(row.get("samples_per_s")) + _pct(row.get("samples_per_s_ratio")),
            format_bytes(row.get("peak_memory_bytes")) + _pct(row.get("peak_memory_ratio")),
            *(format_bytes(split[f"memory_{part}"]) if row.get("memory_detail") else "" for part in SPLIT),
            format_number(row.get("final_loss")),
            self._metric_text(row.get("metric")),
            row.get("note", "") or "",
        ]

    @property
    def _header(self) -> list[str]:
        return [
            "strategy",
            "step time (median)",
            "samples/s",
            "peak memory*",
            *SPLIT_LABELS,
            "final loss",
            self.metric or "metric",
            "note",
        ]

    def warnings(self) -> list[str]:
        """What makes some figures of this table unreliable (printed under it)."""
        noisy = [r["name"] for r in self.rows if self._noisy(r)]
        out = []
        if noisy:
            out.append(
                f"! step times of {', '.join(noisy)} spread more than ±{SPREAD_WARNING:.0%} around their median "
                "(a busy machine?): their time ratios are not reliable; rerun with repeats=3 or more, "
                "on a quieter machine"
            )
        return out

    def left_out_note(self) -> list[str]:
        """One line naming the default strategies left out, and why (none when nothing was left out)."""
        if not self.left_out:
            return []
        why = "; ".join(f"{name} ({reason})" for name, reason in self.left_out.items())
        return [f"left out of the default list, as they cannot apply here: {why}"]

    def to_markdown(self) -> str:
        """A Markdown table (for RESULTS files)."""
        notes = [*self.left_out_note(), *self.warnings()]
        return "\n".join([*self._markdown_lines(), "", *(f"{w}  " for w in notes), self._legend()])

    def __str__(self) -> str:
        # the last column (notes, failure reasons) is never cut and does not widen the others
        return "\n".join([*self._text_lines(free_last=True), *self.left_out_note(), *self.warnings(), self._legend()])

    def __repr__(self) -> str:
        return f"StrategyComparison({len(self.rows)} strategies, baseline={self.baseline!r})\n{self}"

    def _legend(self) -> str:
        return (
            f"(ratios to {self.baseline!r}; ±: the step time's spread (half its interquartile range, or of the "
            f"repeats' range); {self._where()}; "
            "params / grads / optim state / activations: the peak's split, activations including temporaries)"
        )

    def _where(self) -> str:
        env = self.environment
        return f"{env.get('device', '?')}, torch {env.get('torch', '?')}; *peak memory: {self.memory_kind}"

    def _repr_html_(self) -> str:
        notes = "".join(f"<br>{html.escape(w)}" for w in self.left_out_note())
        notes += "".join(f"<br><b style='color:#b35900'>{html.escape(w)}</b>" for w in self.warnings())
        return (
            f"<div class='nbt-compare'>{self._table_html()}<small>Ratios to {html.escape(self.baseline)!s} "
            f"(bars: 100% = 50 px); ±: the step time's spread. {html.escape(self._where())}.{notes}</small></div>"
        )
