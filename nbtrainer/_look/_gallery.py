"""The HTML of error analysis: an item's input fetched back from its dataset, a table of rows, a matrix as a heatmap.

Plain HTML with inline pictures (``data:`` PNGs), so it shows in a notebook's saved output, in the panel's errors
section and in an export without JavaScript. What an input becomes:

* a ``str``: the text; token ids (a 1-d integer tensor, or a dict's ``input_ids``): the text through ``decode``
  (a function ``ids -> str`` or a tokenizer with ``.decode``), else the first ids;
* an image (``_images``: a tensor ``(C, H, W)`` / ``(H, W)``, an array, a PIL image): a picture, floats outside
  [0, 1] (normalized inputs) scaled to their own range first;
* a 1-d float row: a small table of ``feature_names`` (``x0, x1...`` by default) and values.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from nbtrainer._look._images import as_pixels, is_pil, to_png
from nbtrainer._report._format import format_number
from nbtrainer._report._png import encode_png, png_img

__all__ = ["heatmap_html", "input_html", "model_input", "picture_html", "rows_html"]

_MAX_FEATURES = 12
_MAX_IDS = 48


def model_input(sample: Any) -> Any:
    """The input part of a dataset item: a tuple's first element, a dict's ``input_ids`` / ``pixel_values`` /
    ``text`` (else its first value), else the item itself."""
    if isinstance(sample, Mapping):
        for key in ("input_ids", "pixel_values", "text", "image", "x", "inputs"):
            if key in sample:
                return sample[key]
        return next(iter(sample.values()), None)
    if isinstance(sample, (tuple, list)) and sample:
        return sample[0]
    return sample


def _decode(ids: list[int], decode: Any) -> str | None:
    if decode is None:
        return None
    method = getattr(decode, "decode", None)
    if callable(method):
        return str(method(ids, skip_special_tokens=True))
    return str(decode(ids))


def picture_html(value: Any) -> str | None:
    if is_pil(value):
        png = to_png(value)
    else:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.detach().float().cpu().numpy()
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating) and value.size:
            lo, hi = float(np.nanmin(value)), float(np.nanmax(value))
            if lo < 0.0 or hi > 1.0:  # normalized inputs: their own range, not clipped to black and white
                value = (value - lo) / (hi - lo) if hi > lo else np.zeros_like(value)
        pixels = as_pixels(value)
        png = None if pixels is None else encode_png(pixels)
    if png is None:
        return None
    return png_img(png, alt="input", fit=128, style="display:block")


def input_html(sample: Any, *, decode: Any = None, feature_names: Sequence[str] | None = None) -> str:
    """An item's input as HTML (see the module docstring)."""
    value = model_input(sample)
    if isinstance(value, str):
        return f"<div class='nbt-item-text'>{html.escape(value)}</div>"
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value) if value.ndim == 1 else value
    if isinstance(value, torch.Tensor) and value.ndim == 1 and not value.is_floating_point():
        ids = [int(i) for i in value.tolist() if int(i) >= 0]
        text = _decode(ids, decode)
        if text is None:
            more = f" ... ({len(ids)} ids; decode= shows text)" if len(ids) > _MAX_IDS else " (decode= shows text)"
            text = " ".join(str(i) for i in ids[:_MAX_IDS]) + more
        return f"<div class='nbt-item-text'>{html.escape(text)}</div>"
    if isinstance(value, torch.Tensor) and value.ndim == 1:
        values = value.detach().float().cpu().tolist()
        names = list(feature_names) if feature_names is not None else [f"x{i}" for i in range(len(values))]
        shown = list(zip(names, values, strict=False))[:_MAX_FEATURES]
        cells = "".join(
            f"<tr><td>{html.escape(str(n))}</td><td style='text-align:right'>{format_number(v)}</td></tr>"
            for n, v in shown
        )
        more = f"<tr><td colspan='2'>... {len(values) - len(shown)} more</td></tr>" if len(values) > len(shown) else ""
        return f"<table class='nbt-item-row'>{cells}{more}</table>"
    picture = picture_html(value)
    if picture is not None:
        return picture
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return f"<div>{format_number(float(value))}</div>"
    return f"<div class='nbt-item-text'>{html.escape(type(value).__name__)} (no picture of it)</div>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value) if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value) or "-"
    return str(value)


def rows_html(rows: Sequence[Mapping[str, Any]], *, css: str = "nbt-rows") -> str:
    """A table of dict rows (the keys of the first row are the columns)."""
    if not rows:
        return f"<table class='{css}'></table>"
    cols = list(rows[0])
    pad = "padding:1px 8px;text-align:right"
    head = "".join(f"<th style='{pad}'>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td style='{pad}'>{html.escape(_cell(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return (
        f"<table class='{css}' style='border-collapse:collapse'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def heatmap_html(matrix: torch.Tensor, labels: Sequence[str], *, title: str = "") -> str:
    """A confusion matrix as an HTML table (rows: target, columns: prediction), each cell shaded by its share of
    its row, the count written in it."""
    counts = matrix.tolist()
    esc = html.escape
    head = "".join(f"<th style='padding:2px 4px;font-weight:normal'>{esc(str(lab))}</th>" for lab in labels)
    body = []
    for i, row in enumerate(counts):
        total = sum(row) or 1
        cells = []
        for j, n in enumerate(row):
            share = n / total
            colour = "9,105,218" if i == j else "207,34,46"
            text_colour = "white" if share > 0.55 else "inherit"
            cells.append(
                f"<td title='target {esc(str(labels[i]))}, predicted {esc(str(labels[j]))}: {n}' "
                f"style='padding:2px 6px;text-align:right;min-width:24px;background:rgba({colour},{share:.2f});"
                f"color:{text_colour}'>{n}</td>"
            )
        name = f"<th style='padding:2px 4px;font-weight:normal;text-align:right'>{esc(str(labels[i]))}</th>"
        body.append(f"<tr>{name}{''.join(cells)}</tr>")
    caption = f"<caption style='caption-side:top;text-align:left'>{esc(title)}</caption>" if title else ""
    return (
        f"<table class='nbt-confusion' style='border-collapse:collapse;font-variant-numeric:tabular-nums'>{caption}"
        f"<thead><tr><th style='padding:2px 4px;font-weight:normal'>target \\ predicted</th>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )
