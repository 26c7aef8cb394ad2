"""Steering a running panel from other threads: stop, pause/resume, LR and accumulation, failures,
zombie runs, and the UI throttle."""

from __future__ import annotations

import itertools
import threading
import time
import warnings

import pytest
import torch
from widget_helpers import CountRefresh, Slow, make_widget, parts, wait_for

from nbtrainer import Trainer, TrainerWidget
from nbtrainer.widgets._style import IPYWIDGETS_MAJOR


def test_stop_from_another_thread_ends_within_one_step():
    w = make_widget(n=2048, epochs=3, slow=0.003)
    w.view.start.click()
    wait_for(lambda: w.trainer.global_step >= 5, what="5 steps")
    box = {}

    def stopper():
        box["step"] = w.trainer.global_step
        w.stop("user clicked stop")

    th = threading.Thread(target=stopper)
    th.start()
    th.join()
    h = w.wait()
    assert h.status == "stopped" and h.stop_reason == "user clicked stop" and w.status == "stopped"
    assert w.trainer.global_step <= box["step"] + 1
    assert "stopped" in w.view.status.value and not w.view.start.disabled
    assert not Trainer.active()


def test_stop_button_while_paused():
    w = make_widget(n=2048, epochs=3, slow=0.003)
    w.start()
    wait_for(lambda: w.trainer.global_step >= 3)
    w.view.pause.click()
    wait_for(lambda: w.status == "paused", what="paused")
    w.view.stop.click()
    assert w.wait().status == "stopped"


def test_pause_holds_and_resume_continues():
    w = make_widget(n=1024, epochs=1, slow=0.003)
    w.start()
    wait_for(lambda: w.trainer.global_step >= 3)
    w.view.pause.click()
    assert w.view.pause.description == "Resume"
    wait_for(lambda: w.status == "paused", what="paused")
    held = w.trainer.global_step
    time.sleep(0.3)
    assert w.trainer.global_step == held
    wait_for(lambda: "paused" in w.view.status.value, 5, "paused badge")
    w.view.pause.click()  # Resume
    assert w.view.pause.description == "Pause"
    h = w.wait()
    assert h.status == "finished" and len(h.steps["step"]) == 64
    assert [e["kind"] for e in h.events] == ["pause", "resume"]


def test_lr_and_accumulation_changes_mid_run_reach_optimizer_history_and_charts():
    w = make_widget(n=2048, bs=16, epochs=1, slow=0.003, val=False)
    w.start()
    wait_for(lambda: w.trainer.global_step >= 10)
    w.view.lr.value = 0.2  # what dragging the slider does
    w.view.accum.value = 4
    h = w.wait()
    assert w.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    events = {e["kind"]: e for e in h.events}
    assert events["lr"]["new"] == pytest.approx(0.2) and events["lr"]["old"] == pytest.approx(0.05)
    assert events["lr"]["source"] == "dragged"  # the slider said who changed it; the text box says "typed"
    assert events["grad_accum_steps"]["new"] == 4
    lrs = dict(zip(h.steps["step"], h.steps["lr"], strict=True))
    assert lrs[events["lr"]["step"] + 1] == pytest.approx(0.2)
    assert len(h.steps["step"]) < 128  # fewer optimizer steps after accumulating 4
    # the LR change is marked on the LR chart at its new value; both changes on the loss chart
    assert w.charts.lr_events.y.tolist() == pytest.approx([0.2])
    assert w.charts.lr_events.x.tolist() == [events["lr"]["step"]]
    assert list(w.charts.lr_events.names) == [f"step {events['lr']['step']}: lr 5.00e-2 → 2.00e-1 (dragged)"]
    # labelled with the value and how it was set, on the side of its marker that keeps it inside the chart
    labels = {align: list(mark.text) for align, mark in w.charts.lr_labels.items()}
    side = "start" if events["lr"]["step"] < h.steps["step"][-1] / 2 else "end"
    other = "end" if side == "start" else "start"
    assert labels[side] == ["2.00e-1 dragged"] and labels[other] == [], labels
    loss_labels = list(w.charts.loss_events.names)
    assert len(loss_labels) == 2 and any("accumulation 1 → 4" in lab for lab in loss_labels)
    assert any("lr 5.00e-2 → 2.00e-1 (dragged)" in text for _, text in w.view.message_log)


def test_an_exception_in_a_metric_fails_the_run_shows_it_and_wait_reraises():
    calls = {"n": 0}

    def flaky(outputs, targets):
        calls["n"] += 1
        if calls["n"] == 20:
            raise ValueError("metric exploded")
        return (outputs.argmax(1) == targets).float().mean()

    model, crit, opt, loader = parts()
    w = TrainerWidget(
        model,
        crit,
        opt,
        loader,
        metrics={"flaky": flaky},
        epochs=2,
        progress=False,
        refresh_interval=0.05,
        ui_interval=0.05,
    )
    w.view.start.click()
    with pytest.raises(ValueError, match="metric exploded"):
        w.wait()
    assert w.status == "failed" and w.history.status == "failed"
    assert "failed" in w.view.status.value
    errors = [m for m in w.view.messages_log.lines.children if "nbt-message-error" in m._dom_classes]
    assert errors and "metric exploded" in errors[-1].value and "nbt-traceback" in errors[-1].value
    assert "<details" in errors[-1].value and "Traceback" in errors[-1].value
    assert not w.view.start.disabled and w.view.stop.disabled
    assert not Trainer.active()
    w.start()  # the kernel (and this widget) stay usable: the metric works again now
    assert w.wait().status == "finished"


def test_a_second_widget_on_the_same_model_stops_the_first():
    w1 = make_widget(n=4096, epochs=5, slow=0.003)
    w1.start()
    wait_for(lambda: w1.trainer.global_step >= 3)
    with pytest.warns(RuntimeWarning, match="Stopped the previous run"):
        w2 = TrainerWidget(
            w1._model,
            w1.trainer.criterion,
            w1.trainer.optimizer,
            w1.train_loader,
            epochs=1,
            progress=False,
            ui_interval=0.05,
        )
    assert w1._run.done.is_set() and w1.status == "stopped"
    assert "replaced by" in (w1.history.stop_reason or "")
    assert any("Stopped the previous run" in text for _, text in w2.view.message_log)
    w2.start()
    assert w2.wait().status == "finished"


def test_start_while_another_widget_runs_the_model_stops_that_run():
    w1 = make_widget(n=4096, epochs=5, slow=0.003)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing runs yet: no warning
        w2 = TrainerWidget(w1.trainer, w1.train_loader, epochs=1, ui_interval=0.05)
    w1.start()
    wait_for(lambda: w1.trainer.global_step >= 3)
    w2.start()  # same model (and trainer): the old run is stopped first, not left training
    assert w1.status == "stopped"
    assert w2.wait().status == "finished"


def test_a_fit_not_started_by_a_widget_is_refused_with_a_clear_message():
    model, crit, opt, loader = parts(n=4096)
    trainer = Trainer(model, crit, opt, progress=False, callbacks=[Slow(0.003)])
    th = threading.Thread(target=lambda: trainer.fit(loader, epochs=5), daemon=True)
    th.start()
    try:
        wait_for(lambda: trainer.global_step >= 2)
        with pytest.warns(RuntimeWarning, match="not started by a TrainerWidget"):
            w = TrainerWidget(model, crit, opt, loader, progress=False)
        with pytest.raises(RuntimeError, match="not started by a TrainerWidget"):
            w.start()
        assert w.status == "idle" and th.is_alive()
    finally:
        trainer.request_stop()
        th.join(20)


def test_ui_updates_are_throttled_by_wall_clock():
    counter = CountRefresh()
    w = make_widget(n=4096, epochs=1, slow=0.004, refresh_interval=0.0, ui_interval=0.2, callbacks=[counter])
    t0 = time.monotonic()
    w.start()
    w.wait()
    duration = time.monotonic() - t0
    times = w.ui_update_times
    assert duration > 0.8, "the run must be long enough to mean something"
    assert counter.n > 5 * len(times), (counter.n, len(times))  # the trainer refreshed far more often
    assert len(times) <= duration / 0.2 + 2
    gaps = [b - a for a, b in itertools.pairwise(times[:-1])]  # the final push is immediate
    assert min(gaps) >= 0.2 * 0.9, gaps


def test_long_runs_send_a_bounded_number_of_points_with_spikes():
    spike_step = 700

    class Spike:  # the loss of one micro-batch is made huge through the criterion
        def __init__(self):
            self.calls = 0

        def __call__(self, outputs, targets):
            self.calls += 1
            loss = torch.nn.functional.cross_entropy(outputs, targets)
            return loss * 1000 if self.calls == spike_step else loss

    model, _, opt, _ = parts()
    from widget_helpers import make_classification, make_loader

    x, y = make_classification(n=1200 * 4)
    w = TrainerWidget(
        model,
        Spike(),
        opt,
        make_loader(x, y, 4),
        epochs=1,
        progress=False,
        refresh_interval=0.02,
        ui_interval=0.05,
        max_points=100,
    )
    w.start()
    h = w.wait()
    assert len(h.steps["step"]) == 1200
    pts = w.charts.sent_points()
    assert pts["loss"] <= 100 and pts["smoothed"] <= 100 and pts["lr"] <= 100
    top = max(range(1200), key=lambda i: h.steps["loss"][i])
    assert h.steps["loss"][top] > 50 * sorted(h.steps["loss"])[600]  # a real spike
    assert max(w.charts.raw.y) == pytest.approx(h.steps["loss"][top])
    assert h.steps["step"][top] in w.charts.raw.x.tolist()


def test_rerunning_a_cell_that_recreates_the_model_stops_the_old_run(monkeypatch):
    from nbtrainer.widgets import _notebook

    monkeypatch.setattr(_notebook, "cell_id", lambda: ("cell-a", "exec-1"))
    w1 = make_widget(n=4096, epochs=5, slow=0.003)
    w_same_exec = make_widget(n=4096, epochs=5, slow=0.003)  # two widgets in one execution: both may run
    w1.start()
    w_same_exec.start()
    wait_for(lambda: w1.trainer.global_step >= 3 and w_same_exec.trainer.global_step >= 3)
    assert w1.status == w_same_exec.status == "running"
    monkeypatch.setattr(_notebook, "cell_id", lambda: ("cell-a", "exec-2"))  # the cell runs again
    with pytest.warns(RuntimeWarning, match="re-run"):
        w2 = make_widget(epochs=1)  # a new model: the old ones would be zombies
    assert w1.status == w_same_exec.status == "stopped"
    monkeypatch.setattr(_notebook, "cell_id", lambda: ("cell-b", "exec-3"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w3 = make_widget(epochs=1)  # another cell: w2 is left alone
    w2.start()
    w3.start()
    assert w2.wait().status == "finished" and w3.wait().status == "finished"


@pytest.mark.slow  # a few seconds: enough steps for a chart payload the budget holds back
@pytest.mark.skipif(
    IPYWIDGETS_MAJOR < 8, reason="ipywidgets 7 sends no message without a kernel: nothing to spy on (same pump code)"
)
def test_a_long_run_keeps_the_charts_to_their_budget_while_the_progress_goes_at_every_push(monkeypatch):
    # A loaded browser falls behind a fast stream of chart data and the status badge queues behind it, so the
    # charts have a budget of points per second; the progress (a few bytes) still goes at every push.
    import ipywidgets as W

    from nbtrainer.widgets._pump import _POINTS_PER_S

    sends: list[tuple[float, object, int]] = []
    real_send = W.Widget._send

    def spy(self, msg, buffers=None):
        cost = sum(w.charts.sent_points().values()) if self is w.charts.raw else 0  # the pump's measure
        sends.append((time.monotonic(), self, cost))
        return real_send(self, msg, buffers)

    w = make_widget(n=4096, bs=4, epochs=2, slow=0.001, ui_interval=0.05)
    monkeypatch.setattr(W.Widget, "_send", spy)
    w.start()
    h = w.wait()
    assert len(h.steps["step"]) == 2048
    raw = [(t, c) for t, wid, c in sends if wid is w.charts.raw][:-1]  # live renders (the last is the final one)
    assert len(raw) >= 3, "the run must be long enough to mean something"
    # the premise: by the end a render holds more points than the budget allows at every push
    assert raw[-1][1] > 4 * _POINTS_PER_S * w.ui_interval, raw[-1]
    # never more than the budget allows: each render waits for the points of the one before it
    assert sum(c for _, c in raw[:-1]) <= _POINTS_PER_S * (raw[-1][0] - raw[0][0])
    # meanwhile the progress was not held back with the charts: it went at pushes that sent no chart data
    bars = [t for t, wid, _ in sends if wid is w.view.step_bar and raw[0][0] <= t <= raw[-1][0]]
    assert len(bars) > len(raw), (len(bars), len(raw))
    assert max(w.charts.train_metrics.x) == 2 and len(w.charts.val.x) == 2  # the final push drew every epoch


@pytest.mark.slow  # a few seconds: a chart payload the budget holds back, then a pause
def test_paused_badge_comes_with_every_point_up_to_the_held_step():
    # The charts keep to a budget; what they hold back must not arrive after the badge says "paused", or the
    # chart moves while the run holds.
    w = make_widget(n=4096, bs=4, epochs=2, slow=0.001, ui_interval=0.05)
    seen: dict[str, object] = {}

    def on_status(change):
        if "nbt-status-paused" in change["new"] and "charts" not in seen:
            seen["charts"] = (w.charts.sent_points(), w.charts.raw.x.tolist(), w.view.epoch_table.value)

    w.view.status.observe(on_status, "value")
    w.start()
    wait_for(lambda: w.trainer.global_step >= 1500, 60, "1500 steps")
    w.view.pause.click()
    wait_for(lambda: "charts" in seen, 30, "the paused badge")
    time.sleep(1.5)  # longer than any budget wait of this run's charts
    assert (w.charts.sent_points(), w.charts.raw.x.tolist(), w.view.epoch_table.value) == seen["charts"]
    w.view.stop.click()
    assert w.wait().status == "stopped"


@pytest.mark.parametrize("how", ["w.close()", "w.panel.close()"])
def test_closing_the_panel_ends_its_run_and_its_threads(how):
    # a closed panel has no Pause or Stop left: its run went on training (and its UI thread pushing) behind it
    w = make_widget(n=4096, epochs=50, slow=0.002, val=False, name=f"closing {how}")
    w.start()
    wait_for(lambda: w.trainer.global_step >= 5, what="the run started")
    w.close() if how == "w.close()" else w.panel.close()
    assert not w.running and w.trainer.status == "stopped"  # it returned after the training thread had ended
    assert not [t.name for t in threading.enumerate() if f"'closing {how}'" in t.name]
    assert w.history.stop_reason == "the panel was closed"
    assert w.panel.comm is None and w.view.stop.comm is None and w.charts.box.comm is None  # its widgets too
    with pytest.raises(RuntimeError, match="was closed"):
        w.start()
