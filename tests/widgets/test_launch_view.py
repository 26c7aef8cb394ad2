"""LaunchView (issue 23) as Python objects: what rank 0's snapshots and epoch logs draw, and what Stop does before
and during a launch. The real 2-process launch stopped by its Stop button is in tests/test_launch_monitor.py."""

from __future__ import annotations

import multiprocessing

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

from nbtrainer import LaunchMonitor, Progress
from nbtrainer.widgets import LaunchView


def _snapshot(step: int, **kw) -> dict:
    points = [(s, 1.0 / s, 1e-3) for s in range(step - 3, step + 1) if s > 0]
    progress = Progress(epoch=1, epochs=4, batch=step, batches=50, global_step=step, loss=1.0 / step, lr=1e-3)
    progress.step_points = points
    return {**progress.to_dict(), "rank": 0, "world_size": 2, **kw}


def test_snapshots_draw_progress_chart_and_epochs() -> None:
    view = LaunchView()
    assert isinstance(view, LaunchMonitor) and "nbt-launch" in view.panel._dom_classes
    view.attach(multiprocessing.get_context("fork"), 2)
    assert not view.stop_button.disabled and view.last_status == "starting"
    for step in (4, 8, 12):
        view.on_progress(_snapshot(step))
    assert list(view._line.x) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # every step point, once
    assert (view.step_bar.value, view.step_bar.max, view.epoch_bar.value, view.epoch_bar.max) == (12, 50, 1, 4)
    assert "step 12" in view.info.value and "rank 0 of 2" in view.status.value
    view.epochs.append({"epoch": 1, "loss": 0.25, "val_loss": 0.5})
    view.on_epoch(view.epochs[-1])
    assert "val_loss" in view.epoch_table.value and "0.25" in view.epoch_table.value
    view.stop_button.click()
    assert view.stop_requested and view.stop_button.disabled and view.last_status == "stopping"
    view.on_end({"status": "stopped", "global_step": 13}, None)
    assert view.last_status == "stopped" and "13 steps" in view.status.value
    view.close()


def test_a_stop_before_the_launch_is_kept_for_it_and_errors_are_shown() -> None:
    view = LaunchView()
    view.request_stop()
    assert view.stop_requested
    _, shared = view.attach(multiprocessing.get_context("fork"), 2)
    assert shared[0] == 1 and view.stop_requested  # the ranks will stop at their first steps
    view.close(RuntimeError("rank 1 failed\ntraceback..."))
    assert view.last_status == "failed" and "rank 1 failed" in view.status.value
