"""Continuing a run on purpose (``Trainer.fit_more``) and the refusal of a schedule too short for a fit.

The case from the issue: a finished OneCycleLR run, resumed with more epochs, used to fail at its first
step with torch's "Tried to step 109 times" (the saved scheduler replaces the one built for the longer
run). Now the fit is refused before anything is loaded, naming ``fit_more``; and ``fit_more`` trains the
extra epochs on a fresh schedule, from a checkpoint exactly as in the same process.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_classification, make_loader
from torch.optim.lr_scheduler import CosineAnnealingLR, OneCycleLR

from nbtrainer import ModelCheckpoint, Trainer

BATCHES, BATCH = 6, 16  # 6 optimizer steps per epoch


def _setup(ckpt_dir=None, seed=0, epochs=3, scheduler=True, **kw):
    x, y = make_classification(n=BATCHES * BATCH)
    loader = make_loader(x, y, batch_size=BATCH, shuffle=True, seed=seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Dropout(0.1), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    callbacks = [ModelCheckpoint(ckpt_dir, save_last=True)] if ckpt_dir is not None else []
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        seed=seed,
        deterministic=True,
        progress=False,
        device="cpu",
        callbacks=callbacks,
        **kw,
    )
    if scheduler:
        trainer.set_scheduler(OneCycleLR(opt, max_lr=1e-2, total_steps=trainer.total_steps(loader, epochs)))
    return trainer, loader


def _fresh_cycle(max_lr=5e-3):
    return lambda optimizer, steps: OneCycleLR(optimizer, max_lr=max_lr, total_steps=steps)


def _weights(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_resume_of_a_finished_onecycle_with_more_epochs_is_refused_before_anything_loads(tmp_path):
    first, loader = _setup(tmp_path, epochs=3)
    first.fit(loader, epochs=3)
    # The user builds a OneCycle for the longer run; the checkpoint's (used-up) one would replace it.
    second, loader = _setup(tmp_path, seed=7, epochs=5)
    before = _weights(second)
    with pytest.raises(ValueError, match=r"(?s)checkpoint's OneCycleLR has 0 of its total_steps=18 .*fit_more\("):
        second.fit(loader, epochs=5, resume_from="last")
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(second), strict=True))  # nothing loaded
    assert second.global_step == 0 and not second.optimizer.state
    # Resuming to the planned end (epochs=3) is still fine: nothing left to do.
    assert second.fit(loader, epochs=3, resume_from="last").status == "finished"


def test_resume_keeps_the_checkpoints_accumulation_and_says_so(tmp_path):
    # The run was saved with grad_accum_steps=3; a Trainer built with 2 resumes it. The checkpoint's accumulation
    # is kept (the run continues exactly: same weights as the run left alone), and the change is no longer silent:
    # a warning naming both values and the fix, and an event in the History.
    alone, loader = _setup(scheduler=False, grad_accum_steps=3)
    alone.fit(loader, epochs=2)
    first, loader = _setup(tmp_path, scheduler=False, grad_accum_steps=3)
    first.fit(loader, epochs=1)
    second, loader = _setup(tmp_path, seed=7, scheduler=False, grad_accum_steps=2)
    with pytest.warns(UserWarning, match=r"grad_accum_steps=3, this trainer has grad_accum_steps=2.*Build the Trainer"):
        h = second.fit(loader, epochs=2, resume_from="last")
    assert second.grad_accum_steps == 3 and second.global_step == alone.global_step == 4
    assert all(torch.equal(a, b) for a, b in zip(_weights(alone), _weights(second), strict=True))
    change = [e for e in h.events if e["kind"] == "grad_accum_steps"]
    assert change == [{"step": 2, "epoch": 1, "kind": "grad_accum_steps", "old": 2, "new": 3, "source": "checkpoint"}]


def test_fit_more_from_a_checkpoint_equals_fit_more_in_process(tmp_path):
    a, loader_a = _setup(tmp_path, epochs=3)
    a.fit(loader_a, epochs=3)
    ckpt = str(tmp_path / "epoch3.ckpt")
    a.save_checkpoint(ckpt)  # (the run goes on writing last.ckpt)
    ha = a.fit_more(loader_a, epochs=2, scheduler=_fresh_cycle())

    b, loader_b = _setup(None, seed=11, epochs=3)  # another seed and weights: all comes from the checkpoint
    hb = b.fit_more(loader_b, epochs=2, resume_from=ckpt, scheduler=_fresh_cycle())

    for h, t in ((ha, a), (hb, b)):
        assert h.status == "finished" and [r["epoch"] for r in h.epochs] == [1, 2, 3, 4, 5]
        assert t.global_step == 5 * BATCHES and h.steps["step"] == list(range(1, 5 * BATCHES + 1))
        assert isinstance(t.scheduler, OneCycleLR) and t.scheduler.total_steps == 2 * BATCHES
        assert t.scheduler.last_epoch == 2 * BATCHES  # the fresh cycle ran exactly to its end
        assert [e for e in h.events if e["kind"] == "fit_more"] == [
            {"step": 3 * BATCHES, "epoch": 3, "kind": "fit_more", "old": 3, "new": 5}
        ]
        ext = h.steps["lr"][3 * BATCHES :]
        assert ext[0] == pytest.approx(5e-3 / 25) and max(ext) == pytest.approx(5e-3, rel=0.05)
    assert all(torch.equal(p, q) for p, q in zip(_weights(a), _weights(b), strict=True))
    assert ha.steps == hb.steps
    assert [r["loss"] for r in ha.epochs] == [r["loss"] for r in hb.epochs]


def test_fit_more_keeping_a_used_up_onecycle_is_refused_before_any_step():
    trainer, loader = _setup(epochs=2)
    first = trainer.fit(loader, epochs=2)
    before = _weights(trainer)
    with pytest.raises(
        ValueError, match=r"(?s)This trainer's OneCycleLR has 0 of its total_steps=12.*scheduler=lambda"
    ):
        trainer.fit_more(loader, epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(trainer), strict=True))
    assert trainer.history is first and first.status == "finished" and trainer.global_step == 12


def test_a_second_fit_on_a_used_up_onecycle_is_refused_with_the_way_out():
    trainer, loader = _setup(epochs=2)
    trainer.fit(loader, epochs=2)
    with pytest.raises(ValueError, match=r"(?s)has 0 of its total_steps=12 .*needs 12 more.*fit_more"):
        trainer.fit(loader, epochs=2)


def test_fit_more_keeps_an_open_ended_schedule_and_numbers_epochs_on():
    trainer, loader = _setup(epochs=2, scheduler=False)
    trainer.set_scheduler(CosineAnnealingLR(trainer.optimizer, T_max=100))
    first = trainer.fit(loader, epochs=2)
    more = trainer.fit_more(loader, epochs=2)
    assert more is not first and len(first.epochs) == 2  # the earlier History is left as it was
    assert [r["epoch"] for r in more.epochs] == [1, 2, 3, 4] and trainer.scheduler.last_epoch == 4 * BATCHES


def test_fit_more_without_a_schedule_trains_at_the_reference_lr():
    trainer, loader = _setup(epochs=2)
    trainer.fit(loader, epochs=2)
    assert trainer.current_lr < 1e-3  # the one-cycle ended low (max_lr=1e-2)
    more = trainer.fit_more(loader, epochs=1, scheduler=None)
    assert trainer.scheduler is None
    assert more.steps["lr"][2 * BATCHES :] == [1e-2] * BATCHES  # OneCycle's max_lr, constant


def test_fit_more_finishes_an_epoch_that_was_cut_short():
    trainer, loader = _setup(scheduler=False)
    h = trainer.fit(loader, epochs=3, max_steps=BATCHES + 2)  # epoch 2 stopped after 2 of 6 steps
    assert len(h.epochs) == 1
    more = trainer.fit_more(loader, epochs=1)  # finishes epoch 2 (the first of the "1 more")
    assert [r["epoch"] for r in more.epochs] == [1, 2] and trainer.global_step == 2 * BATCHES
    assert more.steps["step"] == list(range(1, 2 * BATCHES + 1))


def test_fit_more_max_steps_counts_steps_of_the_extension():
    trainer, loader = _setup(scheduler=False)
    trainer.fit(loader, epochs=1)
    more = trainer.fit_more(loader, epochs=3, max_steps=4)
    assert trainer.global_step == BATCHES + 4 and more.status == "finished"
    assert more.stop_reason == f"max_steps={BATCHES + 4} reached"


def test_fit_more_takes_arrays_as_fit_does():
    """``fit((x, y), batch_size=...)`` then ``fit_more`` on the same arrays: the extension batches them the same way
    (8 steps an epoch at 12 items a batch) and validates on ``val_data``."""
    trainer, _ = _setup(scheduler=False)
    x, y = make_classification(n=BATCHES * BATCH)
    trainer.fit((x, y), val_data=(x[:24], y[:24]), batch_size=12, epochs=1)
    more = trainer.fit_more((x, y), val_data=(x[:24], y[:24]), batch_size=12, shuffle=False, epochs=2)
    assert trainer.global_step == 3 * 8 and [r["epoch"] for r in more.epochs] == [1, 2, 3]
    assert all("val_loss" in r for r in more.epochs)
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        trainer.fit_more((x, y), epochs=1)  # arrays without a batch size are refused as in fit


def test_fit_more_refusals():
    trainer, loader = _setup(scheduler=False)
    with pytest.raises(RuntimeError, match=r"has not trained yet: call trainer\.fit"):
        trainer.fit_more(loader, epochs=1)
    trainer.fit(loader, epochs=1)
    with pytest.raises(ValueError, match="how many more"):
        trainer.fit_more(loader, epochs=0)
    with pytest.raises(TypeError, match=r"takes a function \(optimizer, total_steps\)"):
        trainer.fit_more(loader, epochs=1, scheduler=CosineAnnealingLR(trainer.optimizer, T_max=3))
    with pytest.raises(ValueError, match="on the optimizer it is given"):
        other = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
        trainer.fit_more(loader, epochs=1, scheduler=lambda opt, steps: CosineAnnealingLR(other, T_max=steps))


def test_fit_more_fresh_schedule_needs_no_matching_scheduler_in_the_new_trainer(tmp_path):
    first, loader = _setup(tmp_path, epochs=2)
    first.fit(loader, epochs=2)
    # No scheduler configured at all: the checkpoint's is not used, a fresh one is built.
    b, loader = _setup(None, seed=3, scheduler=False)
    more = b.fit_more(loader, epochs=1, resume_from=str(tmp_path / "last.ckpt"), scheduler=_fresh_cycle(2e-3))
    assert len(more.epochs) == 3 and b.scheduler.total_steps == BATCHES
    # ... while keeping it needs one to load it into (the existing resume check).
    c, loader = _setup(None, seed=3, scheduler=False)
    with pytest.raises(Exception, match="Configure the scheduler as in the original run"):
        c.fit_more(loader, epochs=1, resume_from=str(tmp_path / "last.ckpt"))


def test_resume_with_fewer_epochs_than_the_checkpoint_has_is_refused_up_front(tmp_path):
    first, loader = _setup(tmp_path, scheduler=False)
    first.fit(loader, epochs=6)
    second, loader = _setup(tmp_path, seed=7, scheduler=False)
    before = _weights(second)
    with pytest.raises(ValueError, match=r"(?s)at epoch 6 \(6 epoch\(s\) done\).*epochs=5.*fit_more\("):
        second.fit(loader, epochs=5, resume_from="last")
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(second), strict=True))  # nothing loaded
    assert second.status == "idle" and not second.history.epochs


@pytest.mark.parametrize("spelling", ["last-if-exists", "auto"])
def test_resume_from_last_if_exists_starts_fresh_then_resumes_and_says_which(tmp_path, spelling):
    import io

    from nbtrainer import ProgressBar

    out = io.StringIO()
    first, loader = _setup(tmp_path / "ckpt", scheduler=False, epochs=2)
    first.add_callback(ProgressBar(mode="lines", file=out))
    history = first.fit(loader, epochs=2, resume_from=spelling)  # no last.ckpt yet: a fresh run
    assert history.status == "finished" and len(history) == 2
    fresh = str(tmp_path / "ckpt" / "last.ckpt")
    assert f"resume_from={spelling!r}: no {fresh} yet, starting fresh" in out.getvalue().splitlines()
    assert [e["new"] for e in history.events if e["kind"] == "resume_from"] == [f"no {fresh} yet, starting fresh"]

    out = io.StringIO()
    second, loader = _setup(tmp_path / "ckpt", seed=7, scheduler=False)
    second.add_callback(ProgressBar(mode="lines", file=out))
    history = second.fit(loader, epochs=3, resume_from=spelling)
    assert [r["epoch"] for r in history] == [1, 2, 3]  # epochs 1-2 came from the checkpoint
    assert f"resume_from={spelling!r}: resuming from {fresh}" in out.getvalue().splitlines()


def test_resume_from_last_if_exists_needs_a_model_checkpoint():
    trainer, loader = _setup(scheduler=False)
    with pytest.raises(ValueError, match=r"last-if-exists.*ModelCheckpoint\(dirpath, save_last=True\)"):
        trainer.fit(loader, epochs=1, resume_from="last-if-exists")
