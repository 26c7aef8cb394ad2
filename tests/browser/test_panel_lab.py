"""The training panel in JupyterLab 4, light and dark, in a real Chromium.

* Run All on the browser tests' panel notebook, then the controls scenario (Start, growing chart, Pause holding
  still, Resume, Stop) and, in both themes, every text of the panel legible (WCAG AA contrast, 4.5:1).
* The blocking case: a cell that runs ``h = w.fit()``; Pause / Resume / Stop clicked while that cell is busy take
  effect, and the cell returns the History with status "stopped".
* A confusion-matrix cell clicked with the mouse shows its items (issue 59).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ._panel import (
    PANEL_SELECTORS,
    badge,
    click_matrix_cell,
    global_step,
    low_contrast,
    wait_badge,
    wait_page,
    wait_shown,
)
from ._scenario import LOSS_POINTS_ABOVE, loss_points, run_controls_scenario
from ._servers import lab_run_all, wait_widgets_rendered, widget_problems

HERE = Path(__file__).resolve().parent
PANEL_NB = HERE / "notebooks" / "panel_live.ipynb"


def _open(page, lab_server, shared_lab, tmp_path: Path, notebook: Path, theme: str) -> None:
    """The light theme (Lab's default) in the worker's shared JupyterLab; another in a server of its own."""
    if theme == "JupyterLab Light":
        page.goto(shared_lab.url(notebook), wait_until="domcontentloaded", timeout=60_000)
        return
    dest = tmp_path / "nb" / notebook.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(notebook, dest)
    server = lab_server(dest.parent, theme=theme)
    page.goto(f"{server.url}/lab/tree/{dest.name}?reset", wait_until="domcontentloaded", timeout=60_000)


def _expand_side_areas(page) -> None:
    """Open every collapsed section (summary...) so its text is checked too; returns once the kernel's
    answer is drawn: each shown section's toggle reads "collapse" and its body is displayed."""
    for toggle in page.locator(".nbt-section .nbt-collapse").all():
        if toggle.is_visible() and "expand" in (toggle.get_attribute("title") or ""):
            toggle.click()
    wait_page(
        page,
        """() => [...document.querySelectorAll('.nbt-section')].filter(s => s.offsetParent !== null).every(s => {
            const toggle = s.querySelector('.nbt-collapse'), body = s.children[1];
            return !(toggle.title || '').includes('expand') && body && getComputedStyle(body).display !== 'none';
        })""",
        cpu_s=30,
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize("theme", ["JupyterLab Light", "JupyterLab Dark"])
def test_panel_in_jupyterlab(theme, lab_server, shared_lab, page, screenshot, console_log, tmp_path) -> None:
    _open(page, lab_server, shared_lab, tmp_path, PANEL_NB, theme)
    wait_page(page, f"() => document.body.dataset.jpThemeName === {theme!r}", cpu_s=60)
    lab_run_all(page, cpu_s=120)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    page.locator(".nbt-panel").first.scroll_into_view_if_needed()
    assert badge(page) == "idle"
    name = "panel-lab-" + theme.split()[-1].lower()
    run_controls_scenario(page, screenshot, name, console_log)

    # legible in this theme: every text node of the panel, its messages, cards, legends, tables, charts
    _expand_side_areas(page)
    bad = low_contrast(page, ".nbt-panel")
    assert not bad, f"low-contrast text in {theme}: {bad[:12]}"
    screenshot(page, f"{name}-summary", selector=".nbt-panel")
    assert widget_problems(page) == []


# the blocking fit cell's output line, by its text as written (below a tall panel JupyterLab's windowing may leave
# it unrendered: innerText "")
RESULT_LINE = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
    .some(e => /RESULT \\w+ \\d+/.test(e.textContent || ''))"""
BLOCKING_CELLS = [
    "import time, torch\n"
    "from torch import nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import TrainerWidget\n"
    "\n"
    "class Slow:  # about 40 optimizer steps per second\n"
    "    def on_optimizer_step(self, trainer, step, skipped):\n"
    "        time.sleep(0.02)\n"
    "\n"
    "_ = torch.manual_seed(0)\n"
    "x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))\n"
    "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05),\n"
    "                  DataLoader(TensorDataset(x, y), batch_size=16), epochs=60, callbacks=[Slow()])\n"
    "w",
    "h = w.fit()  # blocks until the run ends\nprint('RESULT', h.status, len(h.epochs))",
]


@pytest.mark.timeout(240)
def test_blocking_fit_cell_still_obeys_pause_resume_stop(shared_lab, make_notebook, page, screenshot, console_log):
    nb = make_notebook("blocking_fit", BLOCKING_CELLS)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded", timeout=60_000)
    wait_page(
        page,
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return !!k && k.status === 'idle'; }",
        cpu_s=60,
    )
    # Not awaited: the command's promise settles only when every cell has run, and the 2nd cell blocks.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    wait_badge(page, "running", cpu_s=30)
    wait_page(page, LOSS_POINTS_ABOVE, [5], cpu_s=30)

    page.locator("button.nbt-pause").click()
    wait_badge(page, "paused", cpu_s=30)  # the click reached the kernel while the cell is busy
    held, points = global_step(page), loss_points(page)
    page.wait_for_timeout(1500)
    assert (global_step(page), loss_points(page)) == (held, points), "the run moved while paused"
    screenshot(page, "blocking-fit-lab-paused", selector=".nbt-panel")
    page.locator("button.nbt-pause").click()
    wait_badge(page, "running", cpu_s=30)
    wait_page(page, LOSS_POINTS_ABOVE, [points + 5], cpu_s=30)
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)
    # the blocking cell returned the History: status stopped, long before its 60 epochs
    wait_page(page, RESULT_LINE, cpu_s=30, what="the fit cell's RESULT line")
    out = page.locator(".jp-OutputArea-output", has_text=re.compile(r"RESULT \w+ \d+")).first
    # the text as written, not as laid out: below a tall panel the output is off screen, where JupyterLab 4's
    # notebook windowing leaves it unrendered (innerText "")
    status, epochs = (out.text_content() or "").split()[1:3]
    assert status == "stopped" and int(epochs) < 60, out.inner_text()
    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith("pageerror")], console_log


@pytest.mark.timeout(240)
def test_a_confusion_matrix_cell_clicked_in_jupyterlab_shows_its_items(shared_lab, make_notebook, page, screenshot):
    """Issue 59 in JupyterLab itself (ipywidgets 8, bqplot 0.13, Lab's widget manager): the samples notebook with
    ``interpret=True``, trained from Start; a matrix cell clicked with the mouse at its centre, another near a
    corner, each shows its items under the heading the drawn cell says (target, predicted, count)."""
    from .test_panel_samples import CELLS

    nb = make_notebook("matrix_click", CELLS)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded", timeout=60_000)
    lab_run_all(page, cpu_s=120)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    page.locator("button.nbt-start").click()
    wait_badge(page, "finished", cpu_s=60)
    matrix = page.locator(".nbt-errors-matrix svg.svg-figure")
    wait_shown(page, ".nbt-errors-matrix svg.svg-figure", cpu_s=30)
    matrix.scroll_into_view_if_needed()
    for at, skip in (((0.5, 0.5), 0), ((0.1, 0.9), 1)):
        target, predicted, count = click_matrix_cell(page, at=at, skip=skip)
        head = f"target {target}, predicted {predicted}: {count} item(s)"
        wait_shown(page, ".nbt-errors-examples", has_text=head, cpu_s=15)
    screenshot(page, "panel-lab-matrix-click", selector=".nbt-errors")
    assert widget_problems(page) == []
