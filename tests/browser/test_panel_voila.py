"""The training panel in Voila, in a real Chromium: it renders, Start trains live, Stop stops.

The notebook (``tests/browser/notebooks/panel_live.ipynb``, synced from its jupytext source ``panel_live.py``) is the
quickstart's panel without the blocking ``fit()``: training starts only when the test presses Start, and each
forward pass sleeps a little so a 40-epoch run lasts long enough to watch.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _panel import PANEL_ATTACHED, PANEL_SELECTORS, chart, curve, global_step, state_errors, status, step_bar_fraction
from _servers import wait_widgets_rendered, widget_problems

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "panel_live.ipynb"
STOP_WITHIN_S = 5.0

# bqplot draws marks in steps: wait until the raw loss line has more points than `base`
LOSS_POINTS_ABOVE = """([base]) => {
    const g = [...document.querySelectorAll('.nbt-chart-loss svg.svg-figure g.curve')]
        .find(g => (g.querySelector('text.curve_label') || {}).textContent === 'loss (step)');
    const d = g && g.querySelector('path.line') && g.querySelector('path.line').getAttribute('d') || '';
    return (d.match(/[ML]/g) || []).length > base;
}"""


@pytest.mark.timeout(120)
def test_panel_in_voila_start_live_updates_stop(voila_server, page, screenshot, console_log) -> None:
    t0 = time.monotonic()
    server = voila_server(NOTEBOOK)
    # GET / executes the notebook (imports torch, builds the panel) before the page completes
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, PANEL_SELECTORS, timeout=60)
    assert widget_problems(page) == []
    assert all(page.locator(s).count() == 1 for s in PANEL_ATTACHED), PANEL_ATTACHED
    assert status(page).startswith("idle"), status(page)

    # charts are bqplot SVG figures with their axes; marks with no data yet draw no curve
    for sel in (".nbt-chart-loss", ".nbt-chart-lr", ".nbt-chart-metrics"):
        info = chart(page, sel)
        assert info is not None and info["width"] > 0 and len(info["axes"]) == 2, (sel, info)
    screenshot(page, "panel-voila-idle", selector=".nbt-panel")

    # Start: the status turns running, the step counter, the step bar and the loss line grow
    page.locator("button.nbt-start").click()
    page.locator(".nbt-status", has_text="running").wait_for(timeout=20_000)
    page.wait_for_function(LOSS_POINTS_ABOVE, arg=[2], timeout=20_000)
    loss = chart(page, ".nbt-chart-loss")
    assert [c["label"] for c in loss["curves"]][:2] == ["loss (step)", "smoothed"], loss
    step_a, points_a = global_step(page), curve(loss, "loss (step)")["n"]
    page.wait_for_function(LOSS_POINTS_ABOVE, arg=[points_a + 20], timeout=20_000)
    step_b, points_b = global_step(page), curve(chart(page, ".nbt-chart-loss"), "loss (step)")["n"]
    assert step_b > step_a > 0, (step_a, step_b)
    assert points_b > points_a, (points_a, points_b)
    assert 0 < step_bar_fraction(page) <= 1

    # past the first epoch the val-loss markers, the LR line and the metric markers are drawn too
    page.wait_for_function(
        "() => document.querySelectorAll('.nbt-chart-loss g.curve path.dot').length >= 1", timeout=30_000
    )
    loss = chart(page, ".nbt-chart-loss")
    assert curve(loss, "val_loss").get("dots", 0) >= 1, loss
    raw = curve(loss, "loss (step)")
    # the points are spread along the x axis (a broken x scale draws them all at one x)
    assert raw["xspan"] > 0.5 * loss["width"], f"loss points span {raw['xspan']:.0f}px of {loss['width']}px: {loss}"
    assert all(any(t.strip() for t in ticks) for ticks in loss["axes"]), f"axis without tick labels: {loss['axes']}"
    lr = chart(page, ".nbt-chart-lr")
    assert lr["curves"][0]["n"] >= 2, lr
    metrics = chart(page, ".nbt-chart-metrics")
    assert sum(c["dots"] for c in metrics["curves"]) >= 2, metrics
    assert screenshot(page, "panel-voila-running", selector=".nbt-panel").stat().st_size > 10_000

    # Stop: "stopped" within a few seconds, and nothing grows any more
    page.locator("button.nbt-stop").click()
    clicked = time.monotonic()
    # the badge itself (its class names the status), not the detail text beside it
    page.locator(".nbt-status .nbt-status-stopped").wait_for(timeout=STOP_WITHIN_S * 1000)
    took = time.monotonic() - clicked
    print(f"\nstatus 'stopped' {took:.2f} s after the click; test ran {time.monotonic() - t0:.1f} s")
    settled = global_step(page)
    page.wait_for_timeout(1500)
    assert global_step(page) == settled, "training went on after Stop"
    assert page.locator("button.nbt-start").is_enabled(), "Start is not enabled again after Stop"
    screenshot(page, "panel-voila-stopped", selector=".nbt-panel")

    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith("pageerror")], console_log
    assert not state_errors(console_log), state_errors(console_log)[:5]
