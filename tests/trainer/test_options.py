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


class _Dtypes(nn.Module):
    """A linear layer that records the dtype of each forward's output."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.dtypes: set[torch.dtype] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        self.dtypes.add(out.dtype)
        return out


def _classify(model: nn.Module, **options) -> tuple[Trainer, torch.utils.data.DataLoader]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return Trainer(model, nn.CrossEntropyLoss(), opt, progress=False, run_store=False, device="cpu", **options), loader


def test_assigning_the_precision_between_fits_is_set_precision():
    # The attribute replaced the option group only: fp16 autocast ran with no GradScaler (underflowing gradients
    # unscaled), and any string was taken. It now goes through set_precision: checked, aliases resolved, scaler made.
    model = _Dtypes()
    t, loader = _classify(model)
    t.fit(loader, epochs=1)
    t.precision = "16"
    assert t.precision == "fp16-mixed"
    model.dtypes.clear()
    t.fit_more(loader, epochs=1)
    assert isinstance(t.scaler, torch.amp.GradScaler)
    assert model.dtypes == {torch.float16}
    t.precision = "fp32"
    assert t.scaler is None
    with pytest.raises(ValueError, match="fp8"):
        t.precision = "fp8"
    assert t.precision == "fp32"


def test_assigned_step_settings_are_checked_as_their_setters_check_them():
    t, loader = _classify(_Dtypes())
    with pytest.raises(ValueError):
        t.grad_accum_steps = 0
    with pytest.raises(ValueError):
        t.max_grad_norm = -1.0
    with pytest.raises(ValueError, match="interval"):
        t.scheduler_interval = "batch"
    t.grad_accum_steps, t.max_grad_norm, t.scheduler_interval = 2, 1.0, "epoch"
    assert (t.grad_accum_steps, t.max_grad_norm, t.scheduler_interval) == (2, 1.0, "epoch")
    t.fit(loader, epochs=1)
    assert t.global_step == 2  # 4 batches, 2 a step


def test_accumulation_assigned_mid_fit_waits_for_the_step_boundary_and_is_recorded():
    class Assign:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 1:
                trainer.grad_accum_steps = 3

    t, loader = _classify(_Dtypes(), callbacks=[Assign()])
    t.fit(loader, epochs=1)
    assert t.global_step == 2  # batch 1 alone, then 2-4 in one window
    assert [e["kind"] for e in t.history.events] == ["grad_accum_steps"]


def test_assigning_the_device_is_refused_naming_a_new_trainer() -> None:
    """Before: ``trainer.device = "cuda"`` replaced the option alone; the model and its optimizer state stayed where
    they were while the next fit sent the batches to the new device."""
    model = torch.nn.Linear(4, 2)
    trainer = Trainer(model, torch.nn.MSELoss(), "sgd", progress=False, device="cpu")
    with pytest.raises(
        AttributeError, match=r"fixed when the Trainer is built.*Trainer\(model, \.\.\., device='meta'\)"
    ):
        trainer.device = "meta"  # type: ignore[assignment]  # a string, as users write it
    assert trainer.device == torch.device("cpu")
