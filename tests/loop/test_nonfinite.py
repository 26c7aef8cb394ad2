"""Non-finite training losses: ``Trainer(on_nonfinite="raise" | "skip" | "stop")``.

Detection costs no per-step host read in "raise" mode (the throttled refresh already reads every
loss); "skip"/"stop" cost none under fp16 (the flag joins the GradScaler's own inf check) and one
read per optimizer step otherwise (documented in ``nbtrainer._loop._nonfinite``). Reports name the step.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_classification, mlp

from nbtrainer import EarlyStopping, ModelCheckpoint, Trainer, load_checkpoint
from nbtrainer._loop._nonfinite import NonFiniteLossError

BAD = 5  # index of the batch whose inputs hold a NaN


def _batches(n=12, bad=(BAD,), value=float("nan")):
    x, y = make_classification(n=16 * n)
    x = x.clone()
    for b in bad:
        x[16 * b + 3, 0] = value
    return [(x[i : i + 16], y[i : i + 16]) for i in range(0, 16 * n, 16)]


def _trainer(mode="raise", model=None, opt=None, **kw):
    model = model or mlp()
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    kw.setdefault("refresh_interval", 3600.0)  # only epoch ends (and saves) read the losses
    return Trainer(model, torch.nn.CrossEntropyLoss(), opt, progress=False, device="cpu", on_nonfinite=mode, **kw)


@pytest.mark.parametrize("accum,step", [(1, BAD + 1), (2, BAD // 2 + 1), (4, BAD // 4 + 1)])
def test_raise_names_the_step_and_the_fix(accum, step):
    trainer = _trainer(grad_accum_steps=accum)
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit(_batches(), epochs=2)
    msg = str(err.value)
    assert f"first at optimizer step {step} (epoch 1)" in msg, msg  # later losses are NaN too (poisoned)
    assert "micro-batch loss" in msg and "nan" in msg
    assert "on_nonfinite='skip'" in msg and "lower the lr" in msg
    assert trainer.status == "failed" and trainer.history.status == "failed"


def _inf_loss(outputs, targets):  # a NaN becomes +inf (as log(0) would give)
    loss = torch.nn.functional.cross_entropy(outputs, targets)
    return torch.where(torch.isfinite(loss), loss, torch.full_like(loss, float("inf")))


def test_raise_for_inf_names_first_and_last_step():
    trainer = _trainer(refresh_interval=0.0)  # read at every step: only the bad batch itself is reported
    trainer.criterion = _inf_loss
    with pytest.raises(NonFiniteLossError, match=r"first at optimizer step 3 \(epoch 1\): 1 micro-batch loss inf"):
        trainer.fit(_batches(bad=(2,), value=float("inf")), epochs=1)
    trainer = _trainer()  # read at epoch end: the poisoned steps after it are named too
    with pytest.raises(NonFiniteLossError, match=r"first at optimizer step 3 \(epoch 1\), and at later steps up to 12"):
        trainer.fit(_batches(bad=(2,), value=float("inf")), epochs=1)


def test_a_raised_nonfinite_loss_leaves_every_step_in_the_history():
    """The refresh that sees the NaN raises; the steps it read (the finite ones and the NaN one after them) reach
    the History before the error goes on: the user sees where the loss went wrong, not only step 1."""
    seen = []

    class AtFailure:
        def on_exception(self, trainer, exception):
            seen.append(list(trainer.history.steps["step"]))

    trainer = _trainer(callbacks=[AtFailure()])  # one read at the epoch end: every step is pending there
    with pytest.raises(NonFiniteLossError):
        trainer.fit(_batches(), epochs=1)
    steps, losses = trainer.history.steps["step"], trainer.history.steps["loss"]
    assert steps == list(range(1, 13)) and seen == [steps]  # recorded before on_exception, nothing dropped
    assert all(math.isfinite(v) for v in losses[:BAD]) and math.isnan(losses[BAD])  # step BAD + 1: the NaN


def test_no_checkpoint_is_written_from_poisoned_weights(tmp_path):
    trainer = _trainer(callbacks=[ModelCheckpoint(tmp_path, every_n_steps=1, save_last=True)])
    with pytest.raises(NonFiniteLossError, match=f"step {BAD + 1}"):
        trainer.fit(_batches(), epochs=1)
    ckpt = load_checkpoint(tmp_path / "last.ckpt")
    assert ckpt["loop"]["global_step"] == BAD  # the save of step BAD+1 read the NaN first and refused
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("accum", [1, 2])
def test_skip_is_exactly_training_without_the_bad_window(accum):
    """A skipped window changes nothing: same weights as a run that never saw its batches."""
    batches = _batches()
    skip = _trainer("skip", grad_accum_steps=accum)
    h = skip.fit(batches, epochs=1)
    window = range(BAD - BAD % accum, BAD - BAD % accum + accum)
    clean = _trainer(grad_accum_steps=accum)
    clean.fit([b for i, b in enumerate(batches) if i not in window], epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(_weights(skip.model), _weights(clean.model), strict=True))
    row = h.epochs[0]
    assert row["skipped_steps"] == 1 and h.status == "finished"
    assert math.isfinite(row["loss"])  # the skipped window is left out of the epoch loss
    bad_step = BAD // accum + 1
    assert [e for e in h.events if e["kind"] == "nonfinite"] == [
        {"step": bad_step, "epoch": 1, "kind": "nonfinite", "old": None, "new": "loss non-finite: step skipped"}
    ]
    assert math.isnan(h.steps["loss"][bad_step - 1])  # the step series shows where it happened


def test_steps_and_skipped_steps_of_the_epoch_rows_are_run_totals():
    # The documented meaning (History's docstring): each epoch skips the NaN window, and a row counts the run's
    # skips so far, a continued fit's rows too (its epoch has no NaN); an epoch's own is the difference.
    trainer = _trainer("skip")
    h = trainer.fit(_batches(), epochs=2)
    assert [(r["steps"], r["skipped_steps"]) for r in h.epochs] == [(12, 1), (24, 2)]
    h = trainer.fit_more(_batches(bad=()), epochs=1)
    assert [(r["steps"], r["skipped_steps"]) for r in h.epochs] == [(12, 1), (24, 2), (36, 2)]


def test_skip_does_not_step_the_scheduler():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    trainer = _trainer("skip", model=model, opt=opt, scheduler=sched)
    trainer.fit(_batches(), epochs=1)
    assert sched.last_epoch == 12 - 1  # 12 windows, one skipped


def test_skip_under_fp16_uses_the_scalers_check():
    trainer = _trainer("skip", precision="fp16-mixed")
    h = trainer.fit(_batches(bad=(3, 8)), epochs=1)
    assert h.epochs[0]["skipped_steps"] >= 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert len([e for e in h.events if e["kind"] == "nonfinite"]) == 2


def test_stop_ends_the_fit_with_finite_weights():
    trainer = _trainer("stop", refresh_interval=0.0)
    h = trainer.fit(_batches(), epochs=3)
    assert h.status == "stopped"
    assert f"non-finite loss at optimizer step {BAD + 1} (epoch 1)" in h.stop_reason
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


@pytest.mark.parametrize("max_steps", [None, BAD + 3])
def test_stop_seen_in_the_last_epoch_is_still_a_stop(max_steps):
    # The losses are read only at the epoch's end (refresh_interval=3600), so a NaN in a one-epoch fit is seen
    # after the last epoch's steps: the fit used to report status "finished" with no stop_reason, as if nothing had
    # happened. With max_steps reached first, the NaN is still the reason the run reports.
    trainer = _trainer("stop")
    h = trainer.fit(_batches(), epochs=1, max_steps=max_steps)
    assert h.status == trainer.status == "stopped"
    assert h.stop_reason == f"non-finite loss at optimizer step {BAD + 1} (epoch 1): 1 micro-batch loss nan"
    assert [e["kind"] for e in h.events] == ["nonfinite"] and trainer.global_step == (max_steps or 12)


def test_fp16_overflow_handled_by_the_scaler_is_not_an_error():
    trainer = _trainer(precision="fp16-mixed")
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)  # the first steps overflow
    h = trainer.fit(_batches(bad=()), epochs=2)
    assert h.status == "finished"
    assert h.epochs[0]["skipped_steps"] > 0 and "skipped_steps" in h.epochs[1]
    assert not [e for e in h.events if e["kind"] == "nonfinite"]


def test_early_stopping_check_finite_stops():
    val = _batches(n=2, bad=(0,))
    trainer = _trainer(callbacks=[EarlyStopping("val_loss", patience=10, check_finite=True)])
    h = trainer.fit(_batches(bad=()), val, epochs=5)
    assert h.status == "stopped" and len(h.epochs) == 1
    assert h.stop_reason == "EarlyStopping: val_loss is nan"


def test_bad_mode_is_refused():
    with pytest.raises(ValueError, match="on_nonfinite must be one of 'raise', 'skip', 'stop'"):
        _trainer("ignore")


# -- what detection costs --------------------------------------------------------------------------
_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


def _count_reads(monkeypatch, fn):
    counts = {"n": 0}
    for name in _READS:
        original = getattr(torch.Tensor, name)

        def wrapper(self, *a, _orig=original, **kw):
            counts["n"] += 1
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    try:
        fn()
    finally:
        monkeypatch.undo()
    return counts["n"]


@pytest.mark.parametrize("mode,precision,per_step", [("raise", "fp32", 0), ("skip", "fp32", 1), ("stop", "fp32", 1)])
def test_host_reads_per_step(monkeypatch, mode, precision, per_step):
    """raise: no read per step; skip/stop without a scaler: exactly one read per optimizer step."""
    totals = []
    for n in (10, 40):
        batches = _batches(n=n, bad=())
        trainer = _trainer(mode, precision=precision)
        totals.append(_count_reads(monkeypatch, lambda t=trainer, b=batches: t.fit(b, epochs=1)))
    assert totals[1] - totals[0] == per_step * 30, totals


def test_skip_under_fp16_adds_no_read(monkeypatch):
    counts = []
    for mode in ("raise", "skip"):
        batches = _batches(n=20, bad=())
        trainer = _trainer(mode, precision="fp16-mixed")
        counts.append(_count_reads(monkeypatch, lambda t=trainer, b=batches: t.fit(b, epochs=1)))
    assert counts[0] == counts[1], counts
