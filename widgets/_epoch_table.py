"""The live epoch table's HTML: a window of the newest rows, with each column's best value (over every row) bold.

A run of thousands of epochs must not resend a table of thousands of rows at every epoch: the panel sends the
newest rows only (or, on request, the last ``MAX_ALL``), while "best" still looks at the whole run.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from nbtrainer.plotting import epoch_columns, format_cell, higher_is_better

__all__ = ["CSS", "MAX_ALL", "epoch_table"]

MAX_ALL = 500  # rows sent when the user asks for all of them
# One style rule for every cell (inline styles made each row five times longer: a table of 500 rows resent
# every epoch was megabytes a second for a fast run).
CSS = (
    ".nbt-epoch-table td,.nbt-epoch-table th{padding:1px 8px;text-align:right;white-space:nowrap}"
    ".nbt-epoch-table th{border-bottom:1px solid currentColor}"
)


def _best_rows(rows: Sequence[dict[str, Any]], cols: list[str]) -> dict[str, int]:
    best: dict[str, int] = {}
    for c in cols:
        if c in ("epoch", "lr", "time"):
            continue
        vals = [
            (float(v), i)
            for i, r in enumerate(rows)
            for v in [r.get(c)]
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ]
        if vals:
            best[c] = (max if higher_is_better(c) else min)(vals)[1]
    return best


def epoch_table(rows: Sequence[dict[str, Any]], first: int = 0) -> str:
    """Rows ``first`` to the end of ``rows`` as a table (class ``nbt-epoch-table``, styled by ``CSS``)."""
    if not rows:
        return "<table class='nbt-epoch-table'></table>"
    esc = html.escape
    cols = epoch_columns(rows)
    best = _best_rows(rows, cols)
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = []
    for i in range(max(0, first), len(rows)):
        r, cells = rows[i], []
        for c in cols:
            text = esc(format_cell(c, r.get(c)) if c in r else "")
            cells.append(f"<td>{f'<b>{text}</b>' if best.get(c) == i else text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        "<table class='nbt-epoch-table' style='border-collapse:collapse;font-variant-numeric:tabular-nums'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )
