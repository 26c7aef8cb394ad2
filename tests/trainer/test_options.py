"""``trainer.options``: the memory switches stored once, validated, and what the OOM advice reads."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from nbtrainer import MemoryOptions, Trainer


def _model() -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)]  # identical blocks, for checkpointing
    return nn.Sequential(nn.Sequential(*blocks), nn.Linear(8, 2))


def test_the_trainer_stores_its_memory_switches_validated():
    model = _model()
    t = Trainer(model, nn.CrossEntropyLoss(), "AdamW", lr=1e-3, precision="bf16", progress=False)
    memory = t.options.memory
    assert memory.precision == "bf16-mixed"  # the alias resolved, as the trainer runs it
    assert memory.optimizer == "adamw"
    assert memory.changed() == {"precision": "bf16-mixed", "optimizer": "adamw"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory.precision = "fp32"  # type: ignore[misc]


def test_an_optimizer_instance_is_named_by_its_kind():
    model = _model()
    t = Trainer(model, nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), progress=False)
    assert t.options.memory.optimizer == "adam"
    assert t.options.memory.changed() == {"optimizer": "adam"}


def test_switches_round_trip_through_trainer_keywords():
    options = MemoryOptions(precision="bf16-mixed", activation_checkpointing=True, optimizer="adamw")
    model = _model()
    t = Trainer(model, nn.CrossEntropyLoss(), lr=1e-3, progress=False, **options.changed())
    assert t.options.memory == options
    assert MemoryOptions.from_kwargs({"precision": "bf16-mixed", "epochs": 3}) == MemoryOptions(precision="bf16-mixed")
    assert "activation_checkpointing" in MemoryOptions.names()
    with pytest.raises(TypeError):
        options.replace(not_a_switch=True)
