"""What one push of the panel's UI thread costs, counted (issue 54): the UI thread's time is the training thread's
(it holds the GIL), so a push must send what changed and nothing else, and its work must not grow with the number
of steps it covers. Timings live in bench/widget_overhead.py."""

from __future__ import annotations

import threading
from collections import Counter

import ipywidgets
import pytest
import torch
from widget_helpers import make_widget

from nbtrainer.widgets._pump import UiPump


@pytest.fixture
def sent(monkeypatch):
    """Widget messages (non-empty state updates) sent, each push's (messages, steps it covered), and an event set
    once a push has been applied."""
    count = {"n": 0, "any_thread": False}
    pushes: list[tuple[int, int]] = []
    pushed = threading.Event()
    send_state, apply = ipywidgets.Widget.send_state, UiPump._apply

    def counted_send_state(self, key=None):
        on_ui = threading.current_thread().name.startswith("nbtrainer-ui")
        if (on_ui or count["any_thread"]) and self.get_state(key=key):
            count["n"] += 1
        return send_state(self, key)

    def counted_apply(self, items, final):
        before = self.progress.global_step if self.progress is not None else 0
        count["n"] = 0
        apply(self, items, final)
        after = self.progress.global_step if self.progress is not None else 0
        pushes.append((count["n"], after - before))
        pushed.set()

    monkeypatch.setattr(ipywidgets.Widget, "send_state", counted_send_state)
    monkeypatch.setattr(UiPump, "_apply", counted_apply)
    return count, pushes, pushed


class SecondEpochAfterAPush:
    """Holds the training thread at the second epoch's start until the UI thread has pushed the first: each push
    then covers a whole epoch, however late a loaded machine runs the UI thread."""

    def __init__(self, pushed: threading.Event) -> None:
        self.pushed = pushed

    def on_epoch_start(self, trainer, epoch: int) -> None:
        if epoch == 2:
            assert self.pushed.wait(60), "the UI thread never pushed the first epoch"


def _last_push(sent, steps_per_epoch: int) -> tuple[int, int]:
    """A 2-epoch run whose UI thread pushes twice (ui_interval far longer than the run): at the first epoch's end,
    which wakes it, and at the run's end. The training thread waits for the first push before its second epoch, so
    the last push covers exactly the second epoch, its end and the final state, in both runs."""
    _, pushes, pushed = sent
    pushes.clear()
    pushed.clear()
    w = make_widget(
        n=16 * steps_per_epoch, bs=16, epochs=2, ui_interval=60.0, callbacks=[SecondEpochAfterAPush(pushed)]
    )
    w.start()
    w.wait()
    assert w.trainer.status == "finished"
    assert len(pushes) == 2, pushes
    return pushes[-1]


def test_a_push_sends_no_more_messages_when_it_covers_16x_the_steps(sent):
    """The run's last push carries its steps, its epoch rows and the final state: one message per widget that
    changed (the progress, the stat cards, each chart's marks and axes, the table), never one per step or point."""
    short_msgs, short_steps = _last_push(sent, steps_per_epoch=16)
    long_msgs, long_steps = _last_push(sent, steps_per_epoch=256)
    assert (short_steps, long_steps) == (16, 256)
    # a message per step would add 200+; a few may differ (a health light or the norm chart with more samples)
    assert long_msgs <= short_msgs + 12, (short_msgs, long_msgs)
    assert long_msgs <= 60, long_msgs


def test_a_push_with_nothing_new_sends_nothing_and_rebuilds_no_health_card(sent):
    count, pushes, _ = sent
    w = make_widget(n=512, epochs=2)
    card = w.health_card
    built: Counter[str] = Counter()
    lights_html = card._lights_html

    def counted():
        built["n"] += 1
        return lights_html()

    card._lights_html = counted
    w.start()
    w.wait()  # the UI thread has ended: the pushes below are the only ones
    assert w.trainer.status == "finished" and built["n"] >= 1  # the card was drawn during the run
    count["any_thread"] = True
    w._pump._apply([], True)  # what a push with nothing new does (the run's end was drawn already)
    built["n"] = 0
    for _ in range(5):
        w._pump._apply([], True)
    assert [m for m, _ in pushes[-5:]] == [0] * 5 and built["n"] == 0, (pushes[-5:], built["n"])


def test_the_data_section_counts_the_label_issues_without_listing_them_at_each_push(monkeypatch):
    """The data section's headline ("N likely label issues") was ``len(data_map.label_issues())``: every item the
    model mostly got wrong built into a list at each push, on the UI thread. With random labels that is most of the
    data set: a 96,000-item tiny MLP ran 2.1x headless in the panel. A push now counts them; the list is built only
    when someone asks for it."""
    import nbtrainer._know._issues as issues
    from nbtrainer import TrainerWidget

    built: Counter[str] = Counter()
    init = issues.LabelIssue.__init__

    def counted(self, *args, **kwargs):
        built[threading.current_thread().name.split(" ")[0]] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(issues.LabelIssue, "__init__", counted)
    torch.manual_seed(0)
    x, y = torch.randn(3072, 8), torch.randint(0, 4, (3072,))  # random labels: most items are "likely issues"
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), "sgd", loader, epochs=2, lr=0.05, progress=False,
                      refresh_interval=0.02, ui_interval=0.02)  # fmt: skip
    w.start()
    w.wait()
    assert w.trainer.status == "finished" and w.ui_updates >= 2
    dm = w.looks.data.data_map
    count = dm.label_issue_count()
    assert count > 1000 and f"{count} likely label issues" in w.looks.data.section_detail()
    assert built["nbtrainer-ui"] == 0, built  # counted at each push, none listed
    assert len(dm.label_issues()) == count  # the same items, when asked for
