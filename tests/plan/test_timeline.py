"""A simulated step's allocation trace (nbtrainer._plan._timeline): what the planner derives from it instead of
simulating again (a deeper stack, another micro-batch size, a later micro-batch of an accumulation window) equals
what a simulation of that step records."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

from nbtrainer._plan import _timeline as _trace
from nbtrainer._plan._arithmetic import model_structure
from nbtrainer._plan._context import _shallow_depth, _sim_lora
from nbtrainer._plan._reserved import replay
from nbtrainer._plan._simulate import SimulatedStep, simulate_step

DEPTH = 6


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=172, num_hidden_layers=DEPTH, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa",
    )  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def _batch(rows: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(rows, 64, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids}


def _simulate(model: nn.Module, rows: int, *, blocks: str | None = None, **options: Any) -> SimulatedStep:
    settings: dict[str, Any] = {"autocast_dtype": None, "checkpointing": False, "loss_fn": None, "criterion": None}
    settings.update(options)
    return simulate_step(
        model, _batch(rows), device=torch.device("cpu"), offload_activations=False, blocks=blocks, **settings
    )


def _same(a: _trace.Trace, b: _trace.Trace) -> None:
    assert len(a) == len(b)
    assert _trace.stats(a) == _trace.stats(b)
    for accumulating in (False, True):
        x, y = (_trace.accumulating(t) if accumulating else t for t in (a, b))
        assert _trace.stats(x) == _trace.stats(y)
        kw: dict[str, Any] = {"params": [4096] * 3, "batch": [512], "state": [[64, 64]] * 3, "workspaces": [8 * 2**20]}
        assert replay(first=x, **kw).reserved == replay(first=y, **kw).reserved


def _without_marks(trace: _trace.Trace) -> _trace.Trace:
    return _trace.Trace.of([e for e in zip(trace.ops, trace.ids, trace.sizes, strict=True) if e[0] != _trace.MARK])


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"autocast_dtype": torch.bfloat16, "checkpointing": True},  # the autocast cache releases every block's casts
        {"lora": {"r": 4}},  # frozen base, adapters in every block
    ],
    ids=["fp32", "bf16-checkpointing", "lora"],
)
def test_a_deep_stack_put_together_from_three_blocks_is_the_deep_stacks_trace(options: dict[str, Any]) -> None:
    model = _llama()
    lora = options.pop("lora", None)
    if lora is not None:
        options["prepare"] = functools.partial(_sim_lora, lora=lora, structure=model_structure(model))
    three = _simulate(_shallow_depth(model, "model.layers", 3), 2, blocks="model.layers", **options)
    whole = _simulate(model, 2, **options)
    assert three.trace is not None and whole.trace is not None
    synthesized = _trace.synthesize(three.trace, DEPTH)
    assert synthesized is not None
    _same(synthesized, _without_marks(whole.trace))
    assert _trace.stats(synthesized).peak == whole.peak


def test_blocks_that_do_not_repeat_are_not_put_together() -> None:
    class Block(nn.Module):
        def __init__(self, width: int) -> None:  # the same interface, another hidden width
            super().__init__()
            self.up, self.down = nn.Linear(64, width), nn.Linear(width, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.down(torch.relu(self.up(x)))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Block(w) for w in (256, 128, 32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    step = simulate_step(
        Model(), (torch.randn(8, 64), torch.randn(8, 64)), device=torch.device("cpu"), autocast_dtype=None,
        checkpointing=False, loss_fn=None, criterion=nn.MSELoss(), offload_activations=False, blocks="layers",
    )  # fmt: skip
    assert step.trace is not None and _trace.synthesize(step.trace, 8) is None


@pytest.mark.slow
def test_a_micro_batch_between_two_sizes_is_interpolated_exactly() -> None:
    model = _shallow_depth(_llama(), "model.layers", 2)
    two, three, six = (_simulate(model, rows) for rows in (2, 3, 6))
    assert two.trace is not None and three.trace is not None and six.trace is not None
    between = _trace.at_micro(two.trace, six.trace, 2, 6, 3)
    assert between == three.trace


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_later_micro_batch_is_the_plain_step_with_each_gradient_added_and_freed(checkpointing: bool) -> None:
    model = _shallow_depth(_llama(), "model.layers", 2)
    plain = _simulate(model, 2, checkpointing=checkpointing)
    later = _simulate(model, 2, checkpointing=checkpointing, accumulating=True)
    assert plain.trace is not None and later.trace is not None
    derived = _trace.stats(_trace.accumulating(plain.trace))
    assert derived.peak == later.peak
    assert derived.largest_activations == later.largest_activations


def test_stats_follow_the_peak_tracker() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    step = simulate_step(
        model, (torch.randn(32, 64), torch.randint(0, 10, (32,))), device=torch.device("cpu"), autocast_dtype=None,
        checkpointing=False, loss_fn=None, criterion=nn.CrossEntropyLoss(), offload_activations=False,
    )  # fmt: skip
    assert step.trace is not None
    st = _trace.stats(step.trace)
    assert (st.peak, st.gradients_at_peak, st.largest_activations) == (
        step.peak,
        step.at_peak["gradients"],
        step.largest_activations,
    )
    assert st.gradients_end == step.gradients


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [{}, {"autocast_dtype": torch.bfloat16, "checkpointing": True}, {"lora": {"r": 4}}],
    ids=["fp32", "bf16-checkpointing", "lora"],
)
def test_the_step_without_offloading_follows_from_the_step_with_it(options: dict[str, Any]) -> None:
    model = _shallow_depth(_llama(), "model.layers", 3)
    lora = options.pop("lora", None)
    if lora is not None:
        options["prepare"] = functools.partial(_sim_lora, lora=lora, structure=model_structure(_llama()))
    offloaded = simulate_step(
        model, _batch(2), device=torch.device("cpu"), offload_activations=True, blocks="model.layers",
        **{"autocast_dtype": None, "checkpointing": False, "loss_fn": None, "criterion": None, **options},
    )  # fmt: skip
    kept = _simulate(model, 2, blocks="model.layers", **options)
    assert offloaded.trace is not None and kept.trace is not None
    derived = _trace.kept_on_device(offloaded.trace)
    _same(derived, _without_packs(kept.trace))
    assert _trace.stats(offloaded.trace).peak < _trace.stats(derived).peak  # offloading did hold less


def _without_packs(trace: _trace.Trace) -> _trace.Trace:
    return _trace.Trace.of(
        [e for e in zip(trace.ops, trace.ids, trace.sizes, strict=True) if e[0] not in (_trace.PACK, _trace.UNPACK)]
    )
