"""One owner per piece of state: the Trainer's option groups are the only copy of what they hold, a setter replaces
its group (``dataclasses.replace``), and everything that reports or reasons about a switch reads that one group."""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader
from torch import nn

from nbtrainer import Runs, Trainer
from nbtrainer._loop import _oom


def _model() -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(10, 10), nn.ReLU()) for _ in range(3)]  # repeated blocks: checkpointable
    return nn.Sequential(nn.Sequential(*blocks), nn.Linear(10, 3))


def test_a_switch_set_between_fits_is_the_one_the_second_run_records(tmp_path):
    """The defect of two copies: set_precision / set_activation_checkpointing changed the Trainer's own attribute and
    the model, while ``options.memory`` (what the run store, the OOM advice and the planner read) kept the
    constructor's values, so the second run's record contradicted itself."""
    path = tmp_path / "runs.db"
    x, y = make_classification(n=64)
    loader = make_loader(x, y, batch_size=16)
    trainer = Trainer(_model(), nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=path)
    trainer.fit(loader, epochs=1)
    first_run, first = trainer.run_id, trainer.options.memory
    assert first_run is not None and Runs(path)[first_run].config["memory"] == {"optimizer": "sgd"}

    trainer.set_precision("bf16-mixed")
    blocks = trainer.set_activation_checkpointing(True)
    assert len(blocks) == 3

    memory = trainer.options.memory
    assert memory is not first and first.precision == "fp32" and first.activation_checkpointing is False  # replaced
    assert (memory.precision, memory.activation_checkpointing, memory.optimizer) == ("bf16-mixed", True, "sgd")
    assert trainer.precision == "bf16-mixed"  # the flat attribute reads the group

    trainer.fit(loader, epochs=1)
    assert trainer.run_id is not None
    run = Runs(path)[trainer.run_id]
    assert run.id != first_run
    assert run.config["precision"] == "bf16-mixed"
    assert run.config["memory"] == {"precision": "bf16-mixed", "activation_checkpointing": True, "optimizer": "sgd"}

    # the OOM advice reads the same group: it names the precision in effect and no longer suggests checkpointing
    facts, tips = _oom.advice(trainer, "fit")
    assert "bf16-mixed" in facts
    assert not any(tip.startswith("activation_checkpointing=True") for tip in tips)


def test_setters_between_fits_replace_their_group():
    trainer = Trainer(_model(), nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    step = trainer.options.step
    trainer.set_grad_accum_steps(4)
    trainer.set_max_grad_norm(1.0)
    assert trainer.options.step is not step and step.grad_accum_steps == 1 and step.max_grad_norm is None
    assert (trainer.options.step.grad_accum_steps, trainer.options.step.max_grad_norm) == (4, 1.0)
    assert (trainer.grad_accum_steps, trainer.max_grad_norm) == (4, 1.0)
    trainer.set_activation_checkpointing(False)
    assert trainer.options.memory.activation_checkpointing is False and trainer.checkpointed_blocks == []


def test_a_refused_setter_leaves_the_group_as_it_was():
    trainer = Trainer(_model(), nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    before = trainer.options
    with pytest.raises(ValueError):
        trainer.set_grad_accum_steps(0)
    with pytest.raises(ValueError):
        trainer.set_precision("fp8")
    assert trainer.options is before
