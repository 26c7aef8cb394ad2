"""LR changes made from the panel, as a browser shows them (issue 38), in Voila with a real Chromium.

* The LR chart has a title that says what it is ("learning rate"), as every chart of the panel does.
* An LR typed into the exact-value box mid-run, and one dragged on the slider, are each marked on the LR chart
  with a label: the new value and "typed" / "dragged", drawn inside the figure.

Screenshots: ``test-artifacts/panel-lr-typed.png``, ``panel-lr-dragged.png``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ._panel import PANEL_SELECTORS, wait_badge, wait_page
from ._scenario import STEP_ABOVE
from ._servers import wait_widgets_rendered, widget_problems

NOTEBOOK = Path(__file__).resolve().parent / "notebooks" / "panel_live.ipynb"

# every chart's figure title (bqplot's text.mainheading), by the chart's class
TITLES = """() => Object.fromEntries([...document.querySelectorAll('.nbt-charts .bqplot.figure')]
    .map(f => [[...f.classList].find(c => c.startsWith('nbt-chart-')),
               (f.querySelector('text.mainheading') || {}).textContent || '']))"""
# the LR chart's change labels (bqplot Label marks): text, and whether the text lies inside the figure's svg
LR_LABELS = """() => {
    const fig = document.querySelector('.nbt-chart-lr svg.svg-figure');
    if (!fig) return [];
    const box = fig.getBoundingClientRect();
    return [...fig.querySelectorAll('text.label.element')].filter(t => t.textContent.trim()).map(t => {
        const r = t.getBoundingClientRect();
        const shown = getComputedStyle(t).display !== 'none' && getComputedStyle(t).opacity !== '0' && r.width > 0;
        return {text: t.textContent.trim(), shown,
                inside: r.left >= box.left - 1 && r.right <= box.right + 1 && r.top >= box.top - 1
                        && r.bottom <= box.bottom + 1};
    });
}"""


def _labels(page: Any) -> list[dict[str, Any]]:
    return page.evaluate(LR_LABELS)


def _wait_label(page: Any, word: str) -> dict[str, Any]:
    wait_page(page, f"() => ({LR_LABELS})().some(l => l.text.endsWith(' {word}') && l.shown)", cpu_s=30)
    return next(label for label in _labels(page) if label["text"].endswith(f" {word}"))


@pytest.mark.timeout(180)
def test_lr_changes_from_the_panel_are_labelled_on_a_titled_lr_chart(voila_server, page, screenshot) -> None:
    server = voila_server(NOTEBOOK)
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    titles = page.evaluate(TITLES)
    assert titles.get("nbt-chart-lr") == "learning rate", titles
    assert all(titles.values()), f"a chart without a title: {titles}"

    page.locator("button.nbt-start").click()
    wait_badge(page, "running")
    wait_page(page, STEP_ABOVE, [5], cpu_s=30)

    # typed: the exact box takes the value on Enter
    box = page.locator(".nbt-lr-exact input").first
    box.fill("1e-3")
    box.press("Enter")
    typed = _wait_label(page, "typed")
    assert typed["text"] == "1.00e-3 typed" and typed["inside"], typed
    screenshot(page, "panel-lr-typed", selector=".nbt-chart-lr")

    # dragged: the slider's handle, pulled to the right with the mouse
    handle = page.locator(".nbt-lr .noUi-handle, .nbt-lr .ui-slider-handle").first
    # in view first: the screenshot above scrolled to the LR chart, and a taller panel (a health warning shown
    # during the run) leaves the slider above the viewport, where a mouse at its box's coordinates hits nothing
    handle.scroll_into_view_if_needed()
    hb = handle.bounding_box()
    assert hb is not None
    x, y = hb["x"] + hb["width"] / 2, hb["y"] + hb["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 40, y, steps=8)
    page.mouse.up()
    dragged = _wait_label(page, "dragged")
    value = float(dragged["text"].split()[0])
    assert value > 1e-3 and dragged["inside"], dragged  # to the right: a larger LR than the typed one
    # the typed change keeps its label when there is room for both (the changes are steps apart)
    screenshot(page, "panel-lr-dragged", selector=".nbt-chart-lr")

    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)
    assert widget_problems(page) == []
