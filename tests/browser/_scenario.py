"""The panel scenario every front end must pass in a real browser: Start, a growing chart, Pause holding
still, Resume, Stop (and nothing moves after). Assertions read what the page shows, not the kernel."""

from __future__ import annotations

from typing import Any

from ._panel import chart, curve, global_step, state_errors, wait_badge, wait_page
from ._servers import widget_problems

# bqplot draws marks in steps: wait until the raw loss line has more points than `base`
LOSS_POINTS_ABOVE = """([base]) => {
    const g = [...document.querySelectorAll('.nbt-chart-loss svg.svg-figure g.curve')]
        .find(g => (g.querySelector('text.curve_label') || {}).textContent === 'loss (step)');
    const d = g && g.querySelector('path.line') && g.querySelector('path.line').getAttribute('d') || '';
    return (d.match(/[ML]/g) || []).length > base;
}"""
HOLD_S = 1.5  # how long "paused" and "stopped" must hold still


def loss_points(page: Any) -> int:
    return curve(chart(page, ".nbt-chart-loss"), "loss (step)").get("n", 0)


# The progress line's step (see _panel.global_step) is past a given value.
STEP_ABOVE = """([n]) => {
    const el = document.querySelector('.nbt-progress-info');
    const m = el ? el.innerText.match(/step ([\\d,]+)/) : null;
    return m !== null && parseInt(m[1].replace(/,/g, ''), 10) > n;
}"""


def run_controls_scenario(
    page: Any, screenshot: Any, name: str, console_log: list[str], known_page_errors: tuple[str, ...] = ()
) -> dict[str, int]:
    """Start, watch the chart grow, Pause (holds), Resume (grows again), Stop (holds); returns the steps seen.

    ``known_page_errors``: substrings of page errors the front end itself raises without any widget (each
    documented where it is passed); every other page error fails the scenario.
    """
    page.locator("button.nbt-start").click()
    wait_badge(page, "running")
    wait_page(page, LOSS_POINTS_ABOVE, [2], cpu_s=30)
    a_step, a_points = global_step(page), loss_points(page)
    wait_page(page, LOSS_POINTS_ABOVE, [a_points + 10], cpu_s=30)
    # the step line is its own widget message, which can be drawn after the chart's (seen on ipywidgets 7)
    wait_page(page, STEP_ABOVE, [a_step], cpu_s=30)
    b_step = global_step(page)
    assert b_step > a_step > 0, (a_step, b_step)
    screenshot(page, f"{name}-running", selector=".nbt-panel")

    # Pause: the badge says "paused" only once the loop holds; from then on nothing moves
    page.locator("button.nbt-pause").click()
    wait_badge(page, "paused")
    held_step, held_points = global_step(page), loss_points(page)
    page.wait_for_timeout(HOLD_S * 1000)
    assert (global_step(page), loss_points(page)) == (held_step, held_points), "the run moved while paused"
    assert page.locator("button.nbt-pause").inner_text().strip().lower().startswith("resume")
    screenshot(page, f"{name}-paused", selector=".nbt-panel")

    # Resume: running again, the chart grows past the pause
    page.locator("button.nbt-pause").click()
    wait_badge(page, "running")
    wait_page(page, LOSS_POINTS_ABOVE, [held_points + 5], cpu_s=30)
    # the step line is its own widget message, which can land after the chart's: wait for it too
    wait_page(page, STEP_ABOVE, [held_step], cpu_s=30)

    # Stop: "stopped", the step shown is final, Start is enabled again
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)  # a deadline; the hold below is the check
    final = global_step(page)
    page.wait_for_timeout(HOLD_S * 1000)
    assert global_step(page) == final, "training went on after Stop"
    assert page.locator("button.nbt-start").is_enabled(), "Start is not enabled again after Stop"
    screenshot(page, f"{name}-stopped", selector=".nbt-panel")
    assert widget_problems(page) == []
    errors = [m for m in console_log if m.startswith("pageerror") and not any(k in m for k in known_page_errors)]
    assert not errors, errors
    assert not state_errors(console_log), state_errors(console_log)[:5]
    return {"held": held_step, "final": final}
