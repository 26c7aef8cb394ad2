"""``CompareWidget``: a ``StrategyComparison`` as a table plus bar charts relative to the baseline.

The table is the comparison's own HTML (one renderer for the notebook's plain output and the widget).
The bars show step time, peak memory and the validation metric of every strategy that ran, as ratios
to the baseline (the baseline's bar is at 1.0, a dashed line marks 100%); failed strategies appear
only in the table, with their reason. ``CompareWidget.run`` shows the widget before the first strategy
trains and adds each row as ``compare_strategies`` reports it (``on_row``).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np
import torch

from nbtrainer import InferenceComparison, StrategyComparison, compare_strategies
from nbtrainer.plotting import PALETTE

from ._fallback import html_view
from ._style import theme_style

__all__ = ["CompareWidget"]

_MARGIN = {"top": 35, "bottom": 45, "left": 50, "right": 10}
_LAYOUT = {"flex": "1 1 260px", "min_width": "240px", "height": "240px"}
# chart key -> (title, the row's ratio key, the row's value key, bar color); "metric" has no ratio in the row:
# computed here. An InferenceComparison names its own charts (latency, size, metric) in its ``charts``.
CHARTS = {
    "time": ("step time vs baseline (lower is faster)", "step_time_ratio", "step_time_s", PALETTE[0]),
    "memory": ("peak memory vs baseline", "peak_memory_ratio", "peak_memory_bytes", PALETTE[1]),
    "metric": ("{metric} vs baseline", None, "metric", PALETTE[2]),
}


def _charts_of(comparison: Any) -> dict[str, tuple[str, str | None, str, str]]:
    own = getattr(comparison, "charts", None)
    if not own:
        return CHARTS
    return {key: (*spec, PALETTE[i % len(PALETTE)]) for i, (key, spec) in enumerate(own.items())}


def _first_strategy(strategies: Any) -> str:
    """The name ``compare_strategies`` takes as the baseline when none is given (its first strategy)."""
    if strategies is None:
        return "fp32"  # the first of compare_strategies' default list
    if isinstance(strategies, str):
        return re.split(r"[,\s]+", strategies.strip())[0]
    return str(next(iter(strategies)))


def _bar_chart(key: str, metric: str | None, charts: Mapping[str, tuple] = CHARTS) -> tuple[bq.Figure, bq.Bars]:
    title, _, _, color = charts[key]
    sx, sy = bq.OrdinalScale(), bq.LinearScale(min=0.0)
    tooltip = bq.Tooltip(fields=["x", "y"], formats=["", ".1%"], labels=["strategy", "vs baseline"])
    bars = bq.Bars(
        x=np.array([], dtype=str),
        y=np.empty(0),
        scales={"x": sx, "y": sy},
        colors=[color],
        padding=0.3,
        label_display=True,
        label_display_format=".0%",
        tooltip=tooltip,
    )
    # 100%: a line across the plot on its own 0..1 x scale (an ordinal x has no "across")
    ref = bq.Lines(
        x=[0.0, 1.0],
        y=[1.0, 1.0],
        scales={"x": bq.LinearScale(min=0.0, max=1.0), "y": sy},
        colors=["#8b949e"],
        line_style="dashed",
        stroke_width=1,
    )
    fig = bq.Figure(
        marks=[bars, ref],
        title=title.format(metric=metric),
        axes=[bq.Axis(scale=sx), bq.Axis(scale=sy, side="left", tick_format=".0%", num_ticks=4)],
        fig_margin=dict(_MARGIN),
        animation_duration=0,
        layout=W.Layout(**_LAYOUT),
    )
    fig.add_class(f"nbt-compare-chart-{key}")
    return fig, bars


class CompareWidget:
    """Table and bar charts of a strategy comparison (``nbtrainer.compare_strategies``) or of an inference
    comparison (``nbtrainer.compare_inference``: latency, size on disk and the metric against the baseline).

    Args:
        comparison: a ``StrategyComparison`` or an ``InferenceComparison``; ``None`` for an empty widget that
            :meth:`add_row` fills (what :meth:`run` does).
        baseline, metric: only for an empty widget: the baseline's name and the metric's key.

    Example:
        >>> table = compare_strategies(make_model, make_opt, loss, train, val, ["fp32", "bf16"])  # doctest: +SKIP
        >>> CompareWidget(table)                                   # table + bars  # doctest: +SKIP
        >>> w = CompareWidget.run(make_model, make_opt, loss, train, val, ["fp32", "accum4"])  # doctest: +SKIP
        >>> w.comparison.to_pandas()                               # doctest: +SKIP
    """

    def __init__(
        self,
        comparison: StrategyComparison | InferenceComparison | None = None,
        *,
        baseline: str | None = None,
        metric: str | None = None,
    ) -> None:
        self.comparison = comparison
        self.baseline = comparison.baseline if comparison is not None else (baseline or "")
        self.metric = comparison.metric if comparison is not None else metric
        self.rows: list[dict[str, Any]] = list(comparison.rows) if comparison is not None else []
        self.status = W.HTML()
        self.status.add_class("nbt-compare-status")
        self.table = W.HTML()
        self.table.add_class("nbt-compare-table")
        self.figures: dict[str, bq.Figure] = {}
        self.bars: dict[str, bq.Bars] = {}
        self.charts = _charts_of(comparison)
        for key in self.charts:
            if key != "metric" or self.metric:
                self.figures[key], self.bars[key] = _bar_chart(key, self.metric, self.charts)
        charts = W.HBox(list(self.figures.values()), layout=W.Layout(flex_flow="row wrap", width="100%"))
        charts.add_class("nbt-compare-charts")
        self.root = W.VBox([self.status, self.table, charts, theme_style()])
        self.root.add_class("nbt-compare")
        self._render()

    # -- data ------------------------------------------------------------------------------------
    def ratios(self, key: str) -> tuple[list[str], list[float]]:
        """The strategies that ran and their ratio to the baseline for chart ``key`` (what the bars show)."""
        base = next((r for r in self.rows if r["name"] == self.baseline and r["status"] == "ok"), None)
        names, values = [], []
        for row in self.rows:
            if row["status"] != "ok" or base is None:
                continue
            ratio = self._ratio(row, base, key)
            if ratio is not None and math.isfinite(ratio):
                names.append(row["name"])
                values.append(ratio)
        return names, values

    def _ratio(self, row: dict[str, Any], base: dict[str, Any], key: str) -> float | None:
        _, ratio_key, field, _ = self.charts[key]
        if ratio_key is not None and row.get(ratio_key) is not None:
            return float(row[ratio_key])  # the comparison's own ratio, once it has computed them
        b, v = base.get(field), row.get(field)
        return float(v) / float(b) if isinstance(b, (int, float)) and b and isinstance(v, (int, float)) else None

    def add_row(self, row: Mapping[str, Any]) -> None:
        """Show one more strategy (``compare_strategies``' ``on_row``); ratios are provisional until the end."""
        self.rows.append(dict(row))
        self._render()

    def set_comparison(self, comparison: StrategyComparison | InferenceComparison) -> None:
        """Show the finished comparison (its rows and ratios replace the provisional ones)."""
        self.comparison, self.baseline, self.metric = comparison, comparison.baseline, comparison.metric
        self.rows = list(comparison.rows)
        self._render()

    # -- drawing ---------------------------------------------------------------------------------
    def _render(self) -> None:
        table = self.comparison
        if table is None:  # live: the rows so far, in the comparison's own table layout
            table = StrategyComparison(
                rows=self.rows,
                baseline=self.baseline,
                metric=self.metric,
                memory_kind="stated when every strategy has run",
                environment={"device": "running", "torch": torch.__version__},
            )
            failed = sum(r["status"] != "ok" for r in self.rows)
            self.status.value = (
                f"<span style='font-size:12px'>comparing strategies: {len(self.rows)} done"
                f"{f' ({failed} failed)' if failed else ''}, baseline "
                f"<b>{html.escape(self.baseline)}</b>...</span>"
            )
        else:
            kind = "variants" if isinstance(table, InferenceComparison) else "strategies"
            self.status.value = (
                f"<span style='font-size:12px'>{len(self.rows)} {kind}; bars: ratio to "
                f"<b>{html.escape(self.baseline)}</b> (100%), failed {kind} only in the table"
                "</span>"
            )
        self.table.value = table._repr_html_() if self.rows else ""
        for key, bars in self.bars.items():
            names, values = self.ratios(key)
            with bars.hold_sync():  # x and y change together: one message, never a length mismatch
                bars.x = np.array(names, dtype=str)
                bars.y = np.array(values, dtype=float)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # with text/plain and text/html where widgets cannot render
        return html_view(self.root, "strategy comparison", self.status, self.table)._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        rows = len(self.comparison) if self.comparison is not None else 0
        return f"CompareWidget({rows} rows, baseline {self.baseline!r})"

    # -- live ------------------------------------------------------------------------------------
    @classmethod
    def run(
        cls,
        make_model: Callable[[], torch.nn.Module],
        optimizer: Any,
        criterion: Any,
        train_loader: Any,
        val_loader: Any = None,
        strategies: Any = None,
        *,
        show: bool | Callable[[Any], Any] = True,
        **compare_kwargs: Any,
    ) -> CompareWidget:
        """Show an empty widget, run ``compare_strategies`` here, and add each strategy as it finishes.

        Args:
            make_model, optimizer, criterion, train_loader, val_loader, strategies: as for
                ``compare_strategies``.
            show: display the widget before the first strategy trains: ``True`` with IPython's
                ``display``, or a function called with the widget; ``False`` to display it yourself.
            **compare_kwargs: any other ``compare_strategies`` option (``steps=``, ``metric=``, ``on_row=``...).

        Returns:
            The widget, its ``comparison`` set to the ``StrategyComparison``.
        """
        user_on_row = compare_kwargs.pop("on_row", None)
        metric = compare_kwargs.get("metric", "val_acc") if val_loader is not None else None
        widget = cls(None, baseline=compare_kwargs.get("baseline") or _first_strategy(strategies), metric=metric)
        if show is True:
            from IPython.display import display

            display(widget)
        elif callable(show):
            show(widget)

        def on_row(row: dict[str, Any]) -> None:
            widget.add_row(row)
            if user_on_row is not None:
                user_on_row(row)

        comparison = compare_strategies(
            make_model, optimizer, criterion, train_loader, val_loader, strategies, on_row=on_row, **compare_kwargs
        )
        widget.set_comparison(comparison)
        return widget
