"""Manual optimization (training_step=) through examples/dcgan.py: both optimizers step once per accumulation window,
fp16-mixed runs with one GradScaler, a mid-epoch resume is bit-exact for both networks and both optimizers, the
returned values are logged, and what cannot work is refused before the first optimizer step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nbtrainer import Trainer

_PATH = Path(__file__).resolve().parents[2] / "examples" / "dcgan.py"
_spec = importlib.util.spec_from_file_location("nbt_example_dcgan", _PATH)
assert _spec is not None and _spec.loader is not None
dcgan: Any = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = dcgan
_spec.loader.exec_module(dcgan)


def _loaders(n: int = 384) -> tuple[Any, Any]:
    train, val = dcgan.digits(batch_size=64)
    subset = torch.utils.data.Subset(train.dataset, range(n))
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(subset, batch_size=64, shuffle=True, generator=g), val


class CountSteps:
    """How often each named optimizer really stepped (its step post-hook)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def on_fit_start(self, trainer: Any) -> None:
        for name, opt in trainer.optimizer.items():
            opt.register_step_post_hook(
                lambda *_, name=name: self.counts.__setitem__(name, self.counts.get(name, 0) + 1)
            )


def test_both_optimizers_step_once_per_window_and_values_are_logged() -> None:
    train, val = _loaders()  # 6 batches
    counter = CountSteps()
    trainer = dcgan.build(accum=2, progress=False, run_store=False, callbacks=[counter])
    history = trainer.fit(train, val, epochs=2)
    assert counter.counts == {"d": 6, "g": 6} and trainer.global_step == 6  # 3 windows of 2 per epoch
    row = history.epochs[-1]
    assert {"loss", "d_loss", "val_loss", "val_d_loss"} <= set(row)
    assert all(torch.isfinite(torch.tensor(row[k])) for k in ("loss", "d_loss", "val_loss", "val_d_loss"))
    assert len(history.steps["loss"]) == 6


def test_fp16_mixed_runs_with_one_scaler() -> None:
    train, val = _loaders(256)
    trainer = dcgan.build(precision="fp16-mixed", progress=False, run_store=False)
    assert trainer.scaler is not None
    history = trainer.fit(train, val, epochs=1)
    assert history.status == "finished" and history.epochs[-1]["skipped_steps"] < trainer.global_step
    assert trainer.scaler.get_scale() > 0


def _state(trainer: Trainer) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in trainer.model.parameters()] + [b.clone() for b in trainer.model.buffers()]
    for opt in trainer.optimizer.optimizers.values():  # type: ignore[union-attr]
        for s in opt.state.values():
            out += [v.clone() for v in s.values() if isinstance(v, torch.Tensor)]
    return out


def test_a_mid_epoch_resume_is_bit_exact_for_both_networks_and_optimizers(tmp_path: Any) -> None:
    # each run gets its own loaders: the loader's generator is the user's, and a run moves its state
    straight = dcgan.build(accum=2, progress=False, run_store=False)
    straight.fit(_loaders()[0], epochs=2)
    cut = dcgan.build(accum=2, progress=False, run_store=False)
    cut.fit(_loaders()[0], epochs=2, max_steps=4)  # stops in the middle of the second epoch (3 steps per epoch)
    path = cut.save_checkpoint(str(tmp_path / "gan.ckpt"))
    resumed = dcgan.build(accum=2, progress=False, run_store=False)
    history = resumed.fit(_loaders()[0], epochs=2, resume_from=path)
    assert resumed.global_step == straight.global_step == 6
    for a, b in zip(_state(straight), _state(resumed), strict=True):
        assert torch.equal(a, b)
    assert history.steps["loss"] == straight.history.steps["loss"]


def _gan_trainer(fn: Any, **kwargs: Any) -> Trainer:
    torch.manual_seed(0)
    gan = dcgan.GAN()
    return Trainer(gan, None, dcgan.optimizers(gan), training_step=fn, progress=False, run_store=False, **kwargs)


def test_bad_manual_input_is_refused_before_the_first_step() -> None:
    train, _ = _loaders(128)
    gan = dcgan.GAN()
    with pytest.raises(ValueError, match="criterion=None and no compute_loss"):
        Trainer(gan, nn.BCEWithLogitsLoss(), dcgan.optimizers(gan), training_step=dcgan.training_step)
    with pytest.raises(ValueError, match="steps its optimizers by name"):
        Trainer(gan, None, torch.optim.Adam(gan.parameters()), training_step=dcgan.training_step)

    def unknown(step: Any, batch: Any) -> Any:
        step.step("disc")

    with pytest.raises(ValueError, match=r"step.step\('disc'\): no optimizer of that name; .*\['d', 'g'\]"):
        _gan_trainer(unknown).fit(train, epochs=1)

    def not_a_dict(step: Any, batch: Any) -> Any:
        dcgan.training_step(step, batch)
        return 1.0

    with pytest.raises(TypeError, match="training_step must return a dict of named scalar tensors"):
        _gan_trainer(not_a_dict).fit(train, epochs=1)

    def never_steps(step: Any, batch: Any) -> Any:
        loss = step.model.discriminator(batch[0]).mean()
        step.backward(loss, optimizer="d")
        return {"loss": loss}

    trainer = _gan_trainer(never_steps)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match=r"never called step.step\(name\) during its first accumulation window"):
        trainer.fit(train, epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    with pytest.raises(ValueError, match="needs validation_step"):
        _gan_trainer(dcgan.training_step).evaluate(train)
    # a val_loader without validation_step=: refused before the first step, naming it (not "no criterion")
    trainer = _gan_trainer(dcgan.training_step)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ValueError, match="evaluating needs validation_step"):
        trainer.fit(train, train, epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_returned_names_are_kept_and_the_first_is_also_the_loss() -> None:
    # {"d_loss", "g_loss"} (no "loss"): the History keeps both names, and "loss" is d_loss (the first value), in
    # training and in validation; a run that does return "loss" gets no copy of another value.
    train, val = _loaders(256)

    def named(step: Any, batch: Any) -> Any:
        out = dcgan.training_step(step, batch)
        return {"d_loss": out["d_loss"], "g_loss": out["loss"]}

    def named_val(gan: Any, batch: Any) -> Any:
        out = dcgan.validation_step(gan, batch)
        return {"d_loss": out["d_loss"], "g_loss": out["loss"]}

    trainer = _gan_trainer(named, validation_step=named_val)
    history = trainer.fit(train, val, epochs=2)
    row = history.epochs[-1]
    assert {"loss", "d_loss", "g_loss", "val_loss", "val_d_loss", "val_g_loss"} <= set(row)
    assert row["loss"] == pytest.approx(row["d_loss"], rel=1e-6) and row["loss"] != row["g_loss"]
    assert row["val_loss"] == row["val_d_loss"]
    with_loss = _gan_trainer(dcgan.training_step, validation_step=dcgan.validation_step).fit(train, val, epochs=1)
    assert "g_loss" not in with_loss.epochs[-1] and {"loss", "d_loss", "val_loss"} <= set(with_loss.epochs[-1])


def test_the_dcgan_example_draws_a_fixed_noise_grid_every_epoch_without_changing_the_run() -> None:
    train, val = _loaders(256)
    plain = dcgan.build(progress=False, run_store=False).fit(train, val, epochs=2)
    train, val = _loaders(256)
    trainer = dcgan.build(progress=False, run_store=False, callbacks=[dcgan.noise_grid(16)])
    history = trainer.fit(train, val, epochs=2)
    assert [(s["step"], s["name"], s["kind"]) for s in history.samples] == [
        (0, "fixed noise", "image"), (4, "fixed noise", "image"), (8, "fixed noise", "image"),
    ]  # fmt: skip
    assert history.samples[0]["value"] != history.samples[-1]["value"]  # the generator learned something
    assert history.steps["loss"] == plain.steps["loss"]
    import io

    from PIL import Image

    assert Image.open(io.BytesIO(history.samples[-1]["value"])).size == (32, 32)  # 4 x 4 tiles of 8 x 8


def _tiny_gan() -> tuple[Any, dict[str, Any]]:
    torch.manual_seed(0)
    gan = nn.Module()
    gan.g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))
    gan.d = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opts = {"d": torch.optim.SGD(gan.d.parameters(), lr=0.5), "g": torch.optim.SGD(gan.g.parameters(), lr=0.5)}
    return gan, opts


def _tiny_batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 8, generator=g) + 2, torch.randn(16, 4, generator=g)) for _ in range(n)]


def _tiny_d_loss(gan: Any, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bce = nn.functional.binary_cross_entropy_with_logits
    fake = gan.g(z)
    real, faked = gan.d(x), gan.d(fake.detach())
    return fake, bce(real, torch.ones_like(real)) + bce(faked, torch.zeros_like(faked))


def _tiny_g_loss(gan: Any, fake: torch.Tensor) -> torch.Tensor:
    out = gan.d(fake)
    return nn.functional.binary_cross_entropy_with_logits(out, torch.ones_like(out))


def _tiny_step(step: Any, batch: Any) -> Any:
    x, z = batch
    fake, d_loss = _tiny_d_loss(step.model, x, z)
    step.backward(d_loss, optimizer="d")
    step.step("d")
    g_loss = _tiny_g_loss(step.model, fake)
    step.backward(g_loss, optimizer="g")
    step.step("g")
    return {"loss": g_loss, "d_loss": d_loss}


def test_bf16_generator_loss_sees_the_discriminator_just_updated_as_torch_amp_does() -> None:
    # torch's AMP recipe: autocast around each forward and loss only. G's loss must use D's weights after D's step,
    # not autocast's cached bf16 copy of them from before it (one autocast region around the whole training_step)
    gan, opts = _tiny_gan()
    Trainer(gan, None, opts, training_step=_tiny_step, precision="bf16-mixed", progress=False, run_store=False).fit(
        _tiny_batches(), epochs=1
    )
    ref, ref_opts = _tiny_gan()
    for x, z in _tiny_batches():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake, d_loss = _tiny_d_loss(ref, x, z)
        torch.autograd.backward(d_loss, inputs=list(ref.d.parameters()))
        ref_opts["d"].step()
        ref_opts["d"].zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            g_loss = _tiny_g_loss(ref, fake)
        torch.autograd.backward(g_loss, inputs=list(ref.g.parameters()))
        ref_opts["g"].step()
        ref_opts["g"].zero_grad()
    for a, b in zip(gan.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_logged_lr_is_the_one_each_step_used_as_in_the_automatic_path() -> None:
    # a per-step scheduler moves the LR on inside step.step: the History keeps the LR the step used, not the next one
    data = [(torch.randn(16, 8), torch.randint(0, 3, (16,))) for _ in range(4)]

    def training_step(step: Any, batch: Any) -> Any:
        x, y = batch
        loss = nn.functional.cross_entropy(step.model(x), y)
        step.backward(loss, optimizer="main")
        step.step("main")
        return {"loss": loss}

    rows = {}
    for manual in (False, True):
        torch.manual_seed(0)
        model = nn.Linear(8, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        used: list[float] = []
        opt.register_step_pre_hook(lambda o, *_, used=used: used.append(o.param_groups[0]["lr"]))
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
        kw: dict[str, Any] = {"scheduler": {"main": sched}, "progress": False, "run_store": False}
        if manual:
            trainer = Trainer(model, None, {"main": opt}, training_step=training_step, **kw)
        else:
            trainer = Trainer(model, nn.CrossEntropyLoss(), {"main": opt}, **kw)
        history = trainer.fit(data, epochs=1)
        assert history.steps["lr"] == used == [0.1, 0.05, 0.025, 0.0125]
        rows[manual] = history.epochs[-1]["lr"]
    assert rows[True] == rows[False] == 0.0125


def test_skip_holds_back_every_step_after_a_non_finite_loss_and_counts_it_as_events_say() -> None:
    # on_nonfinite="skip": each step.step decides on every loss back-propagated in the window so far. A NaN generator
    # loss (batch 1) holds G back while D, stepped before it, keeps its update; a NaN discriminator loss (batch 2)
    # holds both back. Each such window is one skipped step and one "nonfinite" event; a hand loop agrees exactly.
    poison = [(1.0, 1.0), (1.0, float("nan")), (float("nan"), 1.0), (1.0, 1.0)]
    pairs = zip(_tiny_batches(4), poison, strict=True)
    batches = [(x, z, torch.tensor(pd), torch.tensor(pg)) for (x, z), (pd, pg) in pairs]

    def training_step(step: Any, batch: Any) -> Any:
        x, z, pd, pg = batch
        fake, d_loss = _tiny_d_loss(step.model, x, z)
        d_loss = d_loss * pd
        step.backward(d_loss, optimizer="d")
        step.step("d")
        g_loss = _tiny_g_loss(step.model, fake) * pg
        step.backward(g_loss, optimizer="g")
        step.step("g")
        return {"loss": g_loss, "d_loss": d_loss}

    gan, opts = _tiny_gan()
    kw: dict[str, Any] = {"on_nonfinite": "skip", "progress": False, "run_store": False}
    history = Trainer(gan, None, opts, training_step=training_step, **kw).fit(batches, epochs=1)
    ref, ref_opts = _tiny_gan()
    for x, z, pd, pg in batches:
        fake, d_loss = _tiny_d_loss(ref, x, z)
        d_loss = d_loss * pd
        torch.autograd.backward(d_loss, inputs=list(ref.d.parameters()))
        if torch.isfinite(d_loss):
            ref_opts["d"].step()
        ref_opts["d"].zero_grad()
        g_loss = _tiny_g_loss(ref, fake) * pg
        torch.autograd.backward(g_loss, inputs=list(ref.g.parameters()))
        if torch.isfinite(d_loss) and torch.isfinite(g_loss):
            ref_opts["g"].step()
        ref_opts["g"].zero_grad()
    for a, b in zip(gan.parameters(), ref.parameters(), strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    assert history.epochs[-1]["skipped_steps"] == 2
    assert [e["step"] for e in history.events if e["kind"] == "nonfinite"] == [2, 3]


def test_a_named_optimizer_with_only_frozen_parameters_is_refused_before_the_first_step() -> None:
    gan, opts = _tiny_gan()
    trainer = Trainer(gan, None, opts, training_step=_tiny_step, freeze=["g"], progress=False, run_store=False)
    before = [p.detach().clone() for p in gan.parameters()]
    with pytest.raises(ValueError, match=r"optimizer 'g' holds no parameter that trains.*drop it from optimizer="):
        trainer.fit(_tiny_batches(), epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, gan.parameters(), strict=True))
