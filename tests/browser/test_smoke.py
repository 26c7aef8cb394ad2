"""Smoke tests that prove the browser fixtures: an ipywidgets Button and a bqplot Figure render in a real
Chromium, in Voila and in JupyterLab, and a click travels to the kernel and back."""

from __future__ import annotations

import json
import urllib.request

import pytest

from ._panel import wait_shown
from ._servers import XSRF_HEADERS, lab_run_all, wait_page, wait_widgets_rendered, widget_problems

SMOKE_CELLS = [
    ("markdown", "# nbtrainer browser smoke test"),
    "import ipywidgets as w\n"
    "import bqplot as bq\n"
    "clicks = {'n': 0}\n"
    "button = w.Button(description='Smoke')\n"
    "button.add_class('nbt-smoke-button')\n"
    "label = w.Label(value='clicks: 0')\n"
    "label.add_class('nbt-smoke-label')\n"
    "def on_click(_):\n"
    "    clicks['n'] += 1\n"
    "    label.value = f\"clicks: {clicks['n']}\"\n"
    "button.on_click(on_click)\n"
    "sx, sy = bq.LinearScale(), bq.LinearScale()\n"
    "line = bq.Lines(x=[0, 1, 2, 3], y=[0, 1, 4, 9], scales={'x': sx, 'y': sy})\n"
    "fig = bq.Figure(marks=[line], axes=[bq.Axis(scale=sx), bq.Axis(scale=sy, orientation='vertical')],\n"
    "                title='smoke', layout=w.Layout(width='500px', height='300px'))\n"
    "fig.add_class('nbt-smoke-figure')\n"
    "w.VBox([w.HBox([button, label]), fig])",
]

SELECTORS = ["button.jupyter-button.nbt-smoke-button", ".nbt-smoke-figure svg.svg-figure", ".nbt-smoke-label"]

# the line path is drawn after the figure: wait until it has a real path
LINE_DRAWN = """() => {
    const p = document.querySelector('.nbt-smoke-figure svg.svg-figure path.line');
    return !!(p && (p.getAttribute('d') || '').length > 10);
}"""


def _click_round_trip(page) -> None:
    page.locator(".nbt-smoke-button").click()
    wait_shown(page, ".nbt-smoke-label", has_text="clicks: 1", what="the kernel's answer to the click")


@pytest.mark.timeout(240)  # a hang guard: a loaded machine takes minutes to start a server and a kernel
def test_voila_renders_button_and_bqplot(voila_server, make_notebook, page, screenshot, console_log):
    server = voila_server(make_notebook("smoke", SMOKE_CELLS))
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=120_000)  # Voila runs the notebook first
    wait_widgets_rendered(page, SELECTORS, cpu_s=60)
    wait_page(page, LINE_DRAWN, cpu_s=30, what="the line")
    _click_round_trip(page)
    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith("pageerror")], console_log
    assert screenshot(page, "smoke-voila").stat().st_size > 0


@pytest.mark.timeout(240)  # a hang guard: a loaded machine takes minutes to start a server and a kernel
def test_lab_runs_notebook_and_renders_widgets(shared_lab, make_notebook, page, screenshot):
    nb = make_notebook("smoke_lab", SMOKE_CELLS)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded")
    lab_run_all(page, cpu_s=40)
    wait_widgets_rendered(page, SELECTORS, cpu_s=20)
    wait_page(page, LINE_DRAWN, cpu_s=30, what="the line")
    _click_round_trip(page)
    assert widget_problems(page) == []
    assert screenshot(page, "smoke-lab", selector=".nbt-smoke-figure").stat().st_size > 0


@pytest.mark.timeout(240)  # a hang guard: a loaded machine takes minutes to start a kernel
def test_the_shared_lab_shuts_down_the_kernels_a_test_started(shared_lab) -> None:
    """Each test's kernels end with it (``Server.shutdown_kernels``, the shared lab's teardown): the server refused
    every DELETE without an XSRF token, and each test's kernel lived on beside the next tests (five idle kernels,
    ~0.5 GB each, seen in one worker's lab midway through its browser tests)."""
    server = shared_lab.server
    for _ in range(2):  # as two notebook pages would
        request = urllib.request.Request(
            server.url + "/api/kernels",
            data=b"{}",
            method="POST",
            headers={**XSRF_HEADERS, "Content-Type": "application/json"},
        )
        urllib.request.urlopen(request, timeout=120).close()
    assert len(json.loads(server.get("/api/kernels")[1])) >= 2
    server.shutdown_kernels(timeout=60)
    assert json.loads(server.get("/api/kernels")[1]) == []
