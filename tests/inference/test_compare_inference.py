"""compare_inference on a trained digits MLP and a smaller student (issue 24): one row per variant with honest
sizes, latency percentiles and spread, the metric and its change, output drift; failures as rows; the table as
text, pandas and HTML; CompareWidget's bars; bad input."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import needs
from inference_data import batches, digits, mlp, train
from torch import nn

from nbtrainer import InferenceComparison, compare_inference, quantize_model

pytestmark = needs("torchao")


@pytest.fixture(scope="module")
def setup():
    xt, yt, xv, yv = digits()
    data = batches(xt, yt)
    teacher = train(mlp(64, seed=0), data, epochs=6)
    student = train(mlp(16, seed=1), data, epochs=6)
    return teacher, student, batches(xv, yv, 90)


@pytest.fixture(scope="module")
def table(setup) -> InferenceComparison:
    teacher, student, val = setup
    return compare_inference(
        teacher, val, models={"student": student, "student int8": quantize_model(student, "int8-weight")}, rounds=3
    )


def test_one_row_per_variant(table) -> None:
    assert table.names == [
        "fp32",
        "bf16",
        "int8-dynamic",
        "int8-weight",
        "int4-weight",
        "codebook4",
        "student",
        "student int8",
    ]
    assert all(r["status"] == "ok" for r in table.rows), [r.get("reason") for r in table.rows]
    assert table.metric == "acc" and table.baseline == "fp32"
    base = table["fp32"]
    assert base["size_ratio"] == 1.0 and base["max_abs_diff"] == 0.0 and base["metric_delta"] == 0.0


def test_sizes_are_what_a_saved_file_holds(table, setup) -> None:
    teacher, student, _ = setup
    fp32 = table["fp32"]
    assert fp32["params"] == sum(p.numel() for p in teacher.parameters()) == table["int8-weight"]["params"]
    assert fp32["size_bytes"] > 4 * fp32["params"]  # float32 weights plus torch.save's framing
    assert fp32["memory_bytes"] == 4 * fp32["params"]
    assert 0.45 < table["bf16"]["size_ratio"] < 0.6
    # int8 weights with float biases and scales; 4-bit codes with a scale per 32 weights and 16 values per layer.
    # On this 9K-parameter model torch.save's per-tensor framing (~0.6 KiB each) weighs; bench/inference.py has
    # the ratios of a 300K-parameter model.
    assert table["codebook4"]["size_ratio"] < table["int8-weight"]["size_ratio"] < 0.4
    assert table["codebook4"]["memory_ratio"] < 0.2 and table["int8-weight"]["memory_ratio"] < 0.3
    assert table["student"]["params"] == sum(p.numel() for p in student.parameters())
    assert table["student int8"]["size_bytes"] < table["student"]["size_bytes"]


def test_metric_latency_and_drift(table) -> None:
    for row in table.rows:
        assert 0.8 < row["metric"] <= 1.0
        assert row["latency_p50_s"] > 0 and row["latency_p90_s"] >= row["latency_p50_s"]
        assert len(row["round_medians_s"]) == 3 and math.isfinite(row["latency_spread"])
        assert row["samples_per_s"] > 0
        assert row["metric_delta"] == pytest.approx(row["metric"] - table["fp32"]["metric"])
    assert 0 < table["int8-weight"]["max_abs_diff"] < table["codebook4"]["max_abs_diff"]
    assert table["student"]["max_abs_diff"] > table["int8-weight"]["max_abs_diff"]  # another model


def test_text_pandas_html(table) -> None:
    text = str(table)
    assert text.splitlines()[0].split()[:3] == ["variant", "size", "on"]
    assert "codebook4" in text and "ratios to 'fp32'" in text and "latency per batch of 90" in text
    assert "3/3 Linear quantized" in text
    frame = table.to_pandas()
    assert list(frame.index) == table.names
    assert {"acc", "acc_delta", "size_ratio", "latency_p50_s", "latency_spread", "max_abs_diff"} <= set(frame.columns)
    html = table._repr_html_()
    assert html.count("<tr>") == len(table.rows) + 1 and "student int8" in html
    markdown = table.to_markdown()
    assert markdown.count("\n| ") >= len(table.rows)


def test_failures_are_rows_with_the_reason() -> None:
    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 3))  # in_features not multiples of 32
    data = [(torch.randn(16, 10), torch.randint(0, 3, (16,))) for _ in range(3)]
    table = compare_inference(model, data, methods=("fp32", "int8-weight", "int4-weight", "codebook4"), rounds=2)
    assert [r["status"] for r in table.rows] == ["ok", "ok", "failed", "failed"]
    assert "in_features divisible by 32" in table["int4-weight"]["reason"]
    assert "failed" in str(table) and "in_features divisible by 32" in table._repr_html_()


def test_when_no_variant_runs_their_errors_are_raised() -> None:
    data = [(torch.randn(8, 64), torch.randint(0, 2, (8,)))]  # 64 features for a model that takes 3
    batch = r"no variant could run.*'fp32': RuntimeError: mat1 and mat2 shapes cannot be multiplied.*first batch"
    with pytest.raises(RuntimeError, match=batch):
        compare_inference(nn.Linear(3, 2), data, methods=("fp32",), rounds=1)
    data = [(torch.randn(8, 10), torch.randint(0, 3, (8,)))]
    methods = r"no variant could run.*'int4-weight': .*in_features divisible by 32.*Pick methods"
    with pytest.raises(RuntimeError, match=methods):
        compare_inference(nn.Linear(10, 3), data, methods=("int4-weight",), baseline="int4-weight", rounds=1)


def test_one_round_warns_that_it_cannot_rank() -> None:
    model = nn.Linear(32, 4)
    data = [(torch.randn(8, 32), torch.zeros(8, dtype=torch.long))] * 2
    table = compare_inference(model, data, methods=("fp32", "bf16"), rounds=1)
    assert any("one round only" in w for w in table.warnings)
    assert "warning: latency: one round only" in str(table)


def test_overlapping_rounds_are_called_too_close_to_rank() -> None:
    model = nn.Linear(32, 4)
    twin = copy.deepcopy(model)  # the same computation twice: latencies cannot be told apart reliably
    data = [(torch.randn(8, 32), torch.zeros(8, dtype=torch.long))] * 4
    tables = [compare_inference(model, data, methods=("fp32",), models={"twin": twin}, rounds=5) for _ in range(3)]
    assert any("too close to rank" in w for t in tables for w in t.warnings)


def test_model_left_as_it_was(setup) -> None:
    teacher, _, val = setup
    teacher.train()
    try:
        compare_inference(teacher, val[:1], methods=("fp32", "int8-weight"), rounds=1)
        assert teacher.training
        assert all(type(p) is nn.Parameter for p in teacher.parameters())
    finally:
        teacher.eval()


def test_a_submodule_frozen_in_eval_mode_stays_in_eval_mode() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 3))
    model.train()
    model[1].eval()  # a frozen BatchNorm: its running statistics must not move in the next fit
    compare_inference(model, [(torch.randn(8, 8), torch.randint(0, 3, (8,)))], methods=("fp32",), rounds=1)
    assert [m.training for m in model.modules()] == [True, True, False, True]


def test_the_extra_models_are_left_in_their_modes() -> None:
    teacher = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).train()
    student = nn.Sequential(nn.Linear(8, 3), nn.BatchNorm1d(3)).train()
    frozen = nn.Sequential(nn.Linear(8, 3), nn.Dropout(0.2)).eval()
    student[1].eval()
    data = [(torch.randn(8, 8), torch.randint(0, 3, (8,)))]
    compare_inference(teacher, data, methods=("fp32",), models={"student": student, "frozen": frozen}, rounds=1)
    assert [m.training for m in student.modules()] == [True, True, False]
    assert [m.training for m in frozen.modules()] == [False, False, False]
    assert teacher.training


def test_custom_metric(setup) -> None:
    teacher, _, val = setup

    def top2(logits, y):
        return (logits.topk(2, -1).indices == y[:, None]).any(-1).float().mean()

    table = compare_inference(teacher, val[:2], methods=("fp32", "int8-weight"), metric=top2, rounds=1)
    assert table.metric == "top2" and table["fp32"]["metric"] > 0.9


def test_default_accuracy_counts_only_labelled_tokens() -> None:
    torch.manual_seed(0)
    tagger = nn.Linear(6, 5)
    xs, ys = torch.randn(2, 4, 7, 6), torch.randint(0, 5, (2, 4, 7))
    ys[0, :, 2:] = -100  # padding, labelled -100 as Hugging Face and CrossEntropyLoss's ignore_index do
    ys[1, :, 6:] = -100
    table = compare_inference(tagger, list(zip(xs, ys, strict=True)), methods=("fp32",), rounds=1)
    with torch.no_grad():
        predicted = tagger(xs).argmax(-1)
    labelled = ys != -100
    assert table.metric == "acc"
    assert table["fp32"]["metric"] == pytest.approx((predicted[labelled] == ys[labelled]).float().mean().item())


def test_default_accuracy_of_a_single_logit_reads_it_as_class_1_when_positive() -> None:
    torch.manual_seed(0)
    x = torch.randn(40, 4)
    y = (x[:, 0] > 0).long()
    head = nn.Linear(4, 1)
    with torch.no_grad():
        expected = ((head(x)[:, 0] > 0).long() == y).float().mean().item()
    table = compare_inference(head, [(x, y)], methods=("fp32",), rounds=1)
    assert table.metric == "acc" and table["fp32"]["metric"] == pytest.approx(expected)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[10.0, 0, 0, 0]]))
        head.bias.zero_()
    floats = compare_inference(head, [(x, y.float())], methods=("fp32",), rounds=1)  # BCEWithLogitsLoss's targets
    assert floats.metric == "acc" and floats["fp32"]["metric"] == 1.0
    counts = compare_inference(head, [(x, y * 3)], methods=("fp32",), rounds=1)  # not 0/1 labels: no accuracy
    assert counts.metric is None and counts["fp32"]["metric"] is None


# -- bad input -------------------------------------------------------------------------------------


def test_models_with_other_output_shapes_are_refused(setup) -> None:
    teacher, _, val = setup
    other = nn.Sequential(nn.Linear(64, 5))
    with pytest.raises(ValueError, match=r"'fp32' gives \(90, 10\), 'five' gives \(90, 5\)"):
        compare_inference(teacher, val[:1], methods=("fp32",), models={"five": other})


def test_an_extra_model_that_cannot_take_the_batch_is_named_with_the_inputs() -> None:
    teacher = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    data = [(torch.randn(8, 64), torch.randint(0, 10, (8,)))]
    with pytest.raises(RuntimeError) as info:
        compare_inference(teacher, data, methods=("fp32",), models={"student": nn.Linear(32, 10)}, rounds=1)
    message = str(info.value)
    assert "models['student'] could not take the loader's first batch" in message
    assert "float32[8, 64]" in message and "mat1 and mat2 shapes cannot be multiplied" in message
    assert "the same inputs as the model" in message


def test_unknown_method_and_baseline() -> None:
    model, data = nn.Linear(32, 4), [(torch.randn(8, 32), torch.zeros(8, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"Unknown method\(s\) \['int2'\]"):
        compare_inference(model, data, methods=("fp32", "int2"))
    with pytest.raises(ValueError, match="baseline='student' is not one of the variants"):
        compare_inference(model, data, methods=("fp32",), baseline="student")
    with pytest.raises(ValueError, match="no batches"):
        compare_inference(model, [], methods=("fp32",))


# -- the widget ------------------------------------------------------------------------------------


def test_compare_widget_shows_bars_relative_to_the_baseline(table) -> None:
    from nbtrainer import CompareWidget

    widget = CompareWidget(table)
    assert set(widget.bars) == {"latency", "size", "metric"}
    names, ratios = widget.ratios("size")
    assert names == table.names
    assert ratios == pytest.approx([r["size_ratio"] for r in table.rows])
    _, metric_ratios = widget.ratios("metric")
    assert metric_ratios[0] == 1.0
    assert list(widget.bars["latency"].x) == table.names
    assert "8 variants" in widget.status.value
    assert "student int8" in widget.table.value


# -- the magic -------------------------------------------------------------------------------------


def test_magic_in_terminal_ipython_prints_the_table(shell, setup, monkeypatch, capsys) -> None:
    teacher, student, val = setup
    monkeypatch.delenv("NBTRAINER_FRONTEND", raising=False)
    shell.user_ns.update(teacher=teacher, val=val[:2], others={"student": student})
    line = "compare-inference teacher val --methods fp32,int8-weight --models others --rounds 2"
    assert shell.run_line_magic("nbtrainer", line) is None
    out = capsys.readouterr().out
    table = shell.user_ns["_nbt_compare_inference"]
    assert table.names == ["fp32", "int8-weight", "student"]
    assert str(table) in out and "_nbt_compare_inference_widget" not in shell.user_ns


def test_magic_usage_errors(shell, setup) -> None:
    from IPython.core.error import UsageError

    teacher, _, val = setup
    shell.user_ns.update(teacher=teacher, val=val[:1], notdict=[1])
    with pytest.raises(UsageError, match=r"Unknown method\(s\) \['int2'\]"):
        shell.run_line_magic("nbtrainer", "compare-inference teacher val --methods fp32,int2")
    with pytest.raises(UsageError, match="must name a dict"):
        shell.run_line_magic("nbtrainer", "compare-inference teacher val --models notdict")
    with pytest.raises(UsageError, match="--rounds must be >= 1"):
        shell.run_line_magic("nbtrainer", "compare-inference teacher val --rounds 0")


def test_hugging_face_model_and_dict_batches() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    data = [{"input_ids": torch.randint(0, 50, (8, 10)), "labels": torch.randint(0, 3, (8,))} for _ in range(3)]
    table = compare_inference(model, data, methods=("fp32", "int8-weight", "codebook4"), rounds=2)
    assert [r["status"] for r in table.rows] == ["ok", "ok", "ok"], [r.get("reason") for r in table.rows]
    assert table.metric == "acc"  # the labels, taken out of the model's inputs as the Trainer does
    assert 0 < table["int8-weight"]["max_abs_diff"] < 0.1
    assert table["int8-weight"]["size_ratio"] < 0.75  # embeddings and LayerNorms stay float32 (about a third here)
