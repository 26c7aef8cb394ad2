"""Selective activation checkpointing: ``Trainer(activation_checkpointing=k | share)`` checkpoints k of the repeated
blocks (or that share of them), evenly spaced. Half-checkpointed, a model's measured peak and its recomputation lie
between none and full; the planner's prediction is within 15% of the measured peak; bad input is refused before
anything changes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

from nbtrainer import Trainer, plan_memory
from nbtrainer._compare._run_measure import measure_step_peak, stored_batches
from nbtrainer._setup._activation_checkpointing import checkpoint_count, selected_blocks

N = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(N))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _stack() -> Stack:
    torch.manual_seed(0)
    return Stack()


def _llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=2000, hidden_size=128, intermediate_size=344, num_hidden_layers=N, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _counting(modules: list[Any]) -> list[int]:
    """How often each module runs (its recomputation under checkpointing included)."""
    calls = [0] * len(modules)
    for i, m in enumerate(modules):
        m.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def test_a_count_and_a_share_pick_evenly_spaced_blocks_ending_with_the_last() -> None:
    assert selected_blocks(8, 4) == [1, 3, 5, 7] and selected_blocks(8, 2) == [3, 7] and selected_blocks(3, 1) == [2]
    assert [checkpoint_count(v, 8) for v in (True, 3, 0.5, 0.25, 0.01, 0.99)] == [8, 3, 4, 2, 1, 8]
    model = _stack()
    trainer = Trainer(model, nn.MSELoss(), "adamw", activation_checkpointing=0.5, progress=False, run_store=False)
    assert trainer.model_setup.checkpointed_blocks == ["layers.1", "layers.3", "layers.5", "layers.7"]
    assert trainer.set_activation_checkpointing(2) == ["layers.3", "layers.7"]
    assert trainer.set_activation_checkpointing(False) == []
    assert all("forward" not in layer.__dict__ for layer in model.layers)  # off: the model exactly as it was


@pytest.mark.parametrize("value", [False, 0.5, True])
def test_checkpointed_blocks_run_forward_twice_the_others_once(value: Any) -> None:
    model = _stack()
    calls = _counting([layer.up for layer in model.layers])
    trainer = Trainer(model, nn.MSELoss(), "adamw", activation_checkpointing=value, progress=False, run_store=False)
    trainer.fit([(torch.randn(16, 64), torch.randn(16, 10))], epochs=1)
    twice = {False: [], 0.5: [1, 3, 5, 7], True: list(range(N))}[value]
    assert calls == [2 if i in twice else 1 for i in range(N)]


def test_a_hugging_face_model_keeps_its_own_switch_on_the_chosen_layers() -> None:
    model = _llama()
    calls = _counting([layer.mlp for layer in model.model.layers])
    trainer = Trainer(model, None, "adamw", activation_checkpointing=0.25, progress=False, run_store=False)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [i in (3, 7) for i in range(N)]
    ids = torch.randint(0, 2000, (2, 32))
    trainer.fit([{"input_ids": ids, "labels": ids}], epochs=1)
    assert calls == [2 if i in (3, 7) else 1 for i in range(N)]
    trainer.set_activation_checkpointing(False)
    assert not any(layer.gradient_checkpointing for layer in model.model.layers)


def _measured(model: nn.Module, batch: Any, value: Any) -> int:
    private = copy.deepcopy(model)

    def make(callbacks: list[Any]) -> Trainer:
        return Trainer(
            private, None, "adamw", lr=1e-3, callbacks=callbacks, progress=False, device="cpu", fast_fetch=False,
            activation_checkpointing=value,
        )  # fmt: skip

    peak, _, _ = measure_step_peak(make, stored_batches([batch, batch], 2))
    return peak


@pytest.mark.slow
def test_half_checkpointed_peak_lies_between_none_and_full_and_is_predicted_within_15_percent() -> None:
    model = _llama()
    ids = torch.randint(0, 2000, (4, 128))
    batch = {"input_ids": ids, "labels": ids.clone()}
    measured = {value: _measured(model, batch, value) for value in (False, 0.5, True)}
    assert measured[False] > measured[0.5] > measured[True]
    plan = plan_memory(model, batch, budget_gb=16, device="cpu")
    for value in (0.5, 2):
        predicted = plan.predict(optimizer="adamw", activation_checkpointing=value).peak_bytes
        actual = measured[value] if value in measured else _measured(model, batch, value)
        assert abs(predicted / actual - 1) <= 0.15, (value, predicted, actual)

    # the plan proposes the shares, and ranks them between none and full. Listing the candidates simulates every row
    # of the search: the stack of the same 8 blocks makes the point in 1.5 s where the Llama takes 8.7 s
    stack = plan_memory(_stack(), (torch.randn(16, 64), torch.randn(16, 10)), budget_gb=16, device="cpu")
    shares = {r.memory.activation_checkpointing for r in stack._candidates}
    assert {0.25, 0.5, 0.75, True} <= shares
    for search in (plan, stack):
        times = [search.predict(activation_checkpointing=v).time_factor for v in (False, 0.25, 0.5, True)]
        assert times == sorted(times) and times[0] < times[-1]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.5, r"float in \(0, 1\)"),
        (0.0, r"float in \(0, 1\)"),
        (-0.5, r"float in \(0, 1\)"),
        (0, r"number of blocks to checkpoint \(>= 1\)"),
        (9, r"has 8 repeated blocks, so at most 8"),
    ],
)
def test_bad_values_are_refused_before_the_model_changes(value: Any, message: str) -> None:
    model = _stack()
    with pytest.raises(ValueError, match=message):
        Trainer(model, nn.MSELoss(), "adamw", activation_checkpointing=value, progress=False, run_store=False)
    assert all("forward" not in layer.__dict__ for layer in model.layers)


def test_a_model_without_repeated_blocks_names_what_to_pass() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder, self.decoder = Block(), nn.Linear(64, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.decoder(self.encoder(x))

    with pytest.raises(ValueError, match=r"has none.*nn.ModuleList.*activation_checkpointing=\[BlockType\].*Block"):
        Trainer(Odd(), nn.MSELoss(), "adamw", activation_checkpointing=0.5, progress=False, run_store=False)


def test_a_class_name_checkpoints_the_blocks_of_that_class() -> None:
    model = _stack()
    calls = _counting([layer.up for layer in model.layers])  # inside a block: its recomputation calls them again
    trainer = Trainer(model, nn.MSELoss(), "adamw", activation_checkpointing=["Block"], progress=False)
    assert trainer.model_setup.checkpointed_blocks == [f"layers.{i}" for i in range(N)]
    trainer.fit([(torch.randn(4, 64), torch.randn(4, 10))], epochs=1)
    assert calls == [2] * N  # each block's forward ran again in the backward
    with pytest.raises(ValueError, match=r"no submodule `Blok` and no module of a class of that name.*'Block'"):
        Trainer(_stack(), nn.MSELoss(), "adamw", activation_checkpointing=["Blok"], progress=False)
