"""The panel's "compare" menu: earlier runs drawn as muted lines under the live loss and metric charts.

The menu lists the runs of this session's store and of the trainer's store (``run_store=``), newest first,
without the run that is training; it is re-read when a run starts and when it ends. Each chosen run adds
one faint line to the loss chart (its per-step loss) and one to the metric chart (the metric shown there,
its validation value when it has one), on the live chart's scales; the live series are never touched.

Alignment: ``step`` puts the earlier run's losses at its own optimizer steps; ``epoch`` stretches them so
its epoch k ends where the live run's epoch k ends (by each run's steps per epoch), so runs with different
batch sizes line up. The metric chart is per epoch either way: x is the epoch number.

Two threads draw: the kernel's (a click in the menu) and the panel's UI thread (each push follows the loss axis and
the live epoch length; a run's end re-reads the stores). A lock makes each drawing read the menu and place its lines
whole (a deselection racing a push's redraw once left the run drawn, unchosen). Each run's lines are made once, on
the thread that built the menu (a widget made by the UI thread mid-run races the kernel's ``comm_info``), and kept
for that run: a redraw moves their data, scales and colours.

Stable CSS classes: ``nbt-compare`` (root), ``nbt-compare-runs`` (the menu), ``nbt-compare-align``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import Runs
from nbtrainer.plotting import PALETTE, classify_metrics, decimate

from ._layouts import shared_layout

if TYPE_CHECKING:
    from nbtrainer import Trainer

__all__ = ["CompareRuns"]

log = logging.getLogger(__name__)

_OPACITY = 0.35  # muted: the live run stays the line the eye follows
_COLORS = [PALETTE[(i + 5) % len(PALETTE)] for i in range(len(PALETTE))]  # mid-tones read on light and dark


def _steps_per_epoch(rows: list[dict[str, Any]]) -> float | None:
    """Optimizer steps per epoch from epoch logs (``steps`` is the global step at each epoch's end)."""
    for r in rows:
        steps, epoch = r.get("steps"), r.get("epoch")
        if isinstance(steps, (int, float)) and isinstance(epoch, (int, float)) and steps > 0 and epoch > 0:
            return float(steps) / float(epoch)
    return None


class CompareRuns:
    """Earlier runs overlaid on a ``LiveCharts``: the menu (``root``) and the muted lines it draws."""

    def __init__(self, charts: Any, trainer: Trainer, *, run_store: Any = None, max_points: int = 2000) -> None:
        self.charts, self.trainer, self.max_points = charts, trainer, max_points
        self._run_store = run_store
        self.sources: list[Runs] = []
        self.running = False  # while True, the trainer's current run_id is the live run: not listed
        self.select = W.SelectMultiple(
            options=[],
            description="compare",
            rows=3,
            layout=W.Layout(width="420px"),
            style={"description_width": "60px"},
        )
        self.select.add_class("nbt-compare-runs")
        self.align = W.ToggleButtons(
            options=["step", "epoch"], value="step", tooltips=["align by optimizer step", "align by epoch"]
        )
        # sized to their words: a fixed 56 px cut "epoch" to "ep..." in JupyterLab's 13 px font (10 px padding)
        self.align.style.button_width = "auto"
        self.align.add_class("nbt-compare-align")
        self.root = W.HBox([self.select, self.align], layout=shared_layout(align_items="center", flex_flow="row wrap"))
        self.root.add_class("nbt-compare")
        self.loss_lines: dict[str, bq.Lines] = {}
        self.metric_lines: dict[str, bq.Lines] = {}
        self._made: dict[str, tuple[bq.Lines, bq.Lines]] = {}  # key -> its loss and metric lines, made once
        self._owner = threading.get_ident()  # the kernel's thread: the only one that makes widgets
        self._lock = threading.RLock()
        self._runs: dict[str, tuple[Runs, str]] = {}  # key -> (store, run id)
        self._drawn: tuple[Any, ...] = ()
        self._quiet = False
        self._read: dict[str, tuple[str, Any]] = {}
        self.select.observe(lambda _: self.draw(), "value")
        self.align.observe(lambda _: self.draw(), "value")
        try:
            self.refresh()
        except Exception as exc:  # a store that cannot be read must not stop the panel from showing
            log.debug("the run store could not be read: the menu says so", exc_info=True)
            self.select.options = [(f"(run store unreadable: {type(exc).__name__}: {exc})", "")]

    # -- the menu ----------------------------------------------------------------------------------
    def _stores(self) -> list[Runs]:
        if not self.sources:
            stores = [Runs()]
            path = self._run_store
            if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__"):
                try:
                    stores.append(Runs(path))
                except FileNotFoundError:  # nothing recorded there yet: listed once a fit has written it
                    return stores
            self.sources = stores
        return self.sources

    def follow(self, trainer: Any, running: bool, notify: Callable[[str, str], None]) -> None:
        """A run starts or ends (on ``trainer``: the savers may have rebuilt it): list the runs before it, never the
        live one. A store that cannot be read is said with ``notify`` and must not block training."""
        self.trainer, self.running = trainer, running
        try:
            self.refresh()
        except Exception as exc:
            log.debug("the run store could not be read: said in the panel", exc_info=True)
            notify("warning", f"compare: could not read the run store: {type(exc).__name__}: {exc}")

    def refresh(self) -> None:
        """Re-read the stores (a run started or ended); the chosen runs that still exist stay chosen."""
        current = self.trainer.run_id if self.running else None
        options: list[tuple[str, str]] = []
        runs: dict[str, tuple[Runs, str]] = {}
        for i, store in enumerate(self._stores()):
            for row in reversed(store.table().rows):
                rid = row["id"]
                if rid == current or any(r == rid for _, r in runs.values()):
                    continue
                key = f"{i}:{rid}"
                runs[key] = (store, rid)
                where = "session" if store.path is None else str(store.path)
                options.append((f"{row['name']} · {row['status']} · {where}", key))
        keep = tuple(k for k in self.select.value if k in runs)
        self._runs = runs
        self._read.clear()
        self._drawn = ()  # the chosen runs may have grown (a run another process is training)
        self._quiet = True  # one draw at the end, not one per trait change
        try:
            self.select.value = ()
            self.select.options = options
            self.select.value = keep
        finally:
            self._quiet = False
        self.draw()

    # -- the lines ---------------------------------------------------------------------------------
    def _live_metric(self, rows: list[dict[str, Any]]) -> tuple[str, bq.Figure] | None:
        """The metric a live metric chart shows and that chart: the first bounded one, or the other chart's."""
        bounded, other = classify_metrics(rows)
        if bounded:
            return bounded[0], self.charts.metrics.fig
        if other and self.charts.other_shown and self.charts.other_choice.value:
            return str(self.charts.other_choice.value), self.charts.other.fig
        return None

    def draw(self) -> None:
        """Redraw the overlay lines for the chosen runs; safe to call after every render (cheap when unchanged)."""
        with self._lock:
            if not self._quiet:
                self._draw()

    def _draw(self) -> None:
        ch = self.charts
        live_spe = _steps_per_epoch(ch.rows)
        loss_scale = ch.loss_fig.axes[1].scale
        shown = self._live_metric(ch.rows)
        state = (self.select.value, self.align.value, live_spe, id(loss_scale), shown)
        if state == self._drawn:
            return
        self._drawn = state
        loss_lines: dict[str, bq.Lines] = {}
        metric_lines: dict[str, bq.Lines] = {}
        metric_figs = [ch.metrics.fig, ch.other.fig]
        for n, key in enumerate(k for k in self.select.value if k in self._runs):
            if key not in self._read:  # one store read per chosen run until the next refresh
                store, rid = self._runs[key]
                run = store[rid]
                self._read[key] = (run.name, run.history)
            name, h = self._read[key]
            color = _COLORS[n % len(_COLORS)]
            x = np.asarray(h.steps.get("step", []), dtype=float)
            y = np.asarray(h.steps.get("loss", []), dtype=float)
            if self.align.value == "epoch":
                spe = _steps_per_epoch(h.epochs)
                if spe and live_spe:
                    x = x * (live_spe / spe)
            lines = self._lines(key, ch.loss_x, loss_scale)
            if lines is None:  # not the kernel's thread, and no lines yet: the click's own drawing makes them
                self._drawn = ()
                continue
            loss, metric_line = lines
            lx, ly = decimate(x, y, self.max_points)
            loss_lines[key] = self._move(loss, lx, ly, ch.loss_x, loss_scale, color, f"{name} · loss")
            chosen = shown or self._live_metric(h.epochs)
            if chosen is not None:
                metric, fig = chosen
                k = f"val_{metric}" if any(f"val_{metric}" in r for r in h.epochs) else metric
                pts = [
                    (float(r.get("epoch", i + 1)), float(r[k]))
                    for i, r in enumerate(h.epochs)
                    if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
                ]
                if pts:
                    ex, ey = decimate([p[0] for p in pts], [p[1] for p in pts], self.max_points)
                    sc = fig.axes
                    metric_lines[key] = self._move(
                        metric_line, ex, ey, sc[0].scale, sc[1].scale, color, f"{name} · {k}"
                    )
        self._place(ch.loss_fig, self.loss_lines, loss_lines)
        for fig in metric_figs:
            mine = {k: m for k, m in metric_lines.items() if m.scales["x"] is fig.axes[0].scale}
            self._place(fig, self.metric_lines, mine)
        self.loss_lines, self.metric_lines = loss_lines, metric_lines

    @property
    def held(self) -> tuple[bq.Lines, ...]:
        """Every compared run's lines, drawn or not (a run unchosen keeps its lines for the next time)."""
        return tuple(line for pair in self._made.values() for line in pair)

    def _lines(self, key: str, sx: Any, sy: Any) -> tuple[bq.Lines, bq.Lines] | None:
        """The run's loss and metric lines, made together once, on the kernel's thread (None elsewhere before then):
        a later drawing only moves them, whichever chart the metric line goes to."""
        made = self._made.get(key)
        if made is None and threading.get_ident() == self._owner:

            def line() -> bq.Lines:
                empty = np.zeros(0)
                return bq.Lines(x=empty, y=empty, scales={"x": sx, "y": sy}, opacities=[_OPACITY], stroke_width=1.5)

            made = self._made[key] = (line(), line())
        return made

    @staticmethod
    def _move(line: bq.Lines, x: Any, y: Any, sx: Any, sy: Any, color: str, label: str) -> bq.Lines:
        """``line`` with this data, scales, colour and label (unchanged traits send nothing: traitlets compares)."""
        with line.hold_sync():
            line.x, line.y = x, y
            line.scales = {"x": sx, "y": sy}
            line.colors, line.labels = [color], [label]
        return line

    @staticmethod
    def _place(fig: bq.Figure, old: dict[str, bq.Lines], new: dict[str, bq.Lines]) -> None:
        """Below the live marks (drawn first), which keep their order and data."""
        gone = set(map(id, old.values()))
        live = [m for m in fig.marks if id(m) not in gone]
        fig.marks = [*new.values(), *live]
