"""Samples: taken at step boundaries without changing the run (weights, data order, RNG bit for bit), kept in the
History through checkpoints, resume, JSON and the run store, shown in the HTML report; a failing fn is reported and
the run goes on; bad input is refused before the first optimizer step."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_classification, make_loader

from nbtrainer import History, Runs, Samples, Trainer, load_checkpoint
from nbtrainer._look._samples import SampleTypeError


class Net(torch.nn.Module):
    """Dropout (draws from the RNG while training) and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3))
        self.frozen_bn = torch.nn.BatchNorm1d(32)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen_bn(self.body(x)))


def _trainer(callbacks: list[Any] = (), **kw: Any) -> Trainer:  # type: ignore[assignment]
    model = Net()
    kw.setdefault("progress", False)
    kw.setdefault("run_store", False)
    return Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, callbacks=list(callbacks), **kw)


def _loaders() -> tuple[Any, Any]:
    x, y = make_classification(n=160)
    return make_loader(x, y, batch_size=16, shuffle=True), make_loader(x[:48], y[:48], batch_size=16)


class Greedy:
    """A sample fn that draws from every global generator (as sampling-based generation does) and records what it
    saw of the model's state."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool, bool]] = []
        self.probe = torch.randn(4, 10, generator=torch.Generator().manual_seed(1))

    def __call__(self, model: torch.nn.Module) -> dict[str, Any]:
        torch.randn(100)
        np.random.rand(10)
        random.random()
        self.seen.append((model.training, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")))
        logits = model(self.probe)
        return {"text": " ".join(str(int(c)) for c in logits.argmax(1)), "picture": torch.rand(3, 6, 5)}


def _numpy_keys() -> Any:
    state: Any = np.random.get_state()
    return state[1]


def _state(trainer: Trainer) -> list[torch.Tensor]:
    return [t.detach().clone() for t in trainer.model.state_dict().values()]


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_run_with_samples_equals_a_run_without_bit_for_bit(precision: str) -> None:
    train, val = _loaders()
    plain = _trainer(precision=precision, seed=0)
    plain.fit(train, val, epochs=2)
    fn = Greedy()
    train, val = _loaders()
    sampled = _trainer([Samples(fn, every_n_steps=3, every_n_epochs=1)], precision=precision, seed=0)
    history = sampled.fit(train, val, epochs=2)
    for a, b in zip(_state(plain), _state(sampled), strict=True):
        assert torch.equal(a, b)
    assert history.steps["loss"] == plain.history.steps["loss"]  # the same batches in the same order
    assert history.epochs[-1]["val_loss"] == plain.history.epochs[-1]["val_loss"]
    # eval mode, no autograd, the run's autocast inside fn; training mode back afterwards
    assert fn.seen and all(s == (False, False, precision == "bf16-mixed") for s in fn.seen)
    assert sampled.model.training
    # the baseline (step 0, epoch 0), every 3rd step, each epoch's end (10 steps per epoch), no step twice
    steps = sorted({s["step"] for s in history.samples})
    assert steps == [0, 3, 6, 9, 10, 12, 15, 18, 20]
    assert {s["epoch"] for s in history.samples if s["step"] == 0} == {0}
    assert {(s["name"], s["kind"]) for s in history.samples} == {("text", "text"), ("picture", "image")}
    png = next(s["value"] for s in history.samples if s["kind"] == "image")
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG")
    assert all(row["sample_time"] > 0 for row in history.epochs)


def test_side_pass_puts_every_module_flag_and_generator_back() -> None:
    from nbtrainer._look._side import side_pass

    model = Net()
    model.frozen_bn.eval()  # a user's frozen BatchNorm (set by a callback at each epoch's start)
    before = [m.training for m in model.modules()]
    rng = (torch.get_rng_state(), _numpy_keys().copy(), random.getstate())
    with pytest.raises(RuntimeError, match="inside"), side_pass(model, torch.autocast("cpu", enabled=False)):
        assert not any(m.training for m in model.modules()) and not torch.is_grad_enabled()
        torch.rand(5), np.random.rand(), random.random()
        raise RuntimeError("inside")
    assert [m.training for m in model.modules()] == before and torch.is_grad_enabled()
    assert torch.equal(rng[0], torch.get_rng_state()) and np.array_equal(rng[1], _numpy_keys())
    assert rng[2] == random.getstate()


def test_the_rng_after_a_fit_is_the_same_with_samples() -> None:
    draws = []
    for callbacks in ([], [Samples(Greedy(), every_n_steps=1)]):
        train, _ = _loaders()
        _trainer(callbacks, seed=0).fit(train, epochs=1)
        draws.append((torch.rand(3).tolist(), np.random.rand(), random.random()))
    assert draws[0] == draws[1]


def test_at_start_false_keeps_no_baseline_and_every_n_epochs() -> None:
    train, _ = _loaders()
    calls = []

    def fn(model: torch.nn.Module) -> str:
        calls.append(1)
        return "hello"

    history = _trainer([Samples(fn, every_n_epochs=2, at_start=False, name="greeting")]).fit(train, epochs=4)
    assert [(s["step"], s["epoch"], s["name"]) for s in history.samples] == [(20, 2, "greeting"), (40, 4, "greeting")]
    assert len(calls) == 3  # the check at the start (its value checked, not kept), then epochs 2 and 4


def test_a_sample_fn_that_raises_is_reported_and_training_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    train, _ = _loaders()
    n = {"calls": 0}

    def flaky(model: torch.nn.Module) -> str:
        n["calls"] += 1
        if n["calls"] == 2:
            raise RuntimeError("the tokenizer is missing")
        return f"call {n['calls']}"

    history = _trainer([Samples(flaky)], progress="lines").fit(train, epochs=3)
    assert history.status == "finished" and len(history.epochs) == 3
    errors = [e for e in history.events if e["kind"] == "sample_error"]
    assert errors == [
        {
            "step": 10,
            "epoch": 1,
            "kind": "sample_error",
            "old": "flaky",
            "new": "RuntimeError: the tokenizer is missing",
        }
    ]
    assert [s["step"] for s in history.samples] == [0, 20, 30]
    out = capsys.readouterr().out
    assert "sample 'flaky' failed at step 10: RuntimeError: the tokenizer is missing" in out
    assert len(re.findall(r"^epoch \d/3 .*  time=\S+  sample_time=\S+  samples_per_s=", out, flags=re.M)) == 3


def test_bad_input_is_refused_before_the_first_step() -> None:
    with pytest.raises(TypeError, match="Samples\\(fn\\) takes a function fn\\(model\\)"):
        Samples("not a function")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="would never sample: give every_n_epochs=N"):
        Samples(lambda m: "x", every_n_epochs=None)
    with pytest.raises(ValueError, match="every_n_steps"):
        Samples(lambda m: "x", every_n_steps=0)
    for value, shown in ((3.5, "a float"), ({"ok": "x", "bad": torch.zeros(5)}, "'bad' is a tensor of shape (5,)")):
        for at_start in (True, False):
            train, _ = _loaders()

            def fn(model: torch.nn.Module, v: Any = value) -> Any:
                return v

            trainer = _trainer([Samples(fn, at_start=at_start)])
            before = _state(trainer)
            with pytest.raises(SampleTypeError, match=r"cannot be shown\. A sample is a str, an image: a torch tensor"):
                trainer.fit(train, epochs=1)
            with pytest.raises(SampleTypeError) as caught:
                trainer.fit(train, epochs=1)
            assert shown in str(caught.value)
            assert trainer.global_step == 0 and all(
                torch.equal(a, b) for a, b in zip(before, _state(trainer), strict=True)
            )


def test_samples_survive_a_checkpoint_and_resume_and_json(tmp_path: Any) -> None:
    def fn(model: Any) -> dict[str, Any]:
        w = model.head.weight.detach()
        return {"norm": f"{float(w.norm()):.6f}", "weights": (w - w.min()) / (w.max() - w.min())}

    train, _ = _loaders()
    straight = _trainer([Samples(fn, every_n_steps=4)], seed=0).fit(train, epochs=2)
    train, _ = _loaders()
    cut = _trainer([Samples(fn, every_n_steps=4)], seed=0)
    cut.fit(train, epochs=2, max_steps=13)
    path = cut.save_checkpoint(str(tmp_path / "cut.ckpt"))
    assert any(s["step"] == 12 for s in load_checkpoint(path)["history"]["samples"])  # weights_only=True load
    train, _ = _loaders()
    resumed = _trainer([Samples(fn, every_n_steps=4)], seed=0).fit(train, epochs=2, resume_from=path)
    assert resumed.samples == straight.samples  # same steps, same text, same PNG bytes
    resumed.to_json(str(tmp_path / "h.json"))
    again = History.from_json(str(tmp_path / "h.json"))  # base64 in JSON, bytes back
    assert again.samples == straight.samples
    json.loads((tmp_path / "h.json").read_text())


def test_the_run_store_keeps_samples_and_the_report_shows_the_latest(tmp_path: Any) -> None:
    store = tmp_path / "runs.db"
    train, _ = _loaders()
    fn = Greedy()
    trainer = _trainer([Samples(fn)], run_store=store)
    history = trainer.fit(train, epochs=2)
    assert trainer.run_id is not None
    run = Runs(store)[trainer.run_id]
    assert run.history.samples == history.samples
    report = history.to_html()
    assert "nbt-summary-samples" in report and report.count("data:image/png;base64,") == 1  # the latest picture
    latest_text = [s for s in history.samples if s["name"] == "text"][-1]["value"]
    assert latest_text in report


def test_pictures_round_trip_through_png() -> None:
    from PIL import Image

    from nbtrainer._look._images import to_png

    rgb = torch.rand(3, 5, 7)
    cases = [
        (rgb, (rgb.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)),
        (torch.tensor([[0, 128], [255, 7]], dtype=torch.uint8), np.array([[0, 128], [255, 7]], dtype=np.uint8)),
        (np.full((2, 3, 4), 0.5, dtype=np.float32), np.full((2, 3, 4), 128, dtype=np.uint8)),
        (torch.tensor([[-1.0, 2.0]]), np.array([[0, 255]], dtype=np.uint8)),  # clipped to [0, 1]
    ]
    for value, expected in cases:
        png = to_png(value)
        assert png is not None
        decoded = np.asarray(Image.open(io.BytesIO(png)))
        assert decoded.shape == expected.shape and np.array_equal(decoded, expected)
    pil = Image.fromarray(np.arange(12, dtype=np.uint8).reshape(3, 4))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(to_png(pil) or b""))), np.asarray(pil))
    assert to_png(torch.zeros(5)) is None and to_png(torch.zeros(2, 2, 2, 2)) is None


def test_host_reads_do_not_grow_with_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples every epoch add reads per sample, none per step (the sync budget of tests/loop/test_sync_budget)."""
    counts = {"n": 0}
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapper(self: Any, *a: Any, _orig: Any = original, **kw: Any) -> Any:
            counts["n"] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    totals = []
    for n_batches in (10, 80):
        x, y = make_classification(n=16 * n_batches)
        picture = torch.rand(1, 8, 8)

        def fn(model: torch.nn.Module, p: torch.Tensor = picture) -> dict[str, Any]:
            return {"p": p, "t": "x"}

        trainer = _trainer([Samples(fn)], refresh_interval=3600.0)
        counts["n"] = 0
        trainer.fit(make_loader(x, y, batch_size=16, shuffle=True), epochs=2)
        totals.append(counts["n"])
    assert totals[0] == totals[1], totals


@pytest.mark.slow
def test_a_plain_fit_imports_nothing_new_and_pictures_need_no_pil() -> None:
    code = (
        "import sys, torch\n"
        "from nbtrainer import Trainer\n"
        "data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 3\n"
        "Trainer(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), 'sgd', progress=False, run_store=False)"
        ".fit(data, epochs=1)\n"
        "assert not [m for m in sys.modules if m.startswith('nbtrainer._look')], 'a plain fit imported _look'\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('PIL', 'matplotlib')], 'a plain fit imported PIL'\n"
        "from nbtrainer import Samples\n"
        "s = Samples(lambda m: {'grid': torch.rand(3, 8, 8), 'text': 'x'})\n"
        "Trainer(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), 'sgd', progress=False, run_store=False,"
        " callbacks=[s]).fit(data, epochs=1)\n"
        "assert 'PIL' not in sys.modules, 'tensor pictures imported PIL'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_sample_drawing_from_the_cuda_generator_leaves_the_run_bit_for_bit() -> None:
    def cuda_draws(model: Any) -> str:
        torch.randn(1000, device="cuda")  # as sampling-based generation does on the GPU
        return f"{float(model.head.weight.sum()):.4f}"

    states = []
    for callbacks in ([], [], [Samples(cuda_draws, every_n_steps=2)]):
        train, val = _loaders()
        trainer = _trainer(callbacks, device="cuda", precision="bf16-mixed", seed=0)
        trainer.fit(train, val, epochs=2)
        states.append(_state(trainer))
    assert all(torch.equal(a, b) for a, b in zip(states[0], states[1], strict=True)), "two plain runs differ"
    assert all(torch.equal(a, b) for a, b in zip(states[0], states[2], strict=True))
