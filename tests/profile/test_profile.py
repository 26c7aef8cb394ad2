"""profile_model: analytic FLOP counts, counter agreement, latency, training memory, checkpointing,
side-effect freedom, dict/multi-input models, fits(). Real torch models, nothing of ours mocked."""

from __future__ import annotations

import copy
import gc
import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nbtrainer import ModelProfile, profile_model
from nbtrainer._profile import count_flops
from nbtrainer._setup._activation_checkpointing import apply_activation_checkpointing, find_checkpointable_blocks

CUDA = torch.cuda.is_available()
FLOPS = ("flops",)


class Attention(nn.Module):
    """Self-attention with an explicit ``q @ k^T`` score matrix and ``F.scaled_dot_product_attention``."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1)  # functional matmul: module hooks can't see it
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, n, d)) + scores.mean()


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(x)


class Stack(nn.Module):
    def __init__(self, d: int = 32, depth: int = 6) -> None:
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.ModuleList([nn.Linear(d, 2), nn.Linear(d, 2)])  # identical too, but smaller
        self.bn = nn.BatchNorm1d(d)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        x = self.drop(self.bn(x))
        return self.head[0](x) + self.head[1](x)


def _counts(model: nn.Module, x, batch_size: int) -> tuple[int, int, int]:
    c = count_flops(copy.deepcopy(model), x, batch_size=batch_size)
    return (
        c["ptflops_macs"]["forward"]["per_batch"],
        c["flop_counter_flops"]["forward"]["per_batch"],
        c["flop_counter_flops"]["forward_backward"]["per_batch"],
    )


# ---------------------------------------------------------------- FLOPs and MACs


@pytest.mark.parametrize("bias", [False, True])
def test_linear_flops_match_analytic(bias: bool) -> None:
    b, i, o = 8, 20, 30
    macs, flops, _ = _counts(nn.Linear(i, o, bias=bias), torch.randn(b, i), b)
    assert flops == 2 * b * i * o  # FlopCounterMode: matmul only
    assert macs == b * i * o + (b * o if bias else 0)  # ptflops: a bias add is one MAC per output


def test_conv2d_flops_match_analytic() -> None:
    b, cin, cout, k, h = 2, 3, 8, 3, 10
    conv = nn.Conv2d(cin, cout, k, padding=1)
    macs, flops, fwd_bwd = _counts(conv, torch.randn(b, cin, h, h), b)
    analytic = b * cout * h * h * cin * k * k
    assert flops == 2 * analytic
    assert macs == analytic + b * cout * h * h
    assert fwd_bwd == 2 * flops  # input needs no grad: only the weight gradient (one more conv)


def test_attention_flops_match_analytic() -> None:
    b, n, d, heads = 2, 16, 32, 4
    macs, flops, _ = _counts(Attention(d, heads), torch.randn(b, n, d), b)
    projections = b * n * d * 3 * d + b * n * d * d
    qk = b * heads * n * n * (d // heads)
    sdpa = 2 * qk  # scores and scores @ v
    assert macs == projections + qk + sdpa  # ptflops sees q@k and (with our rule) the fused kernel
    assert flops == 2 * macs  # no bias anywhere: the counters agree exactly


def test_counters_agree_within_convention_and_backward_is_counted() -> None:
    b, i, h, o = 4, 16, 32, 8
    model = nn.Sequential(nn.Linear(i, h), nn.ReLU(), nn.Linear(h, o))
    macs, flops, fwd_bwd = _counts(model, torch.randn(b, i), b)
    assert 2 * macs - flops == 2 * b * (h + o)  # the difference is exactly the bias adds
    # backward: weight grads of both layers + input grad of the second (the input needs no grad)
    assert fwd_bwd == flops + 2 * b * i * h + 2 * (2 * b * h * o)


def test_transformer_fast_path_is_still_counted() -> None:
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval().requires_grad_(False)
    b, n = 2, 10
    macs, flops, fwd_bwd = _counts(layer, torch.randn(b, n, 32), b)
    linear = b * n * (32 * 96 + 32 * 32 + 32 * 64 + 64 * 32)
    attention = 2 * b * n * n * 32
    assert flops == 2 * (linear + attention)
    assert macs >= linear + attention
    assert fwd_bwd is None  # nothing trainable


def test_profile_reports_per_sample_and_labels() -> None:
    prof = profile_model(nn.Linear(10, 5, bias=False), torch.randn(4, 10), include=FLOPS)
    assert prof.macs == 50 and prof.flops == 100
    assert prof.compute["ptflops_macs"]["forward"]["per_batch"] == 200
    assert "ptflops" in prof.compute["counters"]["macs"]
    assert "FlopCounterMode" in prof.compute["counters"]["flops"]
    assert "1 MAC = 2 FLOPs" in prof.compute["convention"]


# ---------------------------------------------------------------- latency


def test_latency_floats_with_sub_ms_resolution() -> None:
    prof = profile_model(
        nn.Linear(8, 4), torch.randn(2, 8), include=("latency",), precisions=("fp32", "bf16"), n_warmup=3, n_iters=30
    )
    for precision in ("fp32", "bf16-mixed"):
        stats = prof.latency_ms["cpu"][precision]
        assert stats["n_iters"] == 30
        for key in ("median", "p90", "mean", "min"):
            assert isinstance(stats[key], float) and stats[key] > 0
        assert stats["min"] <= stats["median"] <= stats["p90"]
        assert stats["throughput"] == pytest.approx(2 * 1000 / stats["median"])
    fp32 = prof.latency_ms["cpu"]["fp32"]
    assert fp32["median"] < 1.0 and fp32["median"] != round(fp32["median"])  # not rounded to whole ms


def test_latency_auto_iterations_respect_time_budget() -> None:
    prof = profile_model(nn.Linear(8, 4), torch.randn(2, 8), include=("latency",), time_budget_s=0.05)
    assert 10 <= prof.latency_ms["cpu"]["fp32"]["n_iters"] <= 300


# ---------------------------------------------------------------- training memory


@pytest.mark.slow
@pytest.mark.parametrize(
    "make, ratio, keys",
    [
        (lambda p: torch.optim.Adam(p, lr=1e-3), 2, {"exp_avg", "exp_avg_sq"}),
        (lambda p: torch.optim.AdamW(p, lr=1e-3), 2, {"exp_avg", "exp_avg_sq"}),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1, {"momentum_buffer"}),
        (lambda p: torch.optim.SGD(p, lr=0.1), 0, set()),
    ],
)
def test_optimizer_state_read_from_a_real_step(make, ratio: int, keys: set[str]) -> None:
    model = Stack()
    model.inp.requires_grad_(False)  # frozen parameters get no state and no gradient
    mem = profile_model(model, torch.randn(16, 8), include=("memory",), optimizer=make, checkpointing=False).memory[
        "cpu"
    ]["fp32"]
    trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    assert mem["trainable_parameters"] == trainable < mem["parameters"]
    assert mem["gradients"] == trainable
    by_key = mem["optimizer_state_by_key"]
    assert sum(by_key[k] for k in keys) == ratio * trainable
    assert mem["optimizer_state"] - sum(by_key[k] for k in keys) == by_key.get("step", 0)
    assert by_key.get("step", 0) <= 8 * sum(1 for p in model.parameters() if p.requires_grad)  # scalar counters


def test_users_optimizer_is_cloned_not_stepped() -> None:
    model = Stack()
    groups: list[dict[str, Any]] = [
        {"params": model.blocks.parameters(), "momentum": 0.9},
        {"params": model.head.parameters()},
    ]
    opt = torch.optim.SGD(groups, lr=0.1)
    before = copy.deepcopy(model.state_dict())
    mem = profile_model(model, torch.randn(8, 8), include=("memory",), optimizer=opt).memory["cpu"]["fp32"]
    assert opt.state == {} or all(not s for s in opt.state.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert mem["optimizer"] == "SGD"
    assert mem["optimizer_state_by_key"]["momentum_buffer"] == sum(p.numel() * 4 for p in model.blocks.parameters())


@pytest.mark.slow
@pytest.mark.parametrize(
    "make",
    [lambda m: torch.optim.SGD(m.parameters(), lr=0.1), lambda model: torch.optim.SGD(model.parameters(), lr=0.1)],
    ids=["lambda-m", "lambda-model"],
)
def test_a_function_of_the_model_is_refused_before_profiling(make) -> None:
    calls: list[int] = []  # shared by the deep copies profile_model runs (a closure, not an attribute)

    class Counted(Stack):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(1)
            return super().forward(x)

    with pytest.raises(TypeError, match=r"called with the model's parameters.*lambda params"):
        profile_model(Counted(), torch.randn(8, 8), optimizer=make)
    assert calls == []  # refused before the model ran once
    profile_model(Counted(), torch.randn(8, 8), optimizer=torch.optim.SGD, n_iters=2)
    assert calls  # the control: a good optimizer does run the model


def test_activation_memory_drops_with_checkpointing() -> None:
    model, b, d = Stack(d=32, depth=6), 64, 32
    mem = profile_model(model, torch.randn(b, 8), include=("memory",)).memory["cpu"]["fp32"]
    assert mem["checkpoint_blocks"] == [f"blocks.{i}" for i in range(6)]
    assert mem["activations"] > 0
    assert mem["activations_checkpointed"] < mem["activations"] / 3
    # what checkpointing keeps: each block's input (b x d floats) plus what lies outside the blocks
    assert mem["activations_checkpointed"] >= 6 * b * d * 4
    assert 0 < mem["recompute_peak"] < mem["activations"] / 3
    assert mem["total_checkpointed"] < mem["total"]


@pytest.mark.slow
def test_activation_extrapolation_matches_a_measurement_at_double_batch() -> None:
    model = Stack()
    small = profile_model(model, torch.randn(16, 8), include=("memory",), precisions=("bf16",))
    large = profile_model(model, torch.randn(32, 8), include=("memory",), precisions=("bf16",))
    predicted = small.fits(budget_gb=1, batch_size=32).breakdown["activations"]
    measured = large.memory["cpu"]["bf16-mixed"]["activations"]
    assert predicted == pytest.approx(measured, rel=0.05)
    assert small.memory["cpu"]["bf16-mixed"]["scaling"]["activations"]["fixed"] > 0  # bf16 weight copies


def test_the_memory_profile_on_a_cpu_makes_no_full_garbage_collection() -> None:
    """A CPU's figures come from the tensors themselves (saved-tensor hooks, the gradients, the optimizer's state), not
    from an allocator's counters: a full collection there bought nothing and cost ~0.17 s each, twice a profile (90%
    of a small model's memory profile). Automatic collections are off here, so any seen was asked for."""
    model, x = Stack(), torch.randn(16, 8)
    profile_model(model, x, include=("memory",))  # first-use imports
    full: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(seen)
    try:
        mem = profile_model(model, x, include=("memory",)).memory["cpu"]["fp32"]
    finally:
        gc.callbacks.remove(seen)
        if enabled:
            gc.enable()
    assert full == [] and mem["activations"] > 0


def test_fits_and_suggestion() -> None:
    prof = profile_model(Stack(), torch.randn(16, 8), include=("memory",))
    mem = prof.memory["cpu"]["fp32"]
    assert prof.fits(budget_gb=16, batch_size=64) and prof.fits(16, 64).micro_batch_size == 64
    fixed = mem["parameters"] + mem["buffers"] + mem["gradients"] + mem["optimizer_state"]
    per_sample = prof.fits(1, 2).needed_bytes - prof.fits(1, 1).needed_bytes
    budget = fixed + 20.5 * per_sample + 1000  # room for about 20 samples
    answer = prof.fits(budget_gb=budget / 2**30, batch_size=64)
    assert not answer.fits and answer.needed_bytes > answer.budget_bytes
    assert answer.micro_batch_size is not None and answer.accumulation_steps is not None  # a suggestion
    assert answer.micro_batch_size * answer.accumulation_steps == 64
    assert prof.fits(budget / 2**30, answer.micro_batch_size).fits
    assert answer.micro_batch_size == 16  # largest divisor of 64 that fits
    with_ckpt = prof.fits(budget_gb=budget / 2**30, batch_size=64, checkpointing=True)
    assert with_ckpt.needed_bytes < answer.needed_bytes
    hopeless = prof.fits(budget_gb=fixed / 2 / 2**30, batch_size=64)
    assert hopeless.micro_batch_size is None and "micro-batch 1" in hopeless.suggestion
    json.dumps(answer.to_dict())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget_gb": -1}, r"fits\(budget_gb=-1\).*positive number of GiB"),
        ({"budget_gb": 0}, r"fits\(budget_gb=0\).*positive number of GiB"),
        ({"budget_gb": float("nan")}, r"fits\(budget_gb=nan\).*positive number of GiB"),
        ({"budget_gb": float("inf")}, r"fits\(budget_gb=inf\).*positive number of GiB"),
        ({"budget_gb": "8"}, r"fits\(budget_gb='8'\).*positive number of GiB"),
        ({"budget_gb": 1, "batch_size": -4}, r"fits\(batch_size=-4\).*int >= 1"),
        ({"budget_gb": 1, "batch_size": 0}, r"fits\(batch_size=0\).*int >= 1"),
        ({"budget_gb": 1, "batch_size": 2.5}, r"fits\(batch_size=2.5\).*int >= 1"),
        ({"budget_gb": 1, "headroom": 1.5}, r"fits\(headroom=1.5\).*\[0, 1\)"),
        ({"budget_gb": 1, "headroom": -0.1}, r"fits\(headroom=-0.1\).*\[0, 1\)"),
    ],
)
def test_fits_refuses_impossible_budgets_and_batch_sizes(kwargs: dict[str, Any], message: str) -> None:
    with torch.device("meta"):
        planned_model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    measured = profile_model(nn.Linear(8, 2), torch.randn(4, 8), include=("memory",))
    planned = profile_model(planned_model, torch.randn(4, 8, device="meta"), devices=("cpu",))
    for prof in (measured, planned):
        with pytest.raises(ValueError, match=message):
            prof.fits(**kwargs)
    assert measured.fits(1, None).batch_size == 4  # None: the profiled batch


# ---------------------------------------------------------------- inputs


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 4), nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) * self.b(y)


class DictInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16, bias=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.proj(self.emb(input_ids)) * attention_mask[..., None]
        return {"hidden": h, "pooled": h.mean(1)}


def test_multi_input_model() -> None:
    prof = profile_model(TwoInputs(), (torch.randn(5, 6), torch.randn(5, 3)), n_iters=5)
    assert prof.batch_size == 5
    assert prof.flops == 2 * (6 * 4 + 3 * 4)
    assert prof.latency_ms["cpu"]["fp32"]["median"] > 0
    assert prof.memory["cpu"]["fp32"]["gradients"] == sum(p.numel() * 4 for p in TwoInputs().parameters())


def test_dict_input_model() -> None:
    inputs = {"input_ids": torch.randint(0, 50, (3, 7)), "attention_mask": torch.ones(3, 7)}
    prof = profile_model(DictInputs(), inputs, n_iters=5, criterion=lambda out: out["pooled"].square().mean())
    assert prof.batch_size == 3
    assert prof.flops == 2 * 7 * 16 * 16
    assert prof.memory["cpu"]["fp32"]["inputs"] == 3 * 7 * (8 + 4)


def test_a_sliced_example_batch_counts_its_own_bytes_not_the_dataset_behind_it() -> None:
    data = torch.randn(2000, 16)  # a dataset held as one tensor; the example batch is a view of its first rows
    batch = data[:8]
    mem = profile_model(TwoInputs(), (batch[:, :6], batch[:, 6:9]), include=("memory",)).memory["cpu"]["fp32"]
    assert mem["inputs"] == 8 * 6 * 4 + 8 * 3 * 4  # two views of one storage, each its own bytes
    assert mem["scaling"]["inputs"]["per_sample"] == 6 * 4 + 3 * 4
    pair = nn.Bilinear(6, 6, 2)
    view = batch[:, :6]
    once = profile_model(pair, (view, view), include=("memory",)).memory["cpu"]["fp32"]["inputs"]
    assert once == 8 * 6 * 4  # the same tensor passed twice is one allocation
    apart = profile_model(pair, (view, batch[:, 6:12]), include=("memory",)).memory["cpu"]["fp32"]["inputs"]
    assert apart == 2 * 8 * 6 * 4


# ---------------------------------------------------------------- side effects


def _snapshot(model: nn.Module) -> dict:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "device": {n: p.device for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        "hooks": {
            n: (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._backward_hooks), dict(m._state_dict_hooks))
            for n, m in model.named_modules()
        },
        "attrs": {n: set(vars(m)) for n, m in model.named_modules()},
        "buffers": sorted(n for n, _ in model.named_buffers()),
        "rng": torch.get_rng_state(),
    }


@pytest.mark.slow
def test_profiling_is_side_effect_free() -> None:
    model = Stack()
    model.train()
    model.blocks[2].eval()  # mixed modes must survive
    model.inp.weight.requires_grad_(False)
    model(torch.randn(4, 8)).sum().backward()
    model.get_parameter("blocks.0.ff.0.weight").grad = None  # some grads set, some None
    model.register_forward_hook(lambda *a: None)
    model.blocks[1].register_forward_pre_hook(lambda *a: None)
    model.head[0].register_full_backward_hook(lambda *a: None)
    x = torch.randn(16, 8)
    before = _snapshot(model)
    prof = profile_model(model, x, precisions=("fp32", "bf16"), n_iters=5)
    after = _snapshot(model)
    assert isinstance(prof, ModelProfile)
    assert before["device"] == after["device"]
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    assert before["state"].keys() == after["state"].keys()  # no total_ops-style leftovers
    assert all(torch.equal(before["state"][k], after["state"][k]) for k in before["state"])
    assert before["buffers"] == after["buffers"]
    assert before["grads"].keys() == after["grads"].keys()
    for name, grad in before["grads"].items():
        assert (grad is None) == (after["grads"][name] is None), name
        assert grad is None or torch.equal(grad, after["grads"][name]), name
    assert before["hooks"] == after["hooks"]
    assert before["attrs"] == after["attrs"]
    assert torch.equal(before["rng"], after["rng"])  # dropout in the copies didn't advance the caller's RNG


# ---------------------------------------------------------------- activation checkpointing


def test_find_checkpointable_blocks_picks_the_largest_identical_container() -> None:
    assert [n for n, _ in find_checkpointable_blocks(Stack())] == [f"blocks.{i}" for i in range(6)]
    assert find_checkpointable_blocks(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []


def test_checkpointing_same_gradients_and_exact_removal() -> None:
    torch.manual_seed(0)
    model = Stack().eval()  # no dropout/BN noise between the two runs
    x = torch.randn(8, 8)
    attrs = {n: set(vars(m)) for n, m in model.named_modules()}
    model(x).sum().backward()
    reference = [p.grad.clone() for p in model.parameters() if p.grad is not None]  # all: zip(strict=True) below
    model.zero_grad()
    handle = apply_activation_checkpointing(model, [Block])
    assert handle.names == [f"blocks.{i}" for i in range(6)]
    clone = copy.deepcopy(model)  # the copy's wrapped blocks must run the copy's own weights
    with torch.no_grad():
        for p in clone.parameters():
            p.zero_()
    assert torch.count_nonzero(clone(x)) == 0
    model(x).sum().backward()
    for ref, p in zip(reference, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, ref)
    mem = profile_model(model, x, include=("memory",)).memory["cpu"]["fp32"]  # copies strip the wrappers
    assert mem["activations_checkpointed"] < mem["activations"] / 3
    assert all("forward" in vars(b) for b in model.blocks)  # the caller's wrappers stay
    handle.remove()
    handle.remove()  # idempotent
    assert {n: set(vars(m)) for n, m in model.named_modules()} == attrs
    with pytest.raises(ValueError):
        apply_activation_checkpointing(nn.Linear(2, 2))


# ---------------------------------------------------------------- reports


def test_to_dict_to_pandas_and_html() -> None:
    prof = profile_model(Stack(), torch.randn(8, 8), n_iters=5)
    data = prof.to_dict()
    assert ModelProfile.from_dict(json.loads(json.dumps(data))).to_dict() == data
    assert {"params", "trainable_params", "size_mb", "macs", "flops", "latency_ms", "memory"} <= data.keys()
    frame = prof.to_pandas()
    assert list(frame.columns) == ["section", "device", "precision", "metric", "value", "unit", "source"]
    assert set(frame["section"]) == {"model", "compute", "latency", "memory"}
    html = prof._repr_html_()
    assert "Stack" in html and "Inference latency" in html and "Training memory" in html and "<table" in html
    assert prof.size["serialized_bytes"] > prof.params * 4 - 1


@pytest.mark.skipif(CUDA, reason="checks the report for a missing CUDA device")
def test_unavailable_device_is_reported_not_dropped() -> None:
    prof = profile_model(nn.Linear(4, 4), torch.randn(2, 4), devices=("cpu", "cuda"), n_iters=5)
    entry = prof.latency_ms["cuda"]["fp32"]
    assert entry["supported"] is False and "CUDA" in entry["reason"]
    assert prof.latency_ms["cpu"]["fp32"]["median"] > 0


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_latency_and_peak_memory() -> None:
    model = Stack()
    prof = profile_model(model, torch.randn(64, 8), devices=("cuda",), precisions=("fp32", "bf16"), n_iters=20)
    dev = next(iter(prof.latency_ms))
    assert dev.startswith("cuda")
    assert prof.latency_ms[dev]["fp32"]["median"] > 0
    mem = prof.memory[dev]["fp32"]
    assert mem["cuda_peak"] >= mem["parameters"] + mem["gradients"]
    assert mem["cuda_peak_checkpointed"] is not None
    assert next(model.parameters()).device.type == "cpu"


# -- track_peak: the measured peak of live tensor storage (CPU included) --------------------------------


def _deep_mlp(depth: int = 8, width: int = 128) -> nn.Sequential:
    """``depth`` blocks of three Linear + GELU layers (what activation checkpointing wraps: one block)."""
    layers = lambda: [m for _ in range(3) for m in (nn.Linear(width, width), nn.GELU())]  # noqa: E731
    return nn.Sequential(*(nn.Sequential(*layers()) for _ in range(depth)))


def _train_step(model: nn.Sequential, opt: torch.optim.Optimizer, x: torch.Tensor, *, extra: int = 0, ckpt=False):
    tmp = torch.ones(extra, dtype=torch.uint8)  # a temporary made and released inside the step
    h = x
    for block in model:
        h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False) if ckpt else block(h)
    loss = h.square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del tmp


def test_track_peak_sees_a_temporary_and_its_release() -> None:
    from nbtrainer._memory._peak import CATEGORIES, track_peak

    torch.manual_seed(0)
    model = _deep_mlp(depth=3, width=64)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64)
    _train_step(model, opt, x)  # the optimizer's state exists: a steady-state step
    peaks = {}
    for extra in (0, 4 << 20):
        with track_peak(model, opt, inputs=x) as peak:
            _train_step(model, opt, x, extra=extra)
        peaks[extra] = peak.peak_bytes
        assert set(peak.breakdown) == set(CATEGORIES) and sum(peak.breakdown.values()) == peak.peak_bytes
        params = sum(p.numel() * 4 for p in model.parameters())
        assert peak.breakdown["parameters"] == params and peak.breakdown["inputs"] == x.numel() * 4
        assert peak.largest["optimizer_state"] >= 2 * params  # AdamW: exp_avg + exp_avg_sq
        assert peak.current_bytes < peak.peak_bytes  # activations, gradients and the temporary were released
        # what stays between steps: AdamW's two moments (and a scalar step count per parameter), no gradients
        assert 2 * params <= peak.resident["optimizer_state"] < 2.1 * params and peak.resident["gradients"] == 0
    assert peaks[4 << 20] - peaks[0] >= 4 << 20
    assert peak.breakdown["activations"] >= 4 << 20  # labelled: made by the step, neither state nor a gradient


def test_track_peak_agrees_with_torch_mem_tracker() -> None:
    """torch's own tracker (torch.distributed._tools, private) sees the same peak and the same split."""
    from nbtrainer._memory._peak import track_peak

    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    torch.manual_seed(0)
    model = _deep_mlp(depth=4, width=64)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 64)
    _train_step(model, opt, x)
    with track_peak(model, opt, inputs=x) as peak:
        _train_step(model, opt, x)
    theirs = mem_tracker.MemTracker()
    theirs.track_external(model, opt, x)
    with theirs:
        _train_step(model, opt, x)
    peak_snapshot = theirs.get_tracker_snapshot("peak")[x.device]
    snap = {str(getattr(k, "value", k)): v for k, v in peak_snapshot.items()}
    assert peak.peak_bytes == snap["Total"]
    assert peak.breakdown["parameters"] == snap["Parameter"] and peak.breakdown["gradients"] == snap["Gradient"]
    assert peak.breakdown["optimizer_state"] == snap["Optstate"]


def test_activation_checkpointing_lowers_the_measured_peak() -> None:
    from nbtrainer._memory._peak import track_peak

    torch.manual_seed(0)
    model = _deep_mlp(depth=6, width=64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # no state: the activations dominate the peak
    x = torch.randn(512, 64)
    measured = {}
    for ckpt in (False, True):
        with track_peak(model, opt, inputs=x) as peak:
            _train_step(model, opt, x, ckpt=ckpt)
        measured[ckpt] = peak
    plain, saved = measured[False], measured[True]
    assert saved.peak_bytes < 0.6 * plain.peak_bytes, (plain.breakdown, saved.breakdown)
    assert saved.largest["activations"] < 0.5 * plain.largest["activations"]
    assert saved.breakdown["parameters"] == plain.breakdown["parameters"]


@pytest.mark.slow
def test_track_peak_lets_torch_compile_run() -> None:
    """torch.compile skips every frame under a dispatch mode unless the mode ignores compiled internals:
    torchao's 8-bit optimizers compile their step with fullgraph=True, an error then."""
    from nbtrainer._memory._peak import track_peak

    # the eager backend: dynamo's check of the active dispatch mode comes before any backend, so this fails
    # without the fix as inductor would, without a C++ build (about 10 s of CPU here)
    @torch.compile(fullgraph=True, dynamic=False, backend="eager")
    def double_plus_one(t: torch.Tensor) -> torch.Tensor:
        return t * 2 + 1

    x = torch.randn(1024)
    with track_peak(inputs=x) as peak:
        y = double_plus_one(x)
        z = y.sum()  # the compiled output is counted once an operator reads it
    assert torch.equal(y, x * 2 + 1) and float(z) == pytest.approx(float((x * 2 + 1).sum()), rel=1e-5)
    assert peak.peak_bytes >= 2 * 4096
