"""The panel's behaviour as Python objects (issue 11): an honest status, a live epoch table, a bounded layout,
an LR control of useful resolution with exact entry, an LR finder that says when the model was trained."""

from __future__ import annotations

import html
import math
import re
import threading
import time

import pytest
import torch
from widget_helpers import make_classification, make_loader, make_widget, mlp, parts, wait_for

from nbtrainer import Trainer, TrainerWidget


def _badge(w) -> str:
    m = re.search(r"nbt-status-badge nbt-status-(\w+)", w.view.status.value)
    return m.group(1) if m else ""


def _shown_step(w) -> int:
    m = re.search(r"step ([\d,]+)", w.view.progress_info.value)
    return int(m.group(1).replace(",", "")) if m else 0


def test_paused_is_shown_only_once_the_loop_holds_and_then_nothing_moves():
    w = make_widget(n=4096, epochs=1, slow=0.004, val=False)
    w.start()
    wait_for(lambda: w.trainer.global_step >= 5, what="the run started")
    w.pause()
    assert _badge(w) == "pausing"  # requested: true at once, and not yet "paused"
    wait_for(lambda: _badge(w) == "paused", what="paused shown")
    assert w.trainer.status == "paused"
    held = _shown_step(w)
    assert held == w.trainer.global_step  # the last progress drawn is the step the loop holds at
    time.sleep(0.4)
    assert _shown_step(w) == held and w.trainer.global_step == held and _badge(w) == "paused"
    w.resume()
    wait_for(lambda: _shown_step(w) > held, what="running again")
    w.stop()
    assert _badge(w) == "stopping"  # not "stopped" before the loop has ended
    h = w.wait()
    assert h.status == "stopped" and _badge(w) == "stopped"
    assert _shown_step(w) == h.steps["step"][-1]  # the final step was drawn before the status
    detail = re.sub(r"<[^>]+>", " ", w.view.status.value)
    assert detail.split().count("stopped") == 1  # the detail never repeats the status word


def test_the_epoch_table_fills_as_epochs_end_with_one_number_format():
    w = make_widget(epochs=3)
    w.start()
    h = w.wait()
    table = w.view.epoch_table.value
    assert table.count("<tr>") == 1 + 3 and w.view.epoch_section.visible
    for col in ("epoch", "loss", "val_loss", "acc", "val_acc", "lr", "time"):
        assert f">{col}</th>" in table
    from nbtrainer import format_lr, format_number

    assert format_number(h.epochs[1]["val_loss"]) in table and format_lr(h.epochs[0]["lr"]) in table
    assert "5.00e-2" in w.view.progress_info.value  # the LR in the progress line: the same LR format
    assert "memory" in w.view.stats.value and "step time" in w.view.stats.value and "data " in w.view.stats.value


@pytest.mark.parametrize("accum", [1, 4])
def test_the_step_time_card_says_how_many_micro_batches_make_the_step(accum):
    # the loop's sample counts every micro-batch of the window (tests/loop/test_accumulation.py); the card says so
    w = make_widget(epochs=1, grad_accum_steps=accum)
    w.start()
    w.wait()
    card = re.search(r"nbt-stat-steptime.*?line-height:14px'>([^<]+)</div></div>", w.view.stats.value)
    assert card, w.view.stats.value
    sub = html.unescape(card.group(1))
    shares = dict(re.findall(r"(data|fwd|bwd|opt) (\d+)%", sub))
    assert set(shares) == {"data", "fwd", "bwd", "opt"} and 97 <= sum(map(int, shares.values())) <= 103, sub
    assert (f"{accum} micro-batches" in sub) == (accum > 1), sub


def test_the_message_area_shows_three_lines_and_keeps_the_rest_one_click_away():
    w = make_widget(epochs=1)
    log = w.view.messages_log
    for i in range(12):
        w.notify("info", f"message {i}")
    assert len(log.lines.children) == 3 and "message 11" in log.lines.children[-1].value
    assert log.show_all.layout.display == "flex" and "(12)" in log.show_all.description
    log.show_all.value = True
    (scroll,) = log.lines.children
    assert "nbt-messages-scroll" in scroll._dom_classes and log.lines.layout.max_height == "240px"
    assert scroll.value.count("class='nbt-message-info'") == 12 and "message 0<" in scroll.value
    log.show_all.value = False
    assert len(log.lines.children) == 3 and "message 11" in log.lines.children[-1].value
    for i in range(600):
        w.notify("warning", f"flood {i}")
    assert len(log.log) == 500 and len(log.lines.children) == 3  # bounded however long the panel lives


@pytest.mark.slow
def test_side_areas_collapse_and_close():
    w = make_widget(epochs=1)
    section = w.view.profile_section
    assert not section.visible
    w.profile(n_iters=3)
    assert section.visible and section.is_open and section.body.children
    section.toggle.click()
    assert section.visible and not section.is_open and section.toggle.icon == "chevron-down"
    section.toggle.click()
    assert section.is_open
    assert section.close_button is not None  # a closable area
    section.close_button.click()
    assert not section.visible and section.body.children == ()


def test_lr_slider_spans_two_decades_around_the_lr_and_takes_exact_values():
    w = make_widget(epochs=1)  # lr 0.05
    lr = w.view.lr
    assert (lr.min, lr.max) == pytest.approx((math.log10(0.05) - 1, math.log10(0.05) + 1), abs=0.01)
    assert w.view.lr_exact.value == "5.00e-2"
    w.view.lr_exact.value = "3e-4"  # exact entry, far outside the slider's range
    assert w.trainer.lr == pytest.approx(3e-4) and lr.value == pytest.approx(3e-4)
    assert lr.min == pytest.approx(math.log10(3e-4) - 1, abs=0.01) and w.view.lr_exact.value == "3.00e-4"
    w.view.lr_exact.value = "fast"  # refused with the fix, the old value stays
    assert w.trainer.lr == pytest.approx(3e-4) and w.view.lr_exact.value == "3.00e-4"
    assert "not a positive number" in w.view.message_log[-1][1]
    lr.value = 10 ** (lr.max - 0.05)  # a drag that ends near the right end re-centres the range on it
    assert lr.min == pytest.approx(lr.max - 2, abs=0.01) and abs(math.log10(lr.value) - (lr.min + 1)) < 0.02
    assert w.trainer.lr == pytest.approx(lr.value)


def test_lr_finder_says_when_the_model_was_trained_and_restores_the_previous_lr():
    fresh = make_widget(epochs=1)
    fresh.lr_find(steps=15)
    assert fresh.lr_finder.warning.value == "" and "already been trained" not in str(fresh.view.message_log)

    w = make_widget(epochs=1)
    w.start()
    w.wait()
    w.lr_find(steps=15)
    assert "already been trained" in w.lr_finder.warning.value and "re-run" in w.lr_finder.warning.value
    assert any(level == "warning" and "already been trained" in text for level, text in w.view.message_log)
    before = w.trainer.lr
    button = next(iter(w.lr_finder.use_buttons.values()))
    button.click()
    assert w.trainer.lr != pytest.approx(before) and w.lr_finder.restore.layout.display == "flex"
    w.lr_finder.restore.click()
    assert w.trainer.lr == pytest.approx(before) and w.view.lr.value == pytest.approx(before)
    assert w.view.lrfinder_section.visible


def test_a_trainer_without_an_optimizer_gets_a_clear_error():
    model, crit, _, loader = parts()
    with pytest.raises(ValueError, match=r"optimizer=None.*Pass an optimizer"):
        TrainerWidget(Trainer(model, crit, None, progress=False), loader)
    assert isinstance(torch.optim.SGD(model.parameters(), 0.1), torch.optim.Optimizer)


def test_a_step_skipped_for_a_non_finite_loss_in_fp32_is_not_called_fp16():
    x, y = make_classification(n=256)
    x[40, 3] = float("nan")  # one batch of the epoch has a NaN loss: on_nonfinite="skip" skips its step
    model = mlp()
    w = TrainerWidget(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05), make_loader(x, y, 32),
        epochs=1, on_nonfinite="skip", progress=False, refresh_interval=0.05, ui_interval=0.05, run_store=False,
    )  # fmt: skip
    w.start()
    history = w.wait(60)
    assert history.epochs[-1]["skipped_steps"] == 1
    line = html.unescape(re.sub(r"<[^>]+>", "", w.view.progress_info.value))
    assert "1 skipped steps (non-finite loss)" in line, line
    assert "fp16" not in line


class _DrawnBeforeResume:
    """Holds the training thread at the LR event of the boundary that leaves a pause until the UI thread has
    drawn a push after Resume: that push then holds the boundary's first event alone ("lr", before
    "grad_accum_steps" and "resume"), the moment a stale "paused" was drawn, every time instead of by chance."""

    def __init__(self, seen: list[tuple[str, str]]) -> None:
        self.seen: list[tuple[str, str]] = seen
        self.mark: int | None = None

    def drawn(self) -> bool:
        return self.mark is not None and any(t.startswith("nbtrainer-ui") for _, t in self.seen[self.mark :])

    def on_control(self, trainer, event):
        if event["kind"] == "lr" and self.mark is not None:
            wait_for(self.drawn, 20, "a push of the UI thread after Resume")


def test_resume_after_changes_made_while_paused_never_shows_paused_again():
    w = make_widget(n=4096, epochs=1, slow=0.003, val=False)
    seen: list[tuple[str, str]] = []  # every status the view is told, and by which thread
    set_status = w.view.set_status

    def record(status: str, text: str = "") -> None:
        seen.append((status, threading.current_thread().name))
        set_status(status, text)

    w.view.set_status = record
    gate = _DrawnBeforeResume(seen)
    w.start()
    wait_for(lambda: w.trainer.global_step >= 5, what="the run started")
    w.view.pause.click()
    wait_for(lambda: _badge(w) == "paused", what="paused shown")
    w.trainer.add_callback(gate)
    w.view.lr_exact.value = "3e-3"  # typed while paused: applied where the loop leaves the hold
    w.view.accum.value = 2
    gate.mark = len(seen)
    w.view.pause.click()  # Resume
    assert w.wait().status == "finished"
    assert gate.drawn()  # the UI thread did draw between the boundary's events
    after = [status for status, _ in seen[gate.mark :]]
    assert after[0] == "running" and "paused" not in after, after
    assert after[-1] == "finished"
