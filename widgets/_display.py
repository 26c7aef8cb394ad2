"""Display of the panel, plus a plain-HTML output slot that receives the static summary.

The slot is an ordinary ``display_data`` output with a ``display_id``; when a run ends it is updated
(``update_display``) with the summary, so the saved notebook keeps it as plain HTML that renders
without widget state (GitHub, nbviewer, a notebook reopened later).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SummaryDisplay"]


class SummaryDisplay:
    """Mixed into :class:`TrainerWidget` (uses its ``panel``, ``summary_html``, ``history``, ``_display_ids``)."""

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
            return {"text/html": "<div class='nbt-summary-slot'></div>", "text/plain": ""}
        h = self.history
        last = ", ".join(f"{k}={v:.4g}" for k, v in h.last.items() if isinstance(v, float))
        return {"text/html": self.summary_html, "text/plain": f"{self._label}: {h.status}; {last}"}

    def _publish_summary(self) -> None:
        if not self._display_ids or self.summary_html is None:
            return
        from IPython.display import update_display

        for display_id in self._display_ids:
            update_display(self._summary_bundle(), raw=True, display_id=display_id)
