"""The panel's LR finder: the sweep's chart, choosing an LR by button or by clicking the curve, the button
running it in a helper thread, and refusals while the model is busy (no kernel, no browser)."""

from __future__ import annotations

import math
import threading
import time

import bqplot as bq
import numpy as np
import pytest
import torch
from widget_helpers import classes, make_widget, wait_for

from nbtrainer import LRFinderResult, format_lr
from nbtrainer.widgets import LRFinderView


def browser_click(mark: bq.Scatter, index: int) -> None:
    """What the front end sends when a point of a mark with ``interactions={"click": "select"}`` is clicked:
    an ``update`` of ``selected`` to ``Uint32Array([index])``, delivered through the widget's comm handler."""
    buf = np.array([index], dtype=np.uint32).tobytes()
    mark._handle_msg(
        {
            "content": {
                "data": {
                    "method": "update",
                    "buffer_paths": [["selected", "value"]],
                    "state": {"selected": {"dtype": "uint32", "shape": [1]}},
                }
            },
            "buffers": [memoryview(buf)],
        }
    )


def state(w) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in w.trainer.model.state_dict().items()}


def test_lr_find_chart_suggestions_buttons_and_curve_click():
    w = make_widget(epochs=1)
    before, lr_before = state(w), w.trainer.lr
    result = w.lr_find(steps=30)

    assert isinstance(result, LRFinderResult) and len(result.lrs) >= 5
    after = state(w)
    assert all(torch.equal(before[k], after[k]) for k in before), "lr_find changed the weights"
    assert w.trainer.lr == lr_before  # the optimizer (and its LR) restored too

    view = w.lr_finder
    assert isinstance(view, LRFinderView) and w.view.lrfinder_area.children == (view.root,)
    assert {
        "nbt-lrfind",
        "nbt-lrfinder-area",
        "nbt-lrfinder",
        "nbt-lrfinder-chart",
        "nbt-lrfinder-use",
        "nbt-lrfinder-choice",
    } <= classes(w.panel)
    assert isinstance(view.line.scales["x"], bq.LogScale)
    keep = [i for i, s in enumerate(result.smoothed) if math.isfinite(s) and math.isfinite(result.losses[i])]
    lrs = [result.lrs[i] for i in keep]
    np.testing.assert_allclose(view.line.x, lrs)
    np.testing.assert_allclose(view.line.y, [result.smoothed[i] for i in keep])
    np.testing.assert_allclose(view.raw.y, [result.losses[i] for i in keep])
    np.testing.assert_allclose(view.points.x, lrs)  # the clickable copy of the smoothed curve
    assert view.points.interactions.get("click") == "select"
    rules = {k: v for k, v in result.suggestions.items() if v is not None}
    assert rules and result.rule in rules
    np.testing.assert_allclose(view.suggested.x, list(rules.values()))
    assert [n.split()[0] for n in view.suggested.names] == list(rules)
    # the marker starts at the LR control's value
    np.testing.assert_allclose(view.marker.x, [w.view.lr.value] * 2)

    for rule, lr in rules.items():  # each "use ..." button sets the control and the trainer's LR
        button = view.use_buttons[rule]
        assert "nbt-lrfinder-use" in button._dom_classes and rule in button.description
        button.click()
        assert w.view.lr.value == pytest.approx(lr) and w.trainer.lr == pytest.approx(lr)
        assert view.chosen == pytest.approx(lr) and format_lr(lr) in view.choice.value
        np.testing.assert_allclose(view.marker.x, [lr, lr])

    i = min(10, len(lrs) - 1)
    browser_click(view.points, i)
    assert w.view.lr.value == pytest.approx(lrs[i]) and w.trainer.lr == pytest.approx(lrs[i])
    assert "clicked" in view.choice.value and view.points.selected is None
    view.use_buttons[result.rule].click()
    browser_click(view.points, i)  # the same point again is a change again
    assert w.trainer.lr == pytest.approx(lrs[i])

    # an idle control is what the next Start uses
    w.view.scheduler.value = "constant"
    w.start()
    h = w.wait()
    assert h.steps["lr"][0] == pytest.approx(lrs[i])


class SlowLoader:
    """The widget's loader, a little slower per batch, recording the threads that iterate it."""

    def __init__(self, loader, delay: float = 0.01) -> None:
        self.loader, self.delay = loader, delay
        self.threads: set[str] = set()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            self.threads.add(threading.current_thread().name)
            time.sleep(self.delay)
            yield batch


def test_lr_find_button_runs_in_a_helper_thread_and_is_refused_mid_run():
    w = make_widget(epochs=2, slow=0.005)
    fast_loader = w.train_loader
    w.train_loader = slow = SlowLoader(fast_loader)
    w.view.lrfind.click()
    v = w.view
    # returned at once; the sweep (up to 100 steps, 10 ms a batch) holds Start, Save and the LR control meanwhile
    assert v.start.disabled and v.lrfind.disabled and v.save.disabled and v.lr.disabled
    with pytest.raises(RuntimeError, match="LR finder is running"):
        w.start()
    with pytest.raises(RuntimeError, match="already running"):
        w.lr_find(steps=5)
    wait_for(lambda: v.lrfinder_area.children and not v.lr.disabled, 120, "LR finder view")
    assert slow.threads == {"nbtrainer-lrfind"}
    assert not (v.start.disabled or v.lrfind.disabled or v.save.disabled or v.lr.disabled)
    assert [m for m in v.message_log if m[0] != "info"] == []
    assert any(text.startswith("LR finder: ") and "suggestion" in text for _, text in v.message_log)

    w.train_loader = fast_loader
    view = w.lr_finder
    w.start()
    try:
        assert v.lrfind.disabled  # off while a run is alive
        v.lrfind.click()  # a click that got through anyway (a stale front end): refused with a message
        assert v.message_log[-1][0] == "error" and "stop the run first" in v.message_log[-1][1]
        with pytest.raises(RuntimeError, match="between runs"):
            w.lr_find(steps=5)
        assert w.lr_finder is view and v.lrfinder_area.children == (view.root,)
    finally:
        w.stop()
        w.wait()
    assert not v.lrfind.disabled


# each forward's thread and span, of the model and of its copies (Profile runs copies: an attribute would be copied)
CALLS: list[tuple[str, float, float]] = []


class ForwardLog(torch.nn.Module):
    """The model, telling each forward in ``CALLS``; the data check's forward takes 0.3 s longer."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.monotonic()
        if threading.current_thread().name == "nbtrainer-data-check":
            time.sleep(0.3)  # a bigger model or batch: the check is still running when a person clicks
        out = self.inner(x)
        CALLS.append((threading.current_thread().name, start, time.monotonic()))
        return out


@pytest.mark.parametrize("action", ["lr_find", "profile"])
def test_lr_finder_and_profile_wait_for_the_data_check_before_using_the_model(action: str) -> None:
    """The panel checks the data in a helper thread at construction (a forward on the model). The LR finder trains
    that model and Profile runs it: clicked before the check ends, they wait for it, as Start does (a forward beside
    the sweep's steps would see half-updated weights, and a criterion watching the model's calls sees both)."""
    from widget_helpers import parts

    from nbtrainer import TrainerWidget

    inner, criterion, _, loader = parts(n=256, bs=16)
    CALLS.clear()
    model = ForwardLog(inner)
    w = TrainerWidget(model, criterion, torch.optim.SGD(model.parameters(), 0.1), loader, epochs=1, progress=False)
    if action == "lr_find":
        w.lr_find(steps=5)
    else:
        w.profile(time_budget_s=0.05)  # the order of the forwards is the point, not the timings
    check = [c for c in CALLS if c[0] == "nbtrainer-data-check"]
    other = [c for c in CALLS if c[0] != "nbtrainer-data-check"]
    assert check and other, CALLS
    assert min(c[1] for c in other) >= max(c[2] for c in check), CALLS


def test_closing_the_panel_stops_a_running_lr_finder_and_waits_for_its_thread() -> None:
    """Before: ``w.close()`` stopped a run but not the sweep the LR finder button started, whose thread went on
    training the model behind a closed panel (and would then show its chart in closed widgets)."""
    w = make_widget(epochs=1)
    before = state(w)
    threads_before = set(threading.enumerate())
    w.train_loader = slow = SlowLoader(w.train_loader, delay=0.05)  # 100 steps: 5 s of sweep unless stopped
    w.view.lrfind.click()
    wait_for(lambda: "nbtrainer-lrfind" in slow.threads, 60, "the sweep's first batch")
    sweep = next(t for t in threading.enumerate() if t.name == "nbtrainer-lrfind")
    w.close()
    assert not sweep.is_alive()
    assert [t.name for t in set(threading.enumerate()) - threads_before if t.name.startswith("nbtrainer")] == []
    stopped = w.trainer.run_state.lr_finder  # the sweep's result, kept by the trainer
    assert stopped.stopped_early and stopped.stop_reason.startswith("stopped at step") and len(stopped.lrs) < 100
    after = state(w)
    assert all(torch.equal(before[k], after[k]) for k in before)  # put back as after any sweep
    assert w.lr_finder is None and w.view.lrfinder_area.children == ()  # nothing shown in the closed panel
    with pytest.raises(RuntimeError, match="closed"):
        w.lr_find(steps=5)


def test_the_stop_button_ends_the_lr_finders_sweep_and_shows_its_curve_so_far() -> None:
    """Before: Stop was off during the sweep (it stopped runs only), so a sweep started by mistake, or one on a
    model whose steps take seconds, could only be waited out. Now Stop is on while the sweep runs and ends it at its
    next step: the model put back, the curve so far shown, and the next sweep runs in full."""
    w = make_widget(epochs=1)
    before = state(w)
    fast_loader = w.train_loader
    w.train_loader = slow = SlowLoader(fast_loader, delay=0.05)  # 100 steps: 5 s of sweep unless stopped
    v = w.view
    assert v.stop.disabled  # nothing to stop yet
    v.lrfind.click()
    wait_for(lambda: "nbtrainer-lrfind" in slow.threads, 60, "the sweep's first batch")
    assert not v.stop.disabled
    v.stop.click()
    wait_for(lambda: v.lrfinder_area.children and not v.lr.disabled, 60, "LR finder view")
    result = w.lr_finder.result
    assert result.stopped_early and result.stop_reason.startswith("stopped at step") and len(result.lrs) < 100
    assert v.stop.disabled and not v.start.disabled and not v.lrfind.disabled
    after = state(w)
    assert all(torch.equal(before[k], after[k]) for k in before)  # put back as after any sweep
    assert [m for m in v.message_log if m[0] == "error"] == []
    assert any("LR finder: stopping" in text for _, text in v.message_log)
    w.train_loader = fast_loader
    again = w.lr_find(steps=5)  # the Stop of the last sweep does not stop this one
    assert len(again.lrs) == 5 and not again.stop_reason.startswith("stopped")


def test_lr_find_stop_event_ends_the_sweep_at_the_next_step() -> None:
    """``Trainer.lr_find(stop=event)``: set from another thread, the sweep ends at its next step and restores."""
    w = make_widget(epochs=1)
    stop = threading.Event()
    stop.set()
    result = w.trainer.lr_find(w.train_loader, steps=20, stop=stop)
    assert result.lrs == [] and result.stopped_early and result.stop_reason == "stopped at step 0 of 20"
    with pytest.raises(TypeError, match=r"threading\.Event"):
        w.trainer.lr_find(w.train_loader, steps=20, stop=True)
