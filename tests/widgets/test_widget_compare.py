"""CompareWidget on real (tiny) strategy comparisons: table, bars as ratios to the baseline, failed rows
only in the table, rows filled in live, and ``%nbtrainer compare`` showing it (no kernel, no browser)."""

from __future__ import annotations

import html
import sys
from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader, mlp
from torch import nn
from widget_helpers import classes

from nbtrainer import StrategyComparison, compare_strategies
from nbtrainer.widgets import CompareWidget

STRATEGIES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16": {"precision": "bf16-mixed"},
    "bad": {"precision": "fp8"},
    "accum2": {"grad_accum_steps": 2},
}
RATIO = {"time": "step_time_ratio", "memory": "peak_memory_ratio"}


@pytest.fixture(scope="module")
def data():
    x, y = make_classification(n=64)
    return make_loader(x, y, batch_size=16), make_loader(x, y, batch_size=64)


def make_opt(params):
    return torch.optim.SGD(params, lr=0.1)


@pytest.fixture(scope="module")
def comparison(data):
    train, val = data
    return compare_strategies(mlp, make_opt, nn.CrossEntropyLoss(), train, val, STRATEGIES, steps=3, metric="val_acc")


def bars_of(w: CompareWidget, key: str) -> dict[str, float]:
    bars = w.bars[key]
    assert len(bars.x) == len(bars.y)
    return dict(zip(bars.x.tolist(), bars.y.tolist(), strict=True))


@pytest.mark.slow
def test_table_and_bars_of_a_comparison(comparison):
    import nbtrainer
    import nbtrainer.widgets

    assert nbtrainer.CompareWidget is CompareWidget and "CompareWidget" in nbtrainer.widgets.__all__
    assert comparison["bad"]["status"] == "failed"
    ok = [r for r in comparison.rows if r["status"] == "ok"]
    assert [r["name"] for r in ok] == ["fp32", "bf16", "accum2"]

    w = CompareWidget(comparison)
    assert {
        "nbt-compare",
        "nbt-compare-table",
        "nbt-compare-chart-time",
        "nbt-compare-chart-memory",
        "nbt-compare-chart-metric",
    } <= classes(w.root)
    assert w._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"] == w.root.model_id
    assert w.table.value == comparison._repr_html_()
    assert "bad" in w.table.value and html.escape(comparison["bad"]["reason"]) in w.table.value
    for key, ratio_key in RATIO.items():
        heights = bars_of(w, key)
        assert list(heights) == ["fp32", "bf16", "accum2"]  # the failed strategy has no bar
        assert heights["fp32"] == 1.0
        assert heights == pytest.approx({r["name"]: r[ratio_key] for r in ok})
    base = comparison["fp32"]["metric"]
    assert bars_of(w, "metric") == pytest.approx({r["name"]: r["metric"] / base for r in ok})


def test_without_a_metric_there_is_no_metric_chart(data):
    table = compare_strategies(mlp, make_opt, nn.CrossEntropyLoss(), data[0], None, ["fp32", "accum2"], steps=2)
    w = CompareWidget(table)
    assert table.metric is None and set(w.bars) == {"time", "memory"}
    assert "nbt-compare-chart-metric" not in classes(w.root)
    assert bars_of(w, "memory") == pytest.approx({n: table[n]["peak_memory_ratio"] for n in ("fp32", "accum2")})


@pytest.mark.slow
def test_run_adds_each_row_as_it_is_measured(data):
    shown, xs, seen = [], [], []

    def show(widget):
        shown.append((widget, len(widget.rows)))
        widget.bars["time"].observe(lambda change: xs.append(change["new"].tolist()), "x")

    def on_row(row):  # the caller's on_row still runs, after the widget has the row
        widget = shown[0][0]
        seen.append((row["name"], len(widget.rows), bars_of(widget, "time"), widget.status.value))

    train, val = data
    w = CompareWidget.run(
        mlp, make_opt, nn.CrossEntropyLoss(), train, val, STRATEGIES, steps=3, show=show, on_row=on_row
    )
    assert shown == [(w, 0)]  # displayed before the first strategy trained
    assert [(name, n) for name, n, _, _ in seen] == [("fp32", 1), ("bf16", 2), ("bad", 3), ("accum2", 4)]
    assert [list(bars) for _, _, bars, _ in seen] == [
        ["fp32"],
        ["fp32", "bf16"],
        ["fp32", "bf16"],
        ["fp32", "bf16", "accum2"],
    ]
    grew = [x for i, x in enumerate(xs) if i == 0 or x != xs[i - 1]]
    assert grew == [["fp32"], ["fp32", "bf16"], ["fp32", "bf16", "accum2"]]  # the bar mark's x, row by row
    assert all("comparing strategies" in status for *_, status in seen)
    assert isinstance(w.comparison, StrategyComparison) and w.comparison.names == list(STRATEGIES)
    final = {r["name"]: r["step_time_ratio"] for r in w.comparison.rows if r["status"] == "ok"}
    assert bars_of(w, "time") == pytest.approx(final)
    assert seen[-1][2] == pytest.approx(final)  # the live ratios were already the comparison's ratios
    assert w.table.value == w.comparison._repr_html_() and "comparing" not in w.status.value


@pytest.mark.slow
def test_magic_compare_shows_the_widget_or_the_table_without_widgets(shell, data, monkeypatch, capsys):
    from nbtrainer._shell import _magics

    shown = []
    monkeypatch.setattr(
        _magics.NbtrainerMagics, "_display", lambda self, obj: shown.append((obj, len(getattr(obj, "rows", ()))))
    )
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # a kernel with a front end (terminal: text, test_magics)
    shell.user_ns.update(make_model=mlp, make_opt=make_opt, crit=nn.CrossEntropyLoss(), tl=data[0], vl=data[1])
    shell.run_line_magic("nbtrainer", "compare make_model make_opt crit tl vl --strategies fp32,accum2 --steps 2")
    table, widget = shell.user_ns["_nbt_compare"], shell.user_ns["_nbt_compare_widget"]
    assert shown == [(widget, 0)] and isinstance(widget, CompareWidget) and widget.comparison is table
    assert list(widget.bars["time"].x) == ["fp32", "accum2"] and "accum2: done" in capsys.readouterr().out

    monkeypatch.setitem(sys.modules, "nbtrainer.widgets", None)  # the widget layer cannot be imported
    shown.clear()
    shell.run_line_magic("nbtrainer", "compare make_model make_opt crit tl --strategies fp32 --steps 2")
    table = shell.user_ns["_nbt_compare"]
    assert isinstance(table, StrategyComparison) and [obj for obj, _ in shown] == [table]
