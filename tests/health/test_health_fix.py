"""Health's one click, headless: what a learner whose run just broke gets from ``Health(on_problem="pause")`` and
``Health.apply_advice`` (the call the panel's button makes), on scikit-learn's digits with the MLP of issue 56."""

from __future__ import annotations

import math

import pytest
import torch
from _waits import wait_while_alive
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Health, HealthReport, ModelCheckpoint, Samples, Trainer, start_training_thread


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = perm[:1400], perm[1400:]
    return (x[train], y[train]), (x[val], y[val])


def _loader(data):
    return DataLoader(TensorDataset(*data), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _accuracy(model, val) -> float:
    with torch.no_grad():
        return (model(val[0]).argmax(1) == val[1]).float().mean().item()


def _wait_paused(trainer, thread) -> None:
    wait_while_alive(lambda: trainer.status == "paused", thread, "the run ended without Health pausing it")


def _run_to_pause(trainer, digits, epochs: int):
    train, _ = digits
    thread = start_training_thread(trainer.fit, args=(_loader(train),), kwargs={"epochs": epochs})
    _wait_paused(trainer, thread)
    return thread


def test_an_lr_100x_too_high_is_restored_and_lowered_by_one_click_and_the_run_trains(digits):
    """The issue's run: SGD at lr=50 wrecks the weights in one step (its ReLUs die). Health pauses, advises the LR
    the measured update ratio points to and, the weights being damaged, restores those it kept before step 1; one
    click and the run trains to a healthy accuracy; the next window confirms it."""
    model = _model()
    health = Health(every_n_steps=10, on_problem="pause")
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=50.0), callbacks=[health])
    thread = _run_to_pause(trainer, digits, epochs=10)
    report = health.last_problem
    assert report is not None and (report.kind, report.step) == ("update_ratio", 1)
    ratio = report.data["update_ratio"]
    assert report.data["lr"] == 0.1 and 0.05 < 50 * 0.01 / ratio < 0.2  # 50 x 1% / ratio, rounded
    assert f"LR 50 x 1% / {ratio:.0%}" in report.advice and "rounded to 0.1" in report.advice
    assert (report.data["restore"], report.data["restore_step"]) == ("snapshot", 1)
    assert "The weights are damaged" in report.advice and "restores the weights and optimizer state" in report.advice
    assert report.action == "restore the weights before step 1 and apply LR 0.1"

    done = health.apply_advice(trainer)  # what the card's button calls
    trainer.resume()
    thread.join(timeout=120)
    assert done == report.action and not thread.is_alive() and trainer.history.status == "finished"
    assert _accuracy(model, digits[1]) >= 0.85
    assert trainer.lr == 0.1
    (fix,) = health.fixes
    assert fix["worked"] and fix["after"] < math.log(10)
    kinds = [e["kind"] for e in trainer.history.events]
    assert kinds.index("health_fix") < kinds.index("health_restore")
    assert health.signals["learning rate"].level == "ok"


def test_a_fix_applied_while_the_run_trains_is_judged_on_the_steps_after_it(digits):
    """The click lands mid-run (no pause): the fix takes effect at the next step boundary, before the refresh that
    reads the step it closed, whose loss the wrecked weights made (689 here). That loss is not the fix's: the check
    judges the window of steps after it, and the fix that restored the weights worked."""
    model = _model()
    health = Health(every_n_steps=10)
    opt = torch.optim.SGD(model.parameters(), lr=50.0)

    class Click:  # on the training thread, as the button's call lands between two steps
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 5:
                health.apply_advice(trainer)

    # a refresh after every micro-batch: the step the fix closes is read right after the fix took effect
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt, callbacks=[health, Click()], refresh_interval=0.0)
    history = trainer.fit(_loader(digits[0]), epochs=3)
    assert [(e["kind"], e["step"]) for e in history.events if e["kind"].startswith("health_")] == [
        ("health_fix", 5),
        ("health_restore", 5),
    ]
    losses = dict(zip(history.steps["step"], history.steps["loss"], strict=True))
    assert losses[5] > 100 * math.log(10)  # the step that closed at the fix's boundary: before it
    (fix,) = health.fixes
    after = [losses[s] for s in range(6, 106)]  # the window after the fix
    assert fix["after"] == pytest.approx(sum(after) / len(after), rel=1e-9)
    assert fix["worked"] and fix["after"] < math.log(10)
    assert [r.kind for r in health.reports if r.kind == "fix_failed"] == []


def test_an_lr_1000x_too_low_is_a_problem_and_one_click_raises_it(digits):
    """SGD at 5e-4: the loss sits at ln 10 while each step moves the weights by about 0.005%. The learning-rate
    light turns red (the run does not learn, whatever the size of its steps), and the click raises the LR."""
    model = _model()
    health = Health(every_n_steps=10, window=50, on_problem="pause")
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=5e-4), callbacks=[health])
    thread = _run_to_pause(trainer, digits, epochs=10)
    report = health.last_problem
    assert report is not None and report.kind == "not_learning" and report.data["why"] == "flat"
    assert report.step <= 120 and report.message.startswith("The loss has not moved from 2.3")
    assert health.signals["learning rate"].level == "problem"
    assert "not learning" in health.signals["learning rate"].summary
    assert report.data["lr"] == 0.1 and "Raise the LR to 0.1" in report.advice and "restore" not in report.data
    health.apply_advice(trainer)
    trainer.resume()
    thread.join(timeout=120)
    assert _accuracy(model, digits[1]) >= 0.85
    assert health.fixes[0]["worked"]


def test_units_dead_from_the_first_step_come_back_by_reinitializing_the_layer_that_feeds_them(digits):
    model = _model()
    with torch.no_grad():
        model[0].weight.copy_(-model[0].weight.abs())  # digits' pixels are >= 0: every hidden unit is off
        model[0].bias.fill_(-1.0)
    health = Health(every_n_steps=10, on_problem="pause")
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.5), callbacks=[health])
    thread = _run_to_pause(trainer, digits, epochs=8)
    report = health.last_problem
    assert report is not None and (report.kind, report.step, report.level) == ("dead_units", 1, "problem")
    assert health.signals["dead units"].summary == "1 (ReLU): 100% dead"
    assert report.action == "re-initialize 0" and "dead from the first step" in report.advice
    health.apply_advice(trainer)
    trainer.resume()
    thread.join(timeout=120)
    assert _accuracy(model, digits[1]) >= 0.85


def test_a_run_not_learning_because_its_units_were_dead_from_the_start_is_advised_to_reinitialize(digits):
    """The dead units are filed first; the run then does not learn, and that later report (the default of the
    click) must name the same cure, not an LR that cannot wake them."""
    model = _model()
    with torch.no_grad():
        model[0].bias.fill_(-20.0)
    health = Health()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-3, callbacks=[health], progress=False,
                      run_store=False)  # fmt: skip
    train = _loader(digits[0])
    trainer.fit(train, epochs=3)
    assert [r.kind for r in health.reports if r.level == "problem"][-1] == "not_learning"
    report = health.last_problem
    assert report is not None and report.action == "re-initialize 0" and "lr" not in report.data
    assert "dead since the first step" in report.advice
    health.apply_advice(trainer)
    trainer.fit(train, epochs=3)
    assert _accuracy(model, digits[1]) >= 0.6


@pytest.mark.parametrize("broken", ["shuffled_labels", "frozen"])
def test_a_run_at_chance_with_healthy_steps_is_not_advised_an_lr_change(digits, broken):
    """Labels shuffled apart from their inputs, or a model frozen but for its head's bias: the steps are of a healthy
    size and no LR makes such a run learn. The advice names the labels or the frozen share, and has no LR action."""
    (x, y), _ = digits
    model = _model()
    if broken == "shuffled_labels":
        y = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(1))]
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        model[2].bias.requires_grad_(True)
    health = Health()
    trainer = Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=1e-3, callbacks=[health], progress=False,
                      run_store=False)  # fmt: skip
    trainer.fit(_loader((x, y)), epochs=3)
    report = health.last_problem
    assert report is not None and report.kind == "not_learning"
    assert "lr" not in report.data and "the LR to" not in report.advice and report.action == ""
    assert ("requires_grad=True" if broken == "frozen" else "Check the labels") in report.advice
    with pytest.raises(ValueError):
        health.apply_advice(trainer)


def test_damaged_weights_with_no_snapshot_and_no_checkpoint_are_told_to_restart(digits):
    model = _model()
    health = Health(every_n_steps=10, snapshot_mb=0)
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=50.0), callbacks=[health])
    trainer.fit(_loader(digits[0]), epochs=1)
    report = next(r for r in health.reports if r.kind == "update_ratio")
    assert report.data["restart"] is True and report.action == ""
    assert "restart the run from a new model with LR 0.1" in report.advice and "Health(snapshot_mb=0)" in report.advice
    with pytest.raises(ValueError, match="nothing to apply"):
        health.apply_advice(trainer, report)


def test_the_last_checkpoint_from_before_the_damage_is_the_way_back(digits, tmp_path):
    """No snapshot kept (snapshot_mb=0): an LR raised to 50 at step 60 is undone by rolling back to the last.ckpt
    of step 60 (written before the first step at that LR), then lowering the LR."""
    model = _model()

    class Raise:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 60:
                trainer.set_lr(50.0)

    health = Health(every_n_steps=10, snapshot_mb=0, on_problem="pause")
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.5),
        callbacks=[health, Raise(), ModelCheckpoint(tmp_path, save_last=True, every_n_steps=20)],
        refresh_interval=0.0,  # every step read at once: the pause comes at the first problem's next step
    )
    thread = _run_to_pause(trainer, digits, epochs=6)
    report = health.last_problem
    assert report is not None and 61 <= report.step <= 70 and report.data["restore"] == "checkpoint"
    assert report.action.startswith("roll back to the last checkpoint and apply LR")
    assert "It follows an LR increase (set at step 60)" in report.advice
    health.apply_advice(trainer)
    assert trainer.global_step == 60  # rolled back while paused
    trainer.resume()
    thread.join(timeout=120)
    assert trainer.history.status == "finished" and _accuracy(model, digits[1]) >= 0.85


def test_a_fix_that_does_not_work_is_reported_with_the_next_step(digits):
    """The check compares the window after a fix with the one before: an LR made even lower leaves the loss where
    it was, and Health says so, proposing the LR finder and an LR ten times further."""
    model = _model()
    health = Health(every_n_steps=10, window=40)
    # a refresh after every micro-batch: the verdict comes at the step that completes the window after the fix
    opt = torch.optim.SGD(model.parameters(), lr=5e-4)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt, callbacks=[health], refresh_interval=0.0)

    class Fix:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 20:  # a wrong fix, applied through the public call: lower, not higher
                wrong = HealthReport("not_learning", step, 1, "...", data={"lr": 1e-4, "lr_factor": 0.2})
                health.apply_advice(trainer, wrong)

    trainer.add_callback(Fix())
    trainer.fit(_loader(digits[0]), epochs=3)
    failed = [r for r in health.reports if r.kind == "fix_failed"]
    assert failed and failed[0].level == "problem" and failed[0].step == 20 + 40  # steps 21 to 60: after it
    assert failed[0].message.startswith("The fix at step 20 (apply LR 1e-4) did not work")
    assert "LR finder" in failed[0].advice and failed[0].data["lr"] == pytest.approx(1e-5)
    assert health.fixes[0]["worked"] is False


def test_health_and_samples_can_be_added_and_removed_mid_fit(digits):
    """Issue 53: a callback added mid-fit starts from its first event; removed mid-fit, it leaves nothing hooked."""
    model = _model()
    health = Health(every_n_steps=10)
    samples = Samples(lambda m: "ok", every_n_steps=10, every_n_epochs=None)

    class Toggle:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 25:
                trainer.add_callback(health)
                trainer.add_callback(samples)
            elif step == 75:
                trainer.remove_callback(health)
                trainer.remove_callback(samples)

    trainer = Trainer(model, nn.CrossEntropyLoss(), "sgd", lr=0.2, callbacks=[Toggle()], progress=False)
    history = trainer.fit(_loader(digits[0]), epochs=3)
    measured = [s for s, _ in history.health["grad_norm"]["total"]]
    assert measured and measured[0] == 26 and max(measured) <= 75  # started at the step after being added
    assert [s for s, _ in history.health["dead_units"]["1"]] == measured
    assert [s["step"] for s in history.samples] == [30, 40, 50, 60, 70]
    assert all(not m._forward_hooks for m in model.modules())  # nothing left hooked after the removal
    assert history.status == "finished" and health.signals["learning rate"].level == "ok"


@pytest.mark.parametrize("fix", ["advised", "lr_only"])
def test_a_fix_applied_between_fits_is_judged_in_the_next_fit(digits, fix):
    """The learner reads the report after the fit, clicks, and trains on: the fix's check runs over the next fit's
    first window. SGD at lr=50 kills every hidden unit in one step. The advised fix (the weights before step 1, LR
    0.1) works; lowering the LR alone leaves the dead units dead and the loss above chance, and that is said too."""
    model = _model()
    health = Health(every_n_steps=10, window=40)
    trainer = Trainer(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=50.0), callbacks=[health],
                      progress=False, run_store=False)  # fmt: skip
    train = _loader(digits[0])
    trainer.fit(train, epochs=1)
    report = health.last_problem
    assert report is not None and report.data["restore"] == "snapshot"
    if fix == "lr_only":
        report = HealthReport(report.kind, report.step, report.epoch, "...", data={"lr": 20.0, "lr_factor": 0.4})
    health.apply_advice(trainer, report)
    (record,) = health.fixes
    assert "worked" not in record and record["before"] > 2 * math.log(10)
    trainer.fit(train, epochs=2)  # 88 steps: a full window of 40 after the fix
    (record,) = health.fixes
    if fix == "advised":
        assert record["worked"] is True and record["after"] < math.log(10)
        assert [r.kind for r in health.reports if r.kind == "fix_failed"] == []
    else:
        assert record["worked"] is False and record["after"] > math.log(10)
        failed = [r for r in health.reports if r.kind == "fix_failed"]
        assert failed and failed[0].message.startswith(f"The fix at step {record['step']} (apply LR 20) did not work")


def test_a_fix_pending_for_one_model_is_not_judged_on_another(digits):
    """A Health reused with a new model starts afresh: the check of a fix applied to the old model is dropped, not
    judged on the new model's losses."""
    health = Health(every_n_steps=10, window=40)
    train = _loader(digits[0])
    old = _model()
    trainer = Trainer(old, nn.CrossEntropyLoss(), torch.optim.SGD(old.parameters(), lr=50.0), callbacks=[health],
                      progress=False, run_store=False)  # fmt: skip
    trainer.fit(train, epochs=1)
    health.apply_advice(trainer)
    new = _model()
    trainer = Trainer(new, nn.CrossEntropyLoss(), torch.optim.SGD(new.parameters(), lr=0.1), callbacks=[health],
                      progress=False, run_store=False)  # fmt: skip
    trainer.fit(train, epochs=2)
    (record,) = health.fixes
    assert "worked" not in record and not [r for r in health.reports if r.kind == "fix_failed"]
