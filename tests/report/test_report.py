"""History plots without a plotting library: SVG charts and an HTML report (issues 11 and 13).

Checked by parsing what is produced: well-formed SVG, text in ``currentColor`` (theme-aware), the legend above
the plot area, a loss axis that never goes below 0, an LR axis in decades, bounded metrics on 0-1, and files
written atomically.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from nbtrainer import EarlyStopping, History, Trainer, format_number
from nbtrainer.plotting import classify_metrics, svg_chart, use_log_scale

SVG = "{http://www.w3.org/2000/svg}"


def _history(epochs: int = 4, steps_per_epoch: int = 50) -> History:
    h = History()
    pts = []
    for i in range(1, epochs * steps_per_epoch + 1):
        lr = 3e-3 if i < 120 else 1e-4
        pts.append((i, 2.3 * math.exp(-i / 40) + 0.001, lr))  # 2.3 down to 0.017: over two decades
    h.add_steps(pts, epoch=1)
    for e in range(1, epochs + 1):
        h.add_epoch(
            {
                "epoch": e,
                "lr": 3e-3,
                "loss": 1.0 / e,
                "acc": 0.5 + e / 10,
                "val_loss": 1.1 / e,
                "val_acc": 0.45 + e / 10,
                "mae": 4.0 / e,
                "time": 2.5,
                "samples_per_s": 5476.37,
                "steps": steps_per_epoch * e,
                "skipped_steps": 0,
            }
        )
    h.add_event(step=119, epoch=3, kind="lr", old=3e-3, new=1e-4)
    h.add_event(step=150, epoch=3, kind="grad_accum_steps", old=1, new=4)
    h.status = "finished"
    return h


def _charts(svg_text: str) -> list[ET.Element]:
    root = ET.fromstring(svg_text)
    return [el for el in root.iter(f"{SVG}svg") if el.get("class") == "nbt-summary-chart"]


def _title(chart: ET.Element) -> str:
    return next(chart.iter(f"{SVG}text")).text or ""


def _title_of(el: ET.Element) -> str:
    title = el.find(f"{SVG}title")
    assert title is not None and title.text is not None, ET.tostring(el)
    return title.text


def _attr(el: ET.Element, name: str) -> float:
    value = el.get(name)
    assert value is not None, (name, ET.tostring(el))
    return float(value)


def _texts(chart: ET.Element) -> list[str]:
    return [t.text or "" for t in chart.iter(f"{SVG}text")]


def test_to_svg_is_one_svg_with_loss_lr_and_metric_charts_legible_in_any_theme():
    svg = _history().to_svg()
    charts = _charts(svg)
    titles = [_title(c) for c in charts]
    assert titles[0].startswith("loss") and titles[1] == "learning rate" and "metrics per epoch" in titles
    assert "mae per epoch" in titles  # an unbounded metric: its own axis, never the loss's or the 0-1 one
    for chart in charts:
        assert chart.get("fill") == "currentColor"  # text takes the page's colour (light and dark themes)
        assert all(t.get("fill") in (None, "currentColor") for t in chart.iter(f"{SVG}text"))
        axis_labels = [t.text for t in chart.iter(f"{SVG}text") if t.get("text-anchor") == "middle"]
        assert axis_labels, "every chart has axis labels"


def test_loss_axis_never_goes_below_zero_and_turns_log_past_two_decades():
    h = _history()
    loss_chart = _charts(h.to_svg())[0]
    assert _title(loss_chart) == "loss (log scale)"  # 2.3 down to ~0.02: more than two decades
    ticks = [t for t in _texts(loss_chart) if re.fullmatch(r"-?[\d.]+(e-?\d+)?", t)]
    assert ticks and not any(t.startswith("-") for t in ticks)
    small = History()
    small.add_steps([(1, 1.2, 1e-3), (2, 0.9, 1e-3), (3, 0.7, 1e-3)], epoch=1)
    chart = _charts(small.to_svg())[0]
    assert _title(chart) == "loss"
    assert "0" in _texts(chart)  # a linear axis from 0


def test_lr_chart_is_logarithmic_and_marks_the_change_at_its_new_value():
    lr_chart = _charts(_history().to_svg())[1]
    ticks = [t for t in _texts(lr_chart) if re.fullmatch(r"\d\.\d\de-\d+", t)]
    assert "1.00e-4" in ticks and len(ticks) >= 2  # decades in the one LR format
    marks = [p for p in lr_chart.iter(f"{SVG}path") if p.find(f"{SVG}title") is not None]
    assert any("lr 3.00e-3 → 1.00e-4" in _title_of(p) for p in marks)


def test_legend_sits_above_the_plot_area():
    chart = _charts(_history().to_svg())[0]
    plot_top = _attr(next(r for r in chart.iter(f"{SVG}rect")), "y")
    legend_texts = [t for t in chart.iter(f"{SVG}text") if t.text in ("loss (step)", "smoothed", "val_loss")]
    assert len(legend_texts) == 3 and all(_attr(t, "y") < plot_top for t in legend_texts)


def test_markers_carry_exact_values_as_tooltips():
    chart = _charts(_history().to_svg())[0]
    tips = [_title_of(c) for c in chart.iter(f"{SVG}circle")]
    assert f"val_loss 100: {format_number(1.1 / 2)}" in tips


def test_plot_displays_and_saves_svg_and_html_atomically(tmp_path):
    plot = _history().plot()
    assert plot._repr_html_().count("<svg") == 4  # loss, lr, bounded metrics, mae
    svg_path = plot.save(tmp_path / "run.svg")
    text = (tmp_path / "run.svg").read_text(encoding="utf-8")
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg" and "color:#24292f" in (root.get("style") or "")  # dark text standalone
    assert svg_path.endswith("run.svg")
    plot.save(tmp_path / "run.html")
    assert "<svg" in (tmp_path / "run.html").read_text(encoding="utf-8")
    with pytest.raises(ValueError, match=r"\.svg or \.html"):
        plot.save(tmp_path / "run.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.svg"]  # no temp file left


def test_repr_html_is_a_report_with_the_epoch_table_and_the_charts():
    h = _history()
    html = h._repr_html_()
    assert "nbt-summary-table" in html and html.count("<svg") >= 4
    found = re.search(r"<div style='margin-bottom:4px'>(.*?)</div>", html)
    assert found is not None
    header = found.group(1)
    assert "200 optimizer steps" in header and "finished" in header  # the steps taken, not an epoch row's
    rows = re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>")[1])
    assert len(rows) == 4
    assert "<b>0.25</b>" in rows[-1]  # the best (lowest) loss of its column in bold
    assert ">samples_per_s<" not in html  # bookkeeping stays out of the epoch table


def test_metric_classification():
    assert classify_metrics([{"acc": 0.5, "val_acc": 0.7, "f1": 0.4, "mae": 3.0, "lr": 1e-3, "time": 2.0}]) == (
        ["acc", "f1"],
        ["mae"],
    )
    assert classify_metrics([{"acc": 87.5}]) == ([], ["acc"])  # a percent accuracy is not 0-1
    assert use_log_scale([10.0, 0.05]) and not use_log_scale([1.0, 0.5]) and not use_log_scale([1.0, 0.0])


def test_an_empty_chart_says_so():
    svg = svg_chart([], title="loss", xlabel="step", ylabel="loss")
    assert "no data" in svg and ET.fromstring(svg).tag == f"{SVG}svg"


def test_legend_swatches_of_the_raw_and_smoothed_loss_differ_like_their_lines():
    chart = next(c for c in _charts(_history().to_svg()) if _title(c).startswith("loss"))
    texts = list(chart.iter(f"{SVG}text"))
    lines = list(chart.iter(f"{SVG}line"))

    def swatch(label):  # the legend line just left of its label
        text = next(t for t in texts if t.text == label)
        x, y = float(text.get("x", "nan")), float(text.get("y", "nan"))
        return next(
            ln
            for ln in lines
            if float(ln.get("x2", "nan")) == x - 4 and abs(float(ln.get("y1", "nan")) - (y - 3)) < 0.01
        ).attrib

    raw, smooth = swatch("loss (step)"), swatch("smoothed")
    assert raw != smooth
    assert float(raw.get("stroke-opacity", 1)) < float(smooth.get("stroke-opacity", 1))


def test_to_html_shows_every_epoch_without_a_scroll_box():
    h = _history(epochs=30, steps_per_epoch=2)
    text = h.to_html()
    assert "max-height" not in text and text.count("<tr>") == 31  # the header and every epoch


def test_on_a_tie_the_table_bolds_the_first_best_epoch_as_history_best_does():
    from nbtrainer._report._html import epoch_table_html

    rows = [
        {"epoch": e, "val_loss": 0.5 if e in (2, 4) else 0.9, "val_acc": 0.8 if e in (2, 4) else 0.1}
        for e in (1, 2, 3, 4)
    ]
    h = History()
    for r in rows:
        h.add_epoch(r)
    best_loss, best_acc = h.best("val_loss"), h.best("val_acc", mode="max")
    assert best_loss is not None and best_acc is not None
    assert best_loss["epoch"] == 2 and best_acc["epoch"] == 2  # History.best: the first of a tie
    body = epoch_table_html(rows).split("<tbody>")[1].split("</tr>")
    assert body[1].count("<b>") == 2 and body[3].count("<b>") == 0, body  # epoch 2 for both columns


def test_best_refuses_a_mode_it_does_not_know():
    h = History()
    for epoch, loss in ((1, 0.9), (2, 0.2), (3, 0.5)):
        h.add_epoch({"epoch": epoch, "val_loss": loss})
    assert h.best("val_loss")["epoch"] == 2 and h.best("val_loss", mode="max")["epoch"] == 1  # type: ignore[index]
    with pytest.raises(ValueError, match="mode must be 'min', 'max' or 'auto', got 'minimum'"):
        h.best("val_loss", mode="minimum")  # once the maximum: anything but "min" was taken for "max"


def test_history_repr_keeps_small_values():
    h = History()
    h.add_epoch({"epoch": 1, "lr": 1.52e-6, "loss": 0.123456})
    assert "lr=1.52e-6" in repr(h) and "loss=0.1235" in repr(h)  # not rounded to 0 (each value in its own format)


def test_both_comparisons_are_one_table_type_and_draw_a_failed_row_alike():
    """compare_strategies and compare_inference return the one ComparisonTable type (issue 34): the same text,
    Markdown and HTML code draws both, a failed row spanning its reason and ratio bars scaled to the baseline."""
    from nbtrainer._report._comparison import ComparisonTable
    from nbtrainer.compare import StrategyComparison
    from nbtrainer.inference import InferenceComparison

    ok = {"name": "base", "status": "ok", "step_time_s": 0.01, "step_time_ratio": 1.0, "samples_per_s_ratio": 1.0,
          "peak_memory_ratio": 1.0, "size_ratio": 1.0, "latency_ratio": 1.0}  # fmt: skip
    failed = {"name": "broken", "status": "failed", "reason": "out of memory: use checkpointing"}
    tables = [
        StrategyComparison([ok, failed], baseline="base", metric=None, memory_kind="bytes"),
        InferenceComparison([ok, failed], baseline="base", metric=None),
    ]
    for table in tables:
        assert isinstance(table, ComparisonTable)
        page = table._repr_html_()
        assert page.count("width:50px") == 3  # a 100% ratio is a 50 px bar, one per ratio column
        assert "colspan=" in page and "out of memory: use checkpointing" in page
        assert "out of memory: use checkpointing" in str(table) and "| broken | failed |" in table.to_markdown()
        assert table["broken"]["status"] == "failed"


def test_best_without_a_mode_maximizes_an_accuracy_and_names_a_key_never_logged():
    """Before: ``best("val_acc")`` minimized every key (the worst epoch, where EarlyStopping("val_acc") maximizes), and
    a misspelt key returned None, so ``best(...)["val_acc"]`` failed far from the typo."""
    torch.manual_seed(0)
    x, y = torch.randn(96, 10), torch.randint(0, 3, (96,))
    trainer = Trainer(
        torch.nn.Linear(10, 3), torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, progress=False, seed=0,
        metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()},
    )  # fmt: skip
    h = trainer.fit((x, y), val_data=(x, y), batch_size=16, epochs=4)
    accs, losses = h["val_acc"], h["val_loss"]
    assert len(set(accs)) > 1  # a best and a worst epoch to tell apart
    assert h.best("val_acc")["val_acc"] == max(accs)  # type: ignore[index]
    assert h.best("val_loss")["val_loss"] == min(losses)  # type: ignore[index]
    assert h.best("val_acc") == h.best("val_acc", mode=EarlyStopping("val_acc").mode)
    with pytest.raises(KeyError, match=r"'val_accuracy' was not logged in this history's 4 epochs.*'val_acc'"):
        h.best("val_accuracy")
    assert History().best("val_acc") is None  # nothing logged yet: no best, and no key to doubt


# Lower is better for a name that says loss or error, whatever accuracy-like word it also holds (mape holds "map",
# brier_score "score"); the accuracy-like words count as whole words of the name, not inside another word.
LOWER_IS_BETTER = [
    "loss",
    "val_loss",
    "val_mape",
    "val_smape",
    "val_dice_loss",
    "val_iou_loss",
    "val_focal_loss",
    "val_brier_score",
    "val_mae",
    "val_mse",
    "val_rmse",
    "val_error_rate",
    "MeanSquaredError",
    "MeanAbsolutePercentageError",
    "val_perplexity",
    "val_wer",
]
HIGHER_IS_BETTER = [
    "acc",
    "val_acc",
    "val_accuracy",
    "val_top5_acc",
    "val_acc5",
    "val_f1",
    "val_f1_macro",
    "val_auc",
    "val_roc_auc",
    "val_precision",
    "val_recall",
    "val_iou",
    "val_dice",
    "val_r2",
    "val_score",
    "val_map",
    "val_mAP",
    "val_jaccard",
    "val_agreement",
    "val_m_MulticlassAccuracy",
    "val_MulticlassF1Score",
    "R2Score",
    "JaccardIndex",
]


@pytest.mark.parametrize("key", LOWER_IS_BETTER + HIGHER_IS_BETTER)
def test_which_way_is_better_and_what_mode_auto_watches(key, tmp_path):
    from nbtrainer import EarlyStopping, ModelCheckpoint
    from nbtrainer.plotting import higher_is_better

    higher = key in HIGHER_IS_BETTER
    assert higher_is_better(key) is higher
    mode = "max" if higher else "min"
    assert EarlyStopping(key).mode == mode and ModelCheckpoint(tmp_path, monitor=key).mode == mode
