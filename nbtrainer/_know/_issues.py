"""What a data map shows: its label issues (:class:`LabelIssue`, :class:`LabelIssues`) and its picture (an SVG
scatter of confidence against variability, each point coloured by correctness, with the top issues beside it)."""

from __future__ import annotations

import dataclasses
import html
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from nbtrainer._look._gallery import input_html, rows_html
from nbtrainer._look._interpretation import Gallery
from nbtrainer._report._format import format_number

__all__ = ["LabelIssue", "LabelIssues", "correctness_colour", "issue_count", "map_gallery", "map_html", "rank_issues"]

_SHOWN = 4000  # points drawn at most in the static picture (a seeded sample beyond)


@dataclasses.dataclass(frozen=True)
class LabelIssue:
    """One item whose label training disagreed with (``DataMap.label_issues``); read as attributes or keys.

    Attributes:
        index: the item's dataset index.
        given: the label it was trained with (None where targets are not class labels).
        suggested: the class the model predicted the last time it got the item wrong, else the one it ranked after
            the given one (None in loss mode).
        score: how suspicious: ``1 - confidence`` (loss mode: the mean loss); higher is more.
        confidence: the mean probability given to the label; variability: its spread; correctness: the share
            of visits predicted right.
    """

    index: int
    given: int | None
    suggested: int | None
    score: float
    confidence: float = math.nan
    variability: float = math.nan
    correctness: float = math.nan

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def _repr_html_(self) -> str:
        return f"<div class='nbt-label-issue' style='font-size:12px'>{html.escape(str(self))}</div>"

    def __str__(self) -> str:
        if self.given is None:
            return f"#{self.index}: score {format_number(self.score)}"
        return (
            f"#{self.index}: given {self.given}, suggested {self.suggested}, score {self.score:.3f} "
            f"(confidence {self.confidence:.3f}, correct {self.correctness:.0%})"
        )


class LabelIssues(list):  # list[LabelIssue], displayed as a table
    """Label issues, most suspicious first (a list of :class:`LabelIssue`; ``indices`` for ``cleaned(drop=...)``,
    ``suggestions`` for ``cleaned(relabel=...)``)."""

    def __init__(self, items: Iterable[LabelIssue] = (), *, classes: Sequence[str] | None = None) -> None:
        super().__init__(items)
        self.classes = list(classes) if classes is not None else None

    @property
    def indices(self) -> list[int]:
        return [issue.index for issue in self]

    @property
    def suggestions(self) -> dict[int, int]:
        """``{index: suggested}``: relabel them all as the model suggests (``cleaned(relabel=...)``)."""
        return {issue.index: issue.suggested for issue in self if issue.suggested is not None}

    def _name(self, c: int | None) -> Any:
        if c is None or self.classes is None or not 0 <= c < len(self.classes):
            return c
        return self.classes[c]

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "index": i.index,
                "given": self._name(i.given),
                "suggested": self._name(i.suggested),
                "score": i.score,
                "confidence": i.confidence,
                "correct": i.correctness,
            }
            for i in self
        ]

    def _repr_html_(self) -> str:
        return f"<div class='nbt-label-issues'>{rows_html(self.rows())}</div>"

    def __str__(self) -> str:
        return "\n".join(str(i) for i in self) if self else "no label issues"

    def __repr__(self) -> str:
        return f"LabelIssues({len(self)} items: {self.indices[:8]}{'...' if len(self) > 8 else ''})"


def _suspects(t: Mapping[str, torch.Tensor], mode: str | None, everyone: bool) -> torch.Tensor:
    """The items a ranking may list: those visited, and for ``label_issues()`` without ``k`` (``everyone`` False)
    outside loss mode only those predicted right in fewer than half of their visits (by score alone, one right in
    2 of 3 visits but with a low probability would outrank one wrong in 2 of 3 and take its place)."""
    seen = t["visits"] > 0
    if not everyone and mode != "loss":
        seen &= t["correctness"] < 0.5
    return seen


def issue_count(t: Mapping[str, torch.Tensor], mode: str | None) -> int:
    """How many items ``rank_issues(t, mode, None)`` lists (``DataMap.label_issue_count``), nothing built."""
    n = int(_suspects(t, mode, everyone=False).sum())
    return max(1, int(0.01 * n)) if mode == "loss" and n else n


def rank_issues(t: dict[str, torch.Tensor], mode: str | None, k: int | None, classes: Any) -> LabelIssues:
    """``DataMap.label_issues``: the items of the map's table ``t`` most suspicious first (its docstring). The
    listed rows' columns are read once each (``tolist``), not item by item: on 100,000 items that was seconds."""
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
        raise ValueError(f"k must be an int >= 0 or None, got {k!r}.")
    seen = _suspects(t, mode, everyone=k is not None)
    score = torch.where(seen, t["score"].nan_to_num(math.inf), -math.inf)
    k = min(issue_count(t, mode) if k is None else k, int(seen.sum()))
    order = torch.argsort(score, descending=True, stable=True)[:k]
    names = ("given", "suggested", "score", "confidence", "variability", "correctness")
    given, suggested, scores, confidence, variability, correctness = (t[n][order].tolist() for n in names)
    labels = mode != "loss"  # loss mode: no class labels to give or suggest
    return LabelIssues(
        [
            LabelIssue(
                index=i,
                given=g if labels and g >= 0 else None,
                suggested=s if labels and s >= 0 else None,
                score=sc,
                confidence=c,
                variability=v,
                correctness=r,
            )
            for i, g, s, sc, c, v, r in zip(
                order.tolist(), given, suggested, scores, confidence, variability, correctness, strict=True
            )
        ],
        classes=classes,
    )


def correctness_colour(value: float) -> str:
    """Red (never right) through amber to blue (always right): the data map's colour scale."""
    if not math.isfinite(value):
        return "#8c959f"
    stops = [(0.0, (207, 34, 46)), (0.5, (191, 135, 0)), (1.0, (9, 105, 218))]
    for (x0, c0), (x1, c1) in itertools.pairwise(stops):
        if value <= x1:
            f = (value - x0) / (x1 - x0)
            r, g, b = (round(a + (b_ - a) * f) for a, b_ in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#0969da"


def scatter_svg(table: dict[str, torch.Tensor], *, width: int = 300, height: int = 240) -> str:
    """Confidence (y) against variability (x), coloured by correctness; a seeded sample of at most 4,000 points."""
    seen = (table["visits"] > 0).nonzero().flatten()
    if len(seen) > _SHOWN:
        pick = torch.randperm(len(seen), generator=torch.Generator().manual_seed(0))[:_SHOWN]
        seen = seen[pick]
    x, y = table["variability"][seen].tolist(), table["confidence"][seen].tolist()
    c = table["correctness"][seen].tolist()
    pad, x_max = 30, max(0.5, max(x, default=0.0))
    w, h = width - pad - 8, height - pad - 8

    def sx(v: float) -> float:
        return pad + w * v / x_max

    def sy(v: float) -> float:
        return 8 + h * (1 - v)

    dots = "".join(
        f"<circle cx='{sx(a):.1f}' cy='{sy(b):.1f}' r='2' fill='{correctness_colour(k)}' fill-opacity='0.7'/>"
        for a, b, k in zip(x, y, c, strict=True)
        if math.isfinite(a) and math.isfinite(b)
    )
    axes = (
        f"<line x1='{pad}' y1='{8 + h}' x2='{pad + w}' y2='{8 + h}' stroke='currentColor' stroke-opacity='0.4'/>"
        f"<line x1='{pad}' y1='8' x2='{pad}' y2='{8 + h}' stroke='currentColor' stroke-opacity='0.4'/>"
        f"<text x='{pad + w / 2}' y='{height - 4}' font-size='10' text-anchor='middle'>variability</text>"
        f"<text x='10' y='{8 + h / 2}' font-size='10' text-anchor='middle' transform='rotate(-90 10 {8 + h / 2})'>"
        "confidence</text>"
        f"<text x='{pad - 3}' y='12' font-size='9' text-anchor='end'>1</text>"
        f"<text x='{pad - 3}' y='{8 + h}' font-size='9' text-anchor='end'>0</text>"
        f"<text x='{pad + w}' y='{8 + h + 10}' font-size='9' text-anchor='end'>{format_number(x_max)}</text>"
    )
    return (
        f"<svg class='nbt-datamap-scatter' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
        f"xmlns='http://www.w3.org/2000/svg'>{axes}{dots}</svg>"
    )


def map_html(
    table: dict[str, torch.Tensor],
    summary: str,
    note: str | None,
    issues: LabelIssues,
    *,
    classes: Sequence[str] | None = None,
) -> str:
    """A data map in a notebook: the summary, its note, the scatter and the top label issues."""
    blocks = [f"<div><b>DataMap</b> · {html.escape(summary)}</div>"]
    if note:
        blocks.append(f"<div class='nbt-datamap-note' style='font-style:italic'>{html.escape(note)}</div>")
    if int((table["visits"] > 0).sum()):
        legend = "colour: correctness (red: never right, blue: always right)"
        picture = f"<div>{scatter_svg(table)}<div style='font-size:10px'>{legend}</div></div>"
        top = f"<div style='margin-left:12px'><div>most suspicious labels</div>{issues._repr_html_()}</div>"
        blocks.append(f"<div style='display:flex;flex-flow:row wrap'>{picture}{top}</div>")
    return f"<div class='nbt-datamap' style='font-size:12px'>{''.join(blocks)}</div>"


def map_gallery(
    table: dict[str, torch.Tensor],
    items: list[int],
    dataset: Any,
    classes: Sequence[str] | None,
    note: str | None,
    *,
    decode: Any = None,
) -> Gallery:
    """``DataMap.show``: the items fetched again from the training set, each captioned from the map's ``table``."""
    if dataset is None:
        shown = f"<div class='nbt-gallery-note'>The items cannot be shown: {note or 'no dataset seen'}.</div>"
        return Gallery(shown, items)
    cards = []
    size = len(dataset)
    for i in items:
        if not 0 <= i < size:  # an index of another dataset (or a typo): said on its card, not raised
            body, caption = "", f"not an item of this training set (0..{size - 1})"
        else:
            body = input_html(dataset[i], decode=decode)
            caption = _caption(table, i, classes) if i < len(table["index"]) else "not in this map"
        cards.append(
            f"<div class='nbt-gallery-item' data-index='{i}' style='margin:0 8px 8px 0;max-width:260px;"
            f"font-size:11px'>{body}<div>#{i} · {html.escape(caption)}</div></div>"
        )
    style = "display:flex;flex-flow:row wrap;align-items:flex-end"
    return Gallery(f"<div class='nbt-gallery' style='{style}'>{''.join(cards)}</div>", items, cards)


def _caption(t: dict[str, torch.Tensor], i: int, classes: Sequence[str] | None) -> str:
    def name(c: int) -> str:
        return str(classes[c]) if classes is not None and 0 <= c < len(classes) else str(c)

    if int(t["visits"][i]) == 0:
        return "not seen yet"
    given, suggested = int(t["given"][i]), int(t["suggested"][i])
    if given < 0:
        return f"mean loss {format_number(float(t['score'][i]))}"
    return (
        f"given {name(given)} · suggested {name(suggested)} · confidence {float(t['confidence'][i]):.2f} · "
        f"right {float(t['correctness'][i]):.0%}"
    )
