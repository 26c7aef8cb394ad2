"""The quickstart notebook itself (``notebooks/01_quickstart.ipynb``) in a real Chromium: in Voila and in
JupyterLab the panel renders, its 5-epoch run completes and the charts show it; in Voila, Start trains on.

The notebook is copied to a temporary folder first, so a run never writes next to the repository's copy.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from _panel import PANEL_SELECTORS, chart, curve, global_step, state_errors, status
from _servers import lab_run_all, wait_widgets_rendered, widget_problems

QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"
EPOCHS = 5  # what the quickstart trains for
STEPS_PER_EPOCH = 23  # 1,437 training digits in batches of 64


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "nb" / QUICKSTART.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(QUICKSTART, dest)
    return dest


def _assert_finished_run_drawn(page) -> None:
    """The finished run is in the charts: every step of the loss, one val point per epoch, metric markers."""
    page.locator(".nbt-status", has_text="finished").wait_for(timeout=30_000)
    page.wait_for_function(
        f"() => document.querySelectorAll('.nbt-chart-loss g.curve path.dot').length >= {EPOCHS}", timeout=20_000
    )
    loss = chart(page, ".nbt-chart-loss")
    raw, val = curve(loss, "loss (step)"), curve(loss, "val_loss")
    assert raw["n"] == EPOCHS * STEPS_PER_EPOCH and val["dots"] == EPOCHS, loss
    assert raw["xspan"] > 0.8 * loss["width"], loss  # spread over the axis, not drawn at one x
    assert all(any(t.strip() for t in ticks) for ticks in loss["axes"]), loss["axes"]
    metrics = chart(page, ".nbt-chart-metrics")
    assert {c["label"] for c in metrics["curves"]} >= {"acc", "val_acc"}, metrics
    assert global_step(page) == EPOCHS * STEPS_PER_EPOCH


@pytest.mark.timeout(150)
def test_quickstart_in_voila_runs_then_trains_on(voila_server, page, screenshot, console_log, tmp_path) -> None:
    server = voila_server(_copy(tmp_path))
    # Voila executes every cell (the 5-epoch w.fit() included) while the page loads
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=120_000)
    wait_widgets_rendered(page, PANEL_SELECTORS, timeout=90)
    _assert_finished_run_drawn(page)
    assert widget_problems(page) == []
    # the cells after the panel ran too: the History table and the bqplot chart of the run
    page.locator("text=best val_acc").first.wait_for(timeout=10_000)
    assert page.locator("svg.svg-figure").count() >= 4  # three panel charts + the notebook's own chart
    screenshot(page, "quickstart-voila-finished", selector=".nbt-panel")

    # Start trains on from the trained weights: a new run, its step counter grows from 0
    page.locator("button.nbt-start").click()
    page.wait_for_function(
        "() => /step [1-9]/.test(document.querySelector('.nbt-progress-info').innerText)"
        " && !/finished/.test(document.querySelector('.nbt-status').innerText)",
        timeout=20_000,
    )
    page.locator(".nbt-status", has_text="finished").wait_for(timeout=60_000)
    assert global_step(page) == EPOCHS * STEPS_PER_EPOCH
    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith("pageerror")], console_log
    assert not state_errors(console_log), state_errors(console_log)[:5]


@pytest.mark.timeout(180)
def test_quickstart_in_jupyterlab_run_all(lab_server, page, screenshot, console_log, tmp_path) -> None:
    nb = _copy(tmp_path)
    server = lab_server(nb.parent)
    page.goto(f"{server.url}/lab/tree/{nb.name}", wait_until="domcontentloaded", timeout=60_000)
    t0 = time.monotonic()
    lab_run_all(page, timeout=150)
    print(f"\nrun all: {time.monotonic() - t0:.1f} s")
    wait_widgets_rendered(page, PANEL_SELECTORS, timeout=30)
    page.locator(".nbt-panel").first.scroll_into_view_if_needed()
    _assert_finished_run_drawn(page)
    assert status(page).startswith("finished")
    assert widget_problems(page) == []
    # no cell raised: Lab marks an error output with this MIME type class
    assert (
        page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        .filter(has_text="Traceback")
        .count()
        == 0
    )
    assert not state_errors(console_log), state_errors(console_log)[:5]
    screenshot(page, "quickstart-lab-finished", selector=".nbt-panel")
