"""Trainer.rollback: back to a checkpoint mid-fit at a step boundary, and on from there exactly."""

from __future__ import annotations

import threading

import pytest
import torch
from _waits import wait_while_alive
from conftest import make_classification, make_loader, mlp

from nbtrainer import CheckpointError, Health, ModelCheckpoint, Trainer


def _trainer(tmp_path, *callbacks, every_n_steps=5, **kw):
    model = mlp(hidden=16)
    ckpt = ModelCheckpoint(tmp_path / "ckpt", save_last=True, every_n_steps=every_n_steps)
    return Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        scheduler=None,
        callbacks=[ckpt, *callbacks],
        progress=False,
        seed=0,
        **kw,
    )


def _loader():
    x, y = make_classification(n=16 * 8, d=10)
    return make_loader(x, y, batch_size=16, shuffle=True, seed=1)


class RollbackAt:
    """Calls trainer.rollback() once, from on_optimizer_step (the training thread, a step boundary)."""

    def __init__(self, step: int, back_to: int = 10) -> None:
        self.step, self.back_to = step, back_to
        self.paths: list[str] = []

    def on_optimizer_step(self, trainer, step, skipped):
        if step == self.step and not self.paths:
            self.paths.append(trainer.rollback())
            assert trainer.global_step == self.back_to  # restored at once


def test_rollback_mid_fit_goes_on_exactly_as_the_run_would_have(tmp_path):
    """Rolled back from step 13 to last.ckpt (step 10, batch 2 of epoch 2), the run trains steps 11-24 again and ends
    with the weights, step series and epoch rows of a run that was never rolled back (the data order is replayed and
    the RNG restored, as a resume does)."""
    reference = _trainer(tmp_path / "a")
    expected = reference.fit(_loader(), epochs=3)
    roll = RollbackAt(13)
    trainer = _trainer(tmp_path / "b", roll)
    history = trainer.fit(_loader(), epochs=3)
    assert roll.paths == [str(tmp_path / "b" / "ckpt" / "last.ckpt")]
    assert history.steps["step"] == list(range(1, 25)) == expected.steps["step"]
    assert history.steps["loss"] == expected.steps["loss"]
    assert [r["loss"] for r in history.epochs] == [r["loss"] for r in expected.epochs]
    for a, b in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)
    (event,) = [e for e in history.events if e["kind"] == "rollback"]
    assert (event["old"], event["new"], event["step"], event["epoch"]) == (13, 10, 10, 2)
    assert history is trainer.history and history.status == "finished"


def test_rollback_from_another_thread_while_paused(tmp_path):
    """The panel's path: the fit runs in a thread and holds at a pause; rollback() from here hands the load to the
    training thread at its step boundary, returns once done, and the resumed run ends as the reference does."""
    reference = _trainer(tmp_path / "a")
    reference.fit(_loader(), epochs=3)
    trainer = _trainer(tmp_path / "b", PauseAt12())
    thread, errors = _fit_until_paused(trainer)
    try:
        assert trainer.status == "paused" and trainer.global_step == 12
        assert trainer.rollback() == str(tmp_path / "b" / "ckpt" / "last.ckpt")
        assert trainer.global_step == 10 and trainer.status == "paused"
    finally:
        trainer.resume()
        thread.join(60)
    assert not errors and trainer.history.status == "finished"
    for a, b in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)


class PauseAt12:
    """Pauses the fit at step 12, once: the rolled-back run passes step 12 again."""

    done = False

    def on_optimizer_step(self, trainer, step, skipped):
        if step == 12 and not self.done:
            self.done = True
            trainer.pause()


def _fit_until_paused(trainer) -> tuple[threading.Thread, list[BaseException]]:
    """``trainer.fit`` in a thread of its own, returned once it holds at a pause (the panel's path), with the list
    its error goes to."""
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(trainer, errors))
    thread.start()
    wait_while_alive(lambda: trainer.status == "paused", thread, f"the fit ended without pausing: {errors}")
    return thread, errors


def _run(trainer, errors):
    try:
        trainer.fit(_loader(), epochs=3)
    except BaseException as exc:  # pragma: no cover - shown by the assert
        errors.append(exc)


def test_rollback_refuses_without_a_checkpoint(tmp_path):
    model = mlp()
    bare = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    with pytest.raises(CheckpointError, match="no checkpoint to roll back to: this trainer has no ModelCheckpoint"):
        bare.rollback()
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        bare.rollback(str(tmp_path / "missing.ckpt"))
    trainer = _trainer(tmp_path)
    with pytest.raises(CheckpointError, match=r"no checkpoint to roll back to yet.*every_n_steps"):
        trainer.rollback()


def test_rollback_refuses_a_running_fit_that_is_not_paused(tmp_path):
    started, release = threading.Event(), threading.Event()

    class Hold:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 6:
                started.set()
                release.wait(30)

    trainer = _trainer(tmp_path, Hold())
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(trainer, errors))
    thread.start()
    try:
        assert started.wait(30)
        with pytest.raises(RuntimeError, match=r"needs it paused first: trainer.pause\(\)"):
            trainer.rollback()
    finally:
        release.set()
        thread.join(60)
    assert not errors and trainer.history.status == "finished" and trainer.global_step == 24


def test_rollback_between_fits_loads_the_state_for_fit_more(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.fit(_loader(), epochs=2)  # last.ckpt: the end of epoch 2 (step 16)
    trainer.fit_more(_loader(), epochs=1)
    assert trainer.global_step == 24
    trainer.rollback()
    assert trainer.global_step == 24 and trainer.run_state.loop_state.epoch_complete  # the latest last.ckpt
    trainer.rollback(str(tmp_path / "ckpt" / "last.ckpt"))
    more = trainer.fit_more(_loader(), epochs=1)
    assert trainer.global_step == 32 and [r["epoch"] for r in more.epochs] == [1, 2, 3, 4]


def test_health_stop_saves_last_and_pause_holds_at_the_next_step(tmp_path):
    """on_problem="stop" ends the run at the next step boundary with last.ckpt written there; "pause" holds there."""
    x, y = make_classification(n=16 * 40, d=10)
    loader = make_loader(x, y, batch_size=16)
    model = mlp(hidden=64)
    ckpt = ModelCheckpoint(tmp_path / "stop", save_last=True)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=5.0,  # 100x too high: an update-ratio problem at step 1
        callbacks=[Health(on_problem="stop"), ckpt],
        progress=False,
        refresh_interval=0.0,
    )
    history = trainer.fit(loader, epochs=1)
    assert history.status == "stopped" and str(history.stop_reason).startswith("Health: Step 1 changed the weights")
    assert trainer.global_step == 2
    from nbtrainer import load_checkpoint

    assert load_checkpoint(ckpt.last_path)["loop"]["global_step"] == 2

    model = mlp(hidden=64)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        "sgd",
        lr=5.0,
        callbacks=[Health(on_problem="pause")],
        progress=False,
        refresh_interval=0.0,
    )
    done: list = []
    thread = threading.Thread(target=lambda: done.append(trainer.fit(loader, epochs=1)))
    thread.start()
    try:
        for _ in range(600):
            if trainer.status == "paused":
                break
            thread.join(0.05)
        assert trainer.status == "paused" and trainer.global_step == 2
        trainer.set_lr(5.0 / 3)  # what the report advises, as the panel's button does
    finally:
        trainer.resume()
        thread.join(60)
    assert trainer.history.status == "finished" and trainer.lr == pytest.approx(5.0 / 3)


def test_rollback_to_an_epoch_end_checkpoint(tmp_path):
    """last.ckpt written at the end of epoch 2 (save_last, no every_n_steps); rolled back from step 20 (mid-epoch
    3), the run redoes epoch 3 from its start and ends as the reference run."""
    reference = _trainer(tmp_path / "a", every_n_steps=None)
    expected = reference.fit(_loader(), epochs=3)
    roll = RollbackAt(20, back_to=16)
    trainer = _trainer(tmp_path / "b", roll, every_n_steps=None)
    history = trainer.fit(_loader(), epochs=3)
    assert roll.paths and history.steps["step"] == expected.steps["step"]
    assert [r["epoch"] for r in history.epochs] == [1, 2, 3]
    for a, b in zip(trainer.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_refreshes_after_a_rollback_while_paused_show_the_restored_step(tmp_path):
    """Paused at step 12 and rolled back to step 10 from another thread: every progress snapshot after the rollback
    says step 10 or later in the replay, never the step the run left (the panel's badge said "paused at step 12" and
    drew a memory point at 12 until it trained on)."""

    class Watch:
        def __init__(self) -> None:
            self.rolled = False
            self.after: list[int] = []

        def on_control(self, trainer, event):
            if event.get("kind") == "rollback":
                self.rolled = True

        def on_refresh(self, trainer, progress):
            if self.rolled and len(self.after) < 3:  # the snapshots up to the replay's first steps
                self.after.append(progress.global_step)

    watch = Watch()
    trainer = _trainer(tmp_path, PauseAt12(), watch, refresh_interval=0.0)
    thread, errors = _fit_until_paused(trainer)
    try:
        assert trainer.status == "paused" and trainer.global_step == 12
        trainer.rollback()
        assert trainer.global_step == 10
        # still paused, the loop shows the restored state at its next refresh; rollback() returns once the state is
        # restored, before that refresh, and a resume at once would let the run train on first (trial 34: [11, 12,
        # 13]), so the paused refresh is waited for, as a person sees it before clicking Resume
        wait_while_alive(lambda: watch.after, thread, "the fit ended before a refresh after the rollback")
    finally:
        trainer.resume()
        thread.join(60)
    assert not errors
    assert watch.after and watch.after[0] == 10 and max(watch.after) <= 12, watch.after
    assert watch.after == sorted(watch.after), watch.after
