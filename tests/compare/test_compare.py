"""compare_strategies: one row per strategy, ratios to the baseline, failures as rows, identical starts."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader
from torch import nn

from nbtrainer import StrategyComparison, compare_strategies
from nbtrainer._compare import resolve_strategies, split_batch


class Net(nn.Module):
    """Residual MLP: wide activations relative to its parameters (checkpointing has something to save)."""

    def __init__(self, d: int = 10, hidden: int = 32, n: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)) for _ in range(n)
        )
        self.head = nn.Linear(hidden, 3)
        self.seen: list[float] = []  # what the model was fed, in order (data-order check)

    def forward(self, x):
        if self.training:
            self.seen.append(float(x[:, 0].sum()))
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def data():
    x, y = make_classification(n=128)
    return make_loader(x, y, batch_size=32, shuffle=True, seed=3), make_loader(x, y, batch_size=128)


@pytest.mark.slow
def test_rows_ratios_failure_row_and_outputs(data):
    train, val = data
    table = compare_strategies(
        Net,
        functools.partial(torch.optim.AdamW, lr=3e-3),
        nn.CrossEntropyLoss(),
        train,
        val,
        {
            "fp32": {},
            "bf16": {"precision": "bf16-mixed"},
            "fp8": {"precision": "fp8"},
            "ckpt": {"activation_checkpointing": True},
            "accum4": {"grad_accum_steps": 4},
            "adafactor": {"optimizer": "adafactor", "lr": 1e-2},
        },
        epochs=1,
        metric="val_acc",
    )
    assert isinstance(table, StrategyComparison)
    assert table.names == ["fp32", "bf16", "fp8", "ckpt", "accum4", "adafactor"]
    base = table["fp32"]
    assert base["step_time_ratio"] == base["samples_per_s_ratio"] == base["peak_memory_ratio"] == 1.0
    bad = table["fp8"]
    assert bad["status"] == "failed" and "fp8" in bad["reason"] and bad["step_time_s"] is None
    for name in ("fp32", "bf16", "ckpt", "accum4", "adafactor"):
        row = table[name]
        assert row["status"] == "ok", row.get("reason")
        assert row["steps"] == 4 and row["step_time_s"] > 0 and row["samples_per_s"] > 0
        assert row["samples_per_step"] == 32  # accum4 splits each batch: same samples per optimizer step
        assert 0 <= row["metric"] <= 1 and row["final_loss"] > 0
        assert row["step_time_ratio"] == pytest.approx(row["step_time_s"] / base["step_time_s"])
        assert row["peak_memory_ratio"] == pytest.approx(row["peak_memory_bytes"] / base["peak_memory_bytes"])
    # same samples per step and exact accumulation: the same training as fp32
    assert table["accum4"]["final_loss"] == pytest.approx(base["final_loss"], rel=1e-4)
    assert table["ckpt"]["final_loss"] == pytest.approx(base["final_loss"], rel=1e-4)
    # measured memory (CPU): checkpointing keeps fewer activations, adafactor less optimizer state,
    # accumulation's micro-batches a quarter of the activations
    mem = {n: table[n]["memory_detail"] for n in ("fp32", "ckpt", "accum4", "adafactor")}
    assert mem["ckpt"]["activations"] < 0.8 * mem["fp32"]["activations"]
    assert mem["accum4"]["activations"] < 0.5 * mem["fp32"]["activations"]
    assert mem["adafactor"]["optimizer_state"] < 0.5 * mem["fp32"]["optimizer_state"]
    params = sum(p.numel() * 4 for p in Net().parameters())
    assert 2 * params <= table["fp32"]["memory_resident"]["optimizer_state"] < 2.1 * params  # AdamW's moments
    assert table["ckpt"]["peak_memory_ratio"] < 1.0
    assert "measured" in table.memory_kind

    frame = table.to_pandas()
    assert list(frame.index) == table.names and "val_acc" in frame.columns
    assert frame.loc["fp32", "step_time_ratio"] == 1.0 and frame.loc["fp8", "status"] == "failed"
    page = table._repr_html_()
    assert "failed" in page and "(100%)" in page and "<table" in page
    text = str(table)
    assert "fp8" in text and "failed" in text and "(100%)" in text
    markdown = table.to_markdown().splitlines()
    assert sum(line.startswith("|") for line in markdown) == len(table) + 2  # header, rule, one line per row
    assert markdown[-1].startswith("(ratios to 'fp32'")  # the legend says what the figures are


def test_same_initial_weights_and_data_order(data):
    train, _ = data
    counter = iter(range(100))
    starts, models = [], []

    def make_model():
        model = Net()
        with torch.no_grad():  # every call a different model: the comparison must reset the weights
            model.head.weight.fill_(float(next(counter)))
        models.append(model)
        return model

    def make_optimizer(params):
        params = list(params)
        starts.append([p.detach().clone() for p in params])  # the weights this strategy starts from
        return torch.optim.SGD(params, lr=0.01)

    # a shuffling loader without its own generator, too: the Trainer installs one; it must not leak
    x, y = make_classification(n=128)
    plain = make_loader(x, y, batch_size=32, shuffle=True)
    for loader in (train, plain, (x, y)):  # arrays too, batched and shuffled as fit would (batch_size=)
        starts.clear()
        models.clear()
        table = compare_strategies(
            make_model,
            make_optimizer,
            nn.CrossEntropyLoss(),
            loader,
            None,
            {
                "a": {},
                "b": {"max_grad_norm": 1e6},
                "c": {"seed": 5},
                "d": {"optimizer": lambda params: torch.optim.SGD(params, lr=0.05)},
                "e": {"device": "cpu"},
            },
            batch_size=32 if isinstance(loader, tuple) else None,
            steps=3,
            measure_memory=False,
        )
        assert [r["status"] for r in table.rows] == ["ok", "ok", "ok", "ok", "failed"]
        assert "whole comparison" in table["e"]["reason"]
        # the up-front check on the first model, then a, b, c (d brought its own optimizer, e failed first);
        # every strategy's model was made different (head filled with 1, 2, 3) and reset to the first one's weights
        assert len(starts) == 4
        for state in starts[1:]:
            assert all(torch.equal(p, q) for p, q in zip(state, starts[0], strict=True))
        a, b = models[1], models[2]  # models[0] is the first model
        assert len(a.seen) == 3 and a.seen == b.seen  # same batches, same order
    assert table["a"]["metric"] is None  # no val_loader: no metric


def test_the_callers_random_generators_are_left_as_they_were(data):
    import random

    import numpy as np

    train, _ = data
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    before = random.getstate(), np.random.get_state(), torch.get_rng_state()
    table = compare_strategies(Net, torch.optim.SGD, nn.CrossEntropyLoss(), train, None, ["fp32"], steps=2, seed=5)
    assert table["fp32"]["status"] == "ok"
    assert random.getstate() == before[0]
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), before[1], strict=True))
    assert torch.equal(torch.get_rng_state(), before[2])
    with pytest.raises(ValueError, match="sgdd"):  # refused after the comparison seeded: put back all the same
        compare_strategies(Net, "sgdd", nn.CrossEntropyLoss(), train, None, ["fp32"], steps=2)
    assert torch.equal(torch.get_rng_state(), before[2])


def test_arrays_without_a_batch_size_are_refused_with_the_fix():
    x, y = make_classification(n=64)
    with pytest.raises(TypeError, match=r"no batch_size was given.*compare_strategies\(\.\.\., \(x, y\), batch_size="):
        compare_strategies(Net, torch.optim.SGD, nn.CrossEntropyLoss(), (x, y), steps=2)


def test_steps_mode_presets_and_split():
    x, y = make_classification(n=64)
    train, val = make_loader(x, y, batch_size=16, shuffle=True, seed=0), make_loader(x, y, batch_size=64)
    table = compare_strategies(
        lambda: Net(hidden=16),
        lambda params: torch.optim.SGD(params, lr=0.1),
        nn.CrossEntropyLoss(),
        train,
        val,
        ["fp32", "accum2"],
        steps=6,
        warmup=1,
        metric="val_loss",
        repeats=2,
    )
    assert table["fp32"]["steps"] == 6 and table["accum2"]["steps"] == 6  # several passes over 4 batches
    assert table["fp32"]["metric"] > 0  # validated once at the end
    assert table.settings["repeats"] == 2
    assert resolve_strategies("fp32, ckpt accum8") == {
        "fp32": {},
        "ckpt": {"activation_checkpointing": True},
        "accum8": {"grad_accum_steps": 8},
    }
    with pytest.raises(ValueError, match="Unknown strategy preset"):
        resolve_strategies(["fp64"])
    parts = split_batch({"x": torch.zeros(5, 2), "y": torch.arange(5), "tag": "t"}, 2)
    assert [p["y"].tolist() for p in parts] == [[0, 1, 2], [3, 4]] and parts[1]["tag"] == "t"


@pytest.mark.slow
def test_magic_compare_runs_from_namespace_names(shell, monkeypatch, capsys):
    from IPython.core.error import UsageError

    from nbtrainer._shell import _magics

    shown = []
    monkeypatch.setattr(_magics.NbtrainerMagics, "_display", lambda self, obj: shown.append(obj))
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # a front end (terminal: tests/shell)
    x, y = make_classification(n=64)
    shell.user_ns.update(
        make_model=lambda: Net(hidden=16),
        make_opt=functools.partial(torch.optim.SGD, lr=0.1),
        crit=nn.CrossEntropyLoss(),
        tl=make_loader(x, y, batch_size=16),
        vl=make_loader(x, y, batch_size=64),
        mine={"base": {}, "bad": {"precision": "fp8"}},
    )
    shell.run_line_magic("nbtrainer", "compare make_model make_opt crit tl vl --strategies fp32,accum2 --steps 3")
    table = shell.user_ns["_nbt_compare"]
    # with the widget layer installed the magic shows a CompareWidget of the table (else the table itself)
    assert [getattr(obj, "comparison", obj) for obj in shown] == [table]
    assert table.names == ["fp32", "accum2"] and table["fp32"]["steps"] == 3
    shell.run_line_magic("nbtrainer", "compare make_model None crit tl --strategies mine --epochs 1")
    table = shell.user_ns["_nbt_compare"]
    assert table["bad"]["status"] == "failed" and table["base"]["status"] == "ok"
    out = capsys.readouterr().out
    assert "Comparing 2 strategies" in out and "bad: failed" in out
    for line in (
        "compare make_model make_opt crit tl --steps 0",
        "compare make_model make_opt crit tl --steps 2 --epochs 1",
        "compare make_model make_opt crit tl --strategies fp64",
        "compare crit make_opt crit tl",
    ):
        with pytest.raises(UsageError):
            shell.run_line_magic("nbtrainer", line)
    shell.run_line_magic("nbtrainer", "help")
    assert "%nbtrainer compare" in capsys.readouterr().out


# -- the optimizer convention: a callable of the parameters, as torch's classes are ------------------


@pytest.mark.parametrize(
    "optimizer",
    [torch.optim.SGD, functools.partial(torch.optim.SGD, lr=0.05), lambda params: torch.optim.SGD(params, lr=0.05)],
    ids=["class", "partial", "lambda-params"],
)
def test_optimizer_is_a_callable_of_the_parameters(data, optimizer):
    train, _ = data
    table = compare_strategies(
        Net, optimizer, nn.CrossEntropyLoss(), train, None, ["fp32", "adafactor"], steps=2, measure_memory=False
    )
    assert [r["status"] for r in table.rows] == ["ok", "ok"], [r["reason"] for r in table.rows]
    assert table["fp32"]["setup"]["optimizer"] == "SGD"
    assert table["adafactor"]["setup"]["optimizer"] == "adafactor"


def test_an_optimizer_name_is_taken_as_trainer_takes_it(data):
    # Trainer(model, loss, "sgd") trains; compare_strategies refused the same name ("a callable of the parameters")
    train, _ = data
    lrs: list[float] = []

    class SeesLR:
        def on_fit_start(self, trainer):
            lrs.append(trainer.optimizer.param_groups[0]["lr"])

    table = compare_strategies(
        Net, "sgd", nn.CrossEntropyLoss(), train, None, ["fp32", "adafactor"], steps=2, measure_memory=False,
        trainer_kwargs={"lr": 0.05, "callbacks": [SeesLR()]},
    )  # fmt: skip
    assert [r["status"] for r in table.rows] == ["ok", "ok"], [r["reason"] for r in table.rows]
    assert table["fp32"]["setup"]["optimizer"] == "sgd" and table["adafactor"]["setup"]["optimizer"] == "adafactor"
    assert lrs == [0.05, 0.05]
    with pytest.raises(ValueError, match=r"Unknown optimizer name 'sgdd': use one of \[.*'sgd'"):
        compare_strategies(Net, "sgdd", nn.CrossEntropyLoss(), train, None, ["fp32"], steps=2)


def _model_fn(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("optimizer", "strategies"),
    [
        (lambda m: torch.optim.SGD(m.parameters(), lr=0.1), ["fp32"]),  # caught when called with the parameters
        (_model_fn, ["fp32"]),  # caught by its signature
        (None, {"own": {"optimizer": _model_fn}}),  # a strategy's own optimizer
    ],
    ids=["lambda-of-model", "def-of-model", "strategy-option"],
)
def test_a_function_of_the_model_is_refused_before_training(data, optimizer, strategies):
    train, _ = data
    made = []

    def make_model():
        made.append(Net())
        return made[-1]

    with pytest.raises(TypeError, match=r"called with the model's parameters.*functools\.partial"):
        compare_strategies(make_model, optimizer, nn.CrossEntropyLoss(), train, None, strategies, steps=2)
    assert len(made) == 1  # only the first model: no strategy trained


def test_an_optimizer_instance_is_refused_with_the_fix(data):
    train, _ = data
    instance = torch.optim.SGD(Net().parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"not an optimizer instance \(SGD\).*torch\.optim\.AdamW"):
        # the mistake under test, which a type checker also sees: an instance where a factory is expected
        compare_strategies(Net, instance, nn.CrossEntropyLoss(), train, None, ["fp32"], steps=2)  # type: ignore[arg-type]


# -- honest table: measured peak and its split, notes that say what a strategy does, spread warnings ----------


class Deep(nn.Module):
    """Residual MLP of deep blocks: activations dominate a step's memory (SGD keeps no state)."""

    def __init__(self, d: int = 10, hidden: int = 64, n: int = 6) -> None:
        super().__init__()
        self.inp = nn.Linear(d, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU()) for _ in range(n)
        )
        self.head = nn.Linear(hidden, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


@pytest.mark.slow
def test_measured_peak_with_its_split_notes_and_whole_failure_reasons():
    x, y = make_classification(n=384)
    train = make_loader(x, y, batch_size=128, shuffle=True, seed=1)
    table = compare_strategies(
        Deep,
        functools.partial(torch.optim.SGD, lr=0.05),
        nn.CrossEntropyLoss(),
        train,
        None,
        {
            "fp32": {},
            "ckpt": {"activation_checkpointing": True},
            "accum4": {"grad_accum_steps": 4},
            "fp16": {"precision": "fp16-mixed"},
            "bad": {"precision": "fp8"},
        },
        steps=3,
        metric=None,
        device="cpu",
    )
    for name in ("fp32", "ckpt", "accum4", "fp16"):
        row = table[name]
        assert row["status"] == "ok", row["reason"]
        detail = row["memory_detail"]
        assert sum(detail.values()) == row["peak_memory_bytes"]  # a split of the measured peak
        assert detail["parameters"] == sum(p.numel() * 4 for p in Deep().parameters())
        assert detail["optimizer_state"] == 0  # plain SGD
    # checkpointing and accumulation act on the activations, and the measured peak shows it
    assert table["ckpt"]["peak_memory_ratio"] < 0.8 and table["accum4"]["peak_memory_ratio"] < 0.8
    # what accum4 really does here, and fp16 on a CPU without fp16 kernels
    assert "each batch of 128 split into 4 micro-batches of 32" in table["accum4"]["note"]
    if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        assert "fp16 on this CPU is emulated" in table["fp16"]["note"]
    text = str(table)
    for header in ("params", "grads", "optim state", "activations"):
        assert header in text.splitlines()[0]
    assert "measured peak of live tensor storage" in text
    # a failure's whole reason, with its fix at the end, in every view
    reason = table["bad"]["reason"]
    assert reason.endswith("half).") and "Use one of" in reason
    assert reason in text and reason in table.to_markdown()
    frame = table.to_pandas()
    split = ["memory_parameters", "memory_gradients", "memory_optimizer_state", "memory_activations", "memory_other"]
    assert (frame.loc["fp32", split].sum() == frame.loc["fp32", "peak_memory_bytes"]).all()
    assert frame.loc["bad", "reason"] == reason and "step_time_spread" in frame.columns


def test_spread_of_step_times_and_the_warning():
    from nbtrainer._compare._run import spread

    assert spread([1.0, 1.0, 1.0, 1.0], []) == 0.0
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0], []) == pytest.approx((4 - 2) / 2 / 3)  # half the IQR / median
    assert spread([9.0] * 10, [1.0, 2.0, 3.0]) == pytest.approx((3 - 1) / 2 / 2)  # repeats: their medians' range
    assert spread([1.0], []) is None

    def row(name, t, s):
        return {"name": name, "status": "ok", "step_time_s": t, "step_time_spread": s, "step_time_ratio": t / 0.01}

    table = StrategyComparison(
        rows=[row("fp32", 0.01, 0.02), row("bf16", 0.0001, 0.9)], baseline="fp32", metric=None, memory_kind="x"
    )
    text = str(table)
    assert "±2%" in text and "±90%" in text
    assert table.warnings() and "bf16" in table.warnings()[0] and "fp32" not in table.warnings()[0]
    assert "repeats=3" in text and "bf16" in table._repr_html_().split("<small>")[1]


def test_the_default_list_leaves_out_what_cannot_apply_and_says_so() -> None:
    """A plain CNN has no repeated blocks: the default list skips ``ckpt`` (a row that could only fail) and says
    so in one line; a model with repeated blocks keeps it; named explicitly, ``ckpt`` still runs (issue 58)."""
    data = [(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))] * 2

    def cnn() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))

    table = compare_strategies(cnn, None, nn.CrossEntropyLoss(), data, steps=1, measure_memory=False, metric=None)
    assert "ckpt" not in table.names and {"fp32", "accum4", "adafactor"} <= set(table.names)
    assert table.left_out == {"ckpt": "the model has no repeated blocks to checkpoint"}
    lines = [line for line in str(table).splitlines() if line.startswith("left out")]
    assert lines == ["left out of the default list, as they cannot apply here: ckpt (the model has no repeated "
                     "blocks to checkpoint)"]  # fmt: skip
    assert "left out of the default list" in table._repr_html_()
    assert all(r["status"] == "ok" for r in table.rows)

    def stack() -> nn.Module:
        return nn.Sequential(nn.Flatten(), *[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(2)])

    two: dict[str, Any] = {"strategies": ["fp32", "ckpt"], "steps": 1, "metric": None, "measure_memory": False}
    kept = compare_strategies(stack, None, nn.CrossEntropyLoss(), data, **two)
    assert kept.names == ["fp32", "ckpt"] and not kept.left_out
    named = compare_strategies(cnn, None, nn.CrossEntropyLoss(), data, **two)
    assert named.rows[1]["status"] == "failed" and "left out" not in str(named)


def _small() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))  # no repeated blocks


def test_a_baseline_the_default_list_leaves_out_is_refused_before_anything_trains() -> None:
    data = [(torch.randn(8, 8), torch.randint(0, 3, (8,)))] * 2
    rows: list[str] = []
    with pytest.raises(ValueError, match=r"baseline 'ckpt'.*left out.*no repeated blocks.*baseline='fp32'"):
        compare_strategies(_small, None, nn.CrossEntropyLoss(), data, steps=1, metric=None, baseline="ckpt",
                           on_row=lambda row: rows.append(row["name"]))  # fmt: skip
    assert rows == []


def test_a_make_model_that_returns_the_same_model_is_refused_before_anything_trains() -> None:
    data = [(torch.randn(8, 8), torch.randint(0, 3, (8,)))] * 2
    model = _small()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows: list[str] = []
    strategies = {"a": {}, "frozen": {"freeze": ["0.*"]}}
    shared = nn.Linear(8, 16)
    for make in (lambda: model, lambda: nn.Sequential(shared, nn.Tanh(), nn.Linear(16, 3))):
        with pytest.raises(ValueError, match=r"make_model must return a new model each call.*copy\.deepcopy"):
            compare_strategies(make, "sgd", nn.CrossEntropyLoss(), data, None, strategies, steps=2, metric=None,
                               on_row=lambda row: rows.append(row["name"]))  # fmt: skip
    assert rows == []
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
    fresh = compare_strategies(lambda: copy.deepcopy(model), "sgd", nn.CrossEntropyLoss(), data, None, strategies,
                               steps=2, metric=None)  # fmt: skip
    assert [r["status"] for r in fresh.rows] == ["ok", "ok"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
