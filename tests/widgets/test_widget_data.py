"""The panel's data section (issue 55), headless: real trainers, real widgets, no kernel. The clicks themselves are
tested with the mouse in tests/browser/test_panel_data.py; here, what a selection leads to.

Before Start the data check's lights and a batch show, and the fit reuses that report; labels past the model's outputs
keep Start from training; after a run the map is drawn (one point per item), a selection shows those items, most
suspicious first, in the cleaner, whose choices are the map's edits and the next fit's dataset; the errors section's
cleaner writes the interpretation's edits.
"""

from __future__ import annotations

import itertools
import re
import time

import pytest
import torch
from conftest import make_classification, make_loader, mlp
from widget_helpers import classes, wait_for

from nbtrainer import TrainerWidget


def _panel(x: torch.Tensor, y: torch.Tensor, **kw) -> TrainerWidget:
    model = mlp()
    loader = make_loader(x, y, batch_size=32, shuffle=True)
    return TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.2), loader,
                         make_loader(x[:64], y[:64], batch_size=64), run_store=False, **kw)  # fmt: skip


def test_the_check_shows_before_start_the_run_maps_the_items_and_the_cleaner_writes_the_edits() -> None:
    x, y = make_classification(n=320)
    w = _panel(x, y, epochs=3)
    data = w.looks.data
    assert "nbt-data" in classes(w.panel) and "nbt-data-map" not in classes(w.panel)  # no map before a run
    data.wait_check(30)
    report = data.report
    assert report is not None and report.by_kind("duplicates_across")  # validation is the first 64 training items
    assert "nbt-data-problem" in data.report_html.value and "duplicates_across" in data.report_html.value
    assert "nbt-batch" in data.batch_html.value and data.section.visible
    assert not data.map_box.children  # no map before a run
    w.start()
    history = w.wait()
    assert history.status == "finished"
    assert w.trainer.data_report is report  # the fit reused the panel's check
    wait_for(lambda: len(data.scatter.x) == 320, 10, "the map drawn at the run's end")
    dm = w.data_map
    assert int(dm.visits.sum()) == 3 * 320 and data.map_box.children
    assert {"nbt-data-map", "nbt-data-map-mode", "nbt-data-map-note", "nbt-cleaner"} <= classes(w.panel)
    assert "likely label issues" in data.section.title.value

    # a selection (a click or a lasso sets the scatter's `selected`): those items, most suspicious first
    worst = dm.label_issues(3).indices
    points = [int((data._points == i).nonzero()[0][0]) for i in worst[::-1]]
    data.scatter.selected = points
    assert data.selection == worst and list(data.cleaner.choices) == worst
    assert all(f"#{i} · given" in card for i, card in zip(worst, [c.children[0].value for c in
               data.cleaner.items.children], strict=True))  # fmt: skip
    first, second = worst[0], worst[1]
    data.cleaner.choices[first].value = "drop"
    data.cleaner.choices[second].value = "relabel"
    data.cleaner.labels[second].value = 2
    assert dm.edits.dropped == [first] and dm.edits.relabeled == {second: 2}
    assert "1 dropped" in data.cleaner.summary.value and "w.data_map.cleaned()" in data.cleaner.summary.value
    view = dm.cleaned()
    assert view.dataset is w.train_loader.dataset and len(view) == 319 and view.changes["relabeled"] == {second: 2}
    data.cleaner.choices[first].value = "keep"
    assert dm.edits.dropped == []


def test_labels_past_the_outputs_keep_start_from_training() -> None:
    x, y = make_classification(n=96)
    y[40] = 9  # the model has 3 outputs
    w = _panel(x, y)
    data = w.looks.data
    data.wait_check(30)
    assert "label_range" in data.report_html.value and "nbt-data-problem" in data.report_html.value
    w.start()
    assert w.status == "idle" and w.trainer.global_step == 0
    assert any(level == "error" and "not started" in m and "labels 9" in m for level, m in w.view.messages_log.log)


def test_the_errors_sections_cleaner_writes_the_interpretations_edits() -> None:
    x, y = make_classification(n=256)
    w = _panel(x, y, interpret=True, epochs=1)
    w.start()
    w.wait()
    errors = w.looks.errors
    wait_for(lambda: errors.interpretation is not None, 10, "an interpretation drawn")
    interp = errors.interpretation
    cells = [(t, p) for t in range(3) for p in range(3) if t != p and interp.where(target=t, prediction=p)]
    target, predicted = cells[0]
    items = errors.show_cell(target, predicted)
    shown = list(errors.cleaner.choices)
    assert shown == items[: len(shown)] and errors.cleaner.labels[shown[0]].value == predicted
    errors.cleaner.choices[shown[0]].value = "relabel"
    assert interp.edits.relabeled == {shown[0]: predicted}
    assert interp.cleaned().changes["relabeled"] == {shown[0]: predicted}


def test_arrays_train_as_in_fit_with_the_check_and_the_batch_shown() -> None:
    # `Trainer.fit((x, y), batch_size=32)` trains on arrays; the panel refused the batch_size its own error asked for
    # ("pass batch_size= (e.g. fit((x, y), batch_size=32))": unexpected keyword), so arrays could not be used at all
    x, y = make_classification(n=320)
    model = mlp()
    args = (model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.2), (x, y), (x[:64], y[:64]))
    with pytest.raises(TypeError, match=r"no batch_size was given.*TrainerWidget\(\.\.\., \(x, y\), batch_size=32\)"):
        TrainerWidget(*args, run_store=False)
    with pytest.raises(TypeError, match=r"batch_size=32 applies to array data.*TrainerWidget\(\) got a DataLoader"):
        TrainerWidget(*args[:3], make_loader(x, y), batch_size=32, run_store=False)
    w = TrainerWidget(*args, batch_size=32, epochs=2, run_store=False)
    data = w.looks.data
    data.wait_check(30)
    assert data.report is not None and data.report.by_kind("duplicates_across")  # the check read the arrays
    assert "nbt-batch" in data.batch_html.value
    w.start()
    history = w.wait()
    assert history.status == "finished" and w.trainer.global_step == 2 * 10  # 320 rows in batches of 32
    assert int(w.data_map.visits.sum()) == 2 * 320  # the fast path knew every item's index
    assert not torch.equal(next(iter(w.train_loader))[0], x[:32])  # shuffled, as fit shuffles training arrays


def test_integer_inputs_show_dtype_and_shape_without_moments() -> None:
    # token ids have no mean or std: the table showed "nan" in every moment column of a clean integer field
    ids = torch.randint(5, 100, (96, 12), generator=torch.Generator().manual_seed(0))
    labels = ids[:, 0] % 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Flatten(), torch.nn.Linear(96, 3))
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), "adamw", (ids, labels), batch_size=16, run_store=False)
    data = w.looks.data
    data.wait_check(30)
    rows = re.findall(r"<tr>(.*?)</tr>", data.report_html.value, re.S)
    cells = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S)] for r in rows]
    head = cells[0]
    inputs = next(dict(zip(head, c, strict=True)) for c in cells[1:] if c[head.index("field")] == "inputs")
    assert inputs["dtype"] == "int64" and inputs["shape"] == "[12]"
    assert [inputs[k] for k in ("mean", "std", "min", "max")] == ["", "", "", ""]
    assert "nan" not in data.report_html.value


def test_wait_after_a_refused_start_says_it_was_refused_and_why() -> None:
    x, y = make_classification(n=96)
    w = _panel(x, y)
    w.start()  # a first run: wait() must not hand its History back for the refused start below
    assert w.wait().status == "finished"
    y[40] = 9  # the model has 3 outputs: the next start is refused
    for panel in (w, _panel(x, y)):  # after a run, and on a fresh panel
        panel.looks.data.start_check(panel.trainer, panel.train_loader, panel.val_loader)
        panel.start()
        with pytest.raises(RuntimeError, match=r"not started: .*labels 9"):
            panel.wait()


def test_a_drawing_of_a_large_map_reads_it_once_and_keeps_the_most_suspicious_items() -> None:
    # The UI thread draws the map at each epoch's end and holds the GIL the training thread needs: three reads of the
    # map's table, a set difference and a full sort took 36 ms a drawing on 96,000 items (issue 54)
    x, y = make_classification(n=4000)
    y[:300] = (y[:300] + 1) % 3  # mislabeled: the map's most suspicious items
    w = _panel(x, y, epochs=1)
    w.looks.data.wait_check(30)
    w.start()
    w.wait()
    data, dm = w.looks.data, w.data_map
    reads = []
    table = dm.table

    def counted() -> dict:
        reads.append(1)
        return table()

    dm.table = counted  # type: ignore[method-assign]
    data.draw()
    assert len(reads) == 1, "the map was read once for the points, the caption and the section's title"
    del dm.table
    t = dm.table()
    seen = torch.nonzero(t["visits"] > 0).flatten()
    score = t["score"][seen].nan_to_num(-float("inf"))
    top = seen[torch.argsort(-score, stable=True)[:200]].tolist()
    drawn = set(data._points.tolist())
    assert len(drawn) == 3000 and set(top) <= drawn  # a sample of the rest, and every one of the 200 most suspicious
    assert dm.summary(table=t) == dm.summary() and f"{dm.label_issue_count(table=t)} likely" in data.section.title.value


def _drawings(x: torch.Tensor, y: torch.Tensor, **kw) -> list[int]:
    """Run a panel to its end; the rows the map held at each of its drawings."""
    w = _panel(x, y, **kw)
    data, dm = w.looks.data, w.data_map
    data.wait_check(30)
    drawn: list[int] = []
    draw = data.draw

    def counted() -> None:
        drawn.append(int(dm.visits.sum()))
        draw()

    data.draw = counted  # type: ignore[method-assign]
    w.start()
    w.wait()
    return drawn


def test_the_map_is_drawn_once_an_epoch_and_at_the_end_only_with_rows_not_drawn_yet() -> None:
    # each drawing holds the GIL on the UI thread (7 ms on 96,000 items): a run whose last epoch ended was drawn at
    # that end and again at the run's end, with nothing new; a run stopped mid-epoch needs the end's drawing
    x, y = make_classification(n=320)
    drawn = _drawings(x, y, epochs=3)
    # at an epoch's end when the UI thread gets there (each epoch's, or one for several), each drawing with rows the
    # last did not have: never an empty map at Start, never the last epoch's rows again at the run's end
    assert drawn[-1] == 960 and all(0 < a < b for a, b in itertools.pairwise(drawn)) and drawn[0] > 0, drawn
    # stopped after 4 of an epoch's 10 steps: no epoch ended, and the run's end draws its 128 rows
    assert _drawings(x, y, epochs=3, max_steps=4) == [128]


def _budgeted(x: torch.Tensor, y: torch.Tensor, points_per_s: float, **kw) -> tuple[TrainerWidget, list]:
    """A panel whose map may draw ``points_per_s`` points a second, and a record of its drawings: (the time a drawing
    ended, the points drawn, the map's ``updates`` it drew)."""
    w = _panel(x, y, **kw)
    data, dm = w.looks.data, w.data_map
    data._points_per_s = points_per_s
    data.wait_check(30)
    drawings: list[tuple[float, int, int]] = []
    draw = data.draw

    def recorded() -> None:
        updates = dm.updates
        draw()
        drawings.append((time.monotonic(), len(data.scatter.x), updates))

    data.draw = recorded  # type: ignore[method-assign]
    return w, drawings


@pytest.mark.slow  # about 2 s: 250 short epochs, for several drawings the budget spaces out
def test_the_map_keeps_to_its_budget_of_points_and_a_run_that_ends_gets_its_last_map():
    # A browser draws each point of the scatter as an SVG element: redrawn at every push of a run with short epochs,
    # a 3,000-point map kept headless Chromium's main thread busy 95% of the time (0.93 of a core of a 2-core machine,
    # beside the training; bench/browser_cost.py). So the map has a budget of points a second, as the charts have.
    x, y = make_classification(n=320)  # 10 steps an epoch: epochs end far more often than the budget lets it draw
    # a 320-point drawing, then 0.1 s of rest; pushes every 0.02 s
    w, drawings = _budgeted(x, y, points_per_s=320 / 0.1, epochs=250, ui_interval=0.02)
    w.start()
    assert w.wait().status == "finished"
    live = drawings[:-1]
    # the premise: more epochs ended than the map was drawn (the budget held updates back), over several drawings
    assert w.data_map.updates == 250 and 2 <= len(live) < 250, drawings
    # never more than the budget allows: each drawing waits for the points of the one before it (a load only
    # lengthens the waits)
    assert sum(n for _, n, _ in live[:-1]) <= 320 / 0.1 * (live[-1][0] - live[0][0]), live
    # the run's end draws the map as it ended, whatever the budget
    assert drawings[-1][2] == 250 and drawings[-1][1] == 320


def test_a_map_held_back_by_its_budget_is_drawn_when_the_run_pauses():
    # the pushes of a paused run bring no new items: a map the budget held back must still be drawn while it holds
    x, y = make_classification(n=320)
    w, drawings = _budgeted(x, y, points_per_s=320 / 3600, epochs=10_000)  # after its first drawing, an hour's rest
    w.start()
    wait_for(lambda: drawings and w.data_map.updates >= drawings[0][2] + 3, 60, "epochs past the first drawing")
    w.view.pause.click()
    wait_for(lambda: w.trainer.status == "paused", 60, "the pause")
    held = w.data_map.updates  # no epoch ends while the run holds
    wait_for(lambda: drawings[-1][2] == held, 60, "the map drawn as the run holds")
    w.view.stop.click()
    assert w.wait().status == "stopped"


def test_closing_the_panel_mid_check_cancels_the_check_at_its_next_batch_and_a_new_check_replaces_an_old_one() -> None:
    """Before, ``close()`` (and a plan row's new batch size) waited for the whole pass over the data."""
    x, y = make_classification(n=4000)
    read: list[int] = []

    class Slow(torch.utils.data.Dataset):  # a data set read from disk: 1 ms an item, 4 s for the whole pass
        def __len__(self) -> int:
            return len(x)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            read.append(i)
            time.sleep(0.001)
            return x[i], y[i]

    model = mlp()
    loader = torch.utils.data.DataLoader(Slow(), batch_size=50)
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), "sgd", loader, run_store=False)
    data = w.looks.data
    wait_for(lambda: len(read) >= 100, 30, "the check under way")
    first = data._check
    data.start_check(w.trainer, w.train_loader, None)  # a newer check: the older one ends, drawing nothing
    assert first is not None and not first.is_alive() and data.report is None
    before_second = len(read)
    assert before_second < len(x)  # the first pass ended early
    wait_for(lambda: len(read) >= before_second + 200, 30, "the second check under way")
    w.close()
    assert data._check is not None and not data._check.is_alive()
    at_close = len(read)
    assert at_close - before_second < len(x) and data.report is None  # the second pass ended early, nothing drawn
    time.sleep(0.1)
    assert len(read) == at_close  # nothing reads after close() returned
