"""The training panel in the classic Jupyter Notebook 6.5 with widgetsnbextension 3.6: the ipywidgets 7 front end
(Google Colab's stack: ipywidgets 7.7.1, bqplot 0.12, ipykernel 6.17), in a real Chromium.

Runs in the colab profile's venv (``bash scripts/venv.sh colab``; ``scripts/test.sh`` runs it there), skipped in
the main venv, which has Notebook 7 and ipywidgets 8. One server for the module.

* Run All, then the controls scenario (Start trains in the background, the loss chart grows, Pause holds still,
  Resume, Stop holds), no widget error in the page or the console, the panel's text legible (WCAG AA).
* A second panel whose cell blocks in ``w.fit()``: on ipykernel 6 the clicks reach the kernel through
  jupyter-ui-poll; Stop clicked in the page ends the run and the cell returns the History ("stopped").
* The page answered the panel's pushes through its ``jsdlink`` (``widgets/_flow``: a push goes once the page has
  drawn the one before), read from the kernel.
* A finished panel shows all of itself, every time (issue 59): a notebook with samples and the errors section, opened
  and Run All at once, five times ending in ``w.fit()`` and five times in a click on Start, each checked for the
  last progress, the step line, the stat cards, the health lights, the latest sample and the errors. The page's
  widget manager cannot fetch the kernel's widgets through its control comm (unregistered in the kernel, as where it
  times out behind a slow first cell), so it falls back to ``comm_info`` while the panel is being made: the race that
  lost the panel's updates or hid it (``widgets/_restore``). A confusion-matrix cell clicked with the mouse shows its
  items.
* The data section's map on bqplot 0.12: a mouse click on a point and a lasso (test_panel_data.py's scenario).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from . import _servers
from ._panel import (
    PANEL_SELECTORS,
    badge,
    click_matrix_cell,
    incomplete,
    low_contrast,
    panel_state,
    state_errors,
    wait_badge,
    wait_page,
    wait_shown,
)
from ._scenario import run_controls_scenario
from ._servers import Server, wait_widgets_rendered, widget_problems

notebook = pytest.importorskip("notebook")
if int(notebook.__version__.split(".")[0]) >= 7:
    pytest.skip(
        "needs the classic Notebook 6.5 of the colab profile (scripts/test.sh runs this module there)",
        allow_module_level=True,
    )

SETUP = """
import time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import TrainerWidget
torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(2048, 16); y = (x[:, :4].sum(1) > 0).long()
train_loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
val_loader = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=256)

class Slow(nn.Module):  # about 40 steps a second: long enough to watch and click
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
    def forward(self, x):
        time.sleep(0.02)
        return self.inner(x)

def panel(epochs):
    model = Slow(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    return TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=3e-3),
                         train_loader, val_loader, epochs=epochs, seed=0,
                         metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()})
"""

KERNEL_IDLE = """() => {
    const nb = window.Jupyter && window.Jupyter.notebook;
    const icon = document.querySelector('#kernel_indicator_icon');
    return !!(nb && nb.kernel && nb.kernel.is_connected() && icon && icon.classList.contains('kernel_idle_icon'));
}"""
ALL_RAN = """() => {
    const cells = window.Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code');
    const icon = document.querySelector('#kernel_indicator_icon');
    return cells.every(c => c.input_prompt_number !== null && c.input_prompt_number !== '*')
        && icon.classList.contains('kernel_idle_icon');
}"""


# the second panel of a page (the first is the scenario's): its progress line's step past a value
SECOND_STEP_ABOVE = """(n) => {
    const p = document.querySelectorAll('.nbt-panel')[1];
    const el = p && p.querySelector('.nbt-progress-info');
    const m = el && el.innerText.match(/step ([\\d,]+)/);
    return !!m && parseInt(m[1].replace(/,/g, ''), 10) > n;
}"""


@pytest.fixture(scope="module")
def classic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, list[str]], Server]]:
    """One Notebook 6.5 server for the module; ``classic(name, cells)`` writes a notebook into its root."""
    root = tmp_path_factory.mktemp("classic-nb")
    server = _servers.start_classic(root, tmp_path_factory.mktemp("classic"))

    def notebook_of(name: str, cells: list[str]) -> Server:
        _servers.write_notebook(root / f"{name}.ipynb", cells)
        return server

    try:
        yield notebook_of
    finally:
        server.stop()


def _run_all(page: Any, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    wait_page(page, KERNEL_IDLE, cpu_s=90, what="the kernel idle")
    page.evaluate("() => window.Jupyter.notebook.execute_all_cells()")
    wait_page(page, ALL_RAN, cpu_s=120, what="every cell run")


@pytest.mark.timeout(300)
def test_panel_in_classic_notebook_on_ipywidgets_7(classic, page, screenshot, console_log) -> None:
    server = classic("classic_panel", [SETUP, "w = panel(1000)\nw"])
    _run_all(page, f"{server.url}/notebooks/classic_panel.ipynb")
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    page.locator(".nbt-panel").first.scroll_into_view_if_needed()
    assert badge(page) == "idle"
    run_controls_scenario(page, screenshot, "panel-classic", console_log)
    bad = low_contrast(page, ".nbt-panel")
    why = page.evaluate(
        """() => [document.body.getAttribute('class'), document.body.getAttribute('data-jp-theme-light'),
                  getComputedStyle(document.querySelector('.nbt-title')).getPropertyValue('--jp-ui-font-color2'),
                  [...document.querySelectorAll('style')].filter(s => s.textContent.includes('nbt-')).length]"""
    )
    assert not bad, f"low-contrast text in Notebook 6.5: {bad[:12]}; body class, theme, colour 2, styles: {why}"
    # (every text of the charts included: their axis and figure titles take the theme colour from the panel's
    # stylesheet, ipywidgets 7 having refused it as a colour trait)

    # the page's link answered the run's pushes (widgets/_flow): the kernel heard back from this page
    page.evaluate(
        """() => {
            const cell = window.Jupyter.notebook.insert_cell_at_bottom('code');
            cell.set_text("f = w._pump.flow\\nprint('FLOW', f.answered, f.pushes)");
            cell.execute();
        }"""
    )
    line = wait_page(
        page,
        "() => [...document.querySelectorAll('.output_area pre')].map(e => e.innerText)"
        ".find(t => t.startsWith('FLOW'))",
        cpu_s=60,
        what="the FLOW line",
    )
    answered, pushes = str(line.json_value()).split()[1:3]
    assert answered != "None" and 1 <= int(answered) <= int(pushes), line

    # A cell blocks in w.fit(): the Stop clicked in the page reaches the kernel (ipykernel 6: jupyter-ui-poll). The run
    # is 1,000 epochs (about 27 minutes): a Stop handled after its last step would find it finished, so it must
    # outlast the test (docs/testing.md); the waits are CPU-second budgets of the test's processes, as in the scenario
    page.evaluate(
        """() => {
            const cell = window.Jupyter.notebook.insert_cell_at_bottom('code');
            cell.set_text("w2 = panel(1000)\\nh2 = w2.fit()\\nprint('RESULT', h2.status, len(h2.epochs))");
            cell.execute();
        }"""
    )
    wait_badge(page, "running", cpu_s=60, panel=1)
    wait_page(page, SECOND_STEP_ABOVE, 20, cpu_s=60, what="the second panel past step 20")
    page.locator(".nbt-panel").nth(1).locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30, panel=1)
    wait_shown(page, ".output_area pre", has_text="RESULT", cpu_s=30, what="the fit cell's RESULT line")
    words = page.locator(".output_area pre", has_text="RESULT").inner_text().split()
    assert words[:2] == ["RESULT", "stopped"] and int(words[2]) < 1000, words
    assert widget_problems(page) == []
    assert not state_errors(console_log), state_errors(console_log)[:5]
    errors = [m for m in console_log if m.startswith(("pageerror", "error")) and "widget" in m.lower()]
    assert not errors, errors


# A small CNN on 8x8 pictures with samples and the errors section (the notebook, on generated pictures: the
# colab profile has no scikit-learn). Each Run All reuses the kernel, made to look fresh to the page: the previous
# run's widgets are closed before the page opens (_close_widgets), and the first cell takes the control comm away, so
# that the page's widget manager falls back to comm_info, as it does after its 3 s timeout behind a first cell that
# imports torch.
LOOKS = """
import torch, ipywidgets
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from nbtrainer import Samples, TrainerWidget
get_ipython().kernel.comm_manager.targets.pop('jupyter.widget.control', None)
torch.set_num_threads(1)
_ = torch.manual_seed(0)
x = torch.rand(704, 1, 8, 8)  # the class: the brightest of the first 10 pixels
y = x.flatten(1)[:, :10].argmax(1)
order = torch.Generator().manual_seed(0)
train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=64, shuffle=True, generator=order)
val = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=192)
fixed = x[512:520]
def predictions(model):
    digits = fixed[:, 0].permute(1, 0, 2).reshape(8, 64)  # the 8 pictures side by side
    return {'digits': digits, 'predicted': ' '.join(str(int(c)) for c in model(fixed).argmax(1))}
model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(256, 10))
w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 3e-3), train, val, epochs=2,
                  callbacks=[Samples(predictions, every_n_steps=4)], interpret=True, seed=0)
"""
RUNS = 5
STEPS, EPOCHS = 16, 2  # 8 batches of 64 a epoch


# What the page knows when a panel is missing: each output's widget model id, whether the page's widget manager has
# that model, how many models it has, and the outputs' text (the full console log is kept beside the screenshot).
WHY = """() => {
    const nb = window.Jupyter && window.Jupyter.notebook, manager = nb && nb.kernel && nb.kernel.widget_manager;
    const outputs = nb ? nb.get_cells().map(c => (c.output_area ? c.output_area.outputs : [])) : [];
    const ids = outputs.flat().map(o => o.data && o.data['application/vnd.jupyter.widget-view+json'])
        .filter(Boolean).map(v => v.model_id);
    return {manager: !!manager, models: manager ? Object.keys(manager._models).length : null,
            displayed: ids.map(id => [id, !!(manager && manager._models[id])]),
            text: [...document.querySelectorAll('.output_subarea')].map(e => e.innerText.slice(0, 160))};
}"""


def _open_and_run_all(page: Any, url: str) -> None:
    """Open the notebook and Run All at once, as a person clicking Run All the moment the page shows: the cells go
    ahead of the widget manager's restore (its control comm fails where the first cell took the target away, and its
    comm_info then waits behind the cells).

    Once the page's widget manager exists: a fresh kernel's first output (behind ``import torch``) comes long after
    the page's widget extension has loaded, but this reused kernel answers in well under a second, and a page whose
    extension loaded after the cells' comm_open messages arrived has no ``jupyter.widget`` target for them ("Class
    jupyter.widget not found in registry"): the panel never draws (seen once in about 15 suite runs)."""
    page.goto(url, wait_until="domcontentloaded", timeout=60_000)
    wait_page(
        page,
        "() => !!(window.Jupyter && window.Jupyter.notebook && window.Jupyter.notebook.kernel"
        " && window.Jupyter.notebook.kernel.widget_manager)",
        cpu_s=60,
        what="the page's widget manager",
    )
    page.evaluate("() => window.Jupyter.notebook.execute_all_cells()")


def _close_widgets(page: Any) -> None:
    """Close the kernel's widgets from the page that showed them, before the next page opens. A fresh kernel has none
    when a page connects; a reused one would have the previous run's ~700, and a page whose widget manager asked
    comm_info before its cells ran (the control comm fails at once where its target is gone) restores them: a
    comm_open and a request_state each, and the kernel's busy/idle status for each of those 1,400 messages, a flood
    of iopub messages that a loaded server may not drain before the new panel's own comm_opens arrive."""
    page.evaluate(
        """() => new Promise((resolve) => window.Jupyter.notebook.kernel.execute(
            'import ipywidgets; ipywidgets.Widget.close_all()', {shell: {reply: () => resolve(true)}}))"""
    )


def _finished(page: Any, how: str) -> bool:
    """Run the panel to its end as a person does (``w.fit()`` ran with the cells, or a click on Start) and wait for
    its badge; False when the panel never shows the end (its updates lost, or the panel re-rendered away)."""
    try:
        if how == "fit":
            wait_page(page, ALL_RAN, cpu_s=120, what="every cell run")  # the cell returns when the run has ended
        else:
            wait_page(
                page,
                "() => { const b = document.querySelector('button.nbt-start'); return b && !b.disabled; }",
                cpu_s=120,
                what="Start enabled",
            )
            page.locator("button.nbt-start").click(timeout=10_000)
        wait_badge(page, "finished", cpu_s=60 if how == "start" else 10)
    except (PlaywrightTimeout, TimeoutError):
        return False
    return True


@pytest.mark.timeout(300)
def test_a_finished_panel_shows_all_of_itself_every_time(classic, page, screenshot, console_log) -> None:
    server = classic("looks_fit", [LOOKS, "h = w.fit()"])
    classic("looks_start", [LOOKS, "w"])
    seen: dict[str, list[list[str]]] = {"fit": [], "start": []}
    for i in range(RUNS):
        for how in ("fit", "start"):
            _open_and_run_all(page, f"{server.url}/notebooks/looks_{how}.ipynb")
            ended = _finished(page, how)
            state = panel_state(page)  # read at once: the badge is the last thing a run's end draws
            seen[how].append(incomplete(state, steps=STEPS, epochs=EPOCHS) + ([] if ended else ["the end"]))
            if seen[how][-1]:
                screenshot(page, f"panel-classic-incomplete-{how}-{i}")
                print(f"{how} run {i}: missing {seen[how][-1]}: {state}; the page: {page.evaluate(WHY)}")
                break
            if i == 0 and how == "fit":  # a confusion-matrix cell clicked with the mouse: its items
                page.locator(".nbt-errors-matrix").scroll_into_view_if_needed()
                target, predicted, count = click_matrix_cell(page)
                head = f"target {target}, predicted {predicted}: {count} item(s)"
                wait_shown(page, ".nbt-errors-examples", has_text=head, cpu_s=15)
                target, predicted, count = click_matrix_cell(page, at=(0.1, 0.9), skip=1)  # near a corner
                head = f"target {target}, predicted {predicted}: {count} item(s)"
                wait_shown(page, ".nbt-errors-examples", has_text=head, cpu_s=15)
                screenshot(page, "panel-classic-errors", selector=".nbt-errors")
            _close_widgets(page)
        if any(seen["fit"] + seen["start"]):  # the first incomplete panel fails the test: no need to wait on more
            break
    assert seen == {"fit": [[]] * RUNS, "start": [[]] * RUNS}, seen
    assert not state_errors(console_log), state_errors(console_log)[:5]


@pytest.mark.timeout(240)
def test_the_data_map_takes_a_click_and_a_lasso_on_bqplot_0_12(classic, page, screenshot) -> None:
    """The data section's map (issue 55) on Colab's stack (bqplot 0.12, ipywidgets 7): the mouse scenario of
    test_panel_data.py (bqplot 0.13 in Voila): lights before Start, a click on a point, drop, a lasso."""
    from .test_panel_data import CELLS, data_map_scenario

    server = classic("classic_data", CELLS)
    _run_all(page, f"{server.url}/notebooks/classic_data.ipynb")
    wait_widgets_rendered(page, [".nbt-panel", ".nbt-data"], cpu_s=60)
    data_map_scenario(page)
    screenshot(page, "panel-data-classic", selector=".nbt-data")
