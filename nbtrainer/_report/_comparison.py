"""The comparison table both comparisons return (``compare_strategies``, ``compare_inference``): named rows, each
"ok" or "failed" with its reason, drawn as text, Markdown and HTML with ratio bars by one set of code.

A table says what it shows through ``_header`` and ``_cells(row)`` (a failed row: its name, "failed", and its
reason last); ``_bars`` maps a column to the row's ratio key and the bar's colour. Everything else here is shared.
"""

from __future__ import annotations

import html
import math
from typing import Any, ClassVar

from nbtrainer._report._rows import NamedRows

__all__ = ["ComparisonTable"]

BAR_FULL = 50  # px of a ratio bar at 100% of the baseline (capped at 200%)


class ComparisonTable(NamedRows):
    """Rows compared with a baseline row; the rendering shared by :class:`~nbtrainer.compare.StrategyComparison`
    and :class:`~nbtrainer.inference.InferenceComparison`."""

    rows: list[dict[str, Any]]
    baseline: str
    #: column index -> (the row's ratio key, bar colour) drawn under that cell in HTML
    _bars: ClassVar[dict[int, tuple[str, str]]] = {}

    @property
    def _header(self) -> list[str]:
        raise NotImplementedError

    def _cells(self, row: dict[str, Any]) -> list[str]:
        raise NotImplementedError

    def to_markdown(self) -> str:
        raise NotImplementedError

    def _repr_html_(self) -> str:
        raise NotImplementedError

    # -- text -------------------------------------------------------------------------------------------
    def _text_lines(self, *, cut: int | None = None, free_last: bool = False) -> list[str]:
        """Aligned columns with a rule under the header; ``cut``: cells longer than that end in "...";
        ``free_last``: the last column (notes, failure reasons) neither cut nor widening the others."""
        header = self._header
        cells = [self._cells(r) for r in self.rows]
        if cut is not None:
            cells = [[c if len(c) <= cut else c[: cut - 3] + "..." for c in row] for row in cells]
        table = [header, *cells]
        n = len(header) - 1 if free_last else len(header)
        widths = [max(len(row[i]) for row in table) for i in range(n)] + ([0] if free_last else [])
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        rule = [max(w, len(header[-1])) for w in widths] if free_last else widths
        out.insert(1, "  ".join("-" * w for w in rule))
        return out

    def _markdown_lines(self) -> list[str]:
        def line(cells: list[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        return [line(self._header), "|" + "---|" * len(self._header), *(line(self._cells(r)) for r in self.rows)]

    # -- HTML -------------------------------------------------------------------------------------------
    @staticmethod
    def _bar(ratio: Any, color: str) -> str:
        if not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
            return ""
        width = max(1.0, min(ratio, 2.0) * BAR_FULL)
        return (
            f"<div style='background:{color};height:4px;width:{width:.0f}px;margin-top:2px' "
            f"title='{ratio:.0%} of baseline'></div>"
        )

    def _table_html(self) -> str:
        """``<table>`` with a bar under each ratio cell; a failed row spans its reason across the columns."""
        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self._header)
        body = []
        for row in self.rows:
            cells = self._cells(row)
            if row["status"] != "ok":
                body.append(
                    f"<tr><td>{html.escape(cells[0])}</td><td><b style='color:#c00'>failed</b></td>"
                    f"<td colspan='{len(cells) - 2}' style='color:#c00'>{html.escape(cells[-1])}</td></tr>"
                )
                continue
            parts = []
            for i, text in enumerate(cells):
                bar = self._bars.get(i)
                parts.append(html.escape(text) + (self._bar(row.get(bar[0]), bar[1]) if bar else ""))
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in parts) + "</tr>")
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
