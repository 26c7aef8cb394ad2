"""The panel's health card (``nbt-health``): a light per signal of ``nbtrainer.Health``, the block norms over the
steps, and on a problem its advice with the buttons that act on it.

It reads only public names: the ``Health`` callback's ``signals`` and ``last_problem``, ``trainer.history.health``
(the norms), and acts through ``Health.apply_advice`` (the advised action: restore the healthy weights, clip, set
the LR, as the report says), ``trainer.rollback`` and the panel's own pause / resume (the small :class:`HealthHost`
protocol), so the panel's Pause button and badge stay true. It runs on the UI thread (the
pump calls :meth:`HealthCard.draw`) and on the kernel's (the clicks); the training thread only appends reports to
the panel's feed.

Colours are literal hex values in widget traits (ipywidgets 7's Color trait refuses CSS variables; CSS variables
only inside HTML), and the chart uses bqplot API that 0.12 and 0.13 share (checked under ipywidgets 7.7.1 + bqplot
0.12.45 and ipywidgets 8 + bqplot 0.13).
"""

from __future__ import annotations

import html
import logging
import math
from typing import Any, Protocol

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import Health, ModelCheckpoint
from nbtrainer.plotting import PALETTE, log_ticks

from ._chart_parts import legend_html, lin_scale, log_scale, step_ticks
from ._layouts import plain_html, shared_layout
from ._markup import plain_text, text_html
from ._theme import FG, FG2

__all__ = ["HealthCard", "HealthHost", "health_of"]

log = logging.getLogger(__name__)

LIGHTS = {"ok": "#1a7f37", "warning": "#9a6700", "problem": "#cf222e"}
MAX_BLOCKS = 6  # block lines drawn besides the total: the largest by their latest norm


class HealthHost(Protocol):
    """What the card needs from the panel (``TrainerWidget`` implements it)."""

    @property
    def trainer(self) -> Any: ...  # the panel's Trainer (rebuilt at Start when memory savers were chosen)
    @property
    def running(self) -> bool: ...
    @property
    def pause_requested(self) -> bool: ...

    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def notify(self, level: str, text: str, details: str | None = None) -> None: ...


def health_of(trainer: Any) -> Health:
    """The trainer's ``Health`` callback; one at its defaults is added when it has none."""
    for cb in trainer.callbacks.callbacks:
        if isinstance(cb, Health):
            return cb
    health = Health()
    trainer.add_callback(health)
    return health


def _button(description: str, css: str) -> W.Button:
    # no style: ButtonStyle's text_color is ipywidgets 8 only (7 warns, then ignores it)
    button = W.Button(description=description, layout=W.Layout(width="auto", display="none"))
    button.add_class(css)
    return button


class HealthCard:
    """``root`` (class ``nbt-health``): ``nbt-health-lights``, the chart ``nbt-health-chart`` (block gradient norms,
    log scale), ``nbt-health-advice`` and the buttons ``nbt-health-apply`` (also ``nbt-health-apply-lr``: the
    report's advised action, its words on the button: "restore the weights before step 1, apply LR 0.1 and
    resume"), ``nbt-health-rollback``, ``nbt-health-skip`` (shown for the problem they fit)."""

    def __init__(self, host: HealthHost, *, view: Any) -> None:
        self.host = host
        self.health = health_of(host.trainer)
        self.problem: Any = None  # the report the buttons act on
        self.lights = plain_html()
        self.lights.add_class("nbt-health-lights")
        self.x, self.y = lin_scale(min=0.0, max=1.0), log_scale(min=1e-3, max=1.0)
        e = np.empty(0)
        self.lines = bq.Lines(x=e, y=e, scales={"x": self.x, "y": self.y}, colors=[PALETTE[0]], stroke_width=1.5)
        # its own small figure: axes without a label colour (a trait that takes no CSS variable under ipywidgets 7)
        axes = [
            bq.Axis(scale=self.x, label="optimizer step", tick_format=",~g", tick_values=step_ticks(np.empty(0))),
            # explicit ticks (powers of ten, or 1-2-5): bqplot labels every 2..9 of each decade on a log scale
            bq.Axis(
                scale=self.y,
                side="left",
                label="gradient norm",
                tick_format=".1~e",
                label_offset="48px",
                tick_values=np.asarray(log_ticks(1e-3, 1.0)),
            ),
        ]
        self.fig = bq.Figure(
            marks=[self.lines],
            axes=axes,
            title="gradient norm per block (log)",
            title_style={"font-size": "12px", "font-weight": "600", "fill": FG},
            fig_margin={"top": 26, "bottom": 40, "left": 64, "right": 14},
            animation_duration=0,
            layout=W.Layout(width="100%", max_width="560px", height="200px"),
        )
        self.fig.add_class("nbt-health-chart")
        self.legend = plain_html()
        self.legend.add_class("nbt-legend")
        self.advice = plain_html()
        self.advice.add_class("nbt-health-advice")
        self.apply_lr = _button("apply LR", "nbt-health-apply-lr")
        self.apply_lr.add_class("nbt-health-apply")
        self.rollback = _button("roll back to last checkpoint and resume", "nbt-health-rollback")
        self.skip = _button("skip this batch and resume", "nbt-health-skip")
        self.apply_lr.on_click(lambda _: self._guard(self.click_apply_lr))
        self.rollback.on_click(lambda _: self._guard(self.click_rollback))
        self.skip.on_click(lambda _: self._guard(self.click_skip))
        self.buttons = W.HBox([self.apply_lr, self.rollback, self.skip], layout=shared_layout(flex_flow="row wrap"))
        # the chart joins the tree once there are two samples (a chart of one point says nothing, and a figure
        # rendered hidden measures 0 x 0: bqplot logs negative sizes)
        self.chart = W.VBox(layout=shared_layout())
        self.held: tuple[W.Widget, ...] = (self.legend, self.fig)  # in ``chart`` from the second sample on
        self.root = W.VBox([self.lights, self.advice, self.buttons, self.chart], layout=W.Layout(margin="2px 0 4px 0"))
        self.root.add_class("nbt-health")
        self._drawn = -1  # samples of the total norm on the chart
        self._drawn_state: Any = None  # what the lights and buttons show (draw skips when it has not changed)
        self.draw()
        at = list(view.root.children).index(view.stats) + 1  # under the stat cards, over the charts
        view.root.children = (*view.root.children[:at], self.root, *view.root.children[at:])

    @property
    def trainer(self) -> Any:
        return self.host.trainer

    def watch(self, trainer: Any) -> None:
        """The panel rebuilt its Trainer (memory savers, at Start): watch that one (Health added if missing)."""
        self.health = health_of(trainer)
        self.clear()

    def clear(self) -> None:
        """A new run: no problem shown, the chart empty (the lights come from the new fit)."""
        self.problem = None
        self._drawn = -1
        self._drawn_state = None
        self.chart.children = ()
        self._show_problem()

    # -- what the pump calls (the UI thread) -----------------------------------------------------------------
    def add(self, report: Any) -> None:
        """A report arrived (in stream order); a problem becomes the one the buttons act on."""
        if report.level == "problem":
            self.problem = report
            if self.health.on_problem == "pause" and self.host.running and not self.host.pause_requested:
                # Health asked for the pause: it becomes the panel's own (its button says Resume, the badge
                # "pausing" then "paused"). Once per report, never from the status: right after a resume the
                # status still reads "paused", and that would pause the run again.
                self.host.pause()
        self._show_problem()

    def draw(self) -> None:
        """The lights, and the chart when new norm samples arrived; nothing is rebuilt or sent when the lights, the
        problem and the run's state are as at the last push (the UI thread's time is the training thread's)."""
        lights = tuple((s.level, s.summary) for s in self.health.signals.values())
        state = (lights, self.problem, self.host.running, self.trainer.status)
        if state != self._drawn_state:
            self._drawn_state = state
            with self.lights.hold_sync():
                self.lights.value = self._lights_html()
            self._buttons()
        norms = self.trainer.history.health.get("grad_norm", {})
        total = norms.get("total", [])
        if len(total) != self._drawn:
            self._drawn = len(total)
            self._chart(norms)

    def _lights_html(self) -> str:
        cells = []
        for name, state in self.health.signals.items():
            color, tip = LIGHTS.get(state.level, LIGHTS["ok"]), html.escape(plain_text(state.summary))
            cells.append(
                f"<div class='nbt-health-light nbt-health-{state.level}' title='{tip}' "
                f"style='display:flex;align-items:center;gap:6px;min-width:0;font-size:12px;color:{FG}'>"
                f"<span style='flex:none;width:10px;height:10px;border-radius:50%;background:{color}'></span>"
                f"<b style='flex:none'>{html.escape(name)}</b>"
                f"<span style='color:{FG2};white-space:nowrap;overflow:hidden;text-overflow:ellipsis'>"
                f"{text_html(state.summary)}</span></div>"
            )
        return (
            "<div style='display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:2px 12px'>"
            + "".join(cells)
            + "</div>"
        )

    def _chart(self, norms: dict[str, list[tuple[int, float]]]) -> None:
        total = norms.get("total", [])
        if len(total) < 2:
            self.chart.children = ()
            return
        steps = [s for s, _ in total]
        blocks = [n for n in norms if n != "total" and len(norms[n]) == len(total)]
        blocks.sort(key=lambda n: -_finite(norms[n][-1][1]))
        names = ["total", *blocks[:MAX_BLOCKS]]
        values = np.array([[_positive(v) for _, v in norms[n]] for n in names], dtype=float)
        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (1e-3, 1.0)
        if hi / lo < 10:
            mid = math.sqrt(lo * hi)
            lo, hi = mid / math.sqrt(10), mid * math.sqrt(10)
        colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
        with self.lines.hold_sync(), self.x.hold_sync(), self.y.hold_sync():
            self.x.min, self.x.max = float(steps[0]), float(max(steps[-1], steps[0] + 1))
            self.fig.axes[0].tick_values = step_ticks(np.asarray(steps, dtype=float), lo=float(steps[0]))
            self.y.min, self.y.max = lo, hi
            self.lines.x = np.asarray(steps, dtype=float)
            self.lines.y = values
            self.lines.colors = colors
            self.lines.labels = names
            self.lines.stroke_width = 1.5
        # after the scale's range has gone (ticks sent before it are drawn on the old range)
        self.fig.axes[1].tick_values = np.asarray(log_ticks(lo, hi))
        self.legend.value = legend_html([(name, color, False) for name, color in zip(names, colors, strict=True)])
        if not self.chart.children:
            self.chart.children = (self.legend, self.fig)

    # -- the problem and its buttons --------------------------------------------------------------------------
    def _show_problem(self) -> None:
        report = self.problem
        if report is None:
            self.advice.value = ""
        else:
            self.advice.value = (
                f"<div style='font-size:12px;color:{FG};border-left:3px solid {LIGHTS['problem']};padding:2px 8px'>"
                f"<b>{text_html(report.message)}</b><br>{text_html(report.advice)}</div>"
            )
        self._buttons()

    def _buttons(self) -> None:
        report, alive = self.problem, self.host.running
        paused = self.trainer.status == "paused"
        steps = report.action_steps if report is not None else []
        show = alive and bool(steps)
        if show:
            words = [*steps, "resume"] if paused else steps
            self.apply_lr.description = ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1]
        self.apply_lr.layout.display = "flex" if show else "none"
        self.rollback.layout.display = "flex" if alive and report is not None and self._last_checkpoint() else "none"
        skipped = report is not None and report.kind == "nonfinite" and report.data.get("skipped")
        self.skip.layout.display = "flex" if alive and paused and skipped else "none"

    def _last_checkpoint(self) -> str | None:
        checkpoint = ModelCheckpoint.find(self.trainer.callbacks.callbacks)
        return checkpoint.last_model_path if checkpoint is not None and checkpoint.save_last else None

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:  # a click must never take the kernel down: said in the panel
            log.debug(
                "a health card action failed: said in the panel (a click never takes the kernel down)", exc_info=True
            )
            self.host.notify("error", f"{type(exc).__name__}: {exc}")

    def click_apply_lr(self) -> None:
        """Apply the problem's advised action (``Health.apply_advice``: a restore takes effect at the next step
        boundary, before the step) and resume a paused run."""
        report = self.problem
        if report is None or not report.action:
            return
        done = self.health.apply_advice(self.trainer, report)
        self.host.notify("info", f"health: {done}")
        self.problem = None
        self._show_problem()
        self._resume()

    def click_rollback(self) -> None:
        """Pause at the next step boundary (if not paused), roll back to last.ckpt there, and resume."""
        if self.trainer.status != "paused":
            self.host.pause()
        path = self.trainer.rollback("last")
        self.host.notify("info", f"health: rolled back to {path} (step {self.trainer.global_step})")
        self.problem = None
        self._show_problem()
        self._resume()

    def click_skip(self) -> None:
        """The bad batch's step was skipped already (its update withheld): resume without it."""
        self.host.notify("info", "health: the batch's update stays skipped; resuming")
        self.problem = None
        self._show_problem()
        self._resume()

    def _resume(self) -> None:
        if self.host.running:
            self.host.resume()
        self._buttons()


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _positive(value: float) -> float:
    """A norm on a log axis: zero and non-finite values leave a gap."""
    return value if math.isfinite(value) and value > 0 else math.nan
