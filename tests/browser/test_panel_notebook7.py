"""The training panel in Jupyter Notebook 7, in a real Chromium: Run All, then Start, a growing chart, Pause
holding still, Resume, Stop; the panel's text legible (WCAG AA) in Notebook 7's own styles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ._panel import PANEL_SELECTORS, badge, low_contrast
from ._scenario import run_controls_scenario
from ._servers import lab_run_all, wait_widgets_rendered, widget_problems

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "panel_live.ipynb"
# Notebook 7.6.5 raises this when it opens any notebook here, a one-cell notebook without widgets included (with
# yjs "Not same Y.Doc" warnings): the front end's, not the panel's.
NOTEBOOK7_OWN_ERRORS = ("Cannot read properties of undefined (reading 'schema')",)


@pytest.mark.timeout(240)
def test_panel_in_notebook7(notebook7_server, page, screenshot, console_log, tmp_path) -> None:
    dest = tmp_path / "nb" / NOTEBOOK.name
    dest.parent.mkdir(parents=True)
    shutil.copy(NOTEBOOK, dest)
    server = notebook7_server(dest.parent)
    page.goto(f"{server.url}/notebooks/{dest.name}", wait_until="domcontentloaded", timeout=60_000)
    lab_run_all(page, cpu_s=120)  # Notebook 7 is built on the same application shell and commands
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    page.locator(".nbt-panel").first.scroll_into_view_if_needed()
    assert badge(page) == "idle"
    run_controls_scenario(page, screenshot, "panel-notebook7", console_log, known_page_errors=NOTEBOOK7_OWN_ERRORS)
    bad = low_contrast(page, ".nbt-panel")
    assert not bad, f"low-contrast text in Notebook 7: {bad[:12]}"
    assert widget_problems(page) == []
