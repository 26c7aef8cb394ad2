"""offload_activations (save_on_cpu around the forward: gradients bit-identical) and offload_optimizer (refused on
a CPU device: nothing to offload to) (issue 22)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from setup_models import lm_batches, mlp, mlp_data, tiny_llama
from torch import nn

from nbtrainer import ModelCheckpoint, Trainer


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


def test_the_offload_adapter_gives_an_ordinary_state_dict_and_takes_it_back() -> None:
    """The adapter's state dict, checked on a CPU with real torch optimizers laid out as torchao lays them out
    (one per large parameter over its host copy, one on-device optimizer for the small ones): torchao itself
    refuses to start without CUDA or XPU."""
    pytest.importorskip("torchao")
    from nbtrainer._setup._offload_optimizer import offload_optimizer_class

    def built(seed: int) -> tuple[Any, list[torch.Tensor]]:
        torch.manual_seed(seed)
        big, small = [torch.randn(64, 64, requires_grad=True) for _ in range(2)], [torch.randn(8, requires_grad=True)]
        cls: Any = offload_optimizer_class()
        opt = cls.__new__(cls)  # torchao's __init__ needs CUDA; the attributes it would set:
        # the host copies of the large parameters (torchao's param_d2h_map: device parameter -> host copy)
        hosts = {p: p.detach().clone().requires_grad_() for p in big}
        opt.param_d2h_map = {p: hosts[p] for p in big}
        opt.optim_dict = {p: torch.optim.AdamW([hosts[p]], lr=1e-2) for p in big}
        opt.d_opt = torch.optim.AdamW(small, lr=1e-2)
        opt.d_param_groups = opt.d_opt.param_groups  # the same group dicts, as torchao passes them
        opt.queue = {}
        return opt, [*[hosts[p] for p in big], *small]

    opt, params = built(0)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        for inner in [*opt.optim_dict.values(), opt.d_opt]:
            inner.step()
    saved = opt.state_dict()
    assert set(saved) == {"state", "param_groups"} and sorted(saved["state"]) == [0, 1, 2]
    assert [g["params"] for g in saved["param_groups"]] == [[0], [1], [2]]
    assert [g["params"][0].shape for g in opt.param_groups] == [(8,), (64, 64), (64, 64)], "torchao's order"
    fresh, fresh_params = built(1)
    model_weights = list(fresh.param_d2h_map)
    with torch.no_grad():  # a resume loads the model's weights before the optimizer's state
        for p in model_weights:
            p.copy_(torch.full_like(p, 0.5))
    fresh.load_state_dict(saved)
    assert all(torch.equal(host, torch.full_like(host, 0.5)) for host in fresh.param_d2h_map.values()), (
        "the CPU step must update the weights just loaded, not the copies taken at construction"
    )
    for a, b in zip(params, fresh_params, strict=True):
        assert torch.equal(opt.state[a]["exp_avg_sq"], fresh.state[b]["exp_avg_sq"])
    for group in fresh.param_groups:  # what a scheduler does after a resume
        group["lr"] = 0.125
    assert [g["lr"] for opt in [fresh.d_opt, *fresh.optim_dict.values()] for g in opt.param_groups] == [0.125] * 3
    with pytest.raises(ValueError, match=r"has 3 param groups \(one per large parameter"):
        fresh.load_state_dict({"state": {}, "param_groups": saved["param_groups"][:2]})


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _big_mlp(seed: int = 0) -> nn.Module:
    # layers of >= 4096 weights: torchao keeps tensors smaller than that (the biases) on the device
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))


def _offload_fit(
    offload: bool,
    epochs: int,
    *,
    max_steps: int | None = None,
    resume_from: str | None = None,
    seed: int = 0,
    **kwargs: Any,
) -> Trainer:
    x, y = mlp_data()
    trainer = Trainer(
        _big_mlp(seed),
        nn.CrossEntropyLoss(),
        "adamw",
        lr=1e-2,
        offload_optimizer=offload,
        device="cuda",
        progress=False,
        seed=0,
        **kwargs,
    )
    assert trainer.optimizer is not None
    # 5 batches of 26 (the last 24) with accumulation 2: every epoch ends in a ragged window of one micro-batch
    batches = [(x[i : i + 26], y[i : i + 26]) for i in range(0, 128, 26)]
    sched = torch.optim.lr_scheduler.OneCycleLR(
        trainer.optimizer, max_lr=1e-2, total_steps=trainer.total_steps(batches, epochs)
    )
    trainer.set_scheduler(sched)
    trainer.fit(batches, epochs=epochs, max_steps=max_steps, resume_from=resume_from)
    return trainer


@pytest.mark.gpu
@needs_cuda
def test_offload_optimizer_on_cuda_keeps_state_on_the_cpu() -> None:
    trainer = _offload_fit(True, 1)
    assert trainer.optimizer is not None
    # torchao keeps tensors under 4096 values (the biases, the 4 x 128 head) and their state on the device
    large = [p for p in trainer.optimizer.state if p.numel() >= 4096]
    assert len(large) == 2 and all(
        t.device.type == "cpu" for p in large for t in trainer.optimizer.state[p].values() if t.dim()
    )
    saved = trainer.optimizer.state_dict()
    assert set(saved) == {"state", "param_groups"}, "an ordinary optimizer state dict (checkpoints check it)"


@pytest.mark.gpu
@needs_cuda
def test_offload_optimizer_on_cuda_steps_like_adamw_on_the_device() -> None:
    """Accumulation with a ragged last window (the exact rescale), clipping and a schedule act on the gradients
    the CPU step reads: the weights follow AdamW on the GPU (fused CPU vs CUDA kernels: rounding only)."""
    options: dict[str, Any] = {"grad_accum_steps": 2, "max_grad_norm": 0.5}
    plain, offloaded = _offload_fit(False, 3, **options), _offload_fit(True, 3, **options)
    assert offloaded.global_step == plain.global_step == 9
    a, b = plain.model.state_dict(), offloaded.model.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    assert not torch.equal(a["0.weight"], _big_mlp().state_dict()["0.weight"].cuda())


@pytest.mark.gpu
@needs_cuda
def test_offload_optimizer_on_cuda_resumes_exactly(tmp_path: Path) -> None:
    full = _offload_fit(True, 4, grad_accum_steps=2)
    first = _offload_fit(
        True, 4, max_steps=6, grad_accum_steps=2, callbacks=[ModelCheckpoint(tmp_path, save_last=True)]
    )
    assert first.global_step == 6 and full.global_step == 12
    ckpt = torch.load(tmp_path / "last.ckpt", weights_only=True)  # plain data
    assert set(ckpt["optimizer"]) == {"state", "param_groups"}
    resumed = _offload_fit(True, 4, seed=1, grad_accum_steps=2, resume_from=str(tmp_path / "last.ckpt"))
    assert resumed.global_step == 12
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
@needs_cuda
def test_offload_optimizer_on_cuda_with_fp16_counts_the_scalers_skips() -> None:
    trainer = _offload_fit(True, 2, precision="fp16-mixed")
    assert trainer.global_step == 10
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    skipped = trainer.history.epochs[-1]["skipped_steps"]  # counted over the run
    assert skipped < trainer.global_step, "the first steps may be skipped while the scale settles, not all"
