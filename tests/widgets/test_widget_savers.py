"""The panel's "memory savers" group: what it offers on this machine, and a QLoRA run chosen in it before Start."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
from conftest import needs
from widget_helpers import classes, make_classification, make_loader, tooltip, wait_for

from nbtrainer import Trainer, TrainerWidget, memory_saver_support

pytestmark = needs("bitsandbytes", "peft")


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))


def _widget(**kw):
    model = _mlp()
    x, y = make_classification(n=64, d=64, seed=0)
    return TrainerWidget(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        make_loader(x, y, 16),
        epochs=1,
        device="cpu",
        progress=False,
        refresh_interval=0.05,
        ui_interval=0.05,
        **kw,
    )


def _messages(w, level: str) -> list[str]:
    return [m.value for m in w.view.messages_log.lines.children if f"nbt-message-{level}" in m._dom_classes]


def test_the_group_is_in_the_panel_and_unavailable_options_carry_their_reason():
    w = _widget()
    s = w.savers
    assert "nbt-savers" in classes(w.panel)
    every_planned = ["as given", "adamw", "adamw8bit", "paged_adamw8bit", "adamw4bit", "adafactor"]
    assert [v for _, v in s.optimizer.options] == every_planned  # every kind a memory plan row may choose
    assert [v for _, v in s.quantize.options] == ["none", "nf4", "nf4-dq", "fp4", "int8"]
    assert s.optimizer.value == "as given" and s.quantize.value == "none" and not s.lora.value
    # On a CPU the optimizer state is in host RAM already: offloading it is refused, and the box says why.
    assert s.offload_optimizer.disabled
    assert "nothing to offload to" in tooltip(s.offload_optimizer)
    assert "nothing to offload to" in s.note.value
    assert not s.offload_activations.disabled and not s.lora.disabled
    support = memory_saver_support("cpu", "fp32")
    for label, value in s.quantize.options[1:]:
        ok, why = support[f"quantize:{value}"]
        assert label.endswith("(unavailable)") != ok
        assert ok or why in tooltip(s.quantize)
    assert w.savers.options() == {}  # nothing chosen: Start keeps the Trainer as built


def test_nf4_lora_adamw8bit_chosen_before_start_trains_only_the_adapters():
    w = _widget()
    before = w.trainer
    s = w.savers
    s.quantize.value, s.lora.value, s.optimizer.value = "nf4", True, "adamw8bit"
    w.view.start.click()
    assert w.trainer is not before, _messages(w, "error")
    history = w.wait()
    assert history.status == "finished" and w.trainer.global_step == 4
    counts = w.trainer.param_counts
    assert counts.trainable_names and all("lora_" in n for n in counts.trainable_names)
    assert 0 < counts.trainable < counts.frozen
    assert any(type(m).__name__ == "Linear4bit" for m in w.trainer.model.modules())  # a real nf4 base
    assert type(w.trainer.optimizer).__name__ == "AdamW8bit"
    assert "AdamW8bit" in w.view.title.value
    assert all(b.disabled for b in s.widgets)  # the model is quantized in place: no second choice on it
    assert "applied at Start" in s.note.value
    assert any("optimizer=adamw8bit" in m and "quantize=nf4" in m for m in _messages(w, "info"))


def test_a_combination_the_core_refuses_shows_its_message_in_the_panel():
    w = _widget()
    w.savers.lora.value = True  # with the optimizer "as given" (an instance): the core wants a name
    w.view.start.click()
    errors = _messages(w, "error")
    assert errors and "memory savers" in errors[-1] and "by name" in errors[-1]
    assert "Traceback" not in errors[-1]
    assert w.status == "idle" and not w.view.start.disabled
    assert isinstance(w.trainer.optimizer, torch.optim.SGD) and not Trainer.active()
    assert all(type(m) is not torch.nn.Linear or m.weight.requires_grad for m in w._model.modules())


def test_a_panel_given_a_built_trainer_locks_the_group_with_the_reason():
    model = _mlp()
    x, y = make_classification(n=32, d=64, seed=0)
    trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", device="cpu", progress=False)
    w = TrainerWidget(trainer, make_loader(x, y, 16))
    assert all(b.disabled for b in w.savers.widgets)
    assert "pass these options to Trainer" in w.savers.note.value


def test_step_in_backward_chosen_before_start_trains_and_the_controls_that_cannot_follow_say_why():
    w = _widget()
    s = w.savers
    assert not s.in_backward.disabled and s.in_backward in s.widgets
    s.optimizer.value, s.in_backward.value = "adamw", True
    assert s.options() == {"optimizer": "adamw", "optimizer_in_backward": True}
    w.view.start.click()
    history = w.wait()
    assert history.status == "finished", _messages(w, "error")
    assert w.trainer.optimizer_in_backward and w.trainer.global_step == 4
    assert all(p.grad is None for p in w.trainer.model.parameters())
    w.view.accum.value = 4  # no gradients to keep between micro-batches: refused, the control goes back
    assert w.view.accum.value == 1 and w.trainer.grad_accum_steps == 1
    w.view.max_grad_norm.value = 1.0
    assert w.view.max_grad_norm.value == 0.0 and w.trainer.max_grad_norm is None
    warnings = _messages(w, "warning")
    assert any("grad_accum_steps=4 keeps the gradients" in m for m in warnings), warnings
    assert any("max_grad_norm=1.0 clips by the norm" in m for m in warnings), warnings


def test_step_in_backward_with_accumulation_is_refused_at_start_with_the_reason():
    w = _widget(grad_accum_steps=2)
    w.savers.in_backward.value = True
    before = w.trainer
    w.view.start.click()
    assert w.trainer is before
    errors = _messages(w, "error")
    assert any("optimizer_in_backward=True: grad_accum_steps=2 keeps the gradients" in m for m in errors), errors


def test_step_in_backward_is_unavailable_under_fp16():
    support = memory_saver_support("cpu", "fp16-mixed")
    assert support["optimizer_in_backward"][0] is False and "GradScaler" in support["optimizer_in_backward"][1]
    w = _widget(precision="fp16-mixed")
    assert w.savers.in_backward.disabled and "GradScaler" in tooltip(w.savers.in_backward)


@pytest.mark.slow  # starts an interpreter (docs/testing.md)
def test_the_group_checks_the_quantized_formats_when_opened_or_when_one_is_chosen_not_before():
    # bitsandbytes' import is 0.6 s of CPU in a fresh kernel: a panel whose group stays shut never pays it
    script = (
        "import sys, torch\n"
        "from nbtrainer import TrainerWidget\n"
        "m = torch.nn.Linear(4, 2)\n"
        "w = TrainerWidget(m, torch.nn.CrossEntropyLoss(), 'adamw', [(torch.randn(8, 4), torch.randint(0, 2, (8,)))],"
        " epochs=1, progress=False)\n"
        "print('built', 'bitsandbytes' in sys.modules, w.savers.probed)\n"
        "w.savers.section.toggle.click()\n"  # what a click on the group's chevron sends
        "print('opened', 'bitsandbytes' in sys.modules, w.savers.probed, w.savers.section.is_open)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "built False False" in out.stdout and "opened True True True" in out.stdout, out.stdout
    # the plan view sets the menus without opening the group: Start checks the format before building it
    w = _widget()
    assert not w.savers.probed
    w.savers.quantize.value = "nf4"
    assert w.savers.options() == {"quantize": "nf4"} and w.savers.probed


def test_the_group_opened_during_a_run_is_checked_when_the_run_ends():
    # the check runs a quantized layer with the device's RNG saved and restored around it: never beside the
    # training thread's draws
    class Hold:  # the run stays alive at its first step until the test has clicked
        def __init__(self):
            self.reached, self.release = threading.Event(), threading.Event()

        def on_optimizer_step(self, trainer, step, skipped):
            if step == 1:
                self.reached.set()
                self.release.wait(60)

    hold = Hold()
    w = _widget(callbacks=[hold])
    w.view.start.click()
    try:
        assert hold.reached.wait(60), "the run never reached its first step"
        w.savers.section.toggle.click()
        assert w.savers.section.is_open and not w.savers.probed
    finally:
        hold.release.set()
    assert w.wait().status == "finished"
    wait_for(lambda: w.savers.probed, timeout=30, what="the check once the run ended")
