"""What the browser pays to draw a live panel (issue 54): Chromium's CPU while a ``TrainerWidget`` trains in JupyterLab.

``widget_overhead.py`` measures the panel in the kernel (no front end, or a client that draws nothing). On one
machine the browser that draws the panel shares the cores with the training: on a 2-core laptop or Binder a page
that keeps a core busy takes it from the run. This bench starts a JupyterLab server (``tests/browser/_servers.py``),
opens a notebook in Debian's Chromium (Playwright, ``/usr/bin/chromium``), runs a cell that builds a panel on a tiny
MLP (4,096 items, batch 32: 128 steps an epoch, about a dozen epochs a second on one torch thread), clicks Start with
the mouse, and then, in windows of ``--seconds``, reads:

* Chromium's CPU seconds per second (every Chromium process, from ``/proc``): the cores the page takes;
* the page's main thread busy share (Chrome DevTools ``Performance.getMetrics``: ``TaskDuration``);
* the kernel's steps a second (a callback in the kernel stamps every 200 steps) and its CPU;
* how many times the data map was drawn.

Variants, switched inside the kernel between windows (a file the callback reads), alternated over ``--rounds``:

* ``shipped``: the panel as it is (the data map's budget of points a second, ``widgets/_data_view.py``);
* ``map every update``: the map redrawn at every push after an epoch's end, as before its budget;
* ``no map``: the map never redrawn after Start (what the rest of the panel costs).

Chromium runs headless with ``--disable-gpu`` (the suite's flags): it rasterizes and composites in software, which a
desktop browser with a GPU does not, so the rendering share of these figures is an upper bound; the JavaScript
share (bqplot's drawing, the widget messages) is the same anywhere.

    python bench/browser_cost.py                  # 3 rounds of 10 s windows
    python bench/browser_cost.py --rounds 5 --seconds 15
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests" / "browser"), str(ROOT / "tests")]
import _servers  # noqa: E402  (the suite's server helpers: isolated dirs, no token, ready when /api answers)

TICK = os.sysconf("SC_CLK_TCK")
VARIANTS = ("shipped", "map every update", "no map")

CELL = """import json, time, torch
from torch import nn
from nbtrainer import TrainerWidget

torch.set_num_threads(1)
MODE, STAMPS = {mode!r}, {stamps!r}


class Stamp:
    # every 200 steps: the time, the step and the map's drawings so far, and the variant the bench asks for
    def on_optimizer_step(self, trainer, step, skipped):
        if step % 200:
            return
        with open(STAMPS, "a") as f:
            f.write(json.dumps([time.time(), step, drawings[0]]) + "\\n")
        with open(MODE) as f:
            mode = f.read().strip()
        data._points_per_s = float("inf") if mode == "map every update" else budget
        data.refresh = shipped_refresh if mode != "no map" else (lambda final=False, whole=False: False)


x = torch.randn(4096, 32)
y = (x @ torch.randn(32, 10)).argmax(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), lr=1e-3), (x, y),
                  epochs=100_000, batch_size=32, seed=0, callbacks=[Stamp()])
data = w.looks.data
budget, shipped_refresh, drawings, draw = data._points_per_s, data.refresh, [0], data.draw


def counted():
    drawings[0] += 1
    draw()


data.draw = counted
w"""


def chromium_cpu() -> float:
    """CPU seconds of every live Chromium process (and the children they reaped)."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"chromium" not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(v) for v in fields[11:15]) / TICK
    return total


def stamps(path: Path) -> list[tuple[float, int, int]]:
    if not path.exists():
        return []
    return [tuple(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]  # type: ignore[misc]


def window(cdp: Any, path: Path, seconds: float) -> dict[str, float]:
    """One window's figures (see the module docstring)."""

    def busy() -> float:
        return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}["TaskDuration"]

    c0, b0, t0 = chromium_cpu(), busy(), time.time()
    time.sleep(seconds)
    c1, b1, t1 = chromium_cpu(), busy(), time.time()
    inside = [s for s in stamps(path) if t0 <= s[0] <= t1]
    rate = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]) if len(inside) > 1 else float("nan")
    drawn = inside[-1][2] - inside[0][2] if len(inside) > 1 else 0
    return {"chromium": (c1 - c0) / (t1 - t0), "busy": (b1 - b0) / (t1 - t0), "steps_s": rate, "drawn": drawn}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--chromium", default=os.environ.get("NBT_CHROMIUM", "/usr/bin/chromium"))
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    base = Path(tempfile.mkdtemp(prefix="nbt-browser-cost-"))
    root, mode, stamp_file = base / "root", base / "mode", base / "stamps"
    root.mkdir()
    mode.write_text("shipped")
    _servers.write_notebook(root / "cost.ipynb", [CELL.format(mode=str(mode), stamps=str(stamp_file))])
    server = _servers.start_lab(root, base / "work")
    pw = sync_playwright().start()
    try:
        browser = pw.chromium.launch(
            executable_path=args.chromium,
            headless=True,
            args=_servers.chromium_args(),
            env=_servers.chromium_env(base / "chromium"),
        )
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(f"{server.url}/lab/tree/cost.ipynb?reset", timeout=60_000)
        _servers.lab_run_all(page, timeout=120)
        page.wait_for_selector(".nbt-panel .nbt-start", timeout=60_000)
        page.locator(".nbt-panel .nbt-start").first.click()
        cdp = page.context.new_cdp_session(page)
        cdp.send("Performance.enable")
        time.sleep(5)  # the run's start, the check's and the first map's drawing
        print(f"# machine: {os.cpu_count()} CPUs; Chromium {browser.version}, headless; JupyterLab; a tiny MLP "
              f"(32-64-10, batch 32, 4,096 items: 128 steps an epoch) on one torch thread; {args.seconds:.0f} s "
              f"windows, {args.rounds} rounds, variants alternated; medians [min-max]")  # fmt: skip
        results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                mode.write_text(variant)
                time.sleep(2)  # the kernel reads it within 200 steps; what the page still draws of the last settles
                results[variant].append(window(cdp, stamp_file, args.seconds))
        print("| variant | Chromium CPU (cores) | page's main thread busy | kernel steps/s | map drawings a minute |")
        print("|---|---:|---:|---:|---:|")
        for variant, rows in results.items():

            def cell(key: str, fmt: str, rows: list[dict[str, float]] = rows) -> str:
                values = [row[key] for row in rows]
                return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

            per_minute = statistics.median(row["drawn"] for row in rows) * 60 / args.seconds
            print(f"| {variant} | {cell('chromium', '.2f')} | {cell('busy', '.0%')} | {cell('steps_s', '.0f')} | "
                  f"{per_minute:.0f} |")  # fmt: skip
    finally:
        pw.stop()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
