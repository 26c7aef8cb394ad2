"""The panel's compare menu: earlier runs of the store as muted overlay lines on the live charts (headless)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_classification, make_loader, mlp
from widget_helpers import accuracy, make_widget, wait_for

pytest.importorskip("bqplot")

from nbtrainer import Trainer
from nbtrainer.plotting import decimate


def _fit(bs: int, seed: int) -> Trainer:
    x, y = make_classification(n=160, seed=seed)
    model = mlp(seed=seed)
    t = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        metrics={"acc": accuracy},
        progress=False,
    )
    t.fit(make_loader(x[:128], y[:128], bs), make_loader(x[128:], y[128:], 32), epochs=2)
    return t


@pytest.fixture(scope="module")
def two_runs():
    return _fit(16, 1), _fit(32, 2)  # 8 and 4 optimizer steps per epoch


def _key(w, run_id: str) -> str:
    keys = [k for _, k in w.compare.select.options if k.endswith(f":{run_id}")]
    assert len(keys) == 1, w.compare.select.options
    return keys[0]


def test_choosing_a_run_overlays_its_history_and_unchoosing_removes_it(two_runs):
    a, b = two_runs
    w = make_widget(n=64, bs=16, epochs=1)
    assert "nbt-compare-runs" in w.compare.select._dom_classes
    ka, kb = _key(w, a.run_id), _key(w, b.run_id)
    labels = {k: lab for lab, k in w.compare.select.options}
    assert list(labels).index(kb) < list(labels).index(ka)  # newest first
    live = list(w.charts.loss_fig.marks)

    w.compare.select.value = (ka,)
    (line,) = w.compare.loss_lines.values()
    np.testing.assert_allclose(line.x, a.history.steps["step"])
    np.testing.assert_allclose(line.y, a.history.steps["loss"])
    assert line.opacities[0] < 0.5
    assert line in w.charts.loss_fig.marks and w.charts.loss_fig.marks[len(w.compare.loss_lines) :] == live
    assert len(w.charts.raw.x) == 0  # the live series is untouched
    (metric,) = w.compare.metric_lines.values()
    np.testing.assert_allclose(metric.x, [r["epoch"] for r in a.history.epochs])
    np.testing.assert_allclose(metric.y, [r["val_acc"] for r in a.history.epochs])
    assert metric in w.charts.metrics.fig.marks

    w.compare.select.value = (ka, kb)
    assert len(w.compare.loss_lines) == 2 and line.colors != w.compare.loss_lines[kb].colors
    w.compare.select.value = ()
    assert not w.compare.loss_lines and not w.compare.metric_lines
    assert list(w.charts.loss_fig.marks) == live
    assert line not in w.charts.loss_fig.marks and metric not in w.charts.metrics.fig.marks
    w.close()  # the unchosen runs' lines, kept for their next choice, are closed with the panel
    assert line.comm is None and metric.comm is None


def test_overlays_are_decimated_like_the_live_series(two_runs):
    a, _ = two_runs
    w = make_widget(n=64, bs=16, epochs=1, max_points=6)
    w.compare.select.value = (_key(w, a.run_id),)
    (line,) = w.compare.loss_lines.values()
    x, y = decimate(a.history.steps["step"], a.history.steps["loss"], 6)
    assert len(a.history.steps["step"]) == 16 and len(line.x) <= 6
    np.testing.assert_allclose(line.x, x)
    np.testing.assert_allclose(line.y, y)


def test_epoch_alignment_and_the_live_run_is_not_listed(two_runs):
    a, b = two_runs
    w = make_widget(n=64, bs=16, epochs=2, slow=0.01)  # 4 optimizer steps per epoch
    w.compare.select.value = (_key(w, a.run_id), _key(w, b.run_id))
    w.start()
    try:
        wait_for(lambda: w.trainer.run_id not in (None, a.run_id, b.run_id), what="the live run's id")
        w.compare.refresh()  # what a refresh while training shows: never the live run
        assert not any(k.endswith(f":{w.trainer.run_id}") for _, k in w.compare.select.options)
    finally:
        w.wait()
    assert w.compare.select.value == (_key(w, a.run_id), _key(w, b.run_id))  # kept across the refresh
    assert any(k.endswith(f":{w.trainer.run_id}") for _, k in w.compare.select.options)  # ended: an earlier run

    la, lb = (w.compare.loss_lines[_key(w, r.run_id)] for r in (a, b))
    np.testing.assert_allclose(la.x, a.history.steps["step"])  # by step: each run's own steps
    w.compare.align.value = "epoch"
    la, lb = (w.compare.loss_lines[_key(w, r.run_id)] for r in (a, b))
    # epoch k of each earlier run ends where the live run's epoch k ends (step 4k)
    np.testing.assert_allclose(la.x, np.asarray(a.history.steps["step"]) * 4 / 8)
    np.testing.assert_allclose(lb.x, np.asarray(b.history.steps["step"]) * 4 / 4)
    np.testing.assert_allclose(lb.y, b.history.steps["loss"])
    for r in (a, b):  # the metric chart: by epoch number
        m = w.compare.metric_lines[_key(w, r.run_id)]
        np.testing.assert_allclose(m.x, [1.0, 2.0])
        np.testing.assert_allclose(m.y, [e["val_acc"] for e in r.history.epochs])
    assert len(w.charts.raw.x) == 8  # the live loss is its own


def test_a_panels_name_names_its_runs_in_the_store_and_every_compare_menu(tmp_path):
    """Two panels named "slow" and "fast" on one store: their runs are listed by those names (a second run of "slow"
    as "slow (2)"), in the store and in the other panel's compare menu; a panel without a name keeps the default."""
    from nbtrainer import Runs

    store = str(tmp_path / "runs.db")
    slow = make_widget(n=64, bs=16, epochs=1, name="slow", run_store=store)
    fast = make_widget(n=64, bs=16, epochs=1, name="fast", run_store=store)
    plain = make_widget(n=64, bs=16, epochs=1, run_store=store)
    for w in (slow, fast, slow, plain):
        w.start()
        w.wait()
    names = [r["name"] for r in Runs(store).table().rows]
    assert names[:3] == ["slow", "fast", "slow (2)"] and names[3].startswith("sequential-"), names
    fast.compare.refresh()  # (the menu is re-read when a run starts or ends; the others ran since)
    listed = [label.split(" · ")[0] for label, _ in fast.compare.select.options]
    assert {"slow", "fast", "slow (2)"} <= set(listed), listed


def test_a_deselection_racing_a_redraw_on_the_ui_thread_leaves_the_run_undrawn(two_runs, monkeypatch):
    """The UI thread redraws the overlays at a push (the loss axis, the live epoch length) while a click in the menu
    redraws them on the kernel's thread. Without one drawing at a time, the push's drawing, paused after it read the
    menu, put the deselected run back (the browser check of 2026-11-30 saw the line stay, unchosen)."""
    import threading

    import nbtrainer.widgets._compare_runs as compare_runs

    a, _ = two_runs
    w = make_widget(n=64, bs=16, epochs=1)
    key = _key(w, a.run_id)
    w.compare.select.value = (key,)  # a click: its line made on this (the kernel's) thread
    live = [m for m in w.charts.loss_fig.marks if m not in w.compare.loss_lines.values()]
    inside, go = threading.Event(), threading.Event()
    real = compare_runs.decimate

    def held(*args, **kwargs):  # the UI thread's drawing pauses here, after it read the menu
        if threading.current_thread().name == "push":
            inside.set()
            go.wait(5)
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_runs, "decimate", held)
    w.compare._drawn = ()  # something a push follows changed (the live epoch length)
    push = threading.Thread(target=w.compare.draw, name="push")
    push.start()
    assert inside.wait(5)
    click = threading.Thread(target=lambda: setattr(w.compare.select, "value", ()))  # the deselection
    click.start()
    click.join(0.5)  # it waits for the push's drawing to end (before: it drew at once, in the middle of it)
    go.set()
    push.join(5)
    click.join(5)
    assert w.compare.select.value == () and not w.compare.loss_lines
    assert list(w.charts.loss_fig.marks) == live, "the deselected run is still drawn"


def test_the_ui_threads_redraws_move_the_lines_made_at_the_click_and_make_none(two_runs):
    from widget_helpers import widgets_made_elsewhere

    a, _ = two_runs
    w = make_widget(n=64, bs=16, epochs=2, slow=0.002)
    w.compare.select.value = (_key(w, a.run_id),)
    (line,) = w.compare.loss_lines.values()
    with widgets_made_elsewhere() as off:
        w.start()  # the live epoch length becomes known at the first epoch's end: the overlay is redrawn for it
        w.wait()
    assert off == [], off
    assert list(w.compare.loss_lines.values()) == [line] and line in w.charts.loss_fig.marks
