"""The LR finder's curve and the run overlays, used with the mouse in a real Chromium (Voila), issue 59.

* LR finder: the panel's button sweeps, then the curve is drawn with its points. A person hovers a point (the
  tooltip names its LR) and clicks it: the dashed marker is drawn through that point, the line under the chart says
  "learning rate set (clicked on the curve)" with that LR, and the panel's LR box holds it.
* Run overlays: an earlier run of the session (a plain ``Trainer.fit``) is listed in the panel's compare menu.
  While the panel trains, a click on it draws that run's loss as a faint line under the live loss; a Ctrl+click
  unselects it and the line is gone, the live loss still drawn.

Screenshots: ``test-artifacts/panel-lrfinder-clicked.png``, ``panel-compare-overlay.png``.
"""

from __future__ import annotations

import re

import pytest

from ._panel import badge, chart, wait_badge, wait_page, wait_shown
from ._servers import wait_widgets_rendered, widget_problems

CELLS = [
    "import time, torch\n"
    "from torch import nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import Trainer, TrainerWidget\n"
    "torch.set_num_threads(1)\n"
    "_ = torch.manual_seed(0)\n"
    "x = torch.randn(1024, 16); y = (x[:, :4].sum(1) > 0).long()\n"
    "train = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))\n"
    "val = DataLoader(TensorDataset(x[:256], y[:256]), batch_size=256)\n"
    "class Slow(nn.Module):  # a run long enough to click in while it trains\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.inner = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))\n"
    "    def forward(self, x):\n"
    "        time.sleep(0.01)\n"
    "        return self.inner(x)\n"
    "# the earlier run the compare menu lists (recorded in the session's run store)\n"
    "first = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))\n"
    "_ = Trainer(first, nn.CrossEntropyLoss(), torch.optim.AdamW(first.parameters(), 3e-3), progress=False,\n"
    "            seed=0).fit(train, val, epochs=3)\n",
    "model = Slow()\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 1e-3), train, val,\n"
    "                  epochs=300, seed=0)  # stopped by the test\n"
    "w",
]

# The LR finder's clickable points (the Scatter, not the rules' diamonds): centres, left to right; and the dashed
# marker's x (the chosen LR: the one upright line), both in page pixels.
LRF_POINTS = """() => {
    const fig = document.querySelector('.nbt-lrfinder-chart svg.svg-figure');
    if (!fig) return [];
    return [...fig.querySelectorAll('path.dot')].filter(d => !d.closest('g.curve'))
        .filter(d => d.getBoundingClientRect().width < 10)  // the rules' diamonds are larger
        .map(d => { const r = d.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })
        .sort((a, b) => a[0] - b[0]);
}"""
MARKER_X = """() => {
    const fig = document.querySelector('.nbt-lrfinder-chart svg.svg-figure');
    const upright = [...fig.querySelectorAll('g.curve path.line')].map(p => p.getBoundingClientRect())
        .filter(r => r.width < 3 && r.height > 20);
    return upright.length === 1 ? upright[0].x + upright[0].width / 2 : null;
}"""
# the mark's tooltip box (bqplot 0.13: bqplot_mark_tooltip, 0.12: mark_tooltip), shown
TOOLTIP = """() => { const t = [...document.querySelectorAll('.bqplot_mark_tooltip, .mark_tooltip')]
    .find(e => getComputedStyle(e).display !== 'none' && e.innerText.includes('lr'));
    return t ? t.innerText : ''; }"""
# the compare menu's options, as a person reads them
OPTIONS = """() => [...document.querySelectorAll('.nbt-compare-runs option')]
    .map(o => o.textContent.replace(/\\u00a0/g, ' ').trim())"""
# the loss chart's lines, in drawing order (the first drawn lies under the others): label, opacity, points
LOSS_LINES = """() => [...document.querySelectorAll('.nbt-chart-loss svg.svg-figure g.curve')].map(g => {
    const label = g.querySelector('text.curve_label'), path = g.querySelector('path.line');
    const d = (path && path.getAttribute('d')) || '';
    return {label: label ? label.textContent : '', opacity: path ? Number(getComputedStyle(path).opacity) : 0,
            n: (d.match(/[ML]/g) || []).length};
})"""


def _number(text: str) -> float:
    m = re.search(r"(\d+(?:\.\d+)?(?:e[-+]?\d+)?)", text.replace(",", ""))
    assert m, text
    return float(m.group(1))


@pytest.mark.timeout(240)
def test_the_lr_finder_curve_and_the_run_overlays_answer_the_mouse(
    voila_server, make_notebook, page, screenshot, console_log
) -> None:
    server = voila_server(make_notebook("clicks", CELLS))
    page.goto(server.url + "/", wait_until="domcontentloaded", timeout=90_000)
    wait_widgets_rendered(page, [".nbt-panel", ".nbt-chart-loss svg.svg-figure", "button.nbt-lrfind"], cpu_s=60)

    # -- the LR finder: a point hovered, then clicked
    page.locator("button.nbt-lrfind").click()
    # the waits on what the kernel computes (the sweep, the run, the overlay read from the store) are CPU-second
    # budgets of the test's processes (tests/browser/_servers.wait_page), so a loaded machine is not a failure
    wait_page(page, f"() => ({LRF_POINTS})().length > 10", cpu_s=60, what="the LR finder's curve")
    page.locator(".nbt-lrfinder-chart").scroll_into_view_if_needed()
    points = page.evaluate(LRF_POINTS)
    x, y = points[len(points) // 3]  # well before the divergence
    page.mouse.move(x, y)
    wait_page(page, f"() => ({TOOLTIP})() !== ''", cpu_s=10, what="the hovered point's tooltip")
    tip = page.evaluate(TOOLTIP)
    hovered = _number(tip.split("lr", 1)[1])
    page.mouse.click(x, y)
    choice = page.locator(".nbt-lrfinder-choice", has_text="clicked on the curve")
    wait_shown(page, ".nbt-lrfinder-choice", has_text="clicked on the curve", cpu_s=15)
    chosen = _number(choice.inner_text().split(":", 1)[1])
    assert abs(chosen / hovered - 1) < 0.01, (tip, choice.inner_text())
    wait_page(
        page,
        f"(x) => {{ const m = ({MARKER_X})(); return m !== null && Math.abs(m - x) < 2; }}",
        x,
        cpu_s=10,
        what="the marker at the clicked point",
    )
    wait_page(
        page,
        "(lr) => { const b = document.querySelector('.nbt-lr-exact input');"
        " return b && Math.abs(parseFloat(b.value) / lr - 1) < 0.01; }",
        chosen,
        cpu_s=10,
        what="the LR control at the clicked LR",
    )
    screenshot(page, "panel-lrfinder-clicked", selector=".nbt-lrfinder")

    # -- the run overlays: the earlier run chosen while the panel trains, then unselected
    earlier = [o for o in page.evaluate(OPTIONS) if "finished" in o]
    assert len(earlier) == 1, page.evaluate(OPTIONS)
    name = earlier[0].split(" · ")[0]
    page.locator("button.nbt-start").click()
    wait_badge(page, "running", cpu_s=30)
    wait_page(
        page, f"() => ({LOSS_LINES})().some(l => l.label === 'loss (step)' && l.n > 5)", cpu_s=30, what="the loss line"
    )
    option = page.locator(".nbt-compare-runs option", has_text=name)
    option.click()
    try:
        wait_page(
            page, f"(name) => ({LOSS_LINES})().some(l => l.label === name + ' · loss' && l.n > 10)", name, cpu_s=15
        )
    except TimeoutError:
        raise AssertionError(f"no overlay of {name!r}: {page.evaluate(LOSS_LINES)}, {page.evaluate(OPTIONS)}") from None
    lines = page.evaluate(LOSS_LINES)
    labels = [line["label"] for line in lines]
    overlay = labels.index(f"{name} · loss")
    assert badge(page) == "running"
    assert overlay < labels.index("loss (step)") < labels.index("smoothed"), labels  # under the live loss
    assert lines[overlay]["opacity"] < 0.5 < lines[labels.index("smoothed")]["opacity"], lines  # faint
    screenshot(page, "panel-compare-overlay", selector=".nbt-chart-loss")
    option.click(modifiers=["Control"])
    wait_page(
        page,
        f"(name) => {{ const l = ({LOSS_LINES})(); return !l.some(c => c.label.startsWith(name + ' · '))"
        " && l.some(c => c.label === 'smoothed' && c.n > 1); }",
        name,
        cpu_s=15,
        what="the overlay gone after its Ctrl-click",
    )
    assert page.evaluate("() => document.querySelector('.nbt-compare-runs select').selectedOptions.length") == 0
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)
    assert chart(page, ".nbt-chart-loss") is not None
    assert widget_problems(page) == []
