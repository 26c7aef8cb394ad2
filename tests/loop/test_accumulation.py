"""Gradient accumulation is exact: k micro-batches == one k-times batch, ragged last window included."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from conftest import make_loader

from nbtrainer import Trainer


def _data(n_batches: int, bs: int = 4, d: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_batches * bs, d, generator=g, dtype=torch.float64)
    y = torch.randn(n_batches * bs, 1, generator=g, dtype=torch.float64)
    return x, y


def _model(d: int = 5):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(d, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()


def _reference(model, x, y, bs, k, lr):
    """Hand-written: one SGD step per window on the concatenated window (mean loss)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = x.shape[0] // bs
    for start in range(0, n, k):
        stop = min(start + k, n)
        xb, yb = x[start * bs : stop * bs], y[start * bs : stop * bs]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return model


@pytest.mark.parametrize("n_batches,k", [(8, 4), (10, 4), (7, 3), (5, 1), (3, 8)])
def test_accumulated_equals_big_batch(n_batches, k):
    x, y = _data(n_batches)
    base = _model()
    ref = _reference(copy.deepcopy(base), x, y, 4, k, lr=0.1)
    model = copy.deepcopy(base)
    trainer = Trainer(
        model,
        torch.nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        grad_accum_steps=k,
        progress=False,
        device="cpu",
    )
    history = trainer.fit(make_loader(x, y, batch_size=4), epochs=1)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    assert trainer.global_step == -(-n_batches // k)  # ceil: the ragged window still steps
    assert history.epochs[0]["steps"] == -(-n_batches // k)


class _NoLen:
    """An iterable without __len__ (e.g. a streaming dataset): the window end is found by lookahead."""

    def __init__(self, x, y, bs):
        self.x, self.y, self.bs = x, y, bs

    def __iter__(self):
        for i in range(0, self.x.shape[0], self.bs):
            yield self.x[i : i + self.bs], self.y[i : i + self.bs]


def test_ragged_window_without_len():
    x, y = _data(10)
    base = _model()
    ref = _reference(copy.deepcopy(base), x, y, 4, 4, lr=0.1)
    model = copy.deepcopy(base)
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=4, progress=False
    )
    trainer.fit(_NoLen(x, y, 4), epochs=1)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_windows_do_not_straddle_epochs():
    # 5 batches, k=2 -> windows (2, 2, 1) per epoch, never a window mixing epoch 1 and 2.
    x, y = _data(5)
    base = _model()
    ref = copy.deepcopy(base)
    _reference(ref, x, y, 4, 2, lr=0.05)
    _reference(ref, x, y, 4, 2, lr=0.05)
    model = copy.deepcopy(base)
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), grad_accum_steps=2, progress=False
    )
    trainer.fit(make_loader(x, y, batch_size=4), epochs=2)
    assert trainer.global_step == 6
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("max_steps,total,epochs", [(None, 25, 4), (20, 20, 3), (16, 16, 2)])
def test_the_progress_total_counts_again_when_accumulation_changes_mid_run(max_steps, total, epochs):
    """10 batches an epoch, accumulation 1 -> 3 after step 15 (epoch 2, batch 5): the rest of epoch 2 is 2 steps,
    each later epoch 4. The total, and under max_steps the epochs it reaches, are recounted where the change takes
    effect, so the finished run reads "25/25" (it read "25/40"), and a refresh right after already knows."""
    x, y = _data(10)
    model = _model()
    seen = []

    class Change:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 15:
                trainer.set_grad_accum_steps(3)

        def on_refresh(self, trainer, progress):
            seen.append((progress.global_step, progress.total_steps, progress.epochs))

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, torch.nn.MSELoss(), opt, callbacks=[Change()], progress=False, refresh_interval=0.0)
    history = trainer.fit(make_loader(x, y, batch_size=4), epochs=4, max_steps=max_steps)
    assert trainer.global_step == len(history.steps["step"]) == total
    p = trainer.progress
    assert (p.total_steps, p.epochs, history.steps["epoch"][-1]) == (total, epochs, epochs)  # the epoch it ended in
    assert {(t, e) for step, t, e in seen if step > 15} == {(total, epochs)}


def test_clipping_once_per_step_after_unscale_fp16():
    # fp16 + accumulation + clipping: clipping on every micro-step would raise "unscale_() has already
    # been called"; and the clipped update must match fp32 closely.
    x, y = _data(8, d=5)
    losses = {}
    for precision in ("fp32", "fp16-mixed"):
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        trainer = Trainer(
            model,
            torch.nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            grad_accum_steps=3,
            max_grad_norm=0.5,
            precision=precision,
            progress=False,
        )
        h = trainer.fit(make_loader(x.float(), y.float(), batch_size=4), epochs=3)
        losses[precision] = h["loss"]
    assert losses["fp16-mixed"] == pytest.approx(losses["fp32"], rel=2e-2)


def _step_samples(model, k: int, n_batches: int) -> list[tuple[int, dict[str, float]]]:
    """Every step-time sample of one epoch of ``n_batches`` batches of 2, accumulating ``k``: (step, times)."""
    x, y = _data(n_batches, bs=2)
    seen: list[tuple[int, dict[str, float]]] = []

    class Samples:
        def on_refresh(self, trainer, progress):
            seen.extend(progress.step_samples)

    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=1e-3), grad_accum_steps=k,
        timing_every=50, callbacks=[Samples()], progress=False,
    )  # fmt: skip
    trainer.fit(make_loader(x, y, batch_size=2), epochs=1)
    return seen


@pytest.mark.parametrize("k", [1, 3, 5, 10])
def test_every_scheduled_step_time_sample_is_taken_whatever_the_window(k):
    # The loop samples micro-batches 1, 11, 21, 31, then every timing_every; a sample times the micro-batch that closes
    # its window with its optimizer step. It waited for a scheduled micro-batch that also closed a window: with
    # grad_accum_steps=5 or 10 none ever did, and Health's data signal and the profile card got no sample at all.
    seen = [step for step, _ in _step_samples(_model(), k, 320)]
    scheduled = [m for m in range(320) if m in (11, 21, 31) or (m - 1) % 50 == 0]
    # micro-batch m (0-based) closes window ceil((m + 1) / k): the optimizer step it is recorded under
    assert seen == sorted({-(-(m + 1) // k) for m in scheduled})


@pytest.mark.parametrize("k", [1, 4])
def test_a_step_time_sample_counts_every_micro_batch_of_its_window(k):
    # The sample times the window's last micro-batch; the step it reports is k such micro-batches and the optimizer
    # step (Health's data share and the panel's step-time card read it as the step's). A forward that sleeps 3 ms:
    # a step's forward time is at least k x 3 ms (a sleep never ends early; only waits for a CPU are left out).

    class Sleepy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _model()

        def forward(self, inputs):
            time.sleep(0.003)
            return self.inner(inputs)

    times = [t for _, t in _step_samples(Sleepy(), k, 64)]
    assert times and min(t["forward"] for t in times) >= k * 3.0, times


def _ragged_reference(model, x, y, bs, k, lr):
    """Hand-written: one SGD step per window on the concatenated window, whatever its micro-batches' sizes."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    n = -(-x.shape[0] // bs)
    for start in range(0, n, k):
        xb, yb = x[start * bs : min(start + k, n) * bs], y[start * bs : min(start + k, n) * bs]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    return model


def _fit_ragged(x, y, bs, k, loader=None, **options):
    model = _model()
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=k, progress=False,
        device="cpu", **options,
    )  # fmt: skip
    trainer.fit(loader if loader is not None else make_loader(x, y, batch_size=bs), epochs=2)
    return model


# 90 samples in batches of 16: micro-batches 16, 16, 16, 16, 16, 10. With k=3 the last window is 16, 16, 10; k=4
# makes it 16, 10 (short and ragged); k=6 one window of all of them.
@pytest.mark.parametrize("k", [3, 4, 6])
@pytest.mark.parametrize("no_len", [False, True])
def test_a_ragged_last_micro_batch_accumulates_to_one_big_batch(k, no_len):
    # Each micro-batch's mean loss was divided by the window's micro-batch count, so a 10-sample micro-batch weighed
    # as much as a 16-sample one (maxdiff 8e-3 after one epoch). Compared in float64 within 1e-10 (not torch.equal):
    # one big batch's mean sums its samples in another order than per micro-batch means weighted by their sizes.
    x, y = _data(90 // 5, bs=5)
    ref = _model()
    for _ in range(2):
        _ragged_reference(ref, x, y, 16, k, lr=0.1)
    model = _fit_ragged(x, y, 16, k, loader=_NoLen(x, y, 16) if no_len else None)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


def test_a_ragged_window_is_exact_under_the_nonfinite_gate():
    x, y = _data(90 // 5, bs=5)
    ref = _model()
    for _ in range(2):
        _ragged_reference(ref, x, y, 16, 3, lr=0.1)
    model = _fit_ragged(x, y, 16, 3, on_nonfinite="skip")
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n,k", [(96, 3), (112, 3), (96, 1), (64, 8)])
@pytest.mark.parametrize("no_len", [False, True])
def test_equal_micro_batches_keep_the_arithmetic_they_had(n, k, no_len):
    # Windows of equal micro-batches (a short last one included) take exactly the operations they took before sizes
    # were weighted: each loss divided by its planned window (a loader with len() plans the short last window; one
    # without plans k), a window that ended early multiplied by planned / taken. Bit-identical.
    x, y = _data(n // 4, bs=4)
    ref = _model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches = list(make_loader(x, y, batch_size=16))
    for _ in range(2):
        for start in range(0, len(batches), k):
            window = batches[start : start + k]
            planned = k if no_len else len(window)
            for xb, yb in window:
                loss = torch.nn.functional.mse_loss(ref(xb), yb)
                (loss / planned if planned != 1 else loss).backward()
            if len(window) != planned:
                torch._foreach_mul_([p.grad for p in ref.parameters()], planned / len(window))
            opt.step()
            opt.zero_grad(set_to_none=True)
    model = _fit_ragged(x, y, 16, k, loader=_NoLen(x, y, 16) if no_len else None)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_ragged_window_under_fp16_unscales_then_weighs():
    # The GradScaler's scale is taken off before the window's size correction: fp16 tracks the fp32 result.
    x, y = _data(90 // 5, bs=5)
    ref = _model()
    for _ in range(2):
        _ragged_reference(ref, x, y, 16, 3, lr=0.1)
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=3, progress=False,
        device="cpu", precision="fp16-mixed",
    )  # fmt: skip
    trainer.fit(make_loader(x.float(), y.float(), batch_size=16), epochs=2)
    assert trainer.scaler is not None
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q.float(), rtol=0, atol=5e-4)  # 7e-3 when sizes were not weighed


def test_a_batch_split_in_uneven_parts_weighs_each_by_its_rows(monkeypatch):
    # memory_budget_gb's plan trains a loader batch as several forward / backward passes: 16 rows in 3 parts are
    # 6, 5, 5 and the last batch's 10 are 4, 3, 3. Each part weighs by its rows, so the window is still one big batch.
    monkeypatch.setattr(Trainer, "micro_split", property(lambda self: 3))
    x, y = _data(90 // 5, bs=5)
    ref = _model()
    for _ in range(2):
        _ragged_reference(ref, x, y, 16, 3, lr=0.1)
    model = _fit_ragged(x, y, 16, 3)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
