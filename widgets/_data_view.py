"""The panel's data section (``nbt-data``, issue 55): the data checked before Start, a batch as the model receives it,
and the data map of the run with a cleaner.

* **Before Start** a helper thread (``nbtrainer.start_training_thread``) runs ``trainer.check_data(train, val)`` and
  ``nbtrainer.show_batch(train)``: the report's lights and findings (``nbt-data-report``: ``nbt-data-light``,
  ``nbt-data-ok|warning|problem``, each finding ``nbt-data-problem``) and the batch (``nbt-data-batch``). The fit
  reuses the report (``Trainer(check_data=True)`` on the same loaders); labels past the model's outputs refuse the
  run before its first step. Closing the panel, a newer check (a plan row's batch size) or the interpreter's exit
  cancels a check under way at its next batch (``check_data(cancel=)``).
* **During the run** a ``nbtrainer.DataMap`` rides on it; at each epoch's end the UI thread draws the map as a bqplot
  scatter (``nbt-data-map``: confidence against variability, coloured by correctness, at most 3,000 points: a seeded
  sample plus the most suspicious labels). A click on a point (``interactions={"click": "select"}``), or a lasso
  (``nbt-data-map-mode`` set to ``lasso``: bqplot's ``LassoSelector``), shows those items with their labels in the
  cleaner (``_cleaner``): keep, drop or relabel each, written to ``w.data_map.edits``;
  ``w.data_map.cleaned()`` is the next fit's dataset.

  A browser draws each of the scatter's points as an SVG element: a 3,000-point map redrawn at every push of a run
  with short epochs (a tiny MLP's, a dozen a second) kept headless Chromium's main thread busy 95% of the time, 0.93
  of a core of a 2-core machine beside the training, against 0.25 with the map left out (``bench/browser_cost.py``).
  So the map has a budget, like the charts (``_pump``): at most ``_MAP_POINTS_PER_S`` points a second (half in VS
  Code and Colab), a 3,000-point map redrawn at most every 6 s; a run that holds or ends gets its last map at once.
"""

from __future__ import annotations

import concurrent.futures
import html
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from nbtrainer import DataMap, show_batch, start_training_thread

from ._cleaner import Cleaner
from ._frontends import detect
from ._layouts import plain_html, shared_layout
from ._section import Section

__all__ = ["DataView"]

log = logging.getLogger(__name__)

_POINTS = 3000  # drawn at most (a seeded sample, plus the most suspicious labels)
_SUSPECTS = 200
_SHOWN = 12  # items a selection shows in the cleaner
_MAP_POINTS_PER_S = 500  # the map's budget (module docstring)
_COLOURS = ["#cf222e", "#bf8700", "#0969da"]  # correctness 0 -> 1 (the core's static picture uses the same)


def _top(score: np.ndarray, k: int) -> np.ndarray:
    """The positions of the ``k`` highest scores (NaN lowest), highest first, ties in position order: what a stable
    ``argsort(-score)[:k]`` gives, without sorting every item (9 ms of the map's drawing on 96,000 items).

    Example:
        >>> _top(np.array([0.1, 0.9, np.nan, 0.9, 0.5]), 3).tolist()
        [1, 3, 4]
    """
    key = -np.nan_to_num(score, nan=-np.inf)
    if k >= len(key):
        return np.argsort(key, kind="stable")
    bound = np.partition(key, k - 1)[k - 1]  # the k-th smallest key: every position at or under it may be in
    near = np.flatnonzero(key <= bound)
    return near[np.argsort(key[near], kind="stable")[:k]]


class DataView:
    """The data section of one panel (see the module docstring). ``root`` is its :class:`Section`.

    Args:
        notify: the panel's messages (``level, text``).
        classes: class names for the map's captions (optional).

    Attributes:
        data_map: the :class:`nbtrainer.DataMap` the panel's runs record into.
        report: the last data check (``nbtrainer.DataReport``), or None while it runs.
        scatter: the map's bqplot ``Scatter``; ``selection``: the dataset indices shown in the cleaner.
    """

    def __init__(self, notify: Callable[[str, str], None], *, classes: Any = None) -> None:
        self.notify = notify
        self.data_map = DataMap(classes=classes)
        self.report: Any = None
        self.section = Section("data", "nbt-data", closable=False)
        self.root = self.section.root
        self.report_html, self.batch_html, self.map_note = (plain_html() for _ in range(3))
        self.report_html.add_class("nbt-data-report-box")
        self.batch_html.add_class("nbt-data-batch")
        self.map_note.add_class("nbt-data-map-note")
        xs, ys = bq.LinearScale(min=0.0, max=0.5), bq.LinearScale(min=0.0, max=1.0)
        cs = bq.ColorScale(colors=_COLOURS, min=0.0, max=1.0)
        self.scatter = bq.Scatter(
            x=np.zeros(0), y=np.zeros(0), color=np.zeros(0), scales={"x": xs, "y": ys, "color": cs},
            default_size=28, stroke="white", interactions={"click": "select"},
            selected_style={"opacity": 1.0, "stroke": "black", "stroke-width": 2},
            unselected_style={"opacity": 0.35},
        )  # fmt: skip
        axes = [
            bq.Axis(scale=xs, label="variability", tick_format=".2f"),
            bq.Axis(scale=ys, side="left", label="confidence", tick_format=".1f", label_offset="36px"),
        ]
        self.lasso = bq.interacts.LassoSelector(marks=[self.scatter])
        self.figure = bq.Figure(
            marks=[self.scatter], axes=axes, animation_duration=0, title="data map (click a point, or a lasso)",
            fig_margin={"top": 30, "bottom": 40, "left": 50, "right": 10},
            layout=W.Layout(width="380px", height="320px"),
        )  # fmt: skip
        self.figure.add_class("nbt-data-map")
        self.mode = W.ToggleButtons(options=["click", "lasso"], value="click", style={"button_width": "60px"})
        self.mode.add_class("nbt-data-map-mode")
        self.mode.observe(self._on_mode, "value")
        self.cleaner = Cleaner("w.data_map.cleaned()")
        self.cleaner.root.add_class("nbt-data-selection")
        self.selection: list[int] = []
        # empty until the first drawing, and never hidden: a bqplot figure whose view is made inside a hidden box
        # measures 0 x 0 and stays so, and one whose box is shown by the same push that adds it can render before
        # the box's layout arrives (VS Code: its axes at translate(0,NaN)). An empty VBox takes no room.
        self.map_box = W.VBox(layout=shared_layout())
        self._map_parts = (self.map_note, W.HBox([self.figure, self.mode]), self.cleaner.root)
        self.held: tuple[W.Widget, ...] = (*self._map_parts, self.lasso)  # in the tree once there is a map, or a lasso
        self.body = W.VBox([self.report_html, self.batch_html, self.map_box])
        self._points = np.zeros(0, dtype=np.int64)  # the dataset index of each drawn point
        self._drawn_updates = 0  # DataMap.updates when last drawn (a fresh map has nothing to draw)
        self._next_draw = 0.0  # when the budget lets the map be drawn again (time.monotonic)
        self._points_per_s = _MAP_POINTS_PER_S * detect().budget
        self._lock = threading.RLock()
        self._check: threading.Thread | None = None
        self._cancel = threading.Event()  # ends the check under way: the panel closes, the interpreter exits
        self.scatter.observe(self._on_selected, "selected")

    # -- before Start: the data check and the batch preview (a helper thread) ----------------------------
    def start_check(self, trainer: Any, train_loader: Any, val_loader: Any) -> None:
        """Check the data in a helper thread; the lights and the batch show when it is done. A check still under way
        is cancelled first: an older one must not draw over the new one."""
        self.close_check()
        cancel = self._cancel = threading.Event()
        self.report_html.value = "<div class='nbt-data-checking' style='font-size:12px'>checking the data…</div>"
        self.section.show(self.body, detail="checking…")

        def check() -> None:
            try:
                report = trainer.check_data(train_loader, val_loader, cancel=cancel)
            except concurrent.futures.CancelledError:  # closed, exiting, or a newer check: nothing to draw
                return
            except Exception as exc:  # said; Start still works (the fit's own checks run)
                log.debug("the panel's data check failed: said in its data section", exc_info=True)
                self.report_html.value = (
                    f"<div class='nbt-data-report-error' style='font-size:12px'>data check failed: "
                    f"{html.escape(type(exc).__name__)}: {html.escape(str(exc)[:400])}</div>"
                )
                self.section.show(self.body, detail="check failed")
                return
            try:
                batch = show_batch(train_loader, 8, classes=self.data_map.classes)._repr_html_()
            except Exception as exc:
                log.debug("the panel's batch preview failed: said in its data section", exc_info=True)
                batch = f"<div style='font-size:12px'>no batch preview: {html.escape(str(exc))}</div>"
            # the batch goes out before the lights: the lights say the check is done, so whoever reads them (a
            # person, a browser test) finds the whole section drawn, not the lights with the batch still to come
            self.batch_html.value = batch
            self.report = report
            self.report_html.value = report._repr_html_()
            lights = report.lights()
            worst = "problem" if "problem" in lights.values() else "warning" if "warning" in lights.values() else "ok"
            self.section.show(self.body, detail=f"{worst}: {report.summary()}")

        # start_training_thread: an interpreter that exits mid-check cancels it (at its next batch) and waits for that
        # batch, rather than for the whole pass (a minute for a big data set) or aborting mid-op
        self._check = start_training_thread(check, name="nbtrainer-data-check", stop=cancel.set)

    def wait_check(self, timeout: float | None = None) -> None:
        """Wait for the data check (Start does: the fit reuses its report)."""
        if self._check is not None:
            self._check.join(timeout)

    def close_check(self) -> None:
        """Cancel the data check under way, if any, and wait for the batch it is reading (the panel closes)."""
        self._cancel.set()
        if self._check is not None and self._check is not threading.current_thread():
            self._check.join()

    def refused(self) -> str | None:
        """Why Start must not train (labels the model has no output for), or None."""
        report = self.report
        problems = report.by_kind("label_range") if report is not None else []
        return f"{problems[0].message} {problems[0].advice}" if problems else None

    # -- the run ---------------------------------------------------------------------------------------
    def attach(self, trainer: Any) -> None:
        """A run starts: the data map rides on it (a fresh map for a fresh run)."""
        if self.data_map not in trainer.callbacks.callbacks:
            trainer.add_callback(self.data_map)

    def refresh(self, final: bool = False, whole: bool = False) -> bool:
        """The UI thread: redraw the map when it has been brought up to date since the last drawing (an epoch's end,
        the end of a fit stopped mid-epoch: ``DataMap.updates``) and its budget allows, or at once when ``whole``
        (the run holds or has ended)."""
        if not (self.pending() or (whole and self.data_map.updates != self._drawn_updates)):
            return False
        self._drawn_updates = self.data_map.updates
        self.draw()
        # from the end of this drawing: a slow read of a big map is not a head start on the next
        self._next_draw = time.monotonic() + len(self._points) / self._points_per_s
        return True

    def pending(self) -> bool:
        """An update of the map the budget held back is due now."""
        return self.data_map.updates != self._drawn_updates and time.monotonic() >= self._next_draw

    def draw(self) -> None:
        """Draw the map from one consistent read of it."""
        dm = self.data_map
        table = dm.table()
        seen = np.flatnonzero(table["visits"].numpy() > 0)
        with self._lock:
            if not len(seen):
                if dm.note:
                    self.map_note.value = f"<div style='font-size:12px'>{html.escape(dm.note)}</div>"
                    self._show_map()
                return
            if len(seen) > _POINTS:
                top = _top(table["score"].numpy()[seen], _SUSPECTS)  # positions in seen, most suspicious first
                rest = np.ones(len(seen), dtype=bool)
                rest[top] = False
                pick = np.random.default_rng(0).choice(seen[rest], _POINTS - len(top), replace=False)
                seen = np.sort(np.concatenate([seen[top], pick]))
            self._points = seen
            x = np.nan_to_num(table["variability"].numpy()[seen])
            y = np.nan_to_num(table["confidence"].numpy()[seen])
            c = np.nan_to_num(table["correctness"].numpy()[seen], nan=0.5)
            with self.scatter.hold_sync():
                self.scatter.selected = None
                self.scatter.x, self.scatter.y, self.scatter.color = x, y, c
            self.scatter.scales["x"].max = float(max(0.5, x.max() * 1.05))
            total = int((table["visits"] > 0).sum())
            shown = f"{len(seen):,} of {total:,} items drawn" if len(seen) < total else f"{total:,} items"
            note = f" · {dm.note}" if dm.note else ""
            self.map_note.value = (
                f"<div style='font-size:12px'>{html.escape(dm.summary(table=table))} · {shown} drawn; colour: right "
                f"in how many epochs (red never, blue always){html.escape(note)}</div>"
            )
            self._show_map()
            self.section.show(self.body, detail=self.section_detail(table))

    def _show_map(self) -> None:
        if not self.map_box.children:  # filled once, in a box that is already shown (see __init__)
            self.map_box.children = self._map_parts

    def section_detail(self, table: Any = None) -> str:
        issues = self.data_map.label_issue_count(table=table)
        return f"map after epoch {self.data_map.epochs}: {issues} likely label issues"

    # -- clicks (the kernel's thread) -----------------------------------------------------------------
    def _on_mode(self, change: Any) -> None:
        self.figure.interaction = self.lasso if change.get("new") == "lasso" else None
        if change.get("new") != "lasso":
            self.lasso.reset()

    def _on_selected(self, change: Any) -> None:
        selected = change.get("new")
        if selected is None:
            return
        points = np.asarray(selected, dtype=np.int64).reshape(-1)
        with self._lock:
            points = points[(points >= 0) & (points < len(self._points))]
            items = self._points[points].tolist()
        self.show_items(items)

    def show_items(self, items: list[int]) -> list[int]:
        """Show these dataset items (the most suspicious first, at most 12) in the cleaner; returns them."""
        dm = self.data_map
        if not items:
            self.selection = []
            self.cleaner.clear()
            return []
        table = dm.table()
        score = table["score"].numpy()
        items = sorted(set(items), key=lambda i: -np.nan_to_num(score[i], nan=-np.inf))[:_SHOWN]
        gallery = dm.show(items, k=_SHOWN)
        suggested = {i: int(table["suggested"][i]) if int(table["suggested"][i]) >= 0 else None for i in items}
        n = int(max(int(table["given"].max()), int(table["suggested"].max()))) + 1
        names = dm.classes or [str(c) for c in range(max(n, 1))]
        self.selection = items
        self.cleaner.show(dm.edits, gallery.indices, gallery.cards, classes=names, suggested=suggested)
        return items
