"""``RunsWidget``: the runs of a store as a selectable table with overlaid curves; ``TuneView``: a live search.

``RunsWidget(runs)`` lists the runs (newest last), overlays the chosen ones for any metric (per step or per
epoch) and re-reads the store on Refresh. ``RunsWidget.tune(build, ...)`` runs ``nbtrainer.tune`` in a
background thread behind a :class:`TuneView`: every trial's curve as it trains (pruned trials muted, the best
so far highlighted), a table of trials, and a Stop that ends the search after the current trial.

Stable CSS classes: ``nbt-runs`` (root), ``nbt-runs-select``, ``nbt-runs-metric``, ``nbt-runs-x``,
``nbt-runs-refresh``, ``nbt-runs-table``, ``nbt-runs-chart``; ``nbt-tune`` (root), ``nbt-tune-status``,
``nbt-tune-stop``, ``nbt-tune-chart``, ``nbt-tune-table``.
"""

from __future__ import annotations

import html
import logging
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import Runs, format_number, start_training_thread, tune
from nbtrainer.plotting import PALETTE

from ._fallback import html_view
from ._style import theme_style

if TYPE_CHECKING:
    from nbtrainer import Trainer

__all__ = ["RunsWidget", "TuneView"]

log = logging.getLogger(__name__)

MUTED = "#8b949e"
_MARGIN = {"top": 30, "bottom": 40, "left": 60, "right": 10}
_STEP_SERIES = ("loss", "lr")


def _figure(title: str, css: str) -> tuple[bq.Figure, bq.LinearScale, bq.LinearScale]:
    sx, sy = bq.LinearScale(), bq.LinearScale()
    fig = bq.Figure(
        marks=[],
        title=title,
        axes=[bq.Axis(scale=sx, label="step"), bq.Axis(scale=sy, side="left")],
        fig_margin=dict(_MARGIN),
        animation_duration=0,
        layout=W.Layout(width="100%", height="300px"),
    )
    fig.add_class(css)
    return fig, sx, sy


def _line(
    x: list[float], y: list[float], sx: Any, sy: Any, color: str, *, width: float, opacity: float, name: str
) -> Any:
    return bq.Lines(
        x=np.asarray(x, dtype=float),
        y=np.asarray(y, dtype=float),
        scales={"x": sx, "y": sy},
        colors=[color],
        stroke_width=width,
        opacities=[opacity],
        labels=[name],
        display_legend=True,
    )


class RunsWidget:
    """The runs of a store: a table with selection and an overlay chart for any metric.

    Args:
        runs: an ``nbtrainer.Runs`` (default: ``Runs()``, this session's runs), or a store path.

    Example:
        >>> from nbtrainer import Runs, RunsWidget
        >>> RunsWidget(Runs("runs.db"))  # doctest: +SKIP
    """

    def __init__(self, runs: Runs | str | None = None) -> None:
        self.runs = runs if isinstance(runs, Runs) else Runs(runs)
        self.select = W.SelectMultiple(description="runs", layout=W.Layout(width="360px", height="140px"))
        self.select.add_class("nbt-runs-select")
        self.metric = W.Dropdown(description="metric", layout=W.Layout(width="240px"))
        self.metric.add_class("nbt-runs-metric")
        self.x = W.ToggleButtons(options=["auto", "step", "epoch"], value="auto", layout=W.Layout(width="auto"))
        self.x.add_class("nbt-runs-x")
        self.refresh_button = W.Button(description="Refresh", icon="refresh", layout=W.Layout(width="110px"))
        self.refresh_button.add_class("nbt-runs-refresh")
        self.table = W.HTML(layout=W.Layout(max_height="260px", overflow="auto"))
        self.table.add_class("nbt-runs-table")
        self.figure, self._sx, self._sy = _figure("", "nbt-runs-chart")
        self.message = W.HTML()
        controls = W.VBox([self.metric, self.x, self.refresh_button])
        self.root = W.VBox([W.HBox([self.select, controls]), self.message, self.figure, self.table, theme_style()])
        self.root.add_class("nbt-runs")
        self._quiet = False
        self.refresh()
        for control in (self.select, self.metric, self.x):
            control.observe(lambda _: self.draw(), names="value")
        self.refresh_button.on_click(lambda _: self.refresh())

    def refresh(self) -> None:
        """Re-read the store (new runs, statuses, best values) and redraw."""
        self._table = table = self.runs.table()
        options = [(f"{r['name']} · {r['status']} · {r['id']}", r["id"]) for r in table.rows]
        keep = [v for v in self.select.value if v in {r["id"] for r in table.rows}]
        metrics = list(
            dict.fromkeys(["val_loss", "loss", "lr"] + [c[5:] for c in table.columns if c.startswith("best_")])
        )
        self._quiet = True  # one draw at the end, not one per trait change
        try:
            self.select.value = ()
            self.select.options = options
            self.select.value = tuple(keep or [v for _, v in options[-5:]])
            current = self.metric.value
            self.metric.options = metrics
            self.metric.value = current if current in metrics else metrics[0]
        finally:
            self._quiet = False
        self.draw()

    @property
    def selected(self) -> list[str]:
        return list(self.select.value)

    def draw(self) -> None:
        """The table (selected rows marked) and the overlay of the selected runs for the chosen metric."""
        if self._quiet:
            return
        table = self._table
        self.table.value = table.to_html(selected=self.selected) if len(table) else "no runs yet"
        metric, ids = self.metric.value, self.selected
        x = None if self.x.value == "auto" else self.x.value
        marks, note = [], ""
        if ids and metric:
            try:
                curves = self.runs.curves(metric, ids, x=x)
            except ValueError as exc:
                curves, note = [], str(exc)
            for i, c in enumerate(curves):
                if c["y"]:
                    color = PALETTE[i % len(PALETTE)]
                    marks.append(
                        _line(c["x"], c["y"], self._sx, self._sy, color, width=2, opacity=1.0, name=c["run"].name)
                    )
        self.message.value = f"<span style='font-size:12px'>{html.escape(note)}</span>" if note else ""
        self.figure.marks = marks
        self.figure.title = f"{metric} ({len(marks)} runs)"
        self.figure.axes[0].label = x or ("step" if metric in _STEP_SERIES else "epoch")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # with text/plain and text/html where widgets cannot render
        return html_view(self.root, "runs", self.message, self.table)._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"RunsWidget({self.runs!r})"

    @classmethod
    def tune(
        cls, build: Callable[[Any], Any], *, show: bool | Callable[[Any], Any] = True, **tune_kwargs: Any
    ) -> TuneView:
        """Run ``nbtrainer.tune(build, **tune_kwargs)`` in a background thread behind a live :class:`TuneView`.

        The cell returns at once; ``view.wait()`` blocks until the search ends and returns the study
        (also ``view.study``). Stop ends the search after the trial that is training.
        """
        view = TuneView(
            monitor=tune_kwargs.get("monitor", "val_loss"), direction=tune_kwargs.get("direction", "minimize")
        )
        if show is True:
            from IPython.display import display

            display(view)
        elif callable(show):
            show(view)
        view.start(build, **tune_kwargs)
        return view


class _TrialFeed:
    """A trainer callback of the search's trials: each epoch's monitored value to the view."""

    def __init__(self, view: TuneView) -> None:
        self.view = view

    def on_fit_start(self, trainer: Trainer) -> None:
        self.view._trial_started(trainer)

    def on_epoch_end(self, trainer: Trainer, epoch: int, logs: dict[str, Any]) -> None:
        value = logs.get(self.view.monitor)
        if isinstance(value, (int, float)) and math.isfinite(value):
            self.view._point(epoch, float(value))


class TuneView:
    """A live hyperparameter search: every trial's curve, the trials table, and Stop (after the current trial)."""

    def __init__(self, *, monitor: str = "val_loss", direction: str = "minimize") -> None:
        self.monitor, self.direction = monitor, direction
        self.trials: list[dict[str, Any]] = []  # number, state, value, params, x, y
        self.study: Any = None
        self.error: BaseException | None = None
        self.stop_requested = False
        self.done = False
        self._thread: threading.Thread | None = None
        self._trainer: Trainer | None = None  # the trial training now
        self._lock = threading.Lock()
        self.status = W.HTML()
        self.status.add_class("nbt-tune-status")
        self.stop_button = W.Button(description="Stop", icon="stop", tooltip="End the search after this trial")
        self.stop_button.add_class("nbt-tune-stop")
        self.stop_button.on_click(lambda _: self.stop())
        self.figure, self._sx, self._sy = _figure(monitor, "nbt-tune-chart")
        self.figure.axes[0].label = "epoch"
        self.table = W.HTML()
        self.table.add_class("nbt-tune-table")
        self.root = W.VBox([W.HBox([self.status, self.stop_button]), self.figure, self.table, theme_style()])
        self.root.add_class("nbt-tune")
        self._render()

    def stop(self) -> None:
        """End the search once the trial now training is done."""
        self.stop_requested = True
        self.stop_button.disabled = True
        self._render()

    def start(self, build: Callable[[Any], Any], **tune_kwargs: Any) -> None:
        callbacks = [*tune_kwargs.pop("callbacks", ()), _TrialFeed(self)]
        study_callbacks = [*tune_kwargs.pop("study_callbacks", ()), self._trial_done]

        def run() -> None:
            try:
                self.study = tune(build, callbacks=callbacks, study_callbacks=study_callbacks, **tune_kwargs)
            except BaseException as exc:  # shown in the view; wait() re-raises it
                log.debug("the search failed: shown in the view, and re-raised by wait()", exc_info=True)
                self.error = exc
            finally:
                self.done = True
                self.stop_button.disabled = True
                self._render()

        # trials at the main thread's speed; an interpreter that exits mid-search ends the trial at its next step
        self._thread = start_training_thread(run, name="nbtrainer-tune", stop=self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        """No trial after this one, and this one stops at its next step (nothing drawn: the front end is going)."""
        self.stop_requested = True
        with self._lock:
            trainer = self._trainer
        if trainer is not None:
            trainer.request_stop("the interpreter is exiting")

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the search ends; returns the study (re-raises what ended the search, if it failed)."""
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.study

    # -- fed by the search's thread ----------------------------------------------------------------
    def _trial_started(self, trainer: Trainer) -> None:
        with self._lock:
            self._trainer = trainer
            self.trials.append(
                {"number": len(self.trials), "state": "running", "value": None, "params": {}, "x": [], "y": []}
            )
        self._render()

    def _point(self, epoch: int, value: float) -> None:
        with self._lock:
            if self.trials:
                self.trials[-1]["x"].append(float(epoch))
                self.trials[-1]["y"].append(value)
        self._render()

    def _trial_done(self, study: Any, trial: Any) -> None:
        with self._lock:
            row = next((t for t in self.trials if t["number"] == trial.number), None)
            if row is None:  # a trial that failed before its fit started
                row = {"number": trial.number, "x": [], "y": []}
                self.trials.append(row)
            row.update(state=trial.state.name.lower(), value=trial.value, params=dict(trial.params))
        if self.stop_requested:
            study.stop()
        self._render()

    # -- drawing -------------------------------------------------------------------------------
    def best(self) -> dict[str, Any] | None:
        done = [t for t in self.trials if t["state"] == "complete" and isinstance(t.get("value"), (int, float))]
        if not done:
            return None
        return (min if self.direction == "minimize" else max)(done, key=lambda t: t["value"])

    def _render(self) -> None:
        with self._lock:
            trials = [dict(t) for t in self.trials]
        best = self.best()
        marks = []
        for t in trials:
            if not t["y"]:
                continue
            if best is not None and t["number"] == best["number"]:
                color, width, opacity = PALETTE[1], 3.0, 1.0  # the best so far: on top of the eye
            elif t["state"] == "pruned":
                color, width, opacity = MUTED, 1.0, 0.45
            elif t["state"] == "running":
                color, width, opacity = PALETTE[0], 2.0, 1.0
            else:
                color, width, opacity = PALETTE[2], 1.5, 0.8
            name = f"trial {t['number']}"
            marks.append(_line(t["x"], t["y"], self._sx, self._sy, color, width=width, opacity=opacity, name=name))
        self.figure.marks = marks
        running = self._thread is not None and not self.done
        state = "searching" if running else ("failed" if self.error else "done")
        if self.stop_requested and running:
            state = "stopping after this trial"
        pruned = sum(t["state"] == "pruned" for t in trials)
        best_text = f", best {self.monitor} {format_number(best['value'])} (trial {best['number']})" if best else ""
        error = f": {html.escape(str(self.error))}" if self.error else ""
        self.status.value = (
            f"<span style='font-size:12px'>{state}{error}: {len(trials)} trials, {pruned} pruned{best_text}</span>"
        )
        head = "<tr><th>trial</th><th>state</th><th>value</th><th>params</th></tr>"
        rows = []
        for t in trials:
            bold = " style='font-weight:bold'" if best is not None and t["number"] == best["number"] else ""
            params = ", ".join(
                f"{k}={format_number(v) if isinstance(v, float) else v}" for k, v in t.get("params", {}).items()
            )
            rows.append(
                f"<tr{bold}><td>{t['number']}</td><td>{html.escape(str(t['state']))}</td>"
                f"<td>{format_number(t.get('value'))}</td><td>{html.escape(params)}</td></tr>"
            )
        body = "".join(rows)
        self.table.value = f"<table style='font-size:12px;border-collapse:collapse'>{head}{body}</table>"

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # with text/plain and text/html where widgets cannot render
        return html_view(self.root, "hyperparameter search", self.status, self.table)._repr_mimebundle_(**kwargs)
