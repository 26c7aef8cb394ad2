"""The panel's health card, headless: lights, the norms chart, and each button clicked while a run is paused by
Health, checked on the trainer's state (its LR, its step, its status)."""

from __future__ import annotations

import torch
from conftest import PoisonNet, make_classification, make_loader, mlp, poisoned_loader
from widget_helpers import classes, make_widget, wait_for

from nbtrainer import Health, ModelCheckpoint, TrainerWidget
from nbtrainer._health._health_report import readable


def test_the_panel_adds_health_and_shows_its_lights_and_norms():
    w = make_widget(n=512, epochs=2)
    assert "nbt-health" in classes(w.panel) and "nbt-health-lights" in classes(w.panel)
    health = [cb for cb in w.trainer.callbacks.callbacks if isinstance(cb, Health)]
    assert health == [w.health_card.health] and health[0].on_problem == "warn"  # one, at its defaults
    w.start()
    w.wait()
    lights = w.health_card.lights.value
    for signal in ("gradients", "loss", "non-finite", "learning rate", "dead units", "data"):
        assert f"<b style='flex:none'>{signal}</b>" in lights
    assert lights.count("nbt-health-ok") == 6  # a healthy run: every light green
    assert w.health_card.chart.children == (w.health_card.legend, w.health_card.fig)  # steps 1 and 50: a line
    assert w.health_card.lines.labels[0] == "total" and len(w.health_card.lines.x) == 2
    assert w.health_card.apply_lr.layout.display == "none"  # no problem, no buttons
    # Health's lights name a layer in plain text ("at most 0% dead (1 (ReLU))"); a message that carries a Markdown
    # code span shows it as <code>, and no backtick is left in any HTML of the panel (messages, lights, status)
    assert "(ReLU)" in w.health_card.health.signals["dead units"].summary
    w.notify("warning", "Health: `3` stays zero")
    texts = {h.value for h in _html_widgets(w.panel)}
    assert not [t for t in texts if "`" in t], [t for t in texts if "`" in t]
    assert any("<code class='nbt-code'" in t and ">3</code> stays zero" in t for t in texts)


def _html_widgets(root):
    """Every ``HTML`` widget under ``root`` (the panel's tree, as the page draws it)."""
    import ipywidgets as W

    seen, todo = [], [root]
    while todo:
        w = todo.pop()
        if isinstance(w, W.HTML):
            seen.append(w)
        todo.extend(getattr(w, "children", ()) or ())
    return seen


def test_a_panel_given_a_trainer_with_health_keeps_that_one():
    from nbtrainer import Trainer

    mine = Health(every_n_steps=5)
    x, y = make_classification(n=64)
    model = mlp()
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[mine], progress=False)
    w = TrainerWidget(trainer, make_loader(x, y, 16))
    assert w.health_card.health is mine and sum(isinstance(c, Health) for c in trainer.callbacks.callbacks) == 1


def _too_high(tmp_path=None):
    """A panel whose LR is 100x too high, with Health pausing on the problem (at step 2: the report comes from
    step 1's update ratio, read at the refresh after it)."""
    callbacks: list = [Health(on_problem="pause")]
    if tmp_path is not None:
        callbacks.append(ModelCheckpoint(tmp_path, save_last=True, every_n_steps=1))
    x, y = make_classification(n=1024)
    model = mlp(hidden=64)
    return TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=5.0),
        make_loader(x, y, 16),
        callbacks=callbacks,
        refresh_interval=0.0,
        progress=False,
        ui_interval=0.05,
    )


def test_apply_lr_button_sets_the_advised_lr_and_resumes():
    w = _too_high()
    w.start()
    try:
        wait_for(lambda: w.trainer.status == "paused", what="Health's pause")
        card = w.health_card
        # the push after the loop holds: the button says what it does and that it resumes
        wait_for(
            lambda: card.apply_lr.description.endswith(" and resume") and "nbt-health-problem" in card.lights.value,
            what="the advice and the red light",
        )
        report = card.problem
        assert report.kind == "update_ratio" and card.apply_lr.layout.display == "flex"
        lr = report.data["lr"]
        assert 0.01 <= lr <= 0.5 and f"Lower the LR to {readable(lr)}" in card.advice.value  # from the ratio
        assert card.apply_lr.description == ", ".join(report.action_steps) + " and resume"
        # Health's pause is the panel's own: its button resumes, the badge says paused
        wait_for(lambda: "nbt-status-paused" in w.view.status.value, what="the paused badge")
        assert w.view.pause.description == "Resume" and w.pause_requested
        assert card.rollback.layout.display == "none"  # no ModelCheckpoint: nothing to roll back to
        card.apply_lr.click()
        wait_for(lambda: w.trainer.status == "running" or not w.running, what="the run resumed")
        wait_for(lambda: abs(w.trainer.lr - lr) < 1e-12, what="the advised LR")
    finally:
        w.stop()
        w.wait()
    events = [e for e in w.history.events if e["kind"] == "lr"]
    assert events and events[0]["source"] == "health" and events[0]["new"] == lr
    assert [e["new"] for e in w.history.events if e["kind"] == "health_fix"] == [report.action]


def test_rollback_button_goes_back_to_the_last_checkpoint_and_resumes(tmp_path):
    """A loss spike at step 41 (a batch of wrong labels) pauses the run at step 42; last.ckpt is step 40's; the
    button rolls back there (the panel's charts too) and the run goes on to its end."""
    x, y = make_classification(n=16 * 60)
    y[40 * 16 : 41 * 16] = (y[40 * 16 : 41 * 16] + 1) % 3
    model = mlp(hidden=32)
    w = TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        make_loader(x, y, 16),
        callbacks=[Health(on_problem="pause"), ModelCheckpoint(tmp_path, save_last=True, every_n_steps=10)],
        refresh_interval=0.0,
        progress=False,
        ui_interval=0.05,
        seed=0,
    )
    w.start()
    try:
        wait_for(lambda: w.trainer.status == "paused", what="Health's pause")
        card = w.health_card
        wait_for(lambda: card.rollback.layout.display == "flex", what="the rollback button")
        assert card.problem.kind == "loss_spike" and card.problem.step == 41 and w.trainer.global_step == 42
        # no LR increase before the spike: the advice is clipping, at about twice the measured norms' median
        assert card.apply_lr.description.startswith("clip gradients at ") and "lr" not in card.problem.data
        card.rollback.click()
        assert w.trainer.global_step == 40 and card.problem is None
        wait_for(lambda: not w.running, timeout=30, what="the run's end")
    finally:
        w.stop()
        history = w.wait()
    (event,) = [e for e in history.events if e["kind"] == "rollback"]
    assert (event["old"], event["new"]) == (42, 40) and history.status == "finished"
    assert history.steps["step"] == list(range(1, 61))  # steps 41 and 42 once, from the rolled-back run
    assert any("rolled back to step 40" in text for _, text in w.view.message_log)


def test_skip_button_resumes_past_a_nonfinite_batch():
    """on_nonfinite="skip" and Health pausing: the card offers to skip the batch (its step already withheld)."""
    model = PoisonNet()  # its layers.0.1 turns one batch into NaN
    w = TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        poisoned_loader(batch=5),
        callbacks=[Health(on_problem="pause")],
        on_nonfinite="skip",
        refresh_interval=0.0,
        progress=False,
        ui_interval=0.05,
    )
    w.start()
    try:
        wait_for(lambda: w.trainer.status == "paused", what="Health's pause")
        card = w.health_card
        wait_for(lambda: card.skip.layout.display == "flex", what="the skip button")
        assert "layers.0.1 (Fragile) at step 6, batch 5 of epoch 1" in card.advice.value
        card.skip.click()
        wait_for(lambda: not w.running, timeout=30, what="the run's end")
    finally:
        w.stop()
        history = w.wait()
    assert history.status == "finished" and history.epochs[-1]["skipped_steps"] == 1
