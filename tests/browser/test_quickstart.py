"""The quickstart notebook itself (``notebooks/01_quickstart.ipynb``) in a real Chromium.

* JupyterLab, Run All: the panel renders, its 5-epoch run completes and the charts show it, the History report
  follows, no cell raises; the wall time is printed (it backs the time the notebook announces).
* Exported to HTML by nbconvert after running, opened with JavaScript off (GitHub / nbviewer / an e-mail
  attachment cannot run widgets): the plain-HTML summary under the panel still shows its table and charts.

The notebook is copied to a temporary folder first, so a run never writes next to the repository's copy.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from ._panel import PANEL_SELECTORS, badge, chart, curve, global_step, scatter_points, state_errors, wait_page
from ._servers import lab_run_all, wait_widgets_rendered, widget_problems

QUICKSTART = Path(__file__).resolve().parents[2] / "notebooks" / "01_quickstart.ipynb"
EPOCHS = 5  # what the quickstart trains for
STEPS_PER_EPOCH = 23  # 1,437 training digits in batches of 64


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "nb" / QUICKSTART.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(QUICKSTART, dest)
    return dest


@pytest.mark.timeout(240)
def test_quickstart_in_jupyterlab_run_all(shared_lab, page, screenshot, console_log, tmp_path) -> None:
    nb = _copy(tmp_path)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded", timeout=60_000)
    t0 = time.monotonic()
    lab_run_all(page, cpu_s=200)
    print(f"\nquickstart Run All in JupyterLab: {time.monotonic() - t0:.1f} s")
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=30)
    page.locator(".nbt-panel").first.scroll_into_view_if_needed()
    assert badge(page) == "finished"
    wait_page(
        page,
        "(n) => [...document.querySelectorAll('.nbt-chart-loss svg.svg-figure path.dot')]"
        ".filter(d => !d.closest('g.curve')).length >= n",
        EPOCHS,
        cpu_s=20,
        what="the loss chart's validation points",
    )
    loss = chart(page, ".nbt-chart-loss")
    assert curve(loss, "loss (step)")["n"] == EPOCHS * STEPS_PER_EPOCH and scatter_points(page, ".nbt-chart-loss")
    assert global_step(page) == EPOCHS * STEPS_PER_EPOCH
    # the epoch table is a widget of its own: its last row may land a moment after the chart's last point
    rows = page.locator(".nbt-epoch-table tbody tr")
    wait_page(page, "(n) => document.querySelectorAll('.nbt-epoch-table tbody tr').length >= n", EPOCHS, cpu_s=20)
    assert rows.count() == EPOCHS
    # the History report cell: its table and SVG charts, outside the panel
    report = page.locator(".jp-OutputArea-output .nbt-summary:not(.nbt-summary-static .nbt-summary)")
    assert report.count() >= 1 and report.first.locator("svg.nbt-summary-chart").count() >= 3
    # inside Lab the static copy under the panel is hidden by the panel's style (never shown twice)
    assert not page.locator(".nbt-summary-static").first.is_visible()
    assert widget_problems(page) == []
    outputs = " ".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert "Generator" not in outputs, "a stray output"
    assert (
        page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        .filter(has_text="Traceback")
        .count()
        == 0
    )
    assert not state_errors(console_log), state_errors(console_log)[:5]
    screenshot(page, "quickstart-lab-finished", selector=".nbt-panel")


@pytest.mark.timeout(240)
def test_quickstart_exported_to_html_shows_the_summary_without_javascript(
    browser, screenshot, tmp_path, venv_kernelspec, run_shared_dir
) -> None:
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    from _notebook_runs import executed

    nb = executed(QUICKSTART, run_shared_dir)[0]  # the run tests/test_notebooks.py checks (once per test run)
    body, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(nb)
    html = tmp_path / "quickstart.html"
    html.write_text(body, encoding="utf-8")
    context = browser.new_context(java_script_enabled=False, viewport={"width": 1280, "height": 900})
    try:
        page = context.new_page()
        page.goto(html.as_uri())
        static = page.locator(".nbt-summary-static .nbt-summary").first
        static.wait_for(timeout=30_000)
        assert static.is_visible()
        assert static.locator(".nbt-summary-table tbody tr").count() == EPOCHS
        charts = static.locator("svg.nbt-summary-chart")
        assert charts.count() >= 3 and all(charts.nth(i).is_visible() for i in range(charts.count()))
        assert "finished" in static.inner_text()
        static.scroll_into_view_if_needed()
        screenshot(page, "quickstart-html-export-no-js", selector=".nbt-summary-static")
    finally:
        context.close()
