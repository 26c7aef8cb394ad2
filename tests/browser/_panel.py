"""Reading the training panel in a real page: status, progress and what the bqplot charts really drew.

Selectors are the panel's stable classes (``nbt-*``, documented in ``widgets/__init__.py``) plus bqplot's own
SVG structure (``svg.svg-figure g.curve path.line`` for a Lines mark, ``path.dot`` for its markers, tick
``text`` in the axes of ``svg.svg-background``).
"""

from __future__ import annotations

import re
from typing import Any

from ._servers import wait_page

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
    ".nbt-chart-memory svg.svg-figure",
    "input.nbt-lr-exact, .nbt-lr-exact input",
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


def status(root: Any) -> str:
    """The status line (badge and detail) of the first panel under ``root``: the page, or a panel's locator."""
    return root.locator(".nbt-status").first.inner_text().strip()


def badge(page: Any) -> str:
    """The status word on the badge alone (its class is ``nbt-status-<status>``), not the detail beside it."""
    return page.evaluate("""() => {
        const b = document.querySelector('.nbt-status .nbt-status-badge');
        return b ? b.textContent.trim() : '';
    }""")


_SHOWN = """([selector, n, text]) => {
    const all = [...document.querySelectorAll(selector)].filter(e => text === null || e.innerText.includes(text));
    const e = all[n];
    return !!e && e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
}"""


def wait_shown(
    page: Any, selector: str, *, n: int = 0, has_text: str | None = None, cpu_s: float = 30.0, what: str = ""
) -> None:
    """A locator's ``wait_for()`` (the ``n``-th element matching ``selector``, among those whose text holds
    ``has_text``, is drawn) within ``cpu_s`` CPU seconds of the test's processes (``wait_page``), for what the kernel's
    work puts on the page."""
    wait_page(page, _SHOWN, [selector, n, has_text], cpu_s=cpu_s, what=what or f"{selector} ({has_text or n})")


_BADGE = """([word, panel]) => {
    const root = panel === null ? document : document.querySelectorAll('.nbt-panel')[panel];
    const b = root && root.querySelector('.nbt-status .nbt-status-' + word);
    return !!b && b.getClientRects().length > 0 && getComputedStyle(b).visibility !== 'hidden';
}"""


def wait_badge(page: Any, word: str, cpu_s: float = 20.0, *, panel: int | None = None) -> None:
    """Until the status badge says ``word`` (visible), within ``cpu_s`` CPU seconds of the test's processes; ``panel``:
    the badge of the page's ``panel``-th panel (default: the first badge on the page). On failure the message says
    what the panel shows instead (badge, detail, step): "finished" where "stopped" was awaited is a run that ended
    before its Stop was handled, not a Stop that was ignored."""
    try:
        wait_page(page, _BADGE, [word, panel], cpu_s=cpu_s, what=f"the badge {word!r}")
    except TimeoutError as exc:
        root = page if panel is None else page.locator(".nbt-panel").nth(panel)
        shown = status(root) if root.locator(".nbt-status").count() else ""
        step = f" at step {global_step(page)}" if panel is None else ""
        raise TimeoutError(f"{exc}; the panel shows {shown or '(no status)'!r}{step}") from None


def scatter_points(page: Any, selector: str) -> int:
    """How many Scatter markers the figure under ``selector`` draws (bqplot ``path.dot`` outside lines)."""
    return page.evaluate(
        "(sel) => [...document.querySelectorAll(sel + ' svg.svg-figure path.dot')]"
        ".filter(d => !d.closest('g.curve')).length",
        selector,
    )


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


# What the widget managers log when a model or a view fails (ipywidgets 7 writes "Could not create a view for model
# id ...", "Could not add child view to box" and carries on: the rest of the panel draws, the failed part is missing).
STATE_ERRORS = (
    "Error setting state",
    "Could not process update msg",
    "Could not create a view",
    "Could not create view",
    "Could not add child view",
)


def state_errors(console_log: list[str]) -> list[str]:
    """Console lines saying a widget model failed to apply an update from the kernel, or a view failed to draw."""
    return [m for m in console_log if any(e in m for e in STATE_ERRORS)]


# Every text node in the panel: its colour against the first opaque background behind it (WCAG 2 ratio).
_CONTRAST_JS = """(root) => {
    const lum = (c) => {
        const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
        const [r, g, b, a] = m[1].split(',').map(Number);
        const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return {l: 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b), a: a === undefined ? 1 : a, rgb: [r, g, b]};
    };
    const bgOf = (el) => {
        for (let e = el; e; e = e.parentElement) {
            const c = getComputedStyle(e).backgroundColor; const v = lum(c);
            if (v && v.a > 0.5) return v;
        }
        return lum('rgb(255, 255, 255)');
    };
    const out = [];
    const els = [...document.querySelectorAll(root + ' *')]
        .filter(e => e.offsetParent !== null || e instanceof SVGElement);
    for (const el of els) {
        const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
        if (!own || ['title', 'desc', 'style', 'script', 'TITLE', 'STYLE', 'SCRIPT'].includes(el.tagName)) continue;
        const cs = getComputedStyle(el);
        if (cs.visibility === 'hidden' || cs.display === 'none' || Number(cs.opacity) === 0) continue;
        let fg = lum(el instanceof SVGElement ? (cs.fill && cs.fill !== 'none' ? cs.fill : cs.color) : cs.color);
        if (!fg) continue;
        const bg = bgOf(el);  // its own background first (badges, buttons)
        if (fg.a < 1) {  // a translucent text colour over its background
            const mix = fg.rgb.map((v, i) => v * fg.a + bg.rgb[i] * (1 - fg.a));
            fg = lum(`rgb(${mix.join(',')})`);
        }
        const ratio = (Math.max(fg.l, bg.l) + 0.05) / (Math.min(fg.l, bg.l) + 0.05);
        const text = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('');
        const cls = el.className && el.className.baseVal !== undefined ? el.className.baseVal : el.className;
        out.push({text: text.trim().slice(0, 40), tag: el.tagName, cls: String(cls).slice(0, 60),
                  ratio: Math.round(ratio * 100) / 100});
    }
    return out;
}"""


# Every panel on the page carries its stylesheet (widgets/_view.py HIDE_STATIC, with _style.THEME_CSS: the theme's
# secondary text colour where the front end's is too light, Start/Stop's white text) and the computed colours use it.
_STYLED_JS = """(root) => {
    const panels = [...document.querySelectorAll('.nbt-panel')];
    return document.querySelector(root) !== null && panels.every(p => [...p.querySelectorAll('style')].some(
        s => s.textContent.includes('.nbt-summary-static{display:none}') && s.sheet && s.sheet.cssRules.length > 0));
}"""
_STYLE_STATE_JS = """() => [...document.querySelectorAll('.nbt-panel')].map(p => ({
    styles: [...p.querySelectorAll('style')].map(s => s.textContent.slice(0, 40)),
    children: p.children.length,
    color2: getComputedStyle(p).getPropertyValue('--jp-ui-font-color2').trim(),
}))"""


def wait_styled(page: Any, root: str = ".nbt-panel", timeout_s: float = 30.0) -> None:
    """Wait until ``root`` is in the page and every panel has its stylesheet in the page and applied (then two
    more frames).

    The panel's colours are only what a person sees once its ``<style>`` is in the page: a page read before that
    view is drawn measures the front end's defaults (ipywidgets 7's secondary grey, 3.95:1 on white; issue 57).
    """
    try:
        page.wait_for_function(_STYLED_JS, arg=root, timeout=int(timeout_s * 1000))
    except Exception as exc:
        raise AssertionError(
            f"the panel's stylesheet never reached the page in {timeout_s:.0f} s: {page.evaluate(_STYLE_STATE_JS)}"
        ) from exc
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def low_contrast(page: Any, root: str = ".nbt-panel", minimum: float = 4.5) -> list[dict[str, Any]]:
    """Text under ``root`` whose contrast with its background is below ``minimum`` (WCAG AA: 4.5), read once every
    panel's stylesheet is applied (:func:`wait_styled`): the same page reads the same every time."""
    wait_styled(page, root)
    return [t for t in page.evaluate(_CONTRAST_JS, root) if t["ratio"] < minimum]


# What a finished panel shows (the last panel on the page): the badge, the progress line, the stat cards, the health
# lights, the samples' step and the errors section's summary; and any backtick left in its text.
PANEL_STATE = """() => {
    const panels = document.querySelectorAll('.nbt-panel'), p = panels[panels.length - 1];
    if (!p) return null;
    const text = (sel) => { const e = p.querySelector(sel); return e ? e.innerText.trim() : ''; };
    return {badge: text('.nbt-status-badge'), progress: text('.nbt-progress-info'),
            epoch: text('.nbt-progress-epoch'), cards: p.querySelectorAll('.nbt-stats .nbt-stat').length,
            best: text('.nbt-stat-best'), lights: p.querySelectorAll('.nbt-health-light').length,
            samples: text('.nbt-samples-step'), pictures: p.querySelectorAll('.nbt-samples img').length,
            errors: text('.nbt-errors-summary'), backticks: p.innerText.includes('`')};
}"""


def panel_state(page: Any) -> dict[str, Any]:
    return page.evaluate(PANEL_STATE) or {}


def incomplete(state: dict[str, Any], *, steps: int, epochs: int) -> list[str]:
    """What a finished run's panel (``panel_state``) is missing: [] when it shows all of itself."""
    s = state
    shown = re.match(r"sample (\d+) of (\d+)", (s.get("samples") or "").split(" · ")[-1])
    missing = {
        "the badge": s.get("badge") != "finished",
        "the last progress": f"epoch {epochs}/{epochs}" not in (s.get("epoch") or ""),
        "the step line": f"step {steps}/{steps}" not in (s.get("progress") or ""),
        "the stat cards": (s.get("cards") or 0) < 3 or "val_loss" not in (s.get("best") or ""),
        "the health lights": s.get("lights") != 6,
        "the latest sample": not shown or shown[1] != shown[2] or not s.get("pictures"),
        "the errors": f"after epoch {epochs}" not in (s.get("errors") or ""),
        "text without Markdown": bool(s.get("backticks")),
    }
    return [what for what, bad in missing.items() if bad]


# The confusion matrix as drawn: each cell's box and the count written in it, and the axes' tick labels with their
# centres (x: predicted, y: target), to tell which cell lies under a point.
MATRIX = """() => {
    const fig = document.querySelector('.nbt-errors-matrix');
    const box = (e) => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
    const cells = [...fig.querySelectorAll('rect.heatmapcell')].map(r => {
        const label = r.parentElement.querySelectorAll('.heatmapcell_label')[[...r.parentElement
            .querySelectorAll('rect.heatmapcell')].indexOf(r)];
        return {box: box(r), count: label ? label.textContent.trim() : ''};
    });
    const axes = [...fig.querySelectorAll('svg.svg-background g.axis')].map(a => [...a.querySelectorAll('g.tick')]
        .map(t => { const b = t.querySelector('text').getBoundingClientRect();
                    return [t.querySelector('text').textContent, b.x + b.width / 2, b.y + b.height / 2]; }));
    return {cells, axes};
}"""


def click_matrix_cell(page: Any, *, at: tuple[float, float] = (0.5, 0.5), skip: int = 0) -> tuple[str, str, str]:
    """Click, with the mouse, the ``skip``-th off-diagonal cell that has items, at ``at`` (fractions of its box);
    return what lies there as drawn: (target, predicted, count) read from the axes and the cell's label."""
    m = page.evaluate(MATRIX)
    xs, ys = m["axes"][0], m["axes"][1]
    picked = []
    for c in m["cells"]:
        x, y, w, h = c["box"]
        cx, cy = x + w / 2, y + h / 2
        predicted = min(xs, key=lambda t: abs(t[1] - cx))[0]
        target = min(ys, key=lambda t: abs(t[2] - cy))[0]
        if target != predicted and c["count"] not in ("", "0"):
            picked.append((x + at[0] * w, y + at[1] * h, target, predicted, c["count"]))
    x, y, target, predicted, count = picked[skip]
    page.mouse.click(x, y)
    return target, predicted, count
