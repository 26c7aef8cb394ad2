"""Several named optimizers in automatic mode: one loss, one backward, each optimizer and its scheduler step; the
weights equal a hand loop's, checkpoints hold each and resume exactly, set_lr by name, bad input refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from nbtrainer import Trainer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]


def _parts(model: Net) -> tuple[dict[str, torch.optim.Optimizer], dict[str, Any]]:
    opts: dict[str, torch.optim.Optimizer] = {
        "body": torch.optim.SGD(model.body.parameters(), lr=0.1, momentum=0.9),
        "head": torch.optim.AdamW(model.head.parameters(), lr=1e-2),
    }
    return opts, {"head": torch.optim.lr_scheduler.StepLR(opts["head"], step_size=3, gamma=0.5)}


def test_every_optimizer_steps_as_a_hand_loop_does() -> None:
    hand = Net()
    opts, scheds = _parts(hand)
    for _ in range(2):
        for x, y in _data():
            nn.functional.cross_entropy(hand(x), y).backward()
            nn.utils.clip_grad_norm_(hand.parameters(), 1.0)
            for opt in opts.values():
                opt.step()
            scheds["head"].step()
            for opt in opts.values():
                opt.zero_grad()
    model = Net()
    opts2, scheds2 = _parts(model)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opts2, scheduler=scheds2, max_grad_norm=1.0, progress=False,
                      run_store=False)  # fmt: skip
    trainer.fit(_data(), epochs=2)
    for a, b in zip(hand.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opts2["head"].param_groups[0]["lr"] == opts["head"].param_groups[0]["lr"] == 1e-2 * 0.5**2


def test_checkpoints_hold_every_optimizer_and_resume_exactly(tmp_path: Any) -> None:
    straight = Net()
    opts, scheds = _parts(straight)
    Trainer(straight, nn.CrossEntropyLoss(), opts, scheduler=scheds, progress=False, run_store=False, seed=0).fit(
        _data(), epochs=3
    )
    first = Net()
    opts1, scheds1 = _parts(first)
    t1 = Trainer(first, nn.CrossEntropyLoss(), opts1, scheduler=scheds1, progress=False, run_store=False, seed=0)
    t1.fit(_data(), epochs=1)
    path = t1.save_checkpoint(str(tmp_path / "multi.ckpt"))
    resumed = Net()
    opts2, scheds2 = _parts(resumed)
    t2 = Trainer(resumed, nn.CrossEntropyLoss(), opts2, scheduler=scheds2, progress=False, run_store=False, seed=0)
    t2.fit(_data(), epochs=3, resume_from=path)
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert opts2["body"].state_dict()["state"].keys() == opts["body"].state_dict()["state"].keys()
    # another set of names is refused before anything is loaded
    other = Net()
    renamed = {
        "trunk": torch.optim.SGD(other.body.parameters(), lr=0.1),
        "head": torch.optim.SGD(other.head.parameters()),
    }
    t3 = Trainer(other, nn.CrossEntropyLoss(), renamed, progress=False, run_store=False)
    with pytest.raises(Exception, match=r"holds the optimizers \['body', 'head'\]"):
        t3.fit(_data(), epochs=3, resume_from=path)


def test_set_lr_by_name_and_for_all() -> None:
    model = Net()
    opts, _ = _parts(model)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opts, progress=False, run_store=False)
    trainer.set_lr(0.5, optimizer="body")
    assert opts["body"].param_groups[0]["lr"] == 0.5 and opts["head"].param_groups[0]["lr"] == 1e-2
    trainer.set_lr(1e-3)
    assert opts["body"].param_groups[0]["lr"] == opts["head"].param_groups[0]["lr"] == 1e-3
    with pytest.raises(ValueError, match=r"optimizer='tail': no optimizer of that name; .*\['body', 'head'\]"):
        trainer.set_lr(1e-3, optimizer="tail")


def test_overlapping_or_missing_parameters_are_said_before_training() -> None:
    model = Net()
    with pytest.raises(ValueError, match=r"'a' and 'b' both hold the parameter 'head.weight'"):
        Trainer(model, nn.CrossEntropyLoss(), {"a": torch.optim.SGD(model.parameters(), lr=0.1),
                                               "b": torch.optim.SGD(model.head.parameters(), lr=0.1)})  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model, nn.CrossEntropyLoss(), {"head": torch.optim.SGD(model.head.parameters(), lr=0.1)},
                progress=False, run_store=False)  # fmt: skip
    assert any("have no optimizer" in str(w.message) and "body.0.weight" in str(w.message) for w in caught)
    with pytest.raises(ValueError, match="scheduler 'head' is bound to another optimizer"):
        opts, _ = _parts(model)
        Trainer(model, nn.CrossEntropyLoss(), opts,
                scheduler={"head": torch.optim.lr_scheduler.StepLR(opts["body"], 1)})  # fmt: skip
