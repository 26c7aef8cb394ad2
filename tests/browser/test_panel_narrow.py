"""The panel in JupyterLab at 800 px with the side panel open (about 370 px wide), over a run of many epochs
(issue 26: defects 2, 3, 5, 10 and 11), in a real Chromium.

* The LR finder's x tick labels do not overlap; the live epoch table shows the newest rows and says how many
  are hidden, its lr and time columns are reachable, and "show all" does not pull the view back to the newest
  row once the user has scrolled up; the status and section titles stay on one line.
* The message area shows a run's last three messages (one an epoch, from the training thread); "show all" with the
  mouse lists every one, "show fewer" three again.
* A second run marks the first run's summary as the previous run.
* At 1280 px the LR finder button sits on the buttons' first row.
* At 800 and at 1280 px the compare menu's choices and its step / epoch buttons read in full (issue 38).
* No bqplot console error ("negative width", "translate(0,NaN)") from the page load to the end.
"""

from __future__ import annotations

import itertools
import re
import time

import pytest

from ._panel import PANEL_SELECTORS, wait_badge, wait_page, wait_shown
from ._servers import lab_run_all, wait_widgets_rendered, widget_problems
from .test_panel_reload import bqplot_noise

CELLS = [
    "import time, torch\n"
    "from torch import nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import TrainerWidget\n"
    "torch.set_num_threads(1)\n"
    "\n"
    "class Slow:  # each optimizer step takes a little wall time: epochs arrive a few per second\n"
    "    def on_optimizer_step(self, trainer, step, skipped):\n"
    "        time.sleep(0.01)\n"
    "    def on_epoch_end(self, trainer, epoch, logs):  # a message an epoch, from the training thread\n"
    "        w.notify('info', f'epoch {epoch} ended')\n"
    "\n"
    "def acc(outputs, targets):\n"
    "    return (outputs.argmax(1) == targets).float().mean()\n"
    "\n"
    "_ = torch.manual_seed(0)\n"
    "x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))\n"
    "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))\n"
    "w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05),\n"
    "                  DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32),\n"
    "                  DataLoader(TensorDataset(x[192:], y[192:]), batch_size=64),\n"
    "                  metrics={'acc': acc}, epochs=20, callbacks=[Slow()], ui_interval=0.1)\n"
    "w",
]

# x tick labels of a chart's horizontal axis: [left, right] of each, in page pixels
X_TICKS = """(sel) => {
    const boxes = [...document.querySelectorAll(sel + ' svg.svg-background g.axis')].map(a =>
        [...a.querySelectorAll('g.tick text')].map(t => t.getBoundingClientRect()).filter(r => r.width > 0));
    const horizontal = boxes.filter(rs => rs.length > 1 && Math.abs(rs[0].top - rs[rs.length - 1].top) < 2);
    return horizontal.length ? horizontal[0].map(r => [r.left, r.right]).sort((a, b) => a[0] - b[0]) : null;
}"""
# the live epoch table: epochs of the rows a user sees, the box's scroll state, where the "time" header ends
TABLE = """() => {
    const box = document.querySelector('.nbt-epoch-table-box');
    if (!box) return null;
    const b = box.getBoundingClientRect();
    const rows = [...box.querySelectorAll('tbody tr')].filter(r => {
        const q = r.getBoundingClientRect();
        return getComputedStyle(r).display !== 'none' && q.height > 0 && q.bottom <= b.bottom + 1 && q.top >= b.top - 1;
    }).map(r => Number(r.cells[0].textContent));
    const time = [...box.querySelectorAll('th')].find(t => t.textContent === 'time');
    return {rows, scrollTop: box.scrollTop, scrollWidth: box.scrollWidth, clientWidth: box.clientWidth,
            overflowX: getComputedStyle(box).overflowX, boxRight: b.right,
            timeRight: time ? time.getBoundingClientRect().right : null,
            note: (document.querySelector('.nbt-epoch-note') || {}).innerText || '',
            title: document.querySelector('.nbt-epochs-area').innerText.split('\\n')[0]};
}"""
# The status badge and its detail ("finished" "20 epoch(s)") on one line: the detail is one line box, level
# with the badge.
STATUS_ONE_LINE = """() => {
    const badge = document.querySelector('.nbt-status-badge'), detail = document.querySelector('.nbt-status-detail');
    if (!badge || !detail) return false;
    const b = badge.getBoundingClientRect(), d = detail.getBoundingClientRect();
    return detail.getClientRects().length === 1 && Math.abs(b.top + b.height / 2 - (d.top + d.height / 2)) < 6;
}"""
# The compare menu's words cut short: a button or label whose text overflows its box ("epoch" shown as "ep..."),
# or a choice of the run list wider than the list (measured in the list's own font).
COMPARE_CUT = """() => {
    const cut = [];
    for (const el of document.querySelectorAll('.nbt-compare button, .nbt-compare label')) {
        if (el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
            cut.push({text: el.textContent.trim(), need: el.scrollWidth, have: el.clientWidth});
    }
    const sel = document.querySelector('.nbt-compare select');
    const ctx = document.createElement('canvas').getContext('2d');
    ctx.font = getComputedStyle(sel).font;
    for (const opt of sel.options) {
        const need = ctx.measureText(opt.text).width, have = sel.clientWidth - 8;
        if (need > have) cut.push({text: opt.text, need, have});
    }
    return cut;
}"""
# every visible section title is one line high
TITLES_ONE_LINE = """() => [...document.querySelectorAll('.nbt-section-title')].filter(t => t.offsetParent !== null)
    .map(t => {
        const d = t.querySelector('div') || t, line = parseFloat(getComputedStyle(d).lineHeight);
        return {text: t.innerText, lines: Math.round(d.getBoundingClientRect().height / line)};
    })"""


BOX = "document.querySelector('.nbt-epoch-table-box')"


def _table_until(page, ok, timeout_s: float = 30.0) -> dict:
    """Poll the live epoch table until ``ok(state)``; on timeout, fail with the last state seen."""
    end, last = time.monotonic() + timeout_s, None
    while time.monotonic() < end:
        last = page.evaluate(TABLE)
        if last and ok(last):
            return last
        page.wait_for_timeout(200)
    raise AssertionError(f"epoch table never as expected; last seen: {last}")


def _epochs_so_far(page) -> int:
    m = re.search(r"(\d+) so far", page.locator(".nbt-epochs-area").first.inner_text())
    return int(m.group(1)) if m else 0


@pytest.mark.timeout(300)
def test_narrow_panel_long_run_and_a_second_run(shared_lab, make_notebook, page, screenshot, console_log):
    page.set_viewport_size({"width": 800, "height": 900})
    nb = make_notebook("panel_narrow", CELLS)
    page.goto(shared_lab.url(nb), wait_until="domcontentloaded", timeout=60_000)
    lab_run_all(page, cpu_s=120)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    panel = page.locator(".nbt-panel").first
    if panel.bounding_box()["width"] > 450:  # the side panel closed: open it, as the user had it
        page.evaluate("() => window.jupyterapp.commands.execute('filebrowser:activate')")
        page.wait_for_function("() => document.querySelector('.nbt-panel').getBoundingClientRect().width < 450")
    width = panel.bounding_box()["width"]
    assert width < 450, width

    # LR finder: x tick labels readable (no two overlap)
    page.locator("button.nbt-lrfind").click()
    wait_shown(page, ".nbt-lrfinder-chart svg.svg-figure", cpu_s=60)  # the sweep: the kernel's work, in CPU seconds
    wait_page(page, f"(s) => ({X_TICKS})(s) !== null", ".nbt-lrfinder-chart", cpu_s=30)
    ticks = page.evaluate(X_TICKS, ".nbt-lrfinder-chart")
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(ticks)), ticks
    screenshot(page, "panel-narrow-800-lrfinder", selector=".nbt-lrfinder")

    # a run of 20 epochs: the table shows the newest rows and says how many are hidden
    page.locator("button.nbt-start").click()
    wait_badge(page, "finished", cpu_s=120)
    table = _table_until(page, lambda t: 20 in t["rows"])
    assert table["rows"][-1] == 20 and len(table["rows"]) == 8, table
    assert "12 earlier hidden" in table["note"], table
    # lr and time: inside the box, or the box scrolls sideways to them
    sideways = table["scrollWidth"] > table["clientWidth"] and table["overflowX"] in ("auto", "scroll")
    assert table["timeRight"] is not None and (table["timeRight"] <= table["boxRight"] + 1 or sideways), table
    # one line each: the status ("finished 20 epoch(s)") and the section titles
    assert page.evaluate(STATUS_ONE_LINE), page.locator(".nbt-status").first.inner_text()
    titles = page.evaluate(TITLES_ONE_LINE)
    assert titles and all(t["lines"] == 1 for t in titles), titles
    # the panel is taller than the window: its parts one by one (an element shot shows only what is in view)
    for part in (".nbt-header", ".nbt-epochs-area", ".nbt-chart-metrics"):
        screenshot(page, f"panel-narrow-800{part.replace('.nbt', '')}", selector=part)

    # the message area: the last three messages (the run's last two and the panel's "run finished"); "show all"
    # with the mouse lists every one, "show fewer" three again
    lines = page.locator(".nbt-messages-lines .nbt-message-info")
    said = lines.filter(has_text="ended")
    wait_shown(page, ".nbt-messages-lines .nbt-message-info", has_text="run finished", cpu_s=30)
    texts = lines.all_inner_texts()
    assert texts[:2] == ["info: epoch 19 ended", "info: epoch 20 ended"] and len(texts) == 3, texts
    page.locator(".nbt-messages-all").click()
    wait_shown(page, ".nbt-messages-lines .nbt-message-info", has_text="epoch 1 ended", cpu_s=15)
    assert said.all_inner_texts() == [f"info: epoch {e} ended" for e in range(1, 21)], said.all_inner_texts()
    page.locator(".nbt-messages-all", has_text="show fewer").click()
    wait_page(page, "() => document.querySelectorAll('.nbt-messages-lines .nbt-message-info').length === 3", cpu_s=15)

    # the compare menu lists the finished run; its choices and both align buttons read in full (issue 38)
    wait_page(page, "() => document.querySelectorAll('.nbt-compare select option').length >= 1", cpu_s=15)
    assert page.evaluate(COMPARE_CUT) == [], page.evaluate(COMPARE_CUT)
    screenshot(page, "panel-narrow-800-compare", selector=".nbt-compare")

    # a second, long run: the first run's summary is marked as the previous run's
    epochs = page.locator(".nbt-epochs input").first
    epochs.fill("2000")
    epochs.press("Enter")
    page.wait_for_function("() => document.querySelector('.nbt-epochs input').value === '2000'")
    page.locator("button.nbt-start").click()
    wait_badge(page, "running", cpu_s=30)
    wait_page(page, "() => document.querySelector('.nbt-summary-area').innerText.includes('previous run')", cpu_s=30)

    # it follows the newest epoch while the run goes on
    wait_page(
        page,
        f"""() => {{ const t = ({TABLE})(); const m = /(\\d+) so far/.exec(t.title);
                    return t && m && Number(m[1]) >= 20 && t.rows[t.rows.length - 1] === Number(m[1]); }}""",
        cpu_s=60,
    )
    # "show all": opens at the newest row; once the user scrolls up, new epochs do not pull the view back
    page.locator(".nbt-epoch-all").first.click()
    # ready when every row is there and the box scrolls (its class, rows and height arrive in separate messages)
    wait_page(
        page,
        f"() => {BOX}.classList.contains('nbt-epoch-scrolls') && {BOX}.scrollTop === 0"
        f" && {BOX}.scrollHeight > {BOX}.clientHeight + 120 && {BOX}.querySelectorAll('tbody tr').length > 20",
        cpu_s=30,
        what="every row in a box that scrolls",
    )
    # the user scrolls up (column-reverse: negative from the newest row); done once the box holds the position
    page.wait_for_function(f"() => {{ {BOX}.scrollTop = -80; return {BOX}.scrollTop < -40; }}")
    before = _epochs_so_far(page)
    wait_page(
        page,
        f"() => Number(/(\\d+) so far/.exec(document.querySelector('.nbt-epochs-area').innerText)[1]) > {before}",
        cpu_s=30,
        what="an epoch after the scroll",
    )
    assert page.evaluate(f"() => {BOX}.scrollTop") < -40
    screenshot(page, "panel-narrow-800-show-all", selector=".nbt-epochs-area")
    page.locator("button.nbt-stop").click()
    wait_badge(page, "stopped", cpu_s=30)

    # full width: the LR finder button on the first row of buttons
    page.set_viewport_size({"width": 1280, "height": 900})
    page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
    page.wait_for_function("() => document.querySelector('.nbt-panel').getBoundingClientRect().width > 700")
    start, lrfind = page.locator("button.nbt-start").first, page.locator("button.nbt-lrfind").first
    a, b = start.bounding_box(), lrfind.bounding_box()
    assert abs(a["y"] - b["y"]) < 4, (a, b)
    screenshot(page, "panel-1280-buttons", selector=".nbt-buttons")
    assert page.evaluate(COMPARE_CUT) == [], page.evaluate(COMPARE_CUT)
    screenshot(page, "panel-1280-compare", selector=".nbt-compare")

    assert widget_problems(page) == []
    assert not bqplot_noise(console_log), bqplot_noise(console_log)[:5]
