"""What the panel asks for after the run's last optimizer step (during its last validation) is not lost."""

from __future__ import annotations

import threading

import pytest
from widget_helpers import make_widget


class HoldLastValidation:
    """Holds the last epoch's validation until ``gate`` is set: the run has taken its last optimizer step."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs
        self.inside, self.gate = threading.Event(), threading.Event()

    def on_validation_start(self, trainer) -> None:
        if trainer.run_state.loop_state.epoch + 1 == self.epochs:
            self.inside.set()
            self.gate.wait(60)


def test_lr_and_accumulation_set_during_the_last_validation_reach_the_trainer():
    held = HoldLastValidation(epochs=2)
    w = make_widget(epochs=2, callbacks=[held])
    w.start()
    assert held.inside.wait(60), "the last validation never started"
    w.view.lr.value = 0.2  # what dragging the slider does: no step boundary comes after this in the run
    w.view.accum.value = 4
    held.gate.set()
    w.wait()
    assert w.trainer.lr == pytest.approx(0.2), "the LR the slider shows was never applied to the optimizer"
    assert w.trainer.grad_accum_steps == 4, "the accumulation the control shows was never applied"
    w.start()  # the next run trains with what the controls show
    h = w.wait()
    assert w.view.lr.value == pytest.approx(0.2) and h.steps["lr"][0] == pytest.approx(0.2)
    assert w.view.accum.value == 4 and len(h.steps["step"]) == 2 * 32 // 4


def test_save_during_the_last_validation_returns_when_the_run_ends(tmp_path):
    held = HoldLastValidation(epochs=1)
    w = make_widget(epochs=1, callbacks=[held])
    w.start()
    assert held.inside.wait(60), "the last validation never started"
    box: dict = {}
    path = str(tmp_path / "last-val.ckpt")
    saver = threading.Thread(target=lambda: box.update(path=w.save_checkpoint(path)), daemon=True)
    saver.start()
    held.gate.set()
    w.wait()
    saver.join(30)
    assert not saver.is_alive(), "save_checkpoint still blocks after the run ended (waits for a step that never comes)"
    assert box["path"].endswith("last-val.ckpt") and (tmp_path / "last-val.ckpt").exists()


def test_a_run_that_fails_before_its_first_step_does_not_show_the_last_runs_summary_as_its_own(tmp_path):
    from nbtrainer import ModelCheckpoint

    # validation every second epoch: a one-epoch run never logs the val_loss the checkpoint monitors (refused by fit)
    w = make_widget(epochs=2, val_every_n_epochs=2, callbacks=[ModelCheckpoint(tmp_path, monitor="val_loss")])
    w.start()
    first = w.wait()
    assert first.status == "finished" and "finished" in w.summary_html
    w.view.epochs.value = 1
    w.start()
    with pytest.raises(ValueError, match="will never log"):
        w.wait()
    assert w.status == "failed" and "nbt-status-failed" in w.view.status.value
    assert "ValueError" in w.view.status.value, "the badge names no reason (the last run's stop_reason, None)"
    section = w.view.summary_section
    assert "nbt-summary-previous" in section.root._dom_classes, "the last run's summary is shown as this run's"
    bundle = w._summary.bundle()
    assert "previous run" in bundle["text/html"] and "finished, 2 epoch(s)" in bundle["text/html"]
