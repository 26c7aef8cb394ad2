"""The samples section in a real Chromium (Voila): after a short run started from the page, the section shows the
step-0 baseline beside a later step (pictures and text), and a click on a point of the loss chart moves the
timeline to the sample nearest that step; the errors section draws its confusion matrix, and a cell of it clicked
with the mouse shows its items (issue 59). Issue 46.

Screenshot: ``test-artifacts/panel-samples.png``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ._panel import click_matrix_cell, wait_badge, wait_page, wait_shown
from ._servers import wait_widgets_rendered, widget_problems

CELLS = [
    "import torch\n"
    "from torch import nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import Samples, TrainerWidget\n"
    "torch.set_num_threads(1)\n"
    "_ = torch.manual_seed(0)\n"
    "x = torch.rand(1600, 64)  # 8x8 pictures, the class: the brightest of their first 10 pixels\n"
    "y = x[:, :10].argmax(1)\n"
    "train = DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=64, shuffle=True,\n"
    "                   generator=torch.Generator().manual_seed(0))\n"
    "val = DataLoader(TensorDataset(x[1400:], y[1400:]), batch_size=256)\n"
    "fixed = x[1400:1408]\n"
    "def predictions(model):\n"
    "    grid = fixed.reshape(8, 8, 8).permute(1, 0, 2).reshape(8, 64)  # the 8 digits side by side\n"
    "    return {'digits': grid, 'predicted': ' '.join(str(int(c)) for c in model(fixed).argmax(1))}\n"
    "model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 3e-3), train, val,\n"
    "                  epochs=2, callbacks=[Samples(predictions, every_n_steps=5)], interpret=True)\n"
    "w",
]

# the step the slider shows and "sample k of n"
SHOWN = """() => {
    const el = document.querySelector('.nbt-samples-step');
    const m = el ? el.innerText.match(/step ([\\d,]+) .* sample (\\d+) of (\\d+)/) : null;
    return m ? [parseInt(m[1].replace(/,/g, ''), 10), parseInt(m[2], 10), parseInt(m[3], 10)] : null;
}"""
# the loss chart's invisible hover points (opacity 0), which take clicks: their centres, left to right
HOVER_POINTS = """() => [...document.querySelectorAll('.nbt-chart-loss svg.svg-figure path.dot')]
    .filter(d => getComputedStyle(d).opacity === '0')
    .map(d => { const r = d.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })
    .sort((a, b) => a[0] - b[0])"""


def _shown(page: Any) -> list[int] | None:
    return page.evaluate(SHOWN)


def _wait_samples(page: Any, predicate: str, what: str) -> None:
    """``predicate`` true within 30 CPU seconds of the test's processes; else the failure says what the section shows
    (its step line, or nothing) and the panel's messages (a sample function that failed)."""
    try:
        wait_page(page, predicate, cpu_s=30, what=what)
    except TimeoutError as exc:
        section = page.locator(".nbt-samples").first.inner_text()[:300] if page.locator(".nbt-samples").count() else ""
        log = page.locator(".nbt-messages")
        messages = log.first.inner_text()[-300:] if log.count() else ""
        raise TimeoutError(f"{exc}; shown {_shown(page)}, the section {section!r}, the messages {messages!r}") from None


@pytest.mark.timeout(240)
def test_samples_show_the_baseline_and_a_later_step_and_follow_a_click_on_the_loss(
    voila_server, make_notebook, page, screenshot
) -> None:
    server = voila_server(make_notebook("samples", CELLS))
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, [".nbt-panel", ".nbt-chart-loss svg.svg-figure"], cpu_s=60)
    page.locator("button.nbt-start").click()
    wait_badge(page, "finished", cpu_s=60)
    # The badge comes in the run's final push after the samples' own updates, yet a fresh clone on a VM 2.4x slower
    # than usual waited 30 wall seconds here for the latest sample and failed, saying nothing (why it lagged is not
    # known; a section first shown in that push would still be creating its views). Waited in CPU seconds since.
    latest = f"() => {{ const s = ({SHOWN})(); return s && s[1] === s[2] && s[2] > 3; }}"
    _wait_samples(page, latest, "the latest sample")
    last, k, n = _shown(page) or [0, 0, 0]
    assert last == 44 and k == n  # 22 steps per epoch: the newest sample is the last step's
    left = page.locator(".nbt-samples-left").first.inner_text()
    right = page.locator(".nbt-samples-right").first.inner_text()
    assert re.search(r"step 0\b", left) and f"step {last}" in right, (left, right)
    assert "predicted" in right and page.locator(".nbt-samples img").count() >= 2
    assert widget_problems(page) == []

    # a click on a loss point a quarter of the way in: the timeline moves to the sample nearest that step
    points = page.evaluate(HOVER_POINTS)
    assert len(points) > 20, points
    x, y = points[len(points) // 4]
    page.mouse.click(x, y)
    earlier = f"() => {{ const s = ({SHOWN})(); return s && s[1] < s[2]; }}"
    _wait_samples(page, earlier, "an earlier sample after the click")
    step, k, _ = _shown(page) or [0, 0, 0]
    assert (0 < step < last and step % 5 == 0) or step == 22, step
    assert f"step {step}" in page.locator(".nbt-samples-right").first.inner_text()
    # the errors section: a 10 x 10 heatmap
    assert page.locator(".nbt-errors-matrix svg.svg-figure").count() == 1
    # a confusion-matrix cell clicked with the mouse (bqplot 0.13 here), at its centre and near a corner: its items
    page.locator(".nbt-errors-matrix").scroll_into_view_if_needed()
    for at, skip in (((0.5, 0.5), 0), ((0.1, 0.9), 1)):
        target, predicted, count = click_matrix_cell(page, at=at, skip=skip)
        head = f"target {target}, predicted {predicted}: {count} item(s)"
        wait_shown(page, ".nbt-errors-examples", has_text=head, cpu_s=30, what=f"the items of {head!r}")
    screenshot(page, "panel-samples", selector=".nbt-samples")
