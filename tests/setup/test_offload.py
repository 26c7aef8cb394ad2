"""offload_activations (save_on_cpu around the forward: gradients bit-identical) and offload_optimizer (refused on
a CPU device: nothing to offload to) (issue 22)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from setup_models import lm_batches, mlp, mlp_data, tiny_llama
from torch import nn

from nbtrainer import Trainer


def grads(trainer: Trainer, loss_of) -> dict[str, torch.Tensor]:
    trainer.model.zero_grad()
    loss_of(trainer.model).backward()
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_are_bit_identical_with_offloaded_activations(checkpointing: bool) -> None:
    batch = lm_batches(n=1)[0]
    runs = []
    for offload in (False, True):
        trainer = Trainer(
            tiny_llama(),
            None,
            "adamw",
            offload_activations=offload,
            activation_checkpointing=checkpointing,
            progress=False,
        )
        runs.append(grads(trainer, lambda m: m(**batch).loss))
    plain, offloaded = runs
    assert plain.keys() == offloaded.keys() and len(plain) > 10
    assert all(torch.equal(plain[k], offloaded[k]) for k in plain)


def test_saved_tensors_go_through_save_on_cpu_during_the_forward_only() -> None:
    model = mlp()
    Trainer(model, nn.CrossEntropyLoss(), "adamw", offload_activations=True, progress=False)
    packed = []
    original = torch.autograd.graph.save_on_cpu.__init__

    def spy(self, *args, **kwargs):  # torch's class, not ours: counts how often the forward enters it
        packed.append(kwargs.get("pin_memory", args[0] if args else None))
        original(self, *args, **kwargs)

    torch.autograd.graph.save_on_cpu.__init__ = spy  # type: ignore[method-assign]
    try:
        x, _ = mlp_data(n=8)
        model(x).sum().backward()
        with torch.no_grad():
            model(x)  # evaluation saves nothing: no offload context
    finally:
        torch.autograd.graph.save_on_cpu.__init__ = original  # type: ignore[method-assign]
    assert packed == [False]  # once, not pinned on a CPU device


def test_fit_with_offloaded_activations_matches_the_plain_fit() -> None:
    x, y = mlp_data()
    weights = []
    for offload in (False, True):
        trainer = Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", offload_activations=offload, progress=False, seed=0)
        trainer.fit((x, y), batch_size=32, epochs=2)
        weights.append(trainer.model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_offload_optimizer_on_a_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match=r"offload_optimizer=True on cpu: nothing to offload to"):
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", offload_optimizer=True, device="cpu", progress=False)
    with pytest.raises(TypeError, match=r"offload_activations= takes True or False"):
        bad: Any = "yes"
        Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", offload_activations=bad, progress=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_offload_optimizer_on_cuda_keeps_state_on_the_cpu() -> None:
    x, y = mlp_data()
    trainer = Trainer(mlp(), nn.CrossEntropyLoss(), "adamw", offload_optimizer=True, device="cuda", progress=False)
    trainer.fit((x, y), batch_size=32, epochs=1)
    assert trainer.optimizer is not None
    states = [t for s in trainer.optimizer.state_dict()["state"].values() for t in s.values() if torch.is_tensor(t)]
    assert states and all(t.device.type == "cpu" for t in states)
