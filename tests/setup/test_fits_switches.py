"""profile_model(...).fits() with the memory switches (issue 22): the predicted parameter, gradient and optimizer
bytes against the same model built by the Trainer with those switches, counted tensor by tensor after a real
step; and the refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import needs
from torch import nn

from nbtrainer import Trainer, profile_model

pytestmark = needs("bitsandbytes", "peft")

# Predicted vs counted: the arithmetic should be exact but for PEFT's and bitsandbytes' small extras (scalar
# step counters, code books shared or not); 1% of each part is far below any switch's effect.
REL = 0.01


class Net(nn.Module):
    """Big enough layers for 8-bit optimizer state (>= 4096 values) and several 4-bit blocks."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 128)
        self.head = nn.Linear(128, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _unique(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _quant_tensors(module: nn.Module) -> list[torch.Tensor]:
    """The memory a bitsandbytes layer holds besides its packed weight: block scales, code books, row scales."""
    weight: Any = module.weight
    out = []
    state = getattr(weight, "quant_state", None)
    while state is not None:
        out += [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
        state = getattr(state, "state2", None)
    # LLM.int8 row scales: on the weight until the first forward moves them to the layer's state
    scales = [getattr(weight, "SCB", None), getattr(getattr(module, "state", None), "SCB", None)]
    return out + [s for s in scales if s is not None]


def measured(options: dict[str, Any]) -> dict[str, int]:
    """Build ``Net`` with the Trainer's switches, run one real step, count parameters, gradients, state."""
    trainer = Trainer(Net(), nn.CrossEntropyLoss(), options.pop("optimizer"), lr=1e-3, progress=False, **options)
    model = trainer.model
    x, y = torch.randn(16, 64), torch.randint(0, 4, (16,))
    nn.functional.cross_entropy(model(x), y).backward()
    grads = _unique(p.grad for p in model.parameters() if p.grad is not None)
    optimizer = trainer.optimizer
    assert optimizer is not None
    optimizer.step()
    extras = [t for m in model.modules() if "bitsandbytes" in type(m).__module__ for t in _quant_tensors(m)]
    state = [v for s in optimizer.state.values() for v in s.values()]
    return {
        "parameters": _unique([*model.parameters(), *extras]),
        "gradients": grads,
        "optimizer_state": _unique(state),
    }


@pytest.fixture(scope="module")
def prof() -> Any:
    return profile_model(Net(), torch.randn(16, 64), include=("memory",))


@pytest.mark.parametrize(
    "options",
    [
        {"quantize": "nf4", "lora": {"r": 4}, "optimizer": "adamw"},
        {"quantize": "nf4-dq", "lora": {"r": 8, "target_modules": ["fc2"]}, "optimizer": "adamw"},
        {"quantize": "int8", "lora": {"r": 4}, "optimizer": "adamw8bit"},
        {"quantize": "fp4", "optimizer": "adamw8bit"},  # no adapters: the head trains, in 8-bit state
        {"optimizer": "adamw8bit"},
    ],
    ids=["nf4-lora", "nf4dq-lora-fc2", "int8-lora-8bit", "fp4-head-8bit", "adamw8bit"],
)
def test_fits_predicts_what_the_trainer_builds(prof: Any, options: dict[str, Any]) -> None:
    predicted = prof.fits(budget_gb=1, batch_size=16, **options)
    counted = measured(dict(options))
    for part, value in counted.items():
        assert predicted.breakdown[part] == pytest.approx(value, rel=REL), part
    full = prof.memory["cpu"]["fp32"]
    if "quantize" in options:  # the saving is real and said
        assert counted["parameters"] < 0.5 * full["parameters"]
        assert f"quantize={options['quantize']!r} saves" in predicted.suggestion
        assert predicted.savings[f"quantize={options['quantize']!r}"]["parameters"] > 0.5 * full["parameters"]
    if options == {"optimizer": "adamw8bit"}:  # every layer but the head has >= 4096 values: 8-bit state
        assert counted["optimizer_state"] < 0.4 * full["optimizer_state"] * counted["gradients"] / full["gradients"]
        assert "optimizer='adamw8bit' saves" in predicted.suggestion


def test_offloading_moves_bytes_to_host(prof: Any) -> None:
    plain = prof.fits(budget_gb=1, batch_size=64)
    offloaded = prof.fits(budget_gb=1, batch_size=64, offload_activations=True)
    assert plain.breakdown["activations"] > 0 and offloaded.breakdown["activations"] == 0
    assert offloaded.host_bytes == plain.breakdown["activations"]
    assert "offload_activations moves" in offloaded.suggestion
    state = prof.fits(budget_gb=1, batch_size=64, offload_optimizer=True)
    assert state.breakdown["optimizer_state"] == 0
    assert state.host_bytes == plain.breakdown["optimizer_state"] + prof.memory["cpu"]["fp32"]["trainable_parameters"]
    # a budget the plain step misses and the switched one meets: the answer changes, with the reason
    budget = (plain.needed_bytes + offloaded.needed_bytes) / 2 / 2**30
    assert not prof.fits(budget_gb=budget, batch_size=64)
    assert prof.fits(budget_gb=budget, batch_size=64, offload_activations=True)


def test_bad_switch_values_are_refused_with_the_choices(prof: Any) -> None:
    with pytest.raises(ValueError, match=r"quantize='nf5'.*'nf4', 'nf4-dq', 'fp4', 'int8'"):
        prof.fits(budget_gb=1, quantize="nf5")
    with pytest.raises(ValueError, match=r"optimizer='adam8'.*'adamw8bit', 'paged_adamw8bit', 'adamw4bit'"):
        prof.fits(budget_gb=1, optimizer="adam8")
    with pytest.raises(ValueError, match=r"unknown keys \['rank'\]"):
        prof.fits(budget_gb=1, lora={"rank": 8})
    with pytest.raises(ValueError, match="matches no linear layer"):
        prof.fits(budget_gb=1, lora={"r": 4, "target_modules": ["q_proj"]})
    with pytest.raises(ValueError, match="use one or the other"):
        prof.fits(budget_gb=1, optimizer="adamw8bit", offload_optimizer=True)
    with pytest.raises(TypeError, match="True or False"):
        prof.fits(budget_gb=1, offload_activations="yes")


def test_fits_with_optimizer_in_backward_keeps_about_the_largest_gradient():
    """The gradients the Trainer's step in backward lets exist at once: counted during a real backward (each
    parameter's update hook sees how many gradients are alive), against what fits() predicts."""
    prof = profile_model(Net(), torch.randn(16, 64), include=("memory",), targets=torch.randint(0, 4, (16,)))
    plain = prof.fits(budget_gb=1, batch_size=16)
    result = prof.fits(budget_gb=1, batch_size=16, optimizer_in_backward=True)
    largest = 128 * 128 * 4
    assert result.breakdown["gradients"] == largest < plain.breakdown["gradients"]
    assert result.savings["optimizer_in_backward"]["gradients"] == plain.breakdown["gradients"] - largest
    assert "optimizer_in_backward saves" in result.suggestion
    model = Net()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", optimizer_in_backward=True, progress=False)
    alive: list[int] = []
    for p in model.parameters():  # before the fit adds its update hooks: each sees its own gradient alone
        p.register_post_accumulate_grad_hook(
            lambda _p: alive.append(sum(q.grad.numel() * 4 for q in model.parameters() if q.grad is not None))
        )
    trainer.fit([(torch.randn(16, 64), torch.randint(0, 4, (16,)))], epochs=1)
    assert alive and max(alive) <= result.breakdown["gradients"]
    with pytest.raises(TypeError, match=r"fits\(optimizer_in_backward=\) takes True or False"):
        bad: Any = "yes"
        prof.fits(budget_gb=1, optimizer_in_backward=bad)
