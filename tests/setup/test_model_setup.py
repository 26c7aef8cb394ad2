"""Strategy switches of the Trainer: activation checkpointing, optimizer by name, freezing, compile, channels_last."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from conftest import make_classification, make_loader
from torch import nn

from nbtrainer import Trainer, build_optimizer, freeze_parameters


class Blocks(nn.Module):
    """A small residual MLP with a ModuleList of identical blocks (what checkpointing finds)."""

    def __init__(self, d: int = 10, hidden: int = 32, n: int = 3, out: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(d, hidden)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
            for _ in range(n)
        )
        self.head = nn.Linear(hidden, out)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _grads(model, x, y):
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _block(model: Blocks, i: int) -> nn.Sequential:
    block = model.blocks[i]
    assert isinstance(block, nn.Sequential)
    return block


def _count_calls(module):
    calls = []
    module.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_activation_checkpointing_gradients_equal_and_model_restored():
    torch.manual_seed(0)
    model = Blocks()
    reference = copy.deepcopy(model)
    x, y = make_classification(n=32)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        activation_checkpointing=True,
        progress=False,
    )
    assert trainer.model_setup.checkpointed_blocks == ["blocks.0", "blocks.1", "blocks.2"]
    inner = _count_calls(_block(model, 1)[1])
    got, want = _grads(trainer.model, x, y), _grads(reference, x, y)
    assert len(inner) == 2  # forward + recomputation in backward: checkpointing really ran
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)

    assert trainer.set_activation_checkpointing(False) == []
    assert all("forward" not in b.__dict__ for b in model.blocks)  # the model is exactly as before
    inner.clear()
    _grads(trainer.model, x, y)
    assert len(inner) == 1

    # by type, between fits
    assert trainer.set_activation_checkpointing([nn.Sequential]) == ["blocks.0", "blocks.1", "blocks.2"]
    with pytest.raises(TypeError):
        trainer.set_activation_checkpointing("blocks")


def test_checkpointed_fit_trains_like_the_plain_model():
    x, y = make_classification(n=64)
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = Blocks()
        trainer = Trainer(
            model,
            nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.1),
            seed=0,
            activation_checkpointing=ckpt,
            progress=False,
        )
        trainer.fit(make_loader(x, y, batch_size=16), epochs=2)
        results.append(trainer.model_state_dict())
    for name, value in results[0].items():
        torch.testing.assert_close(results[1][name], value, rtol=1e-5, atol=1e-6, msg=name)


class OwnSwitch(nn.Module):
    """Stands in for a Hugging Face model: brings gradient_checkpointing_enable/disable."""

    supports_gradient_checkpointing = True

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(10, 10) for _ in range(3))
        self.head = nn.Linear(10, 3)
        self.calls: list = []

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.calls.append(("enable", gradient_checkpointing_kwargs))

    def gradient_checkpointing_disable(self):
        self.calls.append(("disable", None))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return self.head(x)


def test_models_with_their_own_switch_use_it():
    model = OwnSwitch()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.1, activation_checkpointing=True, progress=False)
    assert model.calls == [("enable", {"use_reentrant": False})]
    assert all("forward" not in m.__dict__ for m in model.modules())  # not wrapped by us as well
    trainer.set_activation_checkpointing(False)
    assert model.calls[-1] == ("disable", None)
    # an explicit list always uses our wrapping
    assert trainer.set_activation_checkpointing(["layers.0"]) == ["layers.0"]
    assert "forward" in model.layers[0].__dict__


class BothSwitches(OwnSwitch):
    """transformers >= 5: activation_checkpointing_* is the switch, gradient_checkpointing_* a deprecated alias."""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None):
        self.calls.append(("new-enable", activation_checkpointing_kwargs))

    def activation_checkpointing_disable(self):
        self.calls.append(("new-disable", None))

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        warnings.warn("gradient_checkpointing_enable is deprecated", FutureWarning, stacklevel=2)
        super().gradient_checkpointing_enable(gradient_checkpointing_kwargs)


def test_the_current_switch_name_is_preferred():
    model = BothSwitches()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.1, activation_checkpointing=True, progress=False)
        assert trainer.checkpointed_blocks == ["BothSwitches.activation_checkpointing_enable()"]
        trainer.set_activation_checkpointing(False)
    assert model.calls == [("new-enable", {"use_reentrant": False}), ("new-disable", None)]


def _state_bytes(optimizer):
    return sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )


def test_adafactor_by_name_trains_and_keeps_less_state_than_adam():
    x, y = make_classification(n=256)
    state, losses = {}, {}
    for name in ("adam", "adafactor"):
        torch.manual_seed(0)
        model = Blocks(hidden=64)
        trainer = Trainer(model, nn.CrossEntropyLoss(), name, lr=1e-2, progress=False, seed=0)
        assert type(trainer.optimizer).__name__ == {"adam": "Adam", "adafactor": "Adafactor"}[name]
        history = trainer.fit(make_loader(x, y, batch_size=32, shuffle=True), epochs=4)
        losses[name] = history["loss"]
        state[name] = _state_bytes(trainer.optimizer)
    params = sum(p.numel() * 4 for p in Blocks(hidden=64).parameters())
    assert state["adam"] == 2 * params
    assert state["adafactor"] < 0.25 * state["adam"]  # factored second moments: rows + columns
    assert losses["adafactor"][-1] < 0.7 * losses["adafactor"][0]


def test_optimizer_names_fused_lr_and_errors():
    model = Blocks()
    opt = build_optimizer("AdamW", model, lr=3e-4, device="cpu")
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["lr"] == 3e-4
    assert opt.param_groups[0]["fused"] is True  # the CPU has fused Adam kernels in this torch
    assert build_optimizer("sgd", model, lr=0.1, momentum=0.9).param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match="Unknown optimizer name"):
        Trainer(model, nn.CrossEntropyLoss(), "lion", progress=False)
    with pytest.raises(ValueError, match="lr= is for an optimizer given by name"):
        Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1), lr=0.1, progress=False)
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", trainable=["head"], progress=False)
    # a named optimizer holds only the trainable parameters; torch's default lr without lr=
    assert trainer.optimizer is not None
    assert {id(p) for p in trainer.optimizer.param_groups[0]["params"]} == {id(p) for p in model.head.parameters()}
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-3


def test_freezing_trains_only_matching_parameters_and_reports_counts():
    x, y = make_classification(n=64)
    torch.manual_seed(0)
    model = Blocks()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        trainable=["head.*", "blocks.2.*"],
        freeze=["blocks.2.0.*"],
        progress=False,
    )
    counts = trainer.param_counts
    expected = sum(p.numel() for p in model.head.parameters()) + sum(
        p.numel() for p in _block(model, 2)[1:].parameters()
    )
    assert counts.trainable == expected
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert counts.frozen == counts.total - expected
    assert "trainable" in str(counts) and f"{expected:,}" in str(counts)
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    for name, p in model.named_parameters():
        trained = name.startswith("head.") or (name.startswith("blocks.2.") and not name.startswith("blocks.2.0."))
        assert trained == (not torch.equal(p, before[name])), name


def test_bad_pattern_or_failed_validation_leaves_the_model_untouched():
    model = Blocks()
    with pytest.raises(ValueError, match="matches no parameter"):
        Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.1, trainable=["haed.*"], progress=False)
    with pytest.raises(ValueError):  # precision is checked after the strategy options
        Trainer(
            model,
            nn.CrossEntropyLoss(),
            "sgd",
            lr=0.1,
            trainable=["head.*"],
            activation_checkpointing=True,
            precision="fp8",
            progress=False,
        )
    with pytest.raises(ValueError, match="no blocks to checkpoint"):
        Trainer(
            model,
            nn.CrossEntropyLoss(),
            "sgd",
            lr=0.1,
            trainable=["head.*"],
            activation_checkpointing=[nn.Conv2d],
            progress=False,
        )
    with pytest.raises(ValueError, match="activation_checkpointing"):
        Trainer(
            model,
            nn.CrossEntropyLoss(),
            "sgd",
            lr=0.1,
            freeze=["inp"],
            activation_checkpointing=["blocks.7"],
            progress=False,
        )
    assert all(p.requires_grad for p in model.parameters())
    assert all("forward" not in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="no blocks to checkpoint"):  # nothing repeated in a lone Linear
        Trainer(nn.Linear(3, 2), nn.MSELoss(), "sgd", lr=0.1, activation_checkpointing=True, progress=False)


def test_freeze_parameters_function():
    model = Blocks()
    counts = freeze_parameters(model, freeze=["inp", "blocks.0.*"])
    assert not model.inp.weight.requires_grad and not model.get_parameter("blocks.0.1.weight").requires_grad
    assert model.get_parameter("blocks.1.1.weight").requires_grad
    assert counts.frozen == sum(p.numel() for p in model.inp.parameters()) + sum(
        p.numel() for p in model.blocks[0].parameters()
    )


def test_peft_lora_model_trains_only_adapters():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["0", "2"]))
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-2, progress=False)
    assert 0 < trainer.param_counts.trainable < trainer.param_counts.total
    x, y = make_classification(n=64)
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    for name, p in model.named_parameters():
        if name in frozen_before:
            assert torch.equal(p, frozen_before[name]), name


def test_compile_and_channels_last():
    torch.manual_seed(0)
    conv = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )
    x, y = torch.randn(32, 3, 8, 8), torch.randint(0, 3, (32,))
    trainer = Trainer(
        conv, nn.CrossEntropyLoss(), "sgd", lr=0.1, channels_last=True, compile={"backend": "eager"}, progress=False
    )
    assert conv.get_parameter("0.weight").is_contiguous(memory_format=torch.channels_last)
    assert type(trainer.model).__name__ == "OptimizedModule"
    history = trainer.fit(make_loader(x, y, batch_size=8), epochs=1)
    assert history.status == "finished"
    assert set(trainer.model_state_dict()) == set(conv.state_dict())  # no _orig_mod. prefixes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = Blocks()
        Trainer(plain, nn.CrossEntropyLoss(), "sgd", lr=0.1, channels_last=True, progress=False)
    assert any("no 2-D convolutions" in str(w.message) for w in caught)


class TiedLM(nn.Module):
    """An LM head tied to the embedding (GPT-2's lm_head): the tensor has two names, the head's and the embedding's."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.relu(self.mid(self.emb(x))))


def test_patterns_may_name_the_second_owner_of_a_tied_weight_and_counts_stay_deduplicated():
    tied = 20 * 8
    mid = 8 * 8 + 8
    frozen = Trainer(TiedLM(), nn.CrossEntropyLoss(), "adamw", freeze=["head"], progress=False, run_store=False)
    model: Any = frozen.model
    assert not model.emb.weight.requires_grad and model.mid.weight.requires_grad
    counts = frozen.param_counts
    assert (counts.total, counts.trainable, counts.frozen, counts.frozen_tensors) == (tied + mid, mid, tied, 1)
    only = Trainer(TiedLM(), nn.CrossEntropyLoss(), "adamw", trainable=["head.weight"], progress=False, run_store=False)
    model = only.model
    assert model.head.weight.requires_grad and not model.mid.weight.requires_grad
    assert (only.param_counts.trainable, only.param_counts.trainable_tensors) == (tied, 1)
    model = TiedLM()
    freeze_parameters(model, freeze=["head.weight"])
    assert not model.emb.weight.requires_grad
