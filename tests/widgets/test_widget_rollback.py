"""A rollback mid-run (the health card's button, or ``trainer.rollback`` while paused) redraws the charts from the
checkpoint's step: what still holds there stays drawn."""

from __future__ import annotations

import numpy as np
import pytest
from widget_helpers import make_widget, wait_for

from nbtrainer import ModelCheckpoint


def test_a_rollback_keeps_the_change_markers_and_the_memory_up_to_the_checkpoints_step(tmp_path):
    w = make_widget(
        n=1024, epochs=1, slow=0.01, val=False, callbacks=[ModelCheckpoint(tmp_path, save_last=True, every_n_steps=10)]
    )
    w.start()
    wait_for(lambda: w.trainer.global_step >= 5, what="step 5")
    w.view.lr.value = 0.1  # a change before the checkpoint's step: still in effect after the rollback
    wait_for(lambda: w.trainer.global_step >= 25, what="step 25")
    w.pause()
    wait_for(lambda: w.status == "paused", what="paused")
    w.trainer.rollback("last")  # what the health card's rollback button does
    rolled_to = w.trainer.global_step
    w.resume()
    h = w.wait()
    (change,) = [e for e in h.events if e["kind"] == "lr"]
    assert change["step"] < rolled_to == 20
    assert w.charts.lr_events.x.tolist() == [change["step"]], "the LR change's marker was lost in the rollback"
    assert w.charts.lr_events.y.tolist() == pytest.approx([0.1])
    assert w.charts.loss_events.x.tolist() == [change["step"]]
    memory = np.asarray(w.charts.memory.x)
    assert memory.min() <= 10, f"the memory drawn before the checkpoint's step was lost: {memory.tolist()}"
    assert w.charts.raw.x.tolist() == h.steps["step"] == list(range(1, 65))
