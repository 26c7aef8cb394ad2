"""``nbtrainer.show_batch(loader)``: a batch as the model receives it, after the dataset, its transforms and the
collate function, split into inputs and targets by the batch protocol the fit uses.

What an item becomes: images (a ``(C, H, W)``, ``(H, W, C)`` or ``(H, W)`` tensor per item; floats in [0, 1] or
0-255 integers of any type) a grid of pictures (normalized values stretched to each picture's own range, and said),
token ids text through ``decode=`` (a function or a tokenizer; of a dict batch with an ``attention_mask``, each item's
positions the mask keeps, without the batch's padding), a row of floats one row of a table with
``feature_names`` as its columns; each with its target (``classes=`` names class numbers). The loader is read for
one batch, under the run's random generators put back (a shuffling loader draws its order from them).
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._batch import BatchSpec
from nbtrainer._look._gallery import input_html, picture_html, rows_html
from nbtrainer._report._format import format_number
from nbtrainer._setup._seed import kept_rng

__all__ = ["BatchView", "show_batch"]

Tensor = torch.Tensor


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"{str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def _kind(value: Any) -> str:
    """``"images"``, ``"ids"``, ``"table"``, ``"values"``, ``"text"`` or ``"other"``: what one field's items are."""
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], str):
        return "text"
    if not isinstance(value, Tensor) or value.ndim == 0:
        return "other"
    # (N, H, W), (N, C, H, W), or (N, H, W, C) as NumPy and PIL pipelines hand them
    channels = (1, 3, 4)
    if (
        value.ndim == 3
        or (value.ndim >= 4 and value.shape[1] in channels)
        or (value.ndim == 4 and value.shape[-1] in channels)
    ):
        return "images"
    if value.ndim == 2:
        return "table" if value.is_floating_point() else "ids"
    return "values"


def _target_text(targets: Any, i: int, classes: Sequence[str] | None) -> str:
    t = targets[i] if isinstance(targets, (Tensor, list, tuple)) and len(targets) > i else None
    if isinstance(targets, tuple) and targets and isinstance(targets[0], Tensor):  # several targets
        return " / ".join(_target_text(part, i, classes) for part in targets)
    if isinstance(t, Tensor):
        if t.ndim == 0 and not t.is_floating_point():
            c = int(t)
            return str(classes[c]) if classes is not None and 0 <= c < len(classes) else str(c)
        if t.ndim == 0:
            return format_number(float(t))
        if t.numel() <= 8:
            return "[" + ", ".join(format_number(float(v)) for v in t.flatten()) + "]"
        return _describe(t)
    return "" if t is None else str(t)


class BatchView:
    """The first items of a batch as the model receives them (from :func:`show_batch`).

    Attributes:
        fields: per input field, its dtype and shape (``"float32 [32, 1, 8, 8]"``); ``targets`` likewise.
        items: how many items are shown; ``batch_size``: how many the batch holds.
        html: the picture (shown in a notebook).
    """

    def __init__(self, html_text: str, text: str, fields: dict[str, str], items: int, batch_size: int) -> None:
        self.html, self.text, self.fields = html_text, text, fields
        self.items, self.batch_size = items, batch_size

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {v}" for k, v in self.fields.items())
        return f"BatchView({self.items} of {self.batch_size} items; {fields})"


def _first_batch(loader: Any) -> Any:
    if isinstance(loader, Iterator):
        raise TypeError(
            f"show_batch() got a one-shot iterator ({type(loader).__name__}): reading it would use up a batch of the "
            "fit's. Pass the DataLoader, a list of batches or arrays."
        )
    with kept_rng(loader):
        try:
            return next(iter(loader))
        except StopIteration:
            raise ValueError("show_batch(): the loader yielded no batch (empty dataset?).") from None


def show_batch(
    loader: Any,
    n: int = 16,
    *,
    decode: Any = None,
    classes: Sequence[Any] | None = None,
    feature_names: Sequence[str] | None = None,
    spec: BatchSpec | None = None,
) -> BatchView:
    """The first ``n`` items of ``loader``'s first batch as the model receives them (see the module docstring).

    Arrays and a map-style dataset have no batch of their own: they are read as one batch of ``n`` items.

    Example:
        >>> import torch
        >>> from nbtrainer import show_batch
        >>> view = show_batch((torch.rand(8, 1, 4, 4), torch.arange(8)), 4, classes=list("abcdefgh"))
        >>> view.items, view.fields["inputs"]
        (4, 'float32 [4, 1, 4, 4]')
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an int >= 1, got {n!r}.")
    loader = _arrays.eval_loader(
        loader,
        max(n, 1) if _arrays.is_array_data(loader) or _arrays.is_map_dataset(loader) else None,
        name="show_batch() loader",
    )
    batch = _first_batch(loader)
    args, kwargs, targets = (spec or BatchSpec()).split(batch)
    named: dict[str, Any] = (
        {"inputs": args[0]}
        if len(args) == 1 and not kwargs
        else {**{f"inputs[{i}]": a for i, a in enumerate(args)}, **kwargs}
    )
    if isinstance(batch, Mapping) and "input_ids" in batch:  # a tokenizer's batch: the ids carry the text
        named = {"input_ids": batch["input_ids"], **{k: v for k, v in named.items() if k != "input_ids"}}
    fields = {k: _describe(v) for k, v in named.items()}
    if targets is not None:
        fields["targets"] = _describe(targets)
    main: Any = next(iter(named.values()), None)
    if main is None:
        raise ValueError(f"show_batch(): the batch {_describe(batch)} holds no inputs for the model.")
    size = 1 if isinstance(main, Tensor) and main.ndim == 0 else len(main) if hasattr(main, "__len__") else 1
    shown = min(n, size)
    kind = _kind(main)
    names = [str(c) for c in classes] if classes is not None else None
    labels = [_target_text(targets, i, names) for i in range(shown)] if targets is not None else [""] * shown
    note = ""
    if kind == "images":
        cards = []
        for i in range(shown):
            picture = picture_html(main[i]) or f"<div>{html.escape(_describe(main[i]))}</div>"
            cards.append(
                f"<div class='nbt-batch-item' style='margin:0 6px 6px 0;font-size:11px'>{picture}"
                f"<div>{html.escape(labels[i])}</div></div>"
            )
        body = f"<div style='display:flex;flex-flow:row wrap;align-items:flex-end'>{''.join(cards)}</div>"
        lo, hi = (float(main[:shown].min()), float(main[:shown].max())) if main.numel() else (0.0, 0.0)
        if main.is_floating_point() and (lo < 0 or hi > 1):
            note = "normalized values: each picture stretched to its own range"
        elif not main.is_floating_point() and main.dtype != torch.bool and (lo < 0 or hi > 255):
            note = "values beyond 0-255: each picture stretched to its own range"
        text_items = [f"{i}: {_describe(main[i])} -> {labels[i]}" for i in range(shown)]
    elif kind == "table":
        cols = list(feature_names) if feature_names is not None else [f"x{j}" for j in range(main.shape[1])]
        rows = [{**dict(zip(cols, main[i].tolist(), strict=False)), "target": labels[i]} for i in range(shown)]
        body = rows_html(rows, css="nbt-batch-table")
        # the first 8 features, then the target: a wider row cut at 8 entries lost its target from the text
        more = ", ..." if len(cols) > 8 else ""
        text_items = [
            ", ".join(f"{c}={format_number(v)}" for c, v in zip(cols[:8], main[i].tolist(), strict=False))
            + f"{more} -> {labels[i]}"
            for i in range(shown)
        ]
    else:
        cards, text_items = [], []
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        # a tokenizer pads each row to the batch's longest: decode= gets the item's own tokens, not the pad ids
        if not (kind == "ids" and isinstance(mask, Tensor) and mask.shape == main.shape):
            mask = None
        for i in range(shown):
            item = main[i] if mask is None else main[i][mask[i].bool()]
            shown_html = input_html((item,), decode=decode) if kind != "text" else html.escape(str(item))
            cards.append(
                f"<div class='nbt-batch-item' style='margin:0 0 6px 0;font-size:11px'>{shown_html}"
                f"<div><b>{html.escape(labels[i])}</b></div></div>"
            )
            text_items.append(f"{i}: {_plain(item, decode)} -> {labels[i]}")
        body = "".join(cards)
    head = " · ".join(f"{html.escape(k)} {html.escape(v)}" for k, v in fields.items())
    note_html = f"<div class='nbt-batch-note' style='font-style:italic'>{html.escape(note)}</div>" if note else ""
    page = (
        f"<div class='nbt-batch' style='font-size:12px'><div><b>Batch</b> · {shown} of {size} items · {head}</div>"
        f"{note_html}{body}</div>"
    )
    text = "\n".join(
        [
            f"batch: {shown} of {size} items; " + "; ".join(f"{k} {v}" for k, v in fields.items()),
            *([note] if note else []),
            *text_items,
        ]
    )
    return BatchView(page, text, fields, shown, size)


def _plain(item: Any, decode: Any) -> str:
    if isinstance(item, Tensor) and item.ndim == 1 and not item.is_floating_point() and decode is not None:
        method = getattr(decode, "decode", None)
        ids = [int(i) for i in item.tolist() if int(i) >= 0]
        return str(method(ids, skip_special_tokens=True) if callable(method) else decode(ids))
    if isinstance(item, Tensor):
        return _describe(item) if item.numel() > 8 else str(item.tolist())
    return str(item)[:200]
