"""The training panel in Voila, in a real Chromium.

``tests/browser/notebooks/panel_live.ipynb`` (its source is ``panel_live.py``) is the quickstart's panel
without the blocking ``fit()``: training starts only when the test presses Start, and each forward pass sleeps
a little so a run lasts long enough to watch (1,000 epochs: the test stops it). The quickstart itself runs in
Voila with progressive rendering (``voila.json`` at the repository root): the panel must show and respond while
its ``w.fit()`` cell still runs, and the summary must render.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ._panel import (
    PANEL_ATTACHED,
    PANEL_SELECTORS,
    badge,
    chart,
    curve,
    global_step,
    scatter_points,
    wait_badge,
    wait_page,
    wait_shown,
)
from ._scenario import run_controls_scenario
from ._servers import wait_widgets_rendered, widget_problems

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "notebooks" / "panel_live.ipynb"
QUICKSTART = HERE.parents[1] / "notebooks" / "01_quickstart.ipynb"
PROGRESSIVE = ("--VoilaConfiguration.progressive_rendering=True",)


@pytest.mark.timeout(180)
def test_panel_in_voila_start_pause_resume_stop(voila_server, page, screenshot, console_log) -> None:
    server = voila_server(NOTEBOOK)
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    assert widget_problems(page) == []
    assert all(page.locator(s).count() == 1 for s in PANEL_ATTACHED), PANEL_ATTACHED
    assert badge(page) == "idle"
    assert "torch._C.Generator" not in page.inner_text("body"), "a stray output in the notebook"
    # every chart is a bqplot figure with two labelled axes; empty charts have no negative ticks
    for sel in (".nbt-chart-loss", ".nbt-chart-lr", ".nbt-chart-metrics", ".nbt-chart-memory"):
        info = chart(page, sel)
        assert info is not None and info["width"] > 0 and len(info["axes"]) == 2, (sel, info)
    screenshot(page, "panel-voila-idle", selector=".nbt-panel")

    steps = run_controls_scenario(page, screenshot, "panel-voila", console_log)
    assert steps["final"] > steps["held"]

    # what the charts drew over the run
    loss = chart(page, ".nbt-chart-loss")
    assert loss is not None
    raw = curve(loss, "loss (step)")
    assert raw["xspan"] > 0.5 * loss["width"], f"loss points span {raw['xspan']:.0f}px of {loss['width']}px"
    assert all(not t.strip().startswith("-") for t in loss["axes"][1] if t.strip()), loss["axes"]  # never below 0
    assert scatter_points(page, ".nbt-chart-loss") >= 1  # validation loss per epoch, with tooltips
    lr = chart(page, ".nbt-chart-lr")
    assert lr is not None
    assert curve(lr, "lr")["n"] >= 2 and any("e-" in t for t in lr["axes"][1]), lr  # a log axis in LR format
    assert scatter_points(page, ".nbt-chart-metrics") >= 2  # accuracy per epoch, train and val
    assert curve(chart(page, ".nbt-chart-memory"), "memory")["n"] >= 2
    # the per-epoch table filled as epochs ended
    assert page.locator(".nbt-epoch-table tbody tr").count() >= 1


def _long_quickstart(tmp_path: Path) -> Path:
    """The quickstart notebook with 300 epochs instead of 5: its whole run lasts about 1.5 s on this machine, too
    short to click Pause during it reliably; nothing else changes."""
    import nbformat

    nb = nbformat.read(QUICKSTART, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "epochs=5" in c.source]
    assert len(cells) == 1, "the quickstart's TrainerWidget cell (epochs=5) is not where this test expects it"
    cells[0].source = cells[0].source.replace("epochs=5", "epochs=300")
    dest = tmp_path / "nb" / QUICKSTART.name
    dest.parent.mkdir(parents=True)
    nbformat.write(nb, dest)
    return dest


@pytest.mark.timeout(240)
def test_quickstart_in_voila_responds_while_it_trains(voila_server, page, screenshot, console_log, tmp_path) -> None:
    server = voila_server(_long_quickstart(tmp_path), extra_args=PROGRESSIVE)
    t0 = time.monotonic()
    page.goto(server.url + "/", wait_until="commit", timeout=120_000)
    # progressive rendering: the panel shows while the notebook's own w.fit() cell is still training
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    shown = time.monotonic() - t0
    print(f"\npanel rendered {shown:.1f} s after the request")
    wait_badge(page, "running", cpu_s=30)
    page.locator("button.nbt-pause").click()  # usable: the click reaches the blocking cell's run
    wait_badge(page, "paused")
    held = global_step(page)
    page.wait_for_timeout(1000)
    assert global_step(page) == held
    page.locator("button.nbt-pause").click()
    wait_badge(page, "running")
    # stop only once an epoch has ended: on a loaded machine Stop can land inside epoch 1, and a run with no
    # epoch has no summary table to check (and the notebook's best-epoch cell has nothing to print)
    wait_page(page, "() => !!document.querySelector('.nbt-epoch-table tbody tr')", cpu_s=60, what="an epoch's row")
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)
    # the summary renders inside the panel (Voila never re-renders the plain-HTML slot under it)
    # the badge says "stopped" one UI push before the summary is built and shown (folded): wait for it, then open it
    wait_shown(page, ".nbt-summary-area .nbt-section-title", what="the summary's title")
    page.locator(".nbt-summary-area .nbt-collapse").click()
    wait_shown(page, ".nbt-summary-live .nbt-summary-table", what="the summary's table")
    assert page.locator(".nbt-summary-live svg.nbt-summary-chart").count() >= 3
    # the fit cell returned and the cells after it ran: the History report and its table
    wait_page(page, "() => document.body.innerText.includes('best val_acc')", what="the History report's cell")
    assert "torch._C.Generator" not in page.inner_text("body"), "a stray output in the notebook"
    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith("pageerror")], console_log
    screenshot(page, "quickstart-voila-stopped", selector=".nbt-panel")
