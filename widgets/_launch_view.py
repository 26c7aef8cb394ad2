"""``LaunchView``: a light panel for ``nbtrainer.launch(fn, nprocs=N, view=True)``.

The ranks train in other processes; rank 0's progress snapshots arrive through the launch's channel
(:class:`nbtrainer.LaunchMonitor`, which this class is) and are drawn here: status, epoch and step bars, the
loss and learning rate, throughput, a loss chart over optimizer steps and the epoch logs. **Stop** asks every
rank to stop after the same optimizer step (clicks are handled while the cell waits, see ``_poll``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import LaunchMonitor, format_duration, format_lr, format_number
from nbtrainer.plotting import PALETTE, decimate

from ._chart_parts import figure, legend_html, lin_scale
from ._fallback import html_view
from ._notebook import in_notebook
from ._poll import wait_until
from ._style import theme_style
from ._theme import FG, FG2, STATUS_COLORS

__all__ = ["LaunchView"]

_MAX_POINTS = 2000


class LaunchView(LaunchMonitor):
    """The panel of a launched multi-process run: rank 0's progress and loss chart, and a Stop for every rank.

    Pass ``view=True`` to :func:`nbtrainer.launch` (it makes one and shows it), or make one to keep a handle.
    CSS classes: ``nbt-launch`` (root), ``nbt-launch-status``, ``nbt-launch-epoch``, ``nbt-launch-step``,
    ``nbt-launch-info``, ``nbt-launch-stop``, ``nbt-launch-chart`` and ``nbt-launch-epochs``.

    Example:
        >>> import nbtrainer
        >>> view = nbtrainer.LaunchView()
        >>> results = nbtrainer.launch(train, nprocs=2, view=view)  # doctest: +SKIP
    """

    def __init__(self, *, title: str = "nbtrainer.launch") -> None:
        super().__init__()
        self.title = title
        self.status = W.HTML(layout=W.Layout(margin="0 0 4px 0"))
        self.status.add_class("nbt-launch-status")
        self.epoch_bar = W.IntProgress(value=0, min=0, max=1, description="epoch", layout=W.Layout(width="100%"))
        self.epoch_bar.add_class("nbt-launch-epoch")
        self.step_bar = W.IntProgress(value=0, min=0, max=1, description="step", layout=W.Layout(width="100%"))
        self.step_bar.add_class("nbt-launch-step")
        self.info = W.HTML()
        self.info.add_class("nbt-launch-info")
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger", disabled=True)
        self.stop_button.add_class("nbt-launch-stop")
        self.stop_button.on_click(lambda _: self.stop())
        self._steps: list[float] = []
        self._losses: list[float] = []
        scales = {"x": lin_scale(), "y": lin_scale()}
        self._line = bq.Lines(x=[], y=[], scales=scales, colors=[PALETTE[0]], stroke_width=1.5)
        self.chart = figure(
            "nbt-launch-chart", [self._line], scales["x"], scales["y"], "optimizer step", "loss", ".3g", title="loss"
        )
        self.legend = W.HTML(legend_html([("loss (rank 0)", PALETTE[0], False)]))
        self.epoch_table = W.HTML()
        self.epoch_table.add_class("nbt-launch-epochs")
        self.panel = W.VBox(
            [
                W.HBox([self.status, self.stop_button], layout=W.Layout(justify_content="space-between")),
                self.epoch_bar,
                self.step_bar,
                self.info,
                self.legend,
                self.chart,
                self.epoch_table,
                theme_style(),
            ]
        )
        self.panel.add_class("nbt-launch")
        self._shown = False
        self._nprocs = 0
        self._set_status("idle", "not launched yet")

    # -- display --------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import display

        self._shown = True
        display(html_view(self.panel, "distributed run", self.status, self.info, self.epoch_table))

    def on_start(self, nprocs: int) -> None:
        self._nprocs = nprocs
        self._steps, self._losses = [], []
        self._line.x, self._line.y = [], []
        self.epoch_table.value = ""
        self.stop_button.disabled = False
        self.stop_button.description = "Stop"
        self._set_status("starting", f"{nprocs} processes")
        if in_notebook() and not self._shown:
            self._ipython_display_()

    def wait(self, done: Callable[[float], bool]) -> None:
        wait_until(done)  # Stop clicks are handled while the launching cell waits

    def stop(self) -> None:
        """What the Stop button does: every rank stops after the same optimizer step."""
        self.request_stop()
        self.stop_button.disabled = True
        self.stop_button.description = "Stopping"
        self._set_status("stopping", "every rank stops after the same optimizer step")

    # -- the hooks ------------------------------------------------------------------------------
    def on_progress(self, snapshot: dict[str, Any]) -> None:
        for step, loss, _lr in snapshot.get("step_points") or ():
            if loss is not None and math.isfinite(loss):
                self._steps.append(float(step))
                self._losses.append(float(loss))
        status = "stopping" if self.stop_requested else snapshot.get("status", "running")
        world = snapshot.get("world_size", self._nprocs)
        self._set_status(status, f"rank 0 of {world}, {snapshot.get('stage', 'train')}")
        epochs = max(int(snapshot.get("epochs") or 0), 1)
        self.epoch_bar.max = epochs
        self.epoch_bar.value = min(int(snapshot.get("epoch") or 0), epochs)
        batches = snapshot.get("batches") or max(int(snapshot.get("batch") or 0), 1)
        self.step_bar.max = max(int(batches), 1)
        self.step_bar.value = min(int(snapshot.get("batch") or 0), self.step_bar.max)
        parts = [f"step {snapshot.get('global_step', 0)}"]
        if snapshot.get("loss") is not None:
            parts.append(f"loss {format_number(snapshot['loss'])}")
        if snapshot.get("lr") is not None:
            parts.append(f"lr {format_lr(snapshot['lr'])}")
        parts.append(f"{format_number(snapshot.get('samples_per_s') or 0.0)} samples/s per rank")
        parts.append(f"elapsed {format_duration(snapshot.get('elapsed') or 0.0)}")
        parts += [f"{html.escape(k)} {format_number(v)}" for k, v in (snapshot.get("metrics") or {}).items()]
        self.info.value = f"<span style='color:{FG}'>{' · '.join(parts)}</span>"
        self._draw()

    def on_epoch(self, logs: dict[str, Any]) -> None:
        keys = [k for k in logs if k not in ("time",)]
        rows = [*self.epochs[-8:]]  # the newest rows: a light view
        head = "".join(f"<th style='padding:0 6px;text-align:left'>{html.escape(k)}</th>" for k in keys)
        body = "".join(
            "<tr>" + "".join(f"<td style='padding:0 6px'>{_cell(r.get(k))}</td>" for k in keys) + "</tr>" for r in rows
        )
        self.epoch_table.value = f"<table style='font-size:12px;color:{FG}'><tr>{head}</tr>{body}</table>"

    def on_end(self, snapshot: dict[str, Any] | None, error: BaseException | None) -> None:
        self.stop_button.disabled = True
        self.stop_button.description = "Stop"
        if error is not None:
            self._set_status("failed", f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
        else:
            status = (snapshot or {}).get("status") or "finished"
            steps = (snapshot or {}).get("global_step")
            self._set_status(status, f"{self._nprocs} processes" + (f", {steps} steps" if steps is not None else ""))
        self._draw()

    # -- drawing --------------------------------------------------------------------------------
    def _draw(self) -> None:
        if not self._steps:
            return
        x, y = np.asarray(self._steps), np.asarray(self._losses)
        if len(x) > _MAX_POINTS:
            x, y = decimate(x, y, _MAX_POINTS)
        with self._line.hold_sync():
            self._line.x, self._line.y = x, y

    def _set_status(self, status: str, detail: str) -> None:
        color = STATUS_COLORS.get(status, STATUS_COLORS["idle"])
        self.status.value = (
            f"<b style='color:{FG}'>{html.escape(self.title)}</b> "
            f"<span style='background:{color};color:white;border-radius:3px;padding:1px 6px'>{html.escape(status)}"
            f"</span> <span style='color:{FG2}'>{html.escape(detail)}</span>"
        )
        self.last_status = status


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    return html.escape(str(value))
