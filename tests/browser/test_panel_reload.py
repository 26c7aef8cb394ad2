"""A page reloaded while ``history = w.fit()`` blocks gets the panel back live (issue 26, defect 1).

JupyterLab, after a reload, asks the kernel for ``kernel_info`` (it drops every kernel message until the
answer), then restores the widgets through the widget manager's control comm. The blocking cell holds the
main shell, so nbtrainer answers those requests from its subshell while the cell waits. The cell trains 3,000
epochs and ends only when Stop is clicked: the panel's models coming back (no "Loading widget...") while the run is
still going, its progress moving on and Stop ending it prove the requests were answered during the cell, whatever
the machine's load. Without the subshell they would wait for the cell, which never ends, and the wait for the panel
fails at its deadline. How long it took is printed, not asserted (issue 57: a 5-second bound inside the parallel
suite measured the suite's own other workers as much as the kernel).
"""

from __future__ import annotations

import time

import pytest

from ._panel import PANEL_SELECTORS, global_step, wait_badge, wait_page
from ._servers import wait_widgets_rendered, widget_problems
from ._wstrace import Trace
from .test_panel_lab import BLOCKING_CELLS

BACK_DEADLINE_S = 60.0  # CPU seconds: a deadline for readiness, not a measure (the cell never ends by itself)
KERNEL_READY = (
    "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
    " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
    " return !!k && k.status === 'idle'; }"
)
# The notebook's saved outputs are on the page again (the panel's output, rendered or still loading).
OUTPUTS_BACK = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    return !!(w && w.content && w.context && w.context.isReady
              && document.querySelectorAll('.jp-OutputArea-output').length > 0);
}"""
# The panel's widget models are restored: its root is on the page and nothing says "Loading widget".
PANEL_BACK = """() => document.querySelectorAll('.nbt-panel').length > 0
    && !document.body.innerText.includes('Loading widget')"""
BQPLOT_NOISE = ("negative value", "NaN")


def bqplot_noise(console_log: list[str]) -> list[str]:
    """Console errors from marks drawn with no data or a zero-size domain ("negative width", "translate(0,NaN)")."""
    return [m for m in console_log if m.startswith("error") and any(k in m for k in BQPLOT_NOISE)]


@pytest.mark.ws_trace  # a failure's report says what the reloaded page asked the kernel and what it got
@pytest.mark.timeout(300)
def test_reload_while_a_fit_cell_blocks_brings_the_panel_back_live_and_stop_works(
    shared_lab, make_notebook, page, screenshot, console_log
):
    cells = [BLOCKING_CELLS[0].replace("epochs=60", "epochs=3000"), BLOCKING_CELLS[1]]
    assert "epochs=3000" in cells[0]
    nb = make_notebook("reload_mid_fit", cells)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded", timeout=60_000)
    wait_page(page, KERNEL_READY, cpu_s=60)
    # Not awaited: the command settles only when every cell has run, and the 2nd cell blocks for the run.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    wait_badge(page, "running", cpu_s=30)
    wait_page(page, "() => /step [1-9]/.test(document.querySelector('.nbt-progress-info').innerText)", cpu_s=30)
    # the saved notebook holds the panel's output (what a reload shows), then the page is reloaded
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    wait_page(
        page,
        "() => { const w = window.jupyterapp.shell.currentWidget; return !!w && !w.context.model.dirty; }",
        what="the notebook saved",
    )
    before = global_step(page)
    page.reload(wait_until="domcontentloaded", timeout=60_000)

    wait_page(page, OUTPUTS_BACK, cpu_s=60)
    t0 = time.monotonic()
    wait_page(page, PANEL_BACK, cpu_s=BACK_DEADLINE_S, what="the panel back")  # what the kernel answers: the models
    back_after = time.monotonic() - t0
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    wait_badge(page, "running", cpu_s=30)
    # live: the progress the page shows moves on past what the restore showed
    wait_page(
        page,
        "(s) => { const m = /step ([\\d,]+)/.exec(document.querySelector('.nbt-progress-info').innerText);"
        " return !!m && Number(m[1].replace(/,/g, '')) > s; }",
        max(before, global_step(page)),
        cpu_s=30,
    )
    live_after = time.monotonic() - t0
    screenshot(page, "reload-mid-fit-live", selector=".nbt-panel")

    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)
    final = global_step(page)
    page.wait_for_timeout(1000)
    assert global_step(page) == final, "training went on after Stop"
    assert page.locator("button.nbt-start").is_enabled()
    screenshot(page, "reload-mid-fit-stopped", selector=".nbt-panel")
    assert widget_problems(page) == []
    assert not bqplot_noise(console_log), bqplot_noise(console_log)[:5]
    print(f"panel back {back_after:.1f} s and live {live_after:.1f} s after the outputs were back")
    print(Trace.page_connections(page))  # a healthy restore's connections, beside a failed one's in its report
