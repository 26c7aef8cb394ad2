"""The out-of-memory advice asks ``profile_model(...).fits()`` with the memory switches the run uses (issue 22).

A model profiled before the Trainer quantizes it, adds LoRA adapters, checkpoints its blocks or steps it with an
8-bit optimizer: the advice must quote the estimate for that run (``fits(quantize=..., lora=..., ...)``), not the
one for the plain model the profile measured. The models are real (bitsandbytes 4-bit layers, PEFT adapters,
torch's checkpointing); their forward raises ``torch.OutOfMemoryError`` on call ``at`` in training, as CUDA's
allocator would.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader, needs
from torch import nn

from nbtrainer import Trainer, profile_model
from nbtrainer._memory._window import host_capacity

pytestmark = needs("bitsandbytes", "peft")

BUDGET_GB = (host_capacity() or 0) / 2**30  # what the advice takes as the CPU's budget (RAM, or the cgroup limit)


class Blocks(nn.Module):
    """Three repeated blocks (checkpointable) and a head; the forward raises out of memory on training call ``at``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Linear(10, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(64, 3)
        self.at, self.calls = -1, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return self.head(h)


def _loader():
    x, y = make_classification(n=128)
    return make_loader(x, y, batch_size=16)


def _advice(model: Blocks, **options) -> str:
    model.at, model.calls = 3, 0
    trainer = Trainer(model, nn.CrossEntropyLoss(), progress=False, **options)
    with pytest.raises(torch.OutOfMemoryError) as info:
        trainer.fit(_loader(), epochs=1)
    return str(info.value)


def test_oom_advice_estimates_the_qlora_run_not_the_plain_model():
    model = Blocks()
    prof = profile_model(model, next(iter(_loader()))[0], include=("memory",), checkpointing=False)
    text = _advice(
        model, optimizer="adamw", lr=1e-3, quantize="nf4", lora={"r": 4, "alpha": 8}, offload_activations=True
    )
    budget = BUDGET_GB
    switched = prof.fits(
        budget,
        16,
        device="cpu",
        precision="fp32",
        quantize="nf4",
        lora={"r": 4, "target_modules": "all-linear"},
        offload_activations=True,
    )
    plain = prof.fits(budget, 16, device="cpu", precision="fp32")
    assert switched.suggestion != plain.suggestion  # the switches change the estimate
    assert f"profile_model(...).fits(budget_gb={budget:.0f}, batch_size=16): {switched.suggestion}" in text
    assert "quantize='nf4' saves" in text and "offload_activations moves" in text
    assert plain.suggestion not in text


def test_oom_advice_estimates_checkpointing_and_the_8bit_optimizer():
    model = Blocks()
    prof = profile_model(model, next(iter(_loader()))[0], include=("memory",), checkpointing=True)
    text = _advice(model, optimizer="adamw8bit", lr=1e-3, activation_checkpointing=True)
    budget = BUDGET_GB
    switched = prof.fits(budget, 16, device="cpu", precision="fp32", checkpointing=True, optimizer="adamw8bit")
    plain = prof.fits(budget, 16, device="cpu", precision="fp32")
    assert switched.needed_bytes < plain.needed_bytes
    assert f"batch_size=16): {switched.suggestion}" in text
    assert "optimizer='adamw8bit' saves" in text
