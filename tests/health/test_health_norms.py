"""Health's gradient norms, update ratios and blocks equal torch's own numbers of the same step."""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader

from nbtrainer import Health, Trainer
from nbtrainer._health._norms import find_blocks


class Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attention = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU())

    def forward(self, x):
        return x + self.mlp(self.attention(x))


class Encoder(torch.nn.Module):
    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.layer = torch.nn.ModuleList([Block(d) for _ in range(n)])
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        for block in self.layer:
            x = block(x)
        return self.norm(x)


class Net(torch.nn.Module):
    """A transformer-like stack: embedding, encoder.layer.<i>, head, and a parameter of its own."""

    def __init__(self, d: int = 10, n: int = 3, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(d, 16)
        self.encoder = Encoder(16, n)
        self.head = torch.nn.Linear(16, classes)
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.head(self.encoder(self.embed(x))) * self.scale


def test_blocks_split_the_repeated_stack():
    names = [name for name, _ in find_blocks(Net())]
    assert names == [
        "embed",
        "encoder.layer.0",
        "encoder.layer.1",
        "encoder.layer.2",
        "encoder.norm",
        "head",
        "(model)",
    ]
    seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    assert [name for name, _ in find_blocks(seq)] == ["0", "2"]  # a plain Sequential: its layers
    every = [p for _, params in find_blocks(Net()) for p in params]
    assert len(every) == len(list(Net().parameters()))  # each parameter in exactly one block


class Truth:
    """The test's own record of the sampled steps: the gradients torch clips, and the weights around the step."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.grads: dict[int, dict] = {}
        self.before: dict[int, dict] = {}
        self.after: dict[int, dict] = {}

    def on_before_optimizer_step(self, trainer, optimizer):
        step = trainer.global_step + 1
        if step in self.steps:
            self.before[step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
            if step not in self.grads:  # no clipping: the gradients as the optimizer gets them
                self.grads[step] = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()}

    def on_optimizer_step(self, trainer, step, skipped):
        if step in self.steps:
            self.after[step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def _norm(tensors):
    return torch.nn.utils.get_total_norm(list(tensors)).item()


def _block_of(name: str) -> str:
    for block in ("encoder.layer.0", "encoder.layer.1", "encoder.layer.2", "encoder.norm", "embed", "head"):
        if name.startswith(block + "."):
            return block
    return "(model)"


@pytest.mark.parametrize("clip", [None, 0.05])
def test_norms_equal_torchs_of_that_steps_gradients(monkeypatch, clip):
    """At each sampled step, history.health holds torch's norms of the step's gradients (after any unscale and
    window rescale, before clipping: with clip=0.05 every step is clipped, and the values are the unclipped ones)
    and the update-to-weight ratio of the weights around that step."""
    x, y = make_classification(n=20 * 16, d=10)
    sampled = {1, 5, 10, 15, 20}
    truth = Truth(sampled)
    if clip is not None:  # the gradients torch's clip_grad_norm_ sees, and the norm it returns: torch's truth
        original = torch.nn.utils.clip_grad_norm_
        seen: dict[int, tuple[list, float]] = {}

        def clip_and_record(params, max_norm, *a, **kw):
            params = list(params)
            grads = [p.grad.detach().clone() for p in params]
            total = original(params, max_norm, *a, **kw)
            seen[len(seen) + 1] = (grads, float(total))
            return total

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip_and_record)
    model = Net()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=1e-3),
        callbacks=[Health(every_n_steps=5), truth],
        max_grad_norm=clip,
        progress=False,
        refresh_interval=3600.0,
    )
    history = trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    health = history.health
    assert sorted(s for s, _ in health["grad_norm"]["total"]) == sorted(sampled)
    names = [n for n, _ in model.named_parameters()]
    for step in sampled:
        if clip is None:
            grads = truth.grads[step]
            total = _norm(grads.values())
        else:
            grad_list, total = seen[step]
            grads = dict(zip(names, grad_list, strict=True))
            assert total > clip  # each step was clipped: the norms below are not the clipped ones
        got = dict(health["grad_norm"]["total"])[step]
        assert got == pytest.approx(total, rel=1e-5)
        for block in ("embed", "encoder.layer.1", "head", "(model)"):
            want = _norm(g for n, g in grads.items() if _block_of(n) == block)
            assert dict(health["grad_norm"][block])[step] == pytest.approx(want, rel=1e-4)
        before, after = truth.before[step], truth.after[step]
        change = _norm(after[n] - before[n] for n in names)
        assert dict(health["update_ratio"]["total"])[step] == pytest.approx(change / _norm(before.values()), rel=1e-4)
        block_change = _norm(after[n] - before[n] for n in names if _block_of(n) == "encoder.layer.2")
        block_weights = _norm(before[n] for n in names if _block_of(n) == "encoder.layer.2")
        assert dict(health["update_ratio"]["encoder.layer.2"])[step] == pytest.approx(
            block_change / block_weights, rel=1e-4
        )


def test_accumulation_and_bf16_norms_are_the_windows_gradient():
    """With accumulation, the sampled norm is that of the window's summed gradient (what the optimizer steps)."""
    x, y = make_classification(n=12 * 8, d=10)
    truth = Truth({1, 2, 4})
    model = Net()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=[Health(every_n_steps=2), truth],
        grad_accum_steps=3,
        precision="bf16-mixed",
        progress=False,
    )
    history = trainer.fit(make_loader(x, y, batch_size=8), epochs=1)
    for step in (1, 2, 4):
        want = _norm(truth.grads[step].values())
        assert dict(history.health["grad_norm"]["total"])[step] == pytest.approx(want, rel=1e-5)


def test_frozen_blocks_are_left_out_and_optimizer_in_backward_is_said():
    x, y = make_classification(n=64, d=10)
    history = Trainer(
        Net(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, freeze=["embed.*"], callbacks=[Health()], progress=False
    ).fit(make_loader(x, y, batch_size=16), epochs=1)
    assert "embed" not in history.health["grad_norm"] and "head" in history.health["grad_norm"]
    health = Health()
    model = Net()
    Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=0.1,
        optimizer_in_backward=True,
        callbacks=[health],
        progress=False,
    ).fit(make_loader(x, y, batch_size=16), epochs=1)
    assert "optimizer_in_backward" in health.signals["gradients"].summary


class _NewBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes of the tensors the ops under it create (outputs whose storage none of the inputs has)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if
                  isinstance(t, torch.Tensor)}  # fmt: skip
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.bytes += t.untyped_storage().nbytes()
        return out


@pytest.mark.parametrize("snapshots", [False, True])
def test_a_sample_holds_one_copy_of_the_weights_not_two(monkeypatch, snapshots):
    """The update is measured against the copy of the weights taken before the step: after it the weights are
    subtracted from that copy in place, so a sampled step holds one extra copy of the trainable weights (which a
    model near its memory limit must fit), not that copy and a second one for the change. The copy a snapshot keeps
    as its weights stays as it is (the restore test trains from it): that sample makes the change anew."""
    from nbtrainer._health._norms import NormProbe

    made: list[int] = []
    original = NormProbe.after_step

    def measured(self, step):
        with _NewBytes() as mode:
            original(self, step)
        made.append(mode.bytes)

    monkeypatch.setattr(NormProbe, "after_step", measured)
    x, y = make_classification(n=20 * 16, d=10)
    model = Net()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    initial = {id(p): p.detach().clone() for p in model.parameters()}
    health = Health(every_n_steps=5, snapshot_mb=256 if snapshots else 0)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=1e-3),
                      callbacks=[health], progress=False, refresh_interval=3600.0)  # fmt: skip
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    assert len(made) == 5, made  # steps 1, 5, 10, 15, 20
    copies = [b >= weights for b in made]  # the norms are a few bytes a parameter
    if snapshots:  # the fit's first snapshot keeps the copy of step 1: untouched, the weights the fit started from
        first, probe = health._snaps.kept[0], health._probe  # the snapshot's weights are in the probe's order
        assert probe is not None
        order = probe.params
        assert first.step == 1 and all(torch.equal(a, initial[id(p)]) for a, p in zip(first.params, order, strict=True))
        assert copies[0], made
    else:
        assert not any(copies) and max(made) < weights / 10, (made, weights)
