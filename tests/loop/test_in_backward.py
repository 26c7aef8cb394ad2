"""Trainer(optimizer_in_backward=True): each parameter updated inside backward, its gradient freed at once.

The weights must equal a plain step's for every per-parameter optimizer (bit for bit on a CPU), schedules and
resume must work as before, the gradients must never all exist together (measured: the step's peak of live
tensor memory drops by about the parameters' size), and every combination that needs all gradients at once is
refused up front with the reason and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nbtrainer import ModelCheckpoint, Trainer
from nbtrainer._memory._peak import track_peak


def model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def data(n: int = 256, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)
    return [(x[i : i + 32], y[i : i + 32]) for i in range(0, n, 32)]


def sgd_two_groups(m: nn.Sequential) -> torch.optim.Optimizer:
    first, rest = list(m[0].parameters()), [p for layer in (m[2], m[4]) for p in layer.parameters()]
    return torch.optim.SGD(
        [{"params": first, "lr": 0.05}, {"params": rest, "weight_decay": 1e-3}], lr=0.1, momentum=0.9
    )


OPTIMIZERS: dict[str, Any] = {
    "adamw": "adamw",
    "sgd two groups": sgd_two_groups,
    "adafactor": "adafactor",
    "adamw8bit": "adamw8bit",
}


def fit(in_backward: bool, optimizer: Any, *, epochs: int = 3, max_steps: int | None = None, **kwargs: Any) -> Trainer:
    m = model()
    opt = optimizer(m) if callable(optimizer) else optimizer
    if isinstance(opt, str):
        kwargs["lr"] = 1e-2
    trainer = Trainer(
        m, nn.CrossEntropyLoss(), opt, optimizer_in_backward=in_backward, progress=False, seed=0, **kwargs
    )
    assert trainer.optimizer is not None
    sched = torch.optim.lr_scheduler.OneCycleLR(
        trainer.optimizer,
        max_lr=[g["lr"] for g in trainer.optimizer.param_groups],
        total_steps=trainer.total_steps(data(), epochs),
        cycle_momentum="betas" in trainer.optimizer.defaults or "momentum" in trainer.optimizer.defaults,
    )
    trainer.set_scheduler(sched)
    trainer.fit(data(), epochs=epochs, max_steps=max_steps)
    return trainer


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_weights_equal_a_plain_step_with_a_schedule(name: str) -> None:
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    plain, in_bwd = fit(False, OPTIMIZERS[name]), fit(True, OPTIMIZERS[name])
    a, b = plain.model.state_dict(), in_bwd.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a), "a step in backward is the same arithmetic as a plain step"
    assert not torch.equal(a["0.weight"], model().state_dict()["0.weight"]), "it trained"
    assert [e["lr"] for e in plain.history.epochs] == [e["lr"] for e in in_bwd.history.epochs]
    assert in_bwd.global_step == plain.global_step == 24
    assert all(p.grad is None for p in in_bwd.model.parameters())


def _counter(m: nn.Module, seen: list[int]) -> Any:
    def count(_: torch.Tensor) -> None:
        seen.append(sum(p.grad is not None for p in m.parameters()))

    return count


def test_no_gradient_is_kept_until_the_end_of_backward() -> None:
    """The step's peak of live tensor memory falls by about the gradients' size (all the parameters here)."""
    peaks = {}
    for in_bwd in (False, True):
        torch.manual_seed(0)
        m = nn.Sequential(*[nn.Linear(256, 256) for _ in range(8)])
        trainer = Trainer(m, nn.MSELoss(), "adamw", optimizer_in_backward=in_bwd, progress=False)
        x, y = torch.randn(8, 256), torch.randn(8, 256)
        trainer.fit([(x, y)], epochs=1)  # the optimizer state exists from here on
        seen: list[int] = []

        # how many gradients exist when the first layer's weight (among the last in backward) is complete
        first: Any = m[0]
        hook = first.weight.register_post_accumulate_grad_hook(_counter(m, seen))
        with track_peak(m, trainer.optimizer, inputs=(x, y)) as peak:
            trainer.fit([(x, y)], epochs=2, resume_from=None)
        hook.remove()
        peaks[in_bwd] = peak.peak_bytes
        if in_bwd:
            # this hook was registered after the update hook of the first layer's weight: by then only the
            # first layer's bias (whose hook comes after) can still hold its gradient
            assert max(seen) <= 1, seen
        else:
            assert min(seen) == 16, "a plain step keeps every gradient until after backward"
    grads = 8 * (256 * 256 + 256) * 4
    # the saving is every gradient but the one being applied, less the update's temporaries of one parameter
    # (AdamW's denominator): at least all gradients but the two largest
    assert peaks[False] - peaks[True] >= grads - 2 * 256 * 256 * 4, (peaks, grads)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ],
)
def test_resume_is_exact(tmp_path: Path, device: str) -> None:
    full = fit(True, "adamw", epochs=4, device=device)
    first = fit(
        True, "adamw", epochs=4, max_steps=16, device=device, callbacks=[ModelCheckpoint(tmp_path, save_last=True)]
    )
    m = model(seed=1)  # other weights: the checkpoint must bring them back
    resumed = Trainer(
        m, nn.CrossEntropyLoss(), "adamw", lr=1e-2, optimizer_in_backward=True, progress=False, seed=0, device=device
    )
    assert resumed.optimizer is not None
    resumed.set_scheduler(
        torch.optim.lr_scheduler.OneCycleLR(
            resumed.optimizer, max_lr=[1e-2], total_steps=resumed.total_steps(data(), 4)
        )
    )
    resumed.fit(data(), epochs=4, resume_from=str(tmp_path / "last.ckpt"))
    assert first.global_step == 16 and resumed.global_step == full.global_step == 32
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_nonfinite_window_updates_nothing_as_with_a_plain_step() -> None:
    batches = data()
    x, y = batches[3]
    batches[3] = (torch.full_like(x, float("nan")), y)
    out = []
    for in_bwd in (False, True):
        m = model()
        trainer = Trainer(
            m,
            nn.CrossEntropyLoss(),
            "adamw",
            lr=1e-2,
            on_nonfinite="skip",
            optimizer_in_backward=in_bwd,
            progress=False,
            seed=0,
        )
        history = trainer.fit(batches, epochs=2)
        out.append((m.state_dict(), history.epochs[-1]["skipped_steps"]))
    (a, skipped_a), (b, skipped_b) = out
    assert skipped_a == skipped_b == 2
    assert all(torch.equal(a[k], b[k]) and torch.isfinite(b[k]).all() for k in a)


def test_lr_find_runs_and_restores_the_model() -> None:
    m = model()
    trainer = Trainer(m, nn.CrossEntropyLoss(), "adamw", lr=1e-3, optimizer_in_backward=True, progress=False)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    result = trainer.lr_find(data() * 3, min_lr=1e-5, max_lr=1.0, steps=20)
    assert len(result.lrs) >= 5 and all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(p.grad is None for p in m.parameters())
    trainer.fit(data(), epochs=1)  # the sweep's hooks are gone; the fit's own work
    assert not torch.equal(before["0.weight"], m.state_dict()["0.weight"])


class SharedAcrossACheckpoint(nn.Module):
    """A layer used inside a reentrantly checkpointed segment and again outside it: its gradient comes in two
    parts, from the segment's own backward and from the outer one."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.shared, self.head = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        h = checkpoint(lambda t: torch.relu(self.shared(t)), x, use_reentrant=True)
        return self.head(self.shared(h))


def test_a_gradient_in_two_parts_is_refused_before_a_second_update() -> None:
    trainer = Trainer(
        SharedAcrossACheckpoint(), nn.CrossEntropyLoss(), "adamw", optimizer_in_backward=True, progress=False
    )
    x = torch.randn(8, 16, requires_grad=True)  # reentrant checkpointing needs an input that requires grad
    with pytest.raises(RuntimeError, match=r"received its gradient in two parts in one backward.*use_reentrant=False"):
        trainer.fit([(x, torch.randint(0, 4, (8,)))], epochs=1)
    plain = Trainer(SharedAcrossACheckpoint(), nn.CrossEntropyLoss(), "adamw", progress=False)
    assert plain.fit([(x, torch.randint(0, 4, (8,)))], epochs=1).status == "finished"  # the model itself is fine


class GradNorm:
    def on_before_optimizer_step(self, trainer: Any, optimizer: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_grad_norm": 1.0}, r"max_grad_norm=1.0 clips by the norm of all gradients.*drop max_grad_norm"),
        ({"precision": "fp16-mixed"}, r"fp16-mixed's GradScaler checks every gradient.*use bf16-mixed"),
        ({"grad_accum_steps": 4}, r"grad_accum_steps=4 keeps the gradients.*grad_accum_steps=1"),
        ({"optimizer": torch.optim.LBFGS}, r"LBFGS re-evaluates the loss through a closure"),
        ({"callbacks": [GradNorm()]}, r"the callback GradNorm has on_before_optimizer_step.*on_optimizer_step"),
        ({"optimizer": None}, r"there is no optimizer to step in backward"),
    ],
)
def test_what_needs_every_gradient_at_once_is_refused_up_front(options: dict[str, Any], match: str) -> None:
    m = model()
    optimizer = options.pop("optimizer", "adamw")
    if isinstance(optimizer, type):
        optimizer = optimizer(m.parameters())
    with pytest.raises(ValueError, match=r"optimizer_in_backward=True: " + match):
        Trainer(m, nn.CrossEntropyLoss(), optimizer, optimizer_in_backward=True, progress=False, **options)


def test_paged_optimizers_are_refused() -> None:
    pytest.importorskip("bitsandbytes")
    with pytest.raises(
        ValueError, match=r"PagedAdamW8bit synchronizes the device at every step.*optimizer='adamw8bit'"
    ):
        Trainer(model(), nn.CrossEntropyLoss(), "paged_adamw8bit", optimizer_in_backward=True, progress=False)


def test_changes_that_would_break_it_later_are_refused_too() -> None:
    trainer = Trainer(model(), nn.CrossEntropyLoss(), "adamw", optimizer_in_backward=True, progress=False)
    with pytest.raises(ValueError, match=r"grad_accum_steps=2 keeps the gradients"):
        trainer.set_grad_accum_steps(2)
    with pytest.raises(ValueError, match=r"max_grad_norm=0.5 clips"):
        trainer.set_max_grad_norm(0.5)
    with pytest.raises(ValueError, match=r"GradScaler"):
        trainer.set_precision("fp16-mixed")
    with pytest.raises(ValueError, match=r"callback GradNorm"):
        trainer.add_callback(GradNorm())
    assert trainer.grad_accum_steps == 1 and trainer.max_grad_norm is None and trainer.precision == "fp32"
    trainer.callbacks.append(GradNorm())  # around add_callback: the fit refuses it before any step
    with pytest.raises(ValueError, match=r"callback GradNorm"):
        trainer.fit(data(), epochs=1)
    assert trainer.global_step == 0
    with pytest.raises(TypeError, match=r"optimizer_in_backward= takes True or False"):
        bad: Any = "yes"
        Trainer(model(), nn.CrossEntropyLoss(), "adamw", optimizer_in_backward=bad, progress=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_same_weights_with_less_peak_memory() -> None:
    """The hooks run on autograd's device thread there; the weights follow a plain step's, and the peak of
    allocated memory falls by about the gradients' size."""
    import gc

    peaks, weights = {}, {}
    for in_bwd in (False, True):
        gc.collect()  # the first run's trainer (reference cycles) must not count in the second's peak
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        m = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)])
        trainer = Trainer(
            m, nn.MSELoss(), "adamw", lr=1e-3, device="cuda", optimizer_in_backward=in_bwd, progress=False, seed=0
        )
        g = torch.Generator().manual_seed(0)
        batches = [(torch.randn(64, 1024, generator=g), torch.randn(64, 1024, generator=g)) for _ in range(4)]
        trainer.fit(batches, epochs=1)  # the optimizer state exists from here on
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        trainer.fit(batches, epochs=2)
        torch.cuda.synchronize()
        # the fit resets the peak at each refresh (the panel's memory chart); progress keeps the fit's peak
        peaks[in_bwd] = max(torch.cuda.max_memory_allocated(), trainer.progress.memory_peak or 0)
        del trainer
        weights[in_bwd] = {k: v.cpu() for k, v in m.state_dict().items()}
    for k in weights[False]:
        torch.testing.assert_close(weights[True][k], weights[False][k])
    grads = 8 * (1024 * 1024 + 1024) * 4
    assert peaks[False] - peaks[True] >= grads - 2 * 1024 * 1024 * 4, (peaks, grads)
