"""Display of the panel, plus a plain-HTML output slot that receives the static summary.

The slot is an ordinary ``display_data`` output with a ``display_id``; when a run ends it is updated
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

__all__ = ["SummaryDisplay"]


class SummaryDisplay:
    """Mixed into :class:`TrainerWidget` (uses its ``panel``, ``view``, ``summary_html``, ``_display_ids``)."""

    # set by TrainerWidget.__init__
    panel: Any
    view: Any
    trainer: Any
    summary_html: str | None
    _summary_detail = ""  # "finished, 5 epoch(s)": the last summary's status line
    _previous = False  # the summary shown is the previous run's (a new run has started)
    _display_ids: list[str]
    _label: str
    _model: Any

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.panel._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """The panel, then a plain-HTML slot that receives the static summary when a run ends."""
        from IPython.display import display

        display(self.panel)
        display_id = f"nbtrainer-summary-{id(self)}-{len(self._display_ids)}"
        display(self._summary_bundle(), raw=True, display_id=display_id)
        self._display_ids.append(display_id)

    def _summary_bundle(self) -> dict[str, str]:
        if self.summary_html is None:
            return {"text/html": "<div class='nbt-summary-static nbt-summary-slot'></div>", "text/plain": ""}
        if self._previous:  # a run is under way: say whose summary this is
            return {
                "text/html": f"<div class='nbt-summary-static nbt-summary-previous'><div style='font-size:12px'>"
                f"<b>previous run</b> ({html.escape(self._summary_detail)}); a new run has started</div>"
                f"{self.summary_html}</div>",
                "text/plain": f"{self._label}: previous run {self._summary_detail}; a new run has started",
            }
        h = self.trainer.history
        last = ", ".join(f"{k}={format_number(v)}" for k, v in h.last.items() if isinstance(v, float))
        return {
            "text/html": f"<div class='nbt-summary-static'>{self.summary_html}</div>",
            "text/plain": f"{self._label}: {h.status}; {last}",
        }

    def _summary_is_previous(self) -> None:
        """A new run starts: the summary shown (panel section and static slots) is marked as the previous run's."""
        if self.summary_html is None:
            return
        v = self.view
        v.summary_section.set_title("previous run", self._summary_detail)
        v.summary_section.set_open(False)
        v.summary_section.root.add_class("nbt-summary-previous")
        self._previous = True
        self._update_slots()

    def _publish_summary(self, history: Any = None) -> None:
        """Build the summary of ``history`` (if given), show it in the panel and in every display slot."""
        if history is not None:
            self.summary_html = history.to_html(title=f"{type(self._model).__name__} on {self.trainer.device}")
            self._summary_detail = f"{history.status}, {len(history.epochs)} epoch(s)"
            self._previous = False
            v = self.view
            v.summary.value = self.summary_html
            v.summary_section.root.remove_class("nbt-summary-previous")
            v.summary_section.set_title("summary")
            # one line until expanded (the live charts are right above); never open for a moment in between
            v.summary_section.show(v.summary, detail=self._summary_detail, is_open=False)
        self._update_slots()

    def _update_slots(self) -> None:
        if not self._display_ids or self.summary_html is None:
            return
        from IPython.display import update_display

        for display_id in self._display_ids:
            update_display(self._summary_bundle(), raw=True, display_id=display_id)
