"""Closure optimizers (LBFGS): the Trainer builds the closure a hand loop writes; the weights are the hand loop's,
the History has the loss of each step's first evaluation, and what cannot be combined is refused up front."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nbtrainer import Trainer


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(64, 1, generator=g)
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


@pytest.mark.parametrize("max_grad_norm", [None, 0.5])
def test_lbfgs_trains_the_hand_loops_weights(max_grad_norm: float | None) -> None:
    hand = _model()
    opt = torch.optim.LBFGS(hand.parameters(), lr=0.5, max_iter=5, history_size=4)
    first_losses = []
    for _ in range(2):
        for x, y in _data():
            evaluations: list[float] = []

            def closure(x=x, y=y, evaluations=evaluations) -> torch.Tensor:
                opt.zero_grad()
                loss = nn.functional.mse_loss(hand(x), y)
                loss.backward()
                if max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(hand.parameters(), max_grad_norm)
                evaluations.append(loss.item())
                return loss

            opt.step(closure)
            first_losses.append(evaluations[0])
            assert len(evaluations) > 1  # LBFGS evaluated the batch several times

    model = _model()
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=4)
    trainer = Trainer(model, nn.MSELoss(), lbfgs, max_grad_norm=max_grad_norm, progress=False, run_store=False,
                      refresh_interval=0.0)  # fmt: skip
    history = trainer.fit(_data(), epochs=2)
    for a, b in zip(hand.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert history.steps["loss"] == pytest.approx(first_losses, rel=1e-6)
    assert trainer.global_step == 8


def test_lbfgs_runs_under_bf16_and_with_metrics() -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    trainer = Trainer(model, nn.MSELoss(), opt, precision="bf16-mixed", progress=False, run_store=False,
                      metrics={"mae": lambda out, y: (out - y).abs().mean()})  # fmt: skip
    history = trainer.fit(_data(), epochs=3)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]
    assert "mae" in history.epochs[-1]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"grad_accum_steps": 2}, "grad_accum_steps=2"),
        ({"on_nonfinite": "skip"}, "on_nonfinite='skip'"),
        ({"memory_budget_gb": 1}, "memory_budget_gb"),
    ],
)
def test_what_a_closure_optimizer_cannot_take_is_refused(options: dict, message: str) -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match=rf"LBFGS takes a closure in step\(\).*{message}"):
        Trainer(model, nn.MSELoss(), opt, progress=False, **options)


def test_the_step_in_backward_is_refused_for_a_closure_optimizer() -> None:
    model = _model()
    with pytest.raises(ValueError, match="LBFGS re-evaluates the loss through a closure"):
        Trainer(model, nn.MSELoss(), torch.optim.LBFGS(model.parameters()), optimizer_in_backward=True, progress=False)


def test_accumulation_later_is_refused_too() -> None:
    model = _model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.LBFGS(model.parameters()), progress=False, run_store=False)
    with pytest.raises(ValueError, match="grad_accum_steps=4"):
        trainer.set_grad_accum_steps(4)
    assert trainer.grad_accum_steps == 1
