"""The cleaner: items shown with their labels, each with keep / drop / relabel, written to a set of edits.

Used by the data section (the items picked on the data map) and the errors section (a confusion-matrix cell's items).
The edits are the core's (``DataMap.edits``, ``Interpretation.edits``): ``dm.cleaned(dataset)`` /
``interp.cleaned(dataset)`` then make the next fit's dataset view with them. Widgets (stable classes):
``nbt-cleaner`` (the list), each item ``nbt-cleaner-item`` and ``nbt-cleaner-item-<index>``, its picture and caption,
its choice ``nbt-cleaner-choice`` (toggle buttons keep / drop / relabel) and ``nbt-cleaner-label`` (the new label),
and ``nbt-cleaner-summary`` (what is marked so far).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W

from ._layouts import plain_html
from ._lifecycle import replace_children

__all__ = ["Cleaner"]

_CHOICES = ("keep", "drop", "relabel")


class Cleaner:
    """One list of items with a choice each.

    Args:
        what: how to call the result in the summary line (``"dm.cleaned(dataset)"``...).

    Example:
        >>> c = Cleaner("w.data_map.cleaned()")  # doctest: +SKIP
        >>> c.show(dm.edits, [3, 7], ["<img ...>", "<img ...>"], classes=["0", "1"], suggested={3: 1})  # doctest: +SKIP
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.items = W.VBox(layout=W.Layout(flex_flow="row wrap", display="flex"))
        self.summary = plain_html()
        self.summary.add_class("nbt-cleaner-summary")
        self.root = W.VBox([self.items, self.summary])
        self.root.add_class("nbt-cleaner")
        self.edits: Any = None
        self.choices: dict[int, W.ToggleButtons] = {}
        self.labels: dict[int, W.Dropdown] = {}
        self.on_change: Callable[[], None] | None = None

    def show(
        self,
        edits: Any,
        indices: Sequence[int],
        cards: Sequence[str],
        *,
        classes: Sequence[str] | None,
        suggested: dict[int, int | None] | None = None,
    ) -> None:
        """Rows for ``indices`` (their pictures ``cards``), each choice read from and written to ``edits``."""
        self.edits = edits
        self.choices, self.labels = {}, {}
        rows = []
        names = list(classes) if classes is not None else []
        for index, card in zip(indices, cards, strict=False):
            decision = edits.decision(index)
            hint = (suggested or {}).get(index)
            choice = W.ToggleButtons(
                options=list(_CHOICES),
                value="keep" if decision == "keep" else "drop" if decision == "drop" else "relabel",
                style={"button_width": "64px"},
                layout=W.Layout(width="auto"),
            )
            choice.add_class("nbt-cleaner-choice")
            label_value = decision if isinstance(decision, int) else hint if hint is not None else 0
            label = W.Dropdown(
                options=[(f"{c}: {n}" if str(c) != n else n, c) for c, n in enumerate(names)] or [("0", 0)],
                value=label_value if 0 <= label_value < max(len(names), 1) else 0,
                layout=W.Layout(width="120px", display="flex" if decision not in ("keep", "drop") else "none"),
            )
            label.add_class("nbt-cleaner-label")
            choice.observe(lambda change, i=index: self._chosen(i), "value")
            label.observe(lambda change, i=index: self._chosen(i), "value")
            self.choices[index], self.labels[index] = choice, label
            row = W.VBox([W.HTML(card), choice, label], layout=W.Layout(margin="0 10px 8px 0", width="auto"))
            row.add_class("nbt-cleaner-item")
            row.add_class(f"nbt-cleaner-item-{index}")
            rows.append(row)
        replace_children(self.items, tuple(rows))  # about eleven widgets an item, at each selection
        self._summarize()

    def clear(self) -> None:
        replace_children(self.items, ())
        self.choices, self.labels = {}, {}
        self._summarize()

    def _chosen(self, index: int) -> None:
        edits = self.edits
        if edits is None:
            return
        value, label = self.choices[index].value, self.labels[index]
        label.layout.display = "flex" if value == "relabel" else "none"
        if value == "keep":
            edits.keep(index)
        elif value == "drop":
            edits.drop(index)
        else:
            edits.relabel(index, int(label.value))
        self._summarize()
        if self.on_change is not None:
            self.on_change()

    def _summarize(self) -> None:
        edits = self.edits
        if edits is None or not len(edits):
            self.summary.value = ""
            return
        dropped, relabeled = edits.dropped, edits.relabeled
        parts = []
        if dropped:
            parts.append(f"{len(dropped)} dropped ({_few(dropped)})")
        if relabeled:
            parts.append(f"{len(relabeled)} relabeled ({_few([f'{i}->{v}' for i, v in relabeled.items()])})")
        self.summary.value = (
            f"<div style='font-size:12px'>marked: {html.escape('; '.join(parts))}. "
            f"<code>{html.escape(self.what)}</code> gives the next fit's dataset (nothing is copied).</div>"
        )


def _few(values: Sequence[Any]) -> str:
    shown = ", ".join(str(v) for v in values[:6])
    return shown + (f" and {len(values) - 6} more" if len(values) > 6 else "")
