"""Control from another thread (stop, pause/resume, lr, accumulation, save) and Ctrl-C."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from _waits import wait_while_alive
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer, load_checkpoint


class Slow:
    """Makes each step take a little wall time so another thread can act mid-run."""

    def __init__(self, delay=0.002):
        self.delay = delay
        self.steps_after_stop = None

    def on_optimizer_step(self, trainer, step, skipped):
        time.sleep(self.delay)


def _setup(n=2048, bs=16, lr=0.05, **kw):
    x, y = make_classification(n=n)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), opt, progress=False, refresh_interval=0.02, **kw)
    return trainer, make_loader(x, y, batch_size=bs)


def _run_in_thread(trainer, loader, epochs=3):
    result = {}

    def target():
        result["history"] = trainer.fit(loader, epochs=epochs)

    th = threading.Thread(target=target)
    th.start()
    return th, result


def _wait_for(cond, th):
    # readiness, not a clock: the first step includes one-time imports that took over 10 s on a loaded machine
    wait_while_alive(cond, th, "the training thread ended before the condition held")


def test_stop_from_another_thread_within_one_step():
    trainer, loader = _setup()
    trainer.add_callback(Slow())
    th, result = _run_in_thread(trainer, loader)
    _wait_for(lambda: trainer.global_step >= 5, th)
    trainer.request_stop("user clicked stop")
    step_at_request = trainer.global_step
    th.join(5)
    assert not th.is_alive()
    h = result["history"]
    assert h.status == "stopped" and h.stop_reason == "user clicked stop"
    assert trainer.global_step <= step_at_request + 1
    assert trainer.status == "stopped" and not Trainer.active()


def test_pause_holds_and_resume_continues():
    trainer, loader = _setup()
    trainer.add_callback(Slow())
    th, result = _run_in_thread(trainer, loader, epochs=1)
    _wait_for(lambda: trainer.global_step >= 3, th)
    trainer.pause()
    _wait_for(lambda: trainer.status == "paused", th)
    held = trainer.global_step
    time.sleep(0.2)
    assert trainer.global_step == held and trainer.progress.status == "paused"
    trainer.resume()
    th.join(20)
    assert result["history"].status == "finished"
    kinds = [e["kind"] for e in result["history"].events]
    assert kinds == ["pause", "resume"]


def test_lr_and_accumulation_changes_apply_at_next_step_and_are_recorded():
    trainer, loader = _setup(n=2048, bs=16)
    trainer.add_callback(Slow())
    th, result = _run_in_thread(trainer, loader, epochs=1)
    _wait_for(lambda: trainer.global_step >= 10, th)
    trainer.set_lr(0.2)
    trainer.set_grad_accum_steps(4)
    th.join(30)
    h = result["history"]
    events = {e["kind"]: e for e in h.events}
    assert events["lr"]["old"] == pytest.approx(0.05) and events["lr"]["new"] == pytest.approx(0.2)
    assert events["grad_accum_steps"]["new"] == 4
    change = events["lr"]["step"]
    lrs = dict(zip(h.steps["step"], h.steps["lr"], strict=True))
    assert lrs[change] == pytest.approx(0.05) and lrs[change + 1] == pytest.approx(0.2)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    # after the change, 4 micro-batches per optimizer step: fewer steps than batches
    assert trainer.global_step < len(loader) - 3 * (len(loader) - change) // 4 + 5


def test_set_lr_rescales_onecycle_schedule():
    trainer, loader = _setup(n=512, bs=16)
    total = trainer.total_steps(loader, 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(trainer.optimizer, max_lr=0.1, total_steps=total)
    trainer.set_scheduler(sched)
    assert trainer.lr == pytest.approx(0.1)
    trainer.set_lr(0.3)  # idle: applied at once
    assert trainer.lr == pytest.approx(0.3)
    h = trainer.fit(loader, epochs=1)
    assert max(h.steps["lr"]) == pytest.approx(0.3, rel=0.05)


def test_save_checkpoint_from_another_thread(tmp_path):
    trainer, loader = _setup()
    trainer.add_callback(Slow())
    th, _ = _run_in_thread(trainer, loader, epochs=1)
    _wait_for(lambda: trainer.global_step >= 3, th)
    path = trainer.save_checkpoint(str(tmp_path / "mid.ckpt"))  # runs on the training thread at a boundary
    trainer.request_stop()
    th.join(10)
    ck = load_checkpoint(path)
    assert ck["loop"]["global_step"] >= 3 and ck["loop"]["batch"] == ck["loop"]["global_step"]


def test_keyboard_interrupt_returns_history_and_keeps_model_usable(monkeypatch):
    monkeypatch.setenv("NBTRAINER_FRONTEND", "notebook")  # a notebook gets the History (a script: test_interrupt)

    class CtrlC:
        def on_optimizer_step(self, trainer, step, skipped):
            if step == 7:
                raise KeyboardInterrupt

    trainer, loader = _setup(n=512)
    ctrl_c = CtrlC()
    trainer.add_callback(ctrl_c)
    h = trainer.fit(loader, epochs=2)
    assert h.status == "interrupted" and h.interrupted and trainer.global_step == 7
    assert all(p.grad is None for p in trainer.model.parameters())
    trainer.remove_callback(ctrl_c)
    h2 = trainer.fit(loader, epochs=1)  # still usable
    assert h2.status == "finished" and h2 is not h and len(h2) == 1


def test_second_fit_while_running_is_refused():
    trainer, loader = _setup()
    trainer.add_callback(Slow())
    th, _ = _run_in_thread(trainer, loader, epochs=1)
    _wait_for(lambda: trainer.global_step >= 2, th)
    with pytest.raises(RuntimeError, match="already fitting"):
        trainer.fit(loader)
    with pytest.raises(RuntimeError, match="cannot change while fit"):
        trainer.set_precision("bf16")
    trainer.request_stop()
    th.join(10)


@pytest.mark.parametrize("flag", ["should_stop", "stop_training"])
def test_another_trainers_stop_flag_is_refused_naming_request_stop(flag):
    """Lightning's ``trainer.should_stop = True`` and Keras' ``stop_training = True`` in a callback: nbtrainer never
    read them, so the fit trained on to its last epoch (3 of 3 here) as if nothing had been asked."""

    class StopAfterFirstEpoch:
        def on_epoch_end(self, trainer, epoch, logs):
            setattr(trainer, flag, True)

    x, y = make_classification(n=64)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", callbacks=[StopAfterFirstEpoch()], progress=False)
    with pytest.raises(AttributeError, match=rf"{flag} .*never reads.*trainer\.request_stop\("):
        trainer.fit(make_loader(x, y), epochs=3)
    assert len(trainer.history.epochs) == 1
    assert not hasattr(trainer, flag)  # getattr(trainer, flag, False) reads False, as for any missing attribute
