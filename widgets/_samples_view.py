"""The panel's samples section (``nbt-samples``): what ``nbtrainer.Samples`` took, on a timeline beside the loss.

A slider over the sampled steps (the step-0 baseline first) picks the step shown on the right; the left shows the
step it is compared with (the baseline, the previous sample, or none), text differences marked word by word
(``difflib``: ``nbt-diff-del`` on the left, ``nbt-diff-ins`` on the right), pictures side by side. Clicking a point
of the loss chart moves the slider to the sample nearest that step. New samples appear while the run trains: the
UI thread calls :meth:`SamplesView.refresh`, which reads ``history.samples`` (plain data the training thread
appends to) and redraws only when something new came; a slider left on the newest sample follows the new ones, and
a run that has ended rests on its latest. A sample function that failed is said in the section and in the panel's
messages.

Colours come from CSS classes in the section's own style block, not from widget traits (ipywidgets 7 refuses CSS
variables there).
"""

from __future__ import annotations

import bisect
import difflib
import html
import re
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as W

from nbtrainer.plotting import png_img

from ._charts import LiveCharts
from ._layouts import plain_html, shared_layout
from ._section import Section

__all__ = ["SamplesView", "word_diff"]

_STYLE = (
    "<style>.nbt-samples-pane{flex:1 1 0;min-width:0;margin-right:8px}"
    ".nbt-samples-pane pre{white-space:pre-wrap;word-break:break-word;margin:0 0 6px 0;font-size:12px}"
    ".nbt-diff-ins{background:rgba(26,127,55,0.28);text-decoration:none}"
    ".nbt-diff-del{background:rgba(207,34,46,0.28);text-decoration:line-through}"
    ".nbt-samples-name{font-size:11px;font-weight:600;margin:2px 0}"
    ".nbt-samples-head{font-size:12px;margin-bottom:4px}"
    ".nbt-samples-pane img{image-rendering:pixelated;max-width:100%;display:block;margin-bottom:6px}"
    ".nbt-samples-error{font-size:12px}</style>"
)
_COMPARE = [("baseline", "baseline"), ("previous sample", "previous"), ("nothing", "none")]
_TOKEN = re.compile(r"\s+|[^\s]+")


def word_diff(old: str, new: str) -> tuple[str, str]:
    """``(old, new)`` as HTML with the words only in ``old`` in ``nbt-diff-del`` and those only in ``new`` in
    ``nbt-diff-ins`` (whitespace kept).

    Example:
        >>> word_diff("the cat sat", "the dog sat")
        ("the <del class='nbt-diff-del'>cat</del> sat", "the <ins class='nbt-diff-ins'>dog</ins> sat")
    """
    a, b = _TOKEN.findall(old), _TOKEN.findall(new)
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            text = html.escape("".join(a[i1:i2]))
            left.append(text)
            right.append(text)
            continue
        if i2 > i1:
            left.append(f"<del class='nbt-diff-del'>{html.escape(''.join(a[i1:i2]))}</del>")
        if j2 > j1:
            right.append(f"<ins class='nbt-diff-ins'>{html.escape(''.join(b[j1:j2]))}</ins>")
    return "".join(left), "".join(right)


def _picture(value: Any, name: str) -> str:
    return png_img(value, alt=name)  # a small picture enlarged, its pixels kept sharp


class SamplesView:
    """The samples section. ``root`` is its :class:`Section` (class ``nbt-samples``), hidden until a sample comes.

    Args:
        charts: the panel's live charts: a click on a point of the loss chart picks the nearest sample.
        source: returns the panel's current trainer (its ``history.samples`` and ``history.events`` are read).
        notify: the panel's messages (``level, text``): a failed sample function is said there.

    Widgets (stable classes): the slider ``nbt-samples-slider``, the step shown ``nbt-samples-step``, the
    comparison menu ``nbt-samples-compare``, the two panes ``nbt-samples-left`` / ``nbt-samples-right`` and the
    failures ``nbt-samples-error``.

    Example:
        >>> view = SamplesView(w.charts, lambda: w.trainer, w.notify)  # doctest: +SKIP
        >>> view.refresh()  # on the UI thread: new samples drawn, the slider extended  # doctest: +SKIP
    """

    def __init__(self, charts: LiveCharts, source: Callable[[], Any], notify: Callable[[str, str], None]) -> None:
        self.source, self.notify = source, notify
        self.section = Section("samples", "nbt-samples")
        self.root = self.section.root
        self.slider = W.IntSlider(value=0, min=0, max=0, description="step", readout=False, continuous_update=True,
                                  layout=W.Layout(width="320px"))  # fmt: skip
        self.slider.add_class("nbt-samples-slider")
        self.step_label = plain_html()
        self.step_label.add_class("nbt-samples-step")
        self.compare = W.Dropdown(options=_COMPARE, value="baseline", description="compare with",
                                  style={"description_width": "initial"}, layout=W.Layout(width="240px"))  # fmt: skip
        self.compare.add_class("nbt-samples-compare")
        self.left, self.right = plain_html(flex="1 1 0"), plain_html(flex="1 1 0")
        self.left.add_class("nbt-samples-left")
        self.right.add_class("nbt-samples-right")
        self.errors = plain_html()
        self.errors.add_class("nbt-samples-error")
        bar = W.HBox([self.slider, self.step_label, self.compare], layout=shared_layout(flex_flow="row wrap"))
        self.body = W.VBox([W.HTML(_STYLE), bar, W.HBox([self.left, self.right]), self.errors])
        self.held: tuple[W.Widget, ...] = (self.body,)  # in the section from the first sample on
        self.steps: list[int] = []  # the sampled steps, in order
        self._by_step: dict[int, list[dict[str, Any]]] = {}
        self._history: Any = None
        self._seen = self._seen_events = 0
        self._lock = threading.RLock()  # the UI thread (refresh) and the kernel's (slider, clicks) both draw
        self.slider.observe(lambda _: self.render(), "value")
        self.compare.observe(lambda _: self.render(), "value")
        # the loss chart's hover points take clicks too: a click is a step to look at
        self._points = charts.loss_hover
        self._points.interactions = {**dict(self._points.interactions), "click": "select"}
        self._points.observe(self._on_click, "selected")

    # -- data in (UI thread) ------------------------------------------------------------------------------
    def pending(self) -> bool:
        """Nothing is held back: the samples come with the run's progress, which every push drains."""
        return False

    def refresh(self, final: bool = False, whole: bool = False) -> bool:
        """Take the samples and sample failures the History gained; redraw if any. True when something changed."""
        history = getattr(self.source(), "history", None)
        if history is None:
            return False
        with self._lock:
            if history is not self._history:  # a new run: its own History
                self._history, self._seen, self._seen_events = history, 0, 0
                self.steps, self._by_step = [], {}
            samples, events = history.samples, history.events
            n = len(samples)  # once: the training thread may append meanwhile
            new, self._seen = samples[self._seen : n], n
            failed = [e for e in events[self._seen_events :] if e.get("kind") == "sample_error"]
            self._seen_events = len(events)
            for e in failed:
                self.notify("warning", f"sample {e.get('old')!r} failed at step {e.get('step')}: {e.get('new')}")
            if failed:
                self.errors.value = "<br>".join(
                    html.escape(f"step {e.get('step')}: {e.get('old')} failed: {e.get('new')}") for e in failed[-3:]
                )
            if not new:
                return self._rest_on_latest(final) or bool(failed)
            following = not self.steps or self.slider.value >= len(self.steps) - 1
            for s in new:
                if s["step"] not in self._by_step:
                    bisect.insort(self.steps, s["step"])
                    self._by_step[s["step"]] = []
                self._by_step[s["step"]].append(s)
            with self.slider.hold_sync():
                self.slider.max = len(self.steps) - 1
                if following:
                    self.slider.value = len(self.steps) - 1
            if not self.section.visible:
                self.section.show(self.body, detail="")
            if not self._rest_on_latest(final):
                self.render()
            return True

    def _rest_on_latest(self, final: bool) -> bool:
        """A run that has ended shows its latest sample (the slider had stopped following after a click)."""
        last = len(self.steps) - 1
        if not final or last < 0 or self.slider.value == last:
            return False
        self.slider.value = last  # drawn by the slider's observer
        return True

    # -- choosing a step ----------------------------------------------------------------------------------
    def select_step(self, step: float) -> int | None:
        """Show the sample nearest ``step`` (a click on the loss chart); returns the step shown."""
        with self._lock:
            if not self.steps:
                return None
            i = bisect.bisect_left(self.steps, step)
            near = [j for j in (i - 1, i) if 0 <= j < len(self.steps)]
            best = min(near, key=lambda j: abs(self.steps[j] - step))
            self.slider.value = best
            return self.steps[best]

    def _on_click(self, change: Any) -> None:
        selected = change.get("new")
        if selected is None or len(selected) == 0:
            return
        x = self._points.x
        index = int(selected[-1])
        if 0 <= index < len(x):
            self.select_step(float(x[index]))
        self._points.selected = None  # clicking the same point again is a change again

    # -- drawing --------------------------------------------------------------------------------------------
    def render(self) -> None:
        with self._lock:
            if not self.steps:
                return
            i = min(max(int(self.slider.value), 0), len(self.steps) - 1)
            step = self.steps[i]
            mode = self.compare.value
            other = None
            if mode == "baseline" and i > 0:
                other = self.steps[0]
            elif mode == "previous" and i > 0:
                other = self.steps[i - 1]
            entries = self._by_step[step]
            epoch = entries[0].get("epoch")
            where = "baseline" if step == self.steps[0] and epoch == 0 else f"epoch {epoch}"
            self.step_label.value = (
                f"<span style='font-size:12px'>step <b>{step:,}</b> · {where} · sample {i + 1} of "
                f"{len(self.steps)}</span>"
            )
            left, right = self._panes(self._by_step.get(other, []) if other is not None else None, entries)
            head = f"<div class='nbt-samples-head'>step {other:,}</div>" if other is not None else ""
            self.left.value = f"<div class='nbt-samples-pane'>{head}{left}</div>" if other is not None else ""
            self.right.value = (
                f"<div class='nbt-samples-pane'><div class='nbt-samples-head'>step {step:,}</div>{right}</div>"
            )

    def _panes(self, before: list[dict[str, Any]] | None, after: list[dict[str, Any]]) -> tuple[str, str]:
        old = {s["name"]: s for s in before or []}
        left, right = [], []
        for s in after:
            name = s["name"]
            label = f"<div class='nbt-samples-name'>{html.escape(name)}</div>"
            prior = old.get(name)
            if s["kind"] == "text":
                text = str(s["value"])
                if prior is not None and prior["kind"] == "text":
                    a, b = word_diff(str(prior["value"]), text)
                    left.append(f"{label}<pre>{a}</pre>")
                    right.append(f"{label}<pre>{b}</pre>")
                else:
                    right.append(f"{label}<pre>{html.escape(text)}</pre>")
            else:
                right.append(label + _picture(s["value"], name))
                if prior is not None and prior["kind"] == "image":
                    left.append(label + _picture(prior["value"], name))
        return "".join(left), "".join(right)
