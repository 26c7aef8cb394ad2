"""profile_training: torch.profiler over real Trainer steps, Chrome trace with the nbt.* ranges."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
from conftest import make_classification, make_loader, mlp, needs

from nbtrainer import Trainer, profile_training
from nbtrainer._profile import PHASES, TrainingProfile


def _trainer(model: torch.nn.Module, **kw) -> Trainer:
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, progress=False, device="cpu", **kw)


def test_trace_is_valid_json_with_the_named_ranges(tmp_path) -> None:
    x, y = make_classification(192)
    trainer = _trainer(mlp())
    path = tmp_path / "sub" / "trace.json"
    prof = profile_training(trainer, make_loader(x, y, batch_size=32), wait=1, warmup=1, active=3, trace_path=path)
    assert isinstance(prof, TrainingProfile) and prof.trace_path == str(path)
    trace = json.loads(path.read_text())
    names = [e.get("name") for e in trace["traceEvents"]]
    for phase in PHASES:
        assert names.count(phase) == 3, phase  # one range per recorded step
    assert prof.steps == 3
    assert set(prof.phases) == set(PHASES) and all(v > 0 for v in prof.phases.values())
    assert "nbt.forward" in prof.table and "Self CPU" in prof.table
    frame = prof.to_pandas()
    assert {"name", "count", "self_cpu_time_total_us"} <= set(frame.columns)
    assert set(PHASES) <= set(frame["name"])
    assert "Training profile" in prof._repr_html_()


def test_arrays_are_profiled_as_fit_trains_on_them(tmp_path) -> None:
    # len((x, y)) is 2: the schedule read two batches an epoch, and fit then asked for the batch_size= this refused
    x, y = make_classification(192)
    trainer = _trainer(mlp())
    with pytest.raises(TypeError, match=r"no batch_size was given.*profile_training\(\.\.\., \(x, y\), batch_size="):
        profile_training(trainer, (x, y), trace_path=tmp_path / "t0.json")
    prof = profile_training(trainer, (x, y), batch_size=32, active=3, trace_path=tmp_path / "t.json")
    assert prof.steps == 3 and trainer.global_step == 0  # the steps were profiled, and the trainer put back


def test_schedule_counts_optimizer_steps_with_accumulation(tmp_path) -> None:
    x, y = make_classification(64)  # 8 batches of 8 = 4 optimizer steps per epoch: needs 2 epochs
    trainer = _trainer(mlp(), grad_accum_steps=2)
    prof = profile_training(
        trainer, make_loader(x, y, batch_size=8), wait=2, warmup=1, active=2, trace_path=tmp_path / "t.json"
    )
    assert prof.steps == 2
    counts = {r["name"]: r["count"] for r in prof.rows}
    assert counts["nbt.optimizer_step"] == 2
    assert counts["nbt.forward"] == counts["nbt.backward"] == 4  # two micro-batches per step


def test_restore_puts_model_and_optimizer_back(tmp_path) -> None:
    x, y = make_classification(128)
    model = mlp()
    trainer = _trainer(model)
    loader = make_loader(x, y, batch_size=32)
    trainer.fit(loader, epochs=1)  # optimizer has state to protect
    assert trainer.optimizer is not None
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = trainer.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    profile_training(trainer, loader, trace_path=tmp_path / "t.json")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(trainer.optimizer.state_dict()["state"][0]["exp_avg"], opt_before)
    profile_training(trainer, loader, trace_path=tmp_path / "t2.json", restore=False)
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_too_few_steps_raises(tmp_path) -> None:
    x, y = make_classification(64)
    batches = list(make_loader(x, y, batch_size=32))  # a one-shot iterable of 2 batches
    with pytest.raises(RuntimeError, match="No training step was recorded"):
        profile_training(
            _trainer(mlp()), (b for b in batches), wait=2, warmup=1, active=1, trace_path=tmp_path / "t.json"
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_trace_has_device_time(tmp_path) -> None:
    x, y = make_classification(256)
    model = mlp()
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), progress=False, device="cuda"
    )
    prof = profile_training(trainer, make_loader(x, y, batch_size=32), trace_path=tmp_path / "t.json")
    assert prof.sort_by == "self_device_time_total"
    assert any(r["self_device_time_total_us"] > 0 for r in prof.rows)


def test_default_trace_goes_to_a_temp_folder_and_is_printed(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    x, y = make_classification(n=128)
    prof = profile_training(_trainer(mlp()), make_loader(x, y, batch_size=16), wait=0, warmup=1, active=2)
    assert os.listdir(tmp_path) == []  # nothing written to the working directory
    assert os.path.isabs(prof.trace_path) and os.path.isfile(prof.trace_path)
    text = str(prof)
    assert text.splitlines()[0].startswith(f"Training profile: 2 steps; trace: {prof.trace_path} (open it in")
    assert "mean per step: data=" in text and "forward=" in text
    shutil.rmtree(os.path.dirname(prof.trace_path))  # kept for a user to open; a test's run leaves nothing in /tmp


@pytest.mark.parametrize("restore", [True, False])
def test_profiling_after_a_used_up_one_cycle_leaves_history_and_schedule(tmp_path, restore) -> None:
    x, y = make_classification(128)
    loader = make_loader(x, y, batch_size=32)  # 4 optimizer steps per epoch
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=8)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, scheduler=sched, progress=False, device="cpu", seed=0)
    history = trainer.fit(loader, epochs=2)  # the schedule is used up
    epochs = [dict(r) for r in history.epochs]
    losses = list(history.steps["loss"])
    schedule = sched.state_dict()
    lr = [g["lr"] for g in opt.param_groups]
    rng = torch.get_rng_state()

    prof = profile_training(trainer, loader, trace_path=tmp_path / "t.json", restore=restore)

    assert prof.steps == 3
    assert trainer.history is history and history.status == "finished" and trainer.status == "finished"
    assert history.epochs == epochs and history.steps["loss"] == losses
    assert trainer.scheduler is sched and sched.state_dict() == schedule
    assert [g["lr"] for g in opt.param_groups] == lr
    assert torch.equal(torch.get_rng_state(), rng)
    # the trainer goes on from where the fit left it: a used-up schedule is still refused, naming fit_more
    with pytest.raises(ValueError, match="fit_more"):
        trainer.fit(loader, epochs=3)


def _same(a, b) -> bool:
    """Nested state (dicts, lists, tensors) equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.head = torch.nn.Linear(10, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@needs("bitsandbytes", "peft")
def test_restore_on_a_quantized_base_puts_adapters_and_optimizer_back(tmp_path) -> None:
    # a QLoRA model's state dict has keys (weight.absmax, quant_map...) that load_state_dict does not take back
    x, y = make_classification(128)
    loader = make_loader(x, y, batch_size=32)

    def build() -> Trainer:
        return Trainer(
            _Net(), torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, quantize="nf4",
            lora={"r": 4, "target_modules": ["fc1", "fc2"]}, trainable=["head.*"], progress=False, device="cpu", seed=0,
        )  # fmt: skip

    profiled, twin = build(), build()
    for t in (profiled, twin):
        t.fit(loader, epochs=1)
    trained = {n: p.detach().clone() for n, p in profiled.model.named_parameters() if p.requires_grad}
    assert profiled.optimizer is not None
    state = copy.deepcopy(profiled.optimizer.state_dict())
    prof = profile_training(profiled, loader, trace_path=tmp_path / "t.json")
    assert prof.steps == 3
    now = {n: p.detach() for n, p in profiled.model.named_parameters() if p.requires_grad}
    assert trained.keys() == now.keys() and all(torch.equal(trained[n], now[n]) for n in trained)
    assert _same(state, profiled.optimizer.state_dict())
    for t in (profiled, twin):  # the next fit is the fit that would have happened without the profile
        t.fit(loader, epochs=1)
    assert _same(profiled.model_state_dict(), twin.model_state_dict())


def test_steps_taken_inside_backward_are_profiled(tmp_path) -> None:
    x, y = make_classification(192)
    model = mlp()
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, optimizer_in_backward=True, progress=False, device="cpu"
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prof = profile_training(
        trainer, make_loader(x, y, batch_size=32), wait=1, warmup=1, active=2, trace_path=tmp_path / "t.json"
    )
    assert prof.steps == 2
    counts = {r["name"]: r["count"] for r in prof.rows}
    assert counts["nbt.backward"] == 2
    # each parameter's update is its own range, inside backward: 4 tensors (two weights, two biases) per step
    assert counts["nbt.optimizer_step"] == 2 * len(before)
    assert set(prof.phases) == set(PHASES) and prof.phases["nbt.backward"] > prof.phases["nbt.optimizer_step"] > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("restore", [True, False])
def test_each_module_keeps_its_training_flag(tmp_path, restore) -> None:
    x, y = make_classification(128)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )
    trainer = _trainer(model)
    loader = make_loader(x, y, batch_size=32)
    model.eval()  # evaluated last: the profile must not leave it training
    profile_training(trainer, loader, trace_path=tmp_path / "a.json", restore=restore)
    assert not any(m.training for m in model.modules())
    model.train()
    model[1].eval()  # a frozen BatchNorm inside a training model stays frozen
    profile_training(trainer, loader, trace_path=tmp_path / "b.json", restore=restore)
    assert [m.training for m in model.modules()] == [True, True, False, True, True]
