"""Trainer(memory_budget_gb=...): the plan applied at the first fit, the measured peak kept under the budget, the
step down when a model allocates what the plan cannot see, and bad input refused before the first step."""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from typing import Any

import pytest
import torch
from conftest import needs
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from nbtrainer import Trainer, plan_memory
from nbtrainer._memory._peak import FitPeak
from nbtrainer._report._format import format_bytes

GiB = 2**30
D_IN, HIDDEN, N = 64, 256, 1024


class Wide(nn.Module):
    """Small weights, large activations: the batch decides the peak, so splitting it matters."""

    def __init__(self, scratch: int = 0) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(D_IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 10)
        self.scratch = scratch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.l2(torch.relu(self.l1(x))))
        if self.scratch and not isinstance(x, FakeTensor):
            # a workspace the simulation cannot see (like a custom kernel's): real steps allocate it, the plan not
            work = torch.ones(x.shape[0], self.scratch)
            h = h + work[:, :1] * 0
        return self.l3(h)


def _wide(scratch: int = 0) -> nn.Module:
    torch.manual_seed(0)
    return Wide(scratch)


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2 * N, D_IN, generator=g), torch.randint(0, 10, (2 * N,), generator=g)
    return [(x[:N], y[:N]), (x[N:], y[N:])]


class _Gradients:
    """Each optimizer step's gradients, as the optimizer is about to step on them."""

    def __init__(self) -> None:
        self.steps: list[list[torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer: Any, optimizer: Any) -> None:
        self.steps.append([p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"]])


def _predicted(**switches: Any) -> int:
    plan = plan_memory(_wide(), _data()[0], budget_gb=1, device="cpu", criterion=nn.CrossEntropyLoss())
    return plan.predict(optimizer="adamw", **switches).peak_bytes


def test_budget_splits_the_batch_keeps_the_gradient_and_stays_under() -> None:
    whole, half = _predicted(), _predicted(grad_accum_steps=2)
    assert half < whole  # activations dominate: a split batch needs less
    budget_gb = (half + whole) / 2 / 0.9 / GiB  # the whole batch does not fit the usable 90%, half of it does
    peak = FitPeak()
    model = _wide()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    out = io.StringIO()
    grads = _Gradients()
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), opt, precision="fp32", memory_budget_gb=budget_gb, device="cpu",
        progress="lines", callbacks=[peak, grads], run_store=False,
    )  # fmt: skip
    with redirect_stdout(out):
        history = trainer.fit(_data(), epochs=1)
    plan = trainer.memory_plan
    assert plan is not None and plan.best is not None
    assert trainer.micro_split == plan.best.grad_accum_steps >= 2
    assert plan.best.memory.precision == "fp32" and plan.best.memory.optimizer == "adamw"  # kept as given
    assert peak.peak_bytes <= budget_gb * GiB, (peak.peak_bytes, budget_gb * GiB)
    # 2 steps: checked, none left to time; the check is logged at the fit's end
    assert [e["kind"] for e in history.events] == ["memory_plan", "memory_check"]
    line = next(s for s in out.getvalue().splitlines() if s.startswith("memory plan:"))
    assert f"micro-batch {N // trainer.micro_split} x {trainer.micro_split}" in line and "kept" in line
    # the gradient the optimizer steps on is the whole batch's in one pass: equal parts of a mean loss, divided by
    # their count. Compared at the first step, where both start from the same weights: the step's input, not its
    # output (AdamW divides by |g|, so summation-order noise on a near-zero gradient would become a whole update).
    ref_model = _wide()
    ref_grads = _Gradients()
    ref = Trainer(ref_model, nn.CrossEntropyLoss(), torch.optim.AdamW(ref_model.parameters(), lr=1e-3),
                  device="cpu", progress=False, run_store=False, callbacks=[ref_grads])  # fmt: skip
    ref.fit(_data(), epochs=1)
    assert len(grads.steps) == len(ref_grads.steps) == 2
    for a, b in zip(grads.steps[0], ref_grads.steps[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    losses = history.steps["loss"]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref.history.steps["loss"]), rtol=1e-5, atol=1e-6)


def test_budget_steps_down_when_the_measured_peak_is_over() -> None:
    scratch = 4096  # N x 4096 floats = 4 MiB the plan does not see
    whole, half = _predicted(), _predicted(grad_accum_steps=2)
    budget_gb = (whole + N * scratch * 4 // 4) / GiB  # the plan says the whole batch fits; the scratch breaks it
    peak = FitPeak()
    model = _wide(scratch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = _data() * 3
    out = io.StringIO()
    trainer = Trainer(
        model, nn.CrossEntropyLoss(), opt, precision="fp32", memory_budget_gb=budget_gb, device="cpu",
        progress="lines", callbacks=[peak], run_store=False,
    )  # fmt: skip
    assert whole / 0.9 < budget_gb * GiB  # planned: the whole batch
    with redirect_stdout(out):
        history = trainer.fit(data, epochs=1)
    kinds = [e["kind"] for e in history.events]
    assert kinds[0] == "memory_plan" and "memory_step_down" in kinds, history.events
    down = next(e for e in history.events if e["kind"] == "memory_step_down")
    assert down["step"] == 2  # measured over the first two steps, applied at that boundary
    assert trainer.micro_split >= 2
    checks = trainer._budget.check.measured  # type: ignore[union-attr]
    assert checks[0] > budget_gb * GiB >= checks[-1], checks
    assert "memory step down:" in out.getvalue()
    assert history.status == "finished" and len(history.steps["loss"]) == len(data)
    assert half < whole


def test_optimizer_auto_takes_the_kind_of_the_plan() -> None:
    torch.manual_seed(0)  # large weights, a small batch: the optimizer's state decides the peak
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    data = [(x[:32], y[:32]) for x, y in _data()]
    plan = plan_memory(model, data[0], budget_gb=1, device="cpu", criterion=nn.CrossEntropyLoss())
    adamw = [r.peak_bytes for r in plan._candidates if r.memory.optimizer == "adamw"]
    budget_gb = min(adamw) * 0.97 / 0.9 / GiB  # no AdamW row fits
    trainer = Trainer(model, nn.CrossEntropyLoss(), "auto", lr=3e-3, precision="fp32", memory_budget_gb=budget_gb,
                      device="cpu", progress=False, run_store=False)  # fmt: skip
    assert type(trainer.optimizer).__name__ == "AdamW"  # "auto" before a plan: AdamW
    trainer.fit(data, epochs=1)
    best = trainer.memory_plan.best  # type: ignore[union-attr]
    assert best is not None and best.memory.optimizer not in (None, "adamw")
    assert trainer.options.memory.optimizer == best.memory.optimizer
    from nbtrainer._optimizer_kinds import optimizer_kind

    assert optimizer_kind(trainer.optimizer) == best.memory.optimizer
    assert trainer.optimizer is not None and trainer.optimizer.param_groups[0]["lr"] == 3e-3
    assert trainer.global_step == 2


def test_nothing_fits_is_refused_before_the_first_step() -> None:
    model = _wide()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", memory_budget_gb=0.0005, device="cpu", progress=False,
                      run_store=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"nothing fits on cpu.*needs .*What would help: a smaller batch"):
        trainer.fit(_data(), epochs=1)
    assert trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("budget", [0, -1, True, "16"])
def test_a_budget_that_is_not_positive_is_refused(budget: Any) -> None:
    with pytest.raises(ValueError, match="memory_budget_gb must be a positive number"):
        Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", memory_budget_gb=budget, progress=False)


def test_a_distillation_criterion_is_refused_when_the_trainer_is_built() -> None:
    # Found by distilling under a budget: the first fit died in the plan's simulated step with torch's "Please
    # convert all Tensors to FakeTensors first" (the real teacher ran on fake inputs), and no row counted the
    # teacher's weights anyway.
    from nbtrainer import DistillationLoss

    teacher = nn.Sequential(nn.Linear(D_IN, 512), nn.ReLU(), nn.Linear(512, 10)).eval()
    loss = DistillationLoss(teacher)
    with pytest.raises(ValueError, match=r"DistillationLoss runs a teacher model \(Sequential, 1\d\d KiB") as info:
        Trainer(_wide(), loss, "adamw", memory_budget_gb=1, progress=False)
    assert "Plan the student alone" in str(info.value)
    with pytest.raises(ValueError, match="plan_memory: the criterion DistillationLoss runs a teacher model"):
        plan_memory(_wide(), _data()[0], budget_gb=1, device="cpu", criterion=loss)


def test_switches_the_plan_cannot_change_are_refused_or_kept() -> None:
    with pytest.raises(ValueError, match="compile is not planned yet"):
        Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", memory_budget_gb=1, compile=True, progress=False)
    # a precision given is kept: every row of the plan has it
    trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", precision="bf16-mixed", memory_budget_gb=1,
                      device="cpu", progress=False, run_store=False)  # fmt: skip
    trainer.fit(_data(), epochs=1)
    plan = trainer.memory_plan
    assert plan is not None and {r.memory.precision for r in plan.rows} == {"bf16-mixed"}
    assert trainer.precision == "bf16-mixed"


def test_a_one_shot_iterator_is_refused() -> None:
    trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", memory_budget_gb=1, device="cpu", progress=False,
                      run_store=False)  # fmt: skip
    with pytest.raises(ValueError, match="read twice"):
        trainer.fit(iter(_data()), epochs=1)


def test_the_run_store_records_the_plan(tmp_path: Any) -> None:
    from nbtrainer.runs import Runs

    db = tmp_path / "runs.db"
    trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "auto", precision="fp32", memory_budget_gb=1, device="cpu",
                      progress=False, run_store=str(db))  # fmt: skip
    trainer.fit(_data(), epochs=1)
    assert trainer.run_id is not None
    run = Runs(db)[trainer.run_id]
    assert run.config["memory_budget_gb"] == 1
    assert run.config["memory"] == trainer.options.memory.changed()
    (event,) = [e for e in run.history.events if e["kind"] == "memory_plan"]
    assert event["new"].startswith(trainer.memory_plan.best.describe())  # type: ignore[union-attr]


@pytest.mark.slow  # about 3 s (a quantized base and its search; docs/testing.md: over 2 s is slow)
@needs("bitsandbytes", "peft")
def test_qlora_under_a_budget_keeps_the_quantized_base_and_adapters_and_splits_the_batch() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    def tiny_llama() -> nn.Module:
        torch.manual_seed(0)
        return LlamaForCausalLM(
            LlamaConfig(
                vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa",
            )
        )  # fmt: skip

    ids = torch.randint(0, 128, (16, 64), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": ids[:8], "labels": ids[:8]}, {"input_ids": ids[8:], "labels": ids[8:]}]
    lora = {"r": 4}

    def trainer(budget_gb: float, callbacks: list[Any] = ()) -> Trainer:  # type: ignore[assignment]
        return Trainer(
            tiny_llama(), None, "adamw", quantize="nf4", lora=lora, precision="fp32", memory_budget_gb=budget_gb,
            device="cpu", progress=False, run_store=False, callbacks=list(callbacks),
        )  # fmt: skip

    roomy = trainer(1)
    roomy.fit(data[:1], epochs=1)
    plan = roomy.memory_plan
    assert plan is not None and plan.rows
    assert {(r.memory.quantize, (r.memory.lora or {}).get("r")) for r in plan.rows} == {("nf4", 4)}  # QLoRA as set
    whole, half = plan.predict(quantize="nf4", lora=lora), plan.predict(quantize="nf4", lora=lora, grad_accum_steps=2)
    assert half.peak_bytes < whole.peak_bytes
    # a budget the whole batch does not fit (its usable 90%), half of it does: the plan splits, the peak stays under
    budget_gb = (half.peak_bytes + whole.peak_bytes) / 2 / 0.9 / GiB
    peak = FitPeak()
    tight = trainer(budget_gb, [peak])
    tight.fit(data, epochs=1)
    best = tight.memory_plan.best  # type: ignore[union-attr]
    assert best is not None and best.memory.quantize == "nf4" and tight.micro_split >= 2
    assert peak.peak_bytes <= budget_gb * GiB, (peak.peak_bytes, budget_gb * GiB)


def test_the_measured_step_time_is_logged_beside_the_prediction() -> None:
    out = io.StringIO()
    trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", precision="fp32", memory_budget_gb=1, device="cpu",
                      progress="lines", run_store=False)  # fmt: skip
    with redirect_stdout(out):
        history = trainer.fit(_data() * 3, epochs=1)  # 2 checked steps, then 3 timed ones
    check = trainer._budget.check  # type: ignore[union-attr]
    assert len(check.measured) == 1 and len(check.step_seconds) == 1 and check.step_seconds[0] > 0
    (event,) = [e for e in history.events if e["kind"] == "memory_check"]
    best = trainer.memory_plan.best  # type: ignore[union-attr]
    assert best is not None and f"predicted {best.time_factor:.2f}x the time of plain fp32" in event["new"]
    assert f"step time {check.step_seconds[0] * 1000:.0f} ms" in event["new"]
    assert any(s.startswith("memory check: ") for s in out.getvalue().splitlines())


@pytest.mark.slow
def test_a_row_that_splits_the_batch_is_measured_within_6_percent_of_its_prediction() -> None:
    # SGD by name (no state) on a decoder with HF's own checkpointing: the rows the planner got wrong by 50% (SGD
    # counted as AdamW's two moments; the decoder's packed-sequence check, skipped on fake tensors, adding a mask)
    from transformers import LlamaConfig, LlamaForCausalLM

    def llama() -> nn.Module:
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
        return LlamaForCausalLM(cfg)

    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": (ids := torch.randint(0, 512, (8, 128), generator=g)), "labels": ids} for _ in range(2)]
    plan = plan_memory(llama(), data[0], budget_gb=1, device="cpu", optimizer="sgd")
    # the least a whole batch needs in fp32 without the chunked loss (the Trainer keeps both as set): a budget whose
    # usable 90% is just under it leaves only rows that split the batch
    whole = min(
        plan.predict(
            optimizer="sgd", precision="fp32", activation_checkpointing=ckpt, optimizer_in_backward=in_bwd
        ).peak_bytes
        for ckpt in (False, 0.25, 0.5, 0.75, True)
        for in_bwd in (False, True)
    )
    budget_gb = 0.97 * whole / 0.9 / GiB
    trainer = Trainer(llama(), None, "sgd", lr=0.1, precision="fp32", memory_budget_gb=budget_gb, device="cpu",
                      progress=False, run_store=False)  # fmt: skip
    trainer.fit(data, epochs=1)
    best = trainer.memory_plan.best  # type: ignore[union-attr]
    assert best is not None and trainer.micro_split == best.grad_accum_steps > 1
    (measured,) = trainer._budget.check.measured  # type: ignore[union-attr]
    assert abs(best.peak_bytes / measured - 1) <= 0.06, (best.describe(), best.peak_bytes, measured)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_fit_shorter_than_the_timed_steps_logs_what_was_measured_at_its_end(steps: int) -> None:
    # the check is told after 2 measured steps and 3 timed ones: a smoke run of fewer than 5 steps logged nothing
    out = io.StringIO()
    trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", precision="fp32", memory_budget_gb=1, device="cpu",
                      progress="lines", run_store=False)  # fmt: skip
    with redirect_stdout(out):
        history = trainer.fit((_data() * 2)[:steps], epochs=1)
    assert history.steps["step"] == list(range(1, steps + 1))
    check = trainer._budget.check  # type: ignore[union-attr]
    (peak,) = check.measured
    assert 0 < peak <= GiB and check.step_seconds == []  # a partial timing is not one of the timed rounds
    (event,) = [e for e in history.events if e["kind"] == "memory_check"]
    assert event["step"] == steps
    best = trainer.memory_plan.best  # type: ignore[union-attr]
    assert best is not None and event["new"].startswith(f"{best.describe()}: measured peak ")
    assert f"predicted {format_bytes(best.peak_bytes)}" in event["new"]
    if steps == 1:  # the peak before the optimizer's second step, said so; no time
        assert "over 1 step (tensors" in event["new"] and "step time not measured" in event["new"]
    elif steps == 2:  # the peak of the checked steps; no untracked step to time
        assert "step (" not in event["new"] and "step time not measured" in event["new"]
    else:
        assert "step time " in event["new"] and "ms over 1 of the 3 timed steps" in event["new"]
    assert any(s.startswith("memory check: ") for s in out.getvalue().splitlines())


@needs("peft")
def test_a_lora_configs_modules_to_save_are_planned_as_trained() -> None:
    """A ``peft.LoraConfig``'s ``modules_to_save`` train in full, as the same settings given as a dict do: the plan
    under a budget counted the adapters alone (the saved head's copy, its gradient and its AdamW state left out)."""
    from peft import LoraConfig

    def planned(lora: Any) -> Any:
        trainer = Trainer(
            _wide(), nn.CrossEntropyLoss(), "adamw", lora=lora, memory_budget_gb=1, device="cpu", progress=False,
            run_store=False,
        )  # fmt: skip
        trainer.fit(_data()[:1], epochs=1)
        plan = trainer.memory_plan
        assert plan is not None and plan.best is not None
        return plan.best.parts

    as_dict = planned({"r": 4, "target_modules": ["l1", "l2"], "modules_to_save": ["l3"]})
    as_config = planned(LoraConfig(r=4, target_modules=["l1", "l2"], modules_to_save=["l3"]))
    assert as_config == as_dict


def test_trainable_beside_lora_is_planned_as_trained_without_a_copy() -> None:
    """``trainable=`` beside ``lora=`` trains those layers in full (no copy, unlike ``modules_to_save``): the plan
    left out their gradients and AdamW state (a tiny Llama's ``lm_head``: 65,536 bytes of state not counted)."""

    def planned(lora: Any, **kw: Any) -> Any:
        trainer = Trainer(
            _wide(), nn.CrossEntropyLoss(), "adamw", lora=lora, memory_budget_gb=1, device="cpu", progress=False,
            run_store=False, **kw,
        )  # fmt: skip
        trainer.fit(_data()[:1], epochs=1)
        plan = trainer.memory_plan
        assert plan is not None and plan.best is not None
        trains = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        return plan.best.parts, trains

    adapters = {"r": 4, "target_modules": ["l1", "l2"]}
    saved, saved_trains = planned({**adapters, "modules_to_save": ["l3"]})
    kept, kept_trains = planned(adapters, trainable=["l3.*"])
    assert kept_trains == saved_trains  # the premise: the same tensors train (l3's own, or its copy)
    assert kept["optimizer_state"] == saved["optimizer_state"] and kept["gradients"] == saved["gradients"]
    assert kept["parameters"] < saved["parameters"]  # no copy of l3 beside the original


def test_what_trainable_beside_lora_adds_to_the_plan_is_what_it_adds_to_the_measured_peak() -> None:
    """The plan's peak against the peak the budget check measures on the first steps: ``trainable=["l3.*"]`` beside
    the adapters moves both by the same bytes (l3's gradient and AdamW state; 30,848 bytes here)."""

    def peaks(**kw: Any) -> tuple[int, int]:
        lora = {"r": 4, "target_modules": ["l1", "l2"]}
        trainer = Trainer(_wide(), nn.CrossEntropyLoss(), "adamw", lora=lora, memory_budget_gb=1, device="cpu",
                          progress=False, run_store=False, **kw)  # fmt: skip
        trainer.fit(_data() * 3, epochs=1)
        plan = trainer.memory_plan
        assert plan is not None and plan.best is not None
        (measured,) = trainer._budget.check.measured  # type: ignore[union-attr]
        return plan.best.peak_bytes, measured

    planned_alone, measured_alone = peaks()
    planned_kept, measured_kept = peaks(trainable=["l3.*"])
    assert measured_kept > measured_alone  # the premise: the kept layer's tensors are in the measured peak
    assert planned_kept - planned_alone == measured_kept - measured_alone
