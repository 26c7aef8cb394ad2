"""Optimizers by name: adamw8bit / paged_adamw8bit (bitsandbytes), adamw4bit (torchao); their state through our
checkpoints (weights_only) and a bit-exact resume; nothing to train is refused (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import needs
from setup_models import mlp, mlp_data
from torch import nn

from nbtrainer import Trainer, build_optimizer

pytestmark = needs("bitsandbytes")


def fit(name: str, tmp_path, *, resume: bool) -> Trainer:
    x, y = mlp_data()
    trainer = Trainer(mlp(), nn.CrossEntropyLoss(), name, lr=1e-2, progress=False, seed=0)
    if not resume:
        trainer.fit((x, y), batch_size=32, epochs=2, shuffle=False)
        return trainer
    trainer.fit((x, y), batch_size=32, epochs=1, shuffle=False)
    path = trainer.save_checkpoint(str(tmp_path / f"{name}.ckpt"))
    state = torch.load(path, weights_only=True)["optimizer"]["state"]
    assert state, "the optimizer state is in the checkpoint"
    again = Trainer(mlp(seed=1), nn.CrossEntropyLoss(), name, lr=1e-2, progress=False, seed=0)
    again.fit((x, y), batch_size=32, epochs=2, shuffle=False, resume_from=path)
    return again


def fc2_state(trainer: Trainer, *, weight: bool = False) -> Any:
    """The optimizer state of the MLP's 64x64 layer (or, ``weight=True``, that weight)."""
    model: Any = trainer.model
    assert trainer.optimizer is not None
    return model.fc2.weight.detach() if weight else trainer.optimizer.state[model.fc2.weight]


def same_weights(a: Trainer, b: Trainer) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_adamw8bit_is_bitsandbytes_with_8bit_state_and_resumes_bit_exactly(tmp_path) -> None:
    straight = fit("adamw8bit", tmp_path, resume=False)
    assert type(straight.optimizer).__name__ == "AdamW8bit"
    assert type(straight.optimizer).__module__.startswith("bitsandbytes")
    state = fc2_state(straight)  # 64x64 = 4096 values: 8-bit blocks
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    resumed = fit("adamw8bit", tmp_path, resume=True)
    assert same_weights(straight, resumed)


def test_adamw8bit_follows_adamw_closely() -> None:
    x, y = mlp_data()
    runs = {}
    for name in ("adamw", "adamw8bit"):
        trainer = Trainer(mlp(), nn.CrossEntropyLoss(), name, lr=1e-3, progress=False, seed=0)
        trainer.fit((x, y), batch_size=16, epochs=2, shuffle=False)
        runs[name] = fc2_state(trainer, weight=True)
    assert not torch.equal(runs["adamw"], runs["adamw8bit"])
    assert (runs["adamw"] - runs["adamw8bit"]).norm() / runs["adamw"].norm() < 1e-2


def test_paged_adamw8bit_builds_and_steps() -> None:
    model = mlp()
    with pytest.warns(UserWarning, match="Paged optimizers are not supported on CPU"):
        trainer = Trainer(model, nn.CrossEntropyLoss(), "paged_adamw8bit", progress=False)
        trainer.fit(mlp_data(n=32), batch_size=32, epochs=1)
    assert type(trainer.optimizer).__name__ == "PagedAdamW8bit"


def test_build_optimizer_by_name() -> None:
    opt = build_optimizer("ADAMW8BIT", mlp(), lr=3e-4)
    assert type(opt).__name__ == "AdamW8bit" and opt.param_groups[0]["lr"] == 3e-4
    with pytest.raises(ValueError, match=r"use one of \[.*'adamw4bit'.*'adamw8bit'.*'paged_adamw8bit'"):
        build_optimizer("adamw2bit", mlp())


def test_an_8bit_optimizer_with_nothing_to_train_is_refused() -> None:
    model = mlp()
    with pytest.raises(ValueError, match=r"optimizer='adamw8bit' has nothing to train"):
        Trainer(model, nn.CrossEntropyLoss(), "adamw8bit", freeze=["*"], progress=False)
    with pytest.raises(ValueError, match=r"nothing to train"):
        build_optimizer("adamw8bit", model.requires_grad_(False))


@pytest.mark.slow
def test_adamw4bit_is_torchao_and_its_state_round_trips(tmp_path) -> None:
    pytest.importorskip("torchao")
    # torchao's step is a torch.compile'd function: compiled, its first step builds C++ kernels, 68-139 s of a quiet
    # suite run and 320 s in a loaded trial (issue 57), all of it inside torch. Run eagerly (torch's public stance),
    # the same optimizer, state subclass and checkpoint round trip are checked in seconds.
    with torch.compiler.set_stance("force_eager"):
        straight = fit("adamw4bit", tmp_path, resume=False)
        assert type(straight.optimizer).__module__.startswith("torchao")
        resumed = fit("adamw4bit", tmp_path, resume=True)
    assert type(fc2_state(resumed)["exp_avg"]).__name__ == "OptimState4bit"
    assert same_weights(straight, resumed)
