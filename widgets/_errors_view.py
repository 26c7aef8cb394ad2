"""The panel's errors section (``nbt-errors``): ``trainer.interpret`` on the validation set after each validation.

With ``TrainerWidget(..., interpret=True)`` (or a dict of ``interpret`` options: ``loss_per_item=``, ``decode=``,
``classes=``, ``feature_names=``, ``max_items=``) a callback runs ``trainer.interpret(val_loader)`` at each
``on_validation_end``, on the training thread, between optimizer steps (the pass leaves the weights, the model's
mode and the random generators as they were), and prepares the top-losses gallery there too (the dataset is read and
the pictures encoded on the thread that already runs torch). The UI thread then draws it: the confusion matrix as a
bqplot ``GridHeatMap`` (``nbt-errors-matrix``; a click on a cell, taken by an invisible square over it, shows that
cell's items, largest loss first, in ``nbt-errors-examples``, each with keep / drop / relabel in
``nbt-errors-cleaner``: ``interp.cleaned(dataset)``), the per-class figures and the gallery (``nbt-errors-gallery``).
A model whose loss cannot be split per item is said once in the panel's messages and the section, and the run goes
on.
"""

from __future__ import annotations

import html
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import bqplot as bq
import ipywidgets as W
import numpy as np

from ._cleaner import Cleaner
from ._layouts import plain_html, shared_layout
from ._markup import text_html
from ._section import Section

__all__ = ["ErrorsView", "interpret_options"]

log = logging.getLogger(__name__)

_MAX_CLASSES = 30  # a larger matrix is a list of the most confused pairs instead
_EXAMPLES = 9
_PLOT = 250  # the matrix's plot area, px a side
_MARGIN = {"top": 30, "bottom": 40, "left": 50, "right": 10}
_OPTIONS = ("loss_per_item", "decode", "classes", "feature_names", "max_items")


def _cell_area(n: int) -> int:
    """A Scatter square's size (its area in px) covering nearly all of one cell of an ``n`` x ``n`` matrix."""
    side = _PLOT / max(n, 1) - 1.0  # a pixel short of the cell: a click near its edge is never the neighbour's
    return int(max(side, 4.0) ** 2)


def interpret_options(interpret: Any) -> dict[str, Any] | None:
    """``TrainerWidget(interpret=...)``: ``False`` / ``None`` (off), ``True`` or a dict of ``interpret`` options."""
    if interpret is None or interpret is False:
        return None
    if interpret is True:
        return {}
    if isinstance(interpret, Mapping):
        unknown = sorted(set(interpret) - set(_OPTIONS))
        if unknown:
            raise TypeError(
                f"TrainerWidget(interpret={{...}}) takes the interpret options {list(_OPTIONS)}; got {unknown}."
            )
        return dict(interpret)
    raise TypeError(
        f"TrainerWidget(interpret=...) takes True, False or a dict of interpret options, got {interpret!r}."
    )


class _Collector:
    """The training thread's side: interpret the validation set after each validation (a callback)."""

    def __init__(self, loader: Any, options: dict[str, Any], done: Callable[[Any], None]) -> None:
        self.loader, self.options, self.done = loader, options, done
        self.failed = False

    def on_validation_end(self, trainer: Any, logs: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            interp = trainer.interpret(self.loader, **self.options)
            gallery = interp.show(k=_EXAMPLES).html
        except Exception as exc:  # the run goes on; said once
            log.debug("the error analysis failed: said once in the panel, the run goes on", exc_info=True)
            self.failed = True
            self.done(exc)
            return
        self.done((interp, gallery, trainer.global_step, trainer.current_epoch))

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        trainer.remove_callback(self)  # it rides on one run (the panel attaches a new one at each Start)


class ErrorsView:
    """The errors section. ``root`` is its :class:`Section` (class ``nbt-errors``), hidden until a result comes; with
    ``options=None`` an empty hidden box, and the section's widgets are not made.

    Args:
        notify: the panel's messages (``level, text``).
        options: the ``interpret`` options (:func:`interpret_options`), or ``None``: the section stays off.

    Widgets (stable classes): ``nbt-errors-summary``, the heatmap figure ``nbt-errors-matrix`` (its marks:
    :attr:`heatmap`, and :attr:`cells`, the squares that take the clicks), ``nbt-errors-examples`` (a clicked
    cell's items), ``nbt-errors-table`` (per class, or the most confused pairs) and ``nbt-errors-gallery`` (the top
    losses).

    Example:
        >>> view = ErrorsView(w.notify, {})  # doctest: +SKIP
        >>> view.attach(trainer, val_loader); trainer.fit(...); view.refresh()  # doctest: +SKIP
    """

    def __init__(self, notify: Callable[[str, str], None], options: dict[str, Any] | None) -> None:
        self.notify, self.options = notify, options
        self.interpretation: Any = None  # the last one drawn
        self._pending: Any = None  # set by the training thread, taken by the UI thread
        self._collector: _Collector | None = None
        self._lock = threading.RLock()
        self.held: tuple[W.Widget, ...] = ()  # widgets made here that the panel's tree may not hold (closed with it)
        if options is None:
            # off (the default): the section can never show, so none of its 52 widgets is made. Each widget is a comm
            # that the kernel opens and the front end builds a model for when the panel is displayed.
            self.root = W.Box(layout=W.Layout(display="none"))
            return
        self.section = Section("errors", "nbt-errors")
        self.root = self.section.root
        self.summary = plain_html()
        self.summary.add_class("nbt-errors-summary")
        # no padding: the click squares' size would otherwise pad the scales and shrink the cells under them
        rows, cols = bq.OrdinalScale(reverse=True, allow_padding=False), bq.OrdinalScale(allow_padding=False)
        color = bq.ColorScale(scheme="Blues", min=0.0)
        self.heatmap = bq.GridHeatMap(
            color=np.zeros((2, 2)),
            row=np.arange(2),
            column=np.arange(2),
            scales={"row": rows, "column": cols, "color": color},
            display_format=".0f",
            font_style={"font-size": "11px"},
            stroke="white",
        )
        # The trap: bqplot's own GridHeatMap selection never reaches the kernel with a mouse. 0.13 binds each cell's
        # click without the cell (its handler then reads rowNum of nothing); 0.12 sends the selection as a list of
        # [row, column] pairs the kernel side cannot deserialize (bqplot#1632; #1013 and #375 before them). So the
        # clicks land on an invisible square per cell drawn over the heatmap: a Scatter, whose "select" click sets
        # ``selected = [index]`` on both 0.12 and 0.13 (the loss chart's and the LR finder's points work the same way).
        self.cells = bq.Scatter(
            x=np.empty(0),
            y=np.empty(0),
            scales={"x": cols, "y": rows},
            marker="square",
            default_size=_cell_area(2),
            opacities=[0.0],
            names=[],
            display_names=False,
            interactions={"click": "select", "hover": "tooltip"},
            tooltip=bq.Tooltip(fields=["name"], labels=["cell"]),
        )
        axes = [
            bq.Axis(scale=cols, label="predicted", tick_format="d"),
            bq.Axis(scale=rows, side="left", label="target", tick_format="d", label_offset="32px"),
        ]
        # a square plot area (_PLOT x _PLOT px, no padding), so that each cell is square and its click target covers it
        self.figure = bq.Figure(
            marks=[self.heatmap, self.cells],
            axes=axes,
            title="confusion matrix (click a cell)",
            fig_margin=dict(_MARGIN),
            padding_x=0.0,
            padding_y=0.0,
            animation_duration=0,
            layout=W.Layout(
                width=f"{_PLOT + _MARGIN['left'] + _MARGIN['right']}px",
                height=f"{_PLOT + _MARGIN['top'] + _MARGIN['bottom']}px",
            ),
        )
        self.figure.add_class("nbt-errors-matrix")
        self.examples, self.table, self.gallery = (plain_html() for _ in range(3))
        self.examples.add_class("nbt-errors-examples")
        self.table.add_class("nbt-errors-table")
        self.gallery.add_class("nbt-errors-gallery")
        # a cell's items, each with keep / drop / relabel (default: as predicted), into the interpretation's edits
        self.cleaner = Cleaner("w.looks.errors.interpretation.cleaned()")
        self.cleaner.root.add_class("nbt-errors-cleaner")
        self.body = W.VBox(
            [self.summary, W.HBox([self.figure, self.table], layout=shared_layout(flex_flow="row wrap")), self.examples,
             self.cleaner.root, W.HTML("<div style='font-size:12px;margin-top:4px'><b>top losses</b></div>"),
             self.gallery]
        )  # fmt: skip
        self.held = (self.body,)  # in the section once an interpretation is drawn
        self.cells.observe(self._on_cell, "selected")

    # -- the run (the panel attaches it at Start, detaches it when the run ends) ---------------------------
    def attach(self, trainer: Any, loader: Any) -> None:
        if self.options is None or loader is None:
            return
        self._collector = _Collector(loader, self.options, self._arrived)
        trainer.add_callback(self._collector)

    def detach(self, trainer: Any) -> None:
        """Take the callback off (a run that could not start; one that ran took it off at its end)."""
        if self._collector is not None:
            trainer.remove_callback(self._collector)
            self._collector = None

    def _arrived(self, result: Any) -> None:
        self._pending = result  # one reference swap: the UI thread takes the newest

    # -- drawing (UI thread) -----------------------------------------------------------------------------
    def pending(self) -> bool:
        """An interpretation waits to be drawn (one made just before a pause is drawn while the run holds)."""
        return self._pending is not None

    def refresh(self, final: bool = False, whole: bool = False) -> bool:
        result, self._pending = self._pending, None
        if result is None:
            return False
        if isinstance(result, Exception):
            text = f"errors section off: interpret failed: {type(result).__name__}: {result}"
            self.notify("warning", text)
            self.summary.value = f"<div style='font-size:12px'>{text_html(text)}</div>"
            self.section.show(self.body, detail="off")
            return True
        self.show(*result)
        return True

    def show(self, interp: Any, gallery: str, step: int = 0, epoch: int = 0) -> None:
        """Draw ``interp`` (an :class:`nbtrainer.Interpretation`) with its top-losses ``gallery`` HTML."""
        with self._lock:
            self.interpretation = interp
            self.summary.value = (
                f"<div style='font-size:12px'>validation set after epoch {epoch} (step {step:,}): "
                f"{html.escape(interp.summary())}</div>"
            )
            classifier = interp.task in ("classification", "binary") and interp.targets is not None
            matrix = interp.confusion_matrix() if classifier else None
            if matrix is not None and len(matrix) <= _MAX_CLASSES:
                counts = matrix.numpy().astype(float)
                n = len(counts)
                with self.heatmap.hold_sync():
                    self.heatmap.color = counts
                    self.heatmap.row, self.heatmap.column = np.arange(n), np.arange(n)
                target, predicted = np.divmod(np.arange(n * n), n)  # row-major: index = target * n + predicted
                names = interp.classes or list(range(n))
                with self.cells.hold_sync():
                    self.cells.x, self.cells.y = predicted.astype(float), target.astype(float)
                    self.cells.default_size = _cell_area(n)
                    self.cells.names = [
                        f"target {names[t]}, predicted {names[p]}: {int(counts[t, p])}"
                        for t, p in zip(target, predicted, strict=True)
                    ]
                self.figure.layout.display = "flex"
                legend = ", ".join(f"{i}: {c}" for i, c in enumerate(interp.classes)) if interp.classes else ""
                self.table.value = (f"<div style='font-size:11px'>{html.escape(legend)}</div>" if legend else "") + (
                    interp.per_class()._repr_html_()
                )
            else:
                self.figure.layout.display = "none"
                self.table.value = interp.most_confused_html(10)  # empty for a task without classes
            self.gallery.value = gallery
            self.examples.value = ""
            self.cleaner.clear()
            self.section.show(self.body, detail=f"epoch {epoch}")

    def _on_cell(self, change: Any) -> None:
        selected = change.get("new")
        if selected is None or len(selected) == 0:
            return
        index, n = int(np.asarray(selected).reshape(-1)[-1]), len(self.heatmap.row)
        self.cells.selected = None  # a second click on the same cell is a change again
        if self.interpretation is not None and 0 <= index < n * n:
            self.show_cell(*divmod(index, n))

    def show_cell(self, target: int, predicted: int) -> list[int]:
        """The items of one matrix cell (largest loss first) in ``nbt-errors-examples``; returns their indices."""
        with self._lock:
            interp = self.interpretation
            if interp is None:
                return []
            items = interp.where(target=target, prediction=predicted)
            name = interp.classes or list(range(interp.n_classes or 0))
            head = f"target {name[target]}, predicted {name[predicted]}: {len(items)} item(s)"
            self.examples.value = f"<div style='font-size:12px;margin-top:4px'><b>{html.escape(head)}</b></div>"
            shown = interp.show(items=items[:_EXAMPLES], k=_EXAMPLES)
            labels = [str(n) for n in name]
            suggested: dict[int, int | None] = dict.fromkeys(shown.indices, predicted)
            self.cleaner.show(interp.edits, shown.indices, shown.cards, classes=labels, suggested=suggested)
            return items
