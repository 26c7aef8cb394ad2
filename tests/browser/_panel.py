"""Reading the training panel in a real page: status, progress and what the bqplot charts really drew.

Selectors are the panel's stable classes (``nbt-*``, documented in ``widgets/__init__.py``) plus bqplot's own
SVG structure (``svg.svg-figure g.curve path.line`` for a Lines mark, ``path.dot`` for its markers, tick
``text`` in the axes of ``svg.svg-background``).
"""

from __future__ import annotations

import re
from typing import Any

PANEL_SELECTORS = [
    ".nbt-panel",
    ".nbt-status",
    "button.jupyter-button.nbt-start",
    "button.jupyter-button.nbt-pause",
    "button.jupyter-button.nbt-stop",
    "button.jupyter-button.nbt-save",
    "button.jupyter-button.nbt-profile",
    ".nbt-progress-step",
    ".nbt-progress-epoch",
    ".nbt-chart-loss svg.svg-figure",
    ".nbt-chart-lr svg.svg-figure",
    ".nbt-chart-metrics svg.svg-figure",
]
# in the DOM but empty (zero height) until there is something to show
PANEL_ATTACHED = [".nbt-messages"]

# Per chart: every Lines mark's label, number of drawn points, x span in pixels, markers; the plot width;
# and the x / y tick labels. Points are parsed from the path's "M x,y L x,y ..." commands.
_CHART_JS = """(sel) => {
    const root = document.querySelector(sel);
    if (!root) return null;
    const fig = root.querySelector('svg.svg-figure');
    if (!fig) return null;
    const plot = fig.querySelector('rect.plotarea_events');
    const curves = [...fig.querySelectorAll('g.curve')].map(g => {
        const label = g.querySelector('text.curve_label');
        const path = g.querySelector('path.line');
        const d = (path && path.getAttribute('d')) || '';
        const pts = [...d.matchAll(/[ML]\\s*(-?[\\d.]+(?:e[-+]?\\d+)?)[ ,](-?[\\d.]+(?:e[-+]?\\d+)?)/gi)]
            .map(m => [Number(m[1]), Number(m[2])]).filter(p => isFinite(p[0]) && isFinite(p[1]));
        const xs = pts.map(p => p[0]);
        return {label: label ? label.textContent : null, n: pts.length,
                xspan: xs.length ? Math.max(...xs) - Math.min(...xs) : 0,
                dots: g.querySelectorAll('path.dot').length};
    });
    const axes = [...root.querySelectorAll('svg.svg-background g.axis')].map(
        a => [...a.querySelectorAll('g.tick text')].map(t => t.textContent));
    return {curves, width: plot ? Number(plot.getAttribute('width')) : 0, axes};
}"""


def chart(page: Any, selector: str) -> dict[str, Any] | None:
    """What the chart under ``selector`` (e.g. ``.nbt-chart-loss``) has drawn right now."""
    return page.evaluate(_CHART_JS, selector)


def curve(info: dict[str, Any] | None, label: str) -> dict[str, Any]:
    """The Lines mark labelled ``label`` (empty dict if absent)."""
    for c in (info or {}).get("curves", []):
        if c["label"] == label:
            return c
    return {}


def status(page: Any) -> str:
    return page.locator(".nbt-status").first.inner_text().strip()


def global_step(page: Any) -> int:
    """The optimizer step shown in the progress line (``step 266/920 · loss ...``), 0 before a run."""
    text = page.locator(".nbt-progress-info").first.inner_text() if page.locator(".nbt-progress-info").count() else ""
    m = re.search(r"step ([\d,]+)", text)
    return int(m.group(1).replace(",", "")) if m else 0


def step_bar_fraction(page: Any) -> float:
    """How full the step progress bar is (0..1), read from the bar's width style."""
    return page.evaluate("""() => {
        const bar = document.querySelector('.nbt-progress-step .progress-bar');
        if (!bar) return -1;
        const w = bar.style.width || '0%';
        return w.endsWith('%') ? parseFloat(w) / 100 : (parseFloat(w) / bar.parentElement.clientWidth);
    }""")


def state_errors(console_log: list[str]) -> list[str]:
    """Console lines saying a widget model failed to apply an update from the kernel."""
    return [m for m in console_log if "Error setting state" in m or "Could not process update msg" in m]
