"""The panel's run summary: its section in the panel, plus plain-HTML output slots that receive a static copy.

A slot is an ordinary ``display_data`` output with a ``display_id``; when a run ends it is updated
(``update_display``) with the summary, so the saved notebook keeps it as plain HTML that renders
without widget state (GitHub, nbviewer, an nbconvert export without JavaScript). Where the widgets do
render (JupyterLab, Notebook 7, Voila), the panel shows the same summary in its own section and a style
in the panel hides the slot, so it is never shown twice; in Voila, which never re-renders an output after
the page is built, the panel's section is the one that shows.
"""

from __future__ import annotations

import html
from typing import Any

from nbtrainer import format_number

from ._view import PanelView

__all__ = ["SummaryDisplay"]


class SummaryDisplay:
    """The summary of a panel's last run, in the panel's summary section and in every static slot shown.

    Args:
        view: the panel's view (its ``summary_section`` shows the summary).
        label: the panel's name in the slots' plain-text form, e.g. ``"TrainerWidget 'MLP #1'"``.

    Example:
        >>> summary = SummaryDisplay(w.view, label="TrainerWidget 'MLP #1'")  # doctest: +SKIP
        >>> summary.display(w.panel)                   # the panel, then an empty slot  # doctest: +SKIP
        >>> summary.publish(history, title="MLP on cpu")  # fills the section and the slot  # doctest: +SKIP
    """

    def __init__(self, view: PanelView, *, label: str) -> None:
        self.view, self.label = view, label
        self.html: str | None = None  # the last run's summary (None: no run has ended yet)
        self.detail = ""  # "finished, 5 epoch(s)": the last summary's status line
        self.previous = False  # the summary shown is the previous run's (a new run has started)
        self.display_ids: list[str] = []  # one per static slot shown
        self._history: Any = None

    def display(self, panel: Any) -> None:
        """Display ``panel``, then a plain-HTML slot that receives the static summary when a run ends."""
        from IPython.display import display

        display(panel)
        display_id = f"nbtrainer-summary-{id(self)}-{len(self.display_ids)}"
        display(self.bundle(), raw=True, display_id=display_id)
        self.display_ids.append(display_id)

    def bundle(self) -> dict[str, str]:
        """What a static slot shows now (``text/html`` and ``text/plain``)."""
        if self.html is None:
            return {"text/html": "<div class='nbt-summary-static nbt-summary-slot'></div>", "text/plain": ""}
        if self.previous:  # a run is under way: say whose summary this is
            return {
                "text/html": f"<div class='nbt-summary-static nbt-summary-previous'><div style='font-size:12px'>"
                f"<b>previous run</b> ({html.escape(self.detail)}); a new run has started</div>"
                f"{self.html}</div>",
                "text/plain": f"{self.label}: previous run {self.detail}; a new run has started",
            }
        h = self._history
        last = ", ".join(f"{k}={format_number(v)}" for k, v in h.last.items() if isinstance(v, float))
        return {
            "text/html": f"<div class='nbt-summary-static'>{self.html}</div>",
            "text/plain": f"{self.label}: {h.status}; {last}",
        }

    def mark_previous(self) -> None:
        """A new run starts: the summary shown (panel section and static slots) is marked as the previous run's."""
        if self.html is None:
            return
        v = self.view
        v.summary_section.set_title("previous run", self.detail)
        v.summary_section.set_open(False)
        v.summary_section.root.add_class("nbt-summary-previous")
        self.previous = True
        self._update_slots()

    def publish(self, history: Any = None, *, title: str = "") -> None:
        """Build the summary of ``history`` (if given; ``title`` heads it), show it in the panel and every slot."""
        if history is not None:
            self.html = history.to_html(title=title)
            self._history = history
            self.detail = f"{history.status}, {len(history.epochs)} epoch(s)"
            self.previous = False
            v = self.view
            v.summary.value = self.html
            v.summary_section.root.remove_class("nbt-summary-previous")
            v.summary_section.set_title("summary")
            # one line until expanded (the live charts are right above); never open for a moment in between
            v.summary_section.show(v.summary, detail=self.detail, is_open=False)
        self._update_slots()

    def _update_slots(self) -> None:
        if not self.display_ids or self.html is None:
            return
        from IPython.display import update_display

        for display_id in self.display_ids:
            update_display(self.bundle(), raw=True, display_id=display_id)
