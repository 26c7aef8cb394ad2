"""``history.samples``: the list :class:`~nbtrainer.Samples` fills, shown as a grid when a cell returns it."""

from __future__ import annotations

import base64
import html
from typing import Any

__all__ = ["SampleList"]


class SampleList(list):  # list[dict[str, Any]]: the plain list it always was, with a display
    """What :class:`~nbtrainer.Samples` took, one dict per sample: ``{"step", "epoch", "name", "kind": "text" |
    "image", "value"}`` (an image's value is PNG bytes). A list in every way; in a notebook, a table of the samples
    by step, pictures drawn, text as text.

    Example:
        >>> s = SampleList([{"step": 0, "epoch": 0, "name": "prompt", "kind": "text", "value": "hello"}])
        >>> s
        SampleList(1 sample: 'prompt' (text) at step 0)
        >>> "<td>hello</td>" in s._repr_html_()
        True
    """

    def _names(self) -> dict[str, tuple[str, list[int]]]:
        names: dict[str, tuple[str, list[int]]] = {}
        for s in self:
            names.setdefault(str(s["name"]), (str(s["kind"]), []))[1].append(int(s["step"]))
        return names

    def __repr__(self) -> str:
        if not self:
            return "SampleList(no samples)"
        parts = []
        for name, (kind, steps) in self._names().items():
            where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]} to {steps[-1]}"
            parts.append(f"{name!r} ({kind}) at {where}")
        count = f"{len(self)} sample{'s' if len(self) != 1 else ''}"
        return f"SampleList({count}: {'; '.join(parts)})"

    __str__ = __repr__

    def _repr_html_(self) -> str:
        if not self:
            return "<div class='nbtrainer-samples'>no samples</div>"
        names = list(self._names())
        by_step: dict[int, dict[str, Any]] = {}
        for s in self:
            by_step.setdefault(int(s["step"]), {"epoch": s["epoch"]})[str(s["name"])] = s
        head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(n)}</th>" for n in names)
        rows = []
        for step, row in by_step.items():
            cells = "".join(f"<td>{_cell(row.get(n))}</td>" for n in names)
            rows.append(f"<tr><td>step {step}</td><td>epoch {row['epoch']}</td>{cells}</tr>")
        return (
            f"<div class='nbtrainer-samples'><b>Samples</b> ({len(self)} in {len(by_step)} steps)"
            f"<table style='border-collapse:collapse'><tr><th></th><th></th>{head}</tr>{''.join(rows)}</table></div>"
        )


def _cell(sample: dict[str, Any] | None) -> str:
    if sample is None:
        return ""
    value = sample["value"]
    if sample["kind"] == "image" and isinstance(value, bytes):
        data = base64.b64encode(value).decode("ascii")
        return f"<img src='data:image/png;base64,{data}' style='image-rendering:pixelated;max-width:160px'>"
    return html.escape(str(value))
