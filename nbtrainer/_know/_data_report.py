"""What ``check_data`` tells: :class:`DataProblem` (one finding, with its advice and the items it concerns) and
:class:`DataReport` (the findings, the lights, what was read and how), as text, HTML and plain data."""

from __future__ import annotations

import dataclasses
import html
from typing import Any

from nbtrainer._look._gallery import rows_html
from nbtrainer._report._format import format_number

__all__ = ["AREAS", "KINDS", "DataProblem", "DataReport", "few", "is_are", "items_text", "plural"]

#: What a problem can be about, and the light (area) of the panel's data section it belongs to.
KINDS: dict[str, str] = {
    "duplicates_across": "duplicates",  # validation items that are also training items (a leak)
    "duplicates_within": "duplicates",  # copies of the same item inside one split
    "conflicting_labels": "duplicates",  # the same inputs with different labels
    "nonfinite": "values",  # NaN / Inf in inputs or targets
    "scale": "scale",  # inputs far from normalized
    "constant": "scale",  # features with one value over every item
    "shift": "scale",  # validation inputs on another scale than training's (prepared differently)
    "imbalance": "targets",  # a class much rarer than another
    "label_range": "targets",  # labels the model has no output for (refused before the first step)
    "unseen_class": "targets",  # validation classes that training lacks
    "missing_class": "targets",  # outputs of the model no training item has as its label
    "unreadable": "values",  # a field that is not a tensor, or a batch that could not be split
}
#: The data section's lights, in the order the panel shows them.
AREAS: tuple[str, ...] = ("duplicates", "values", "scale", "targets")
_RANK = {"ok": 0, "warning": 1, "problem": 2}
# the theme's own colours in JupyterLab, these elsewhere
_COLOURS = {"ok": "var(--jp-success-color1, #1a7f37)", "warning": "var(--jp-warn-color1, #9a6700)",
            "problem": "var(--jp-error-color1, #cf222e)"}  # fmt: skip


SHOWN = 8  # indices quoted in a message


def few(values: list[Any]) -> str:
    """The first values of a list, and how many more: how a message quotes indices or classes."""
    shown = ", ".join(str(v) for v in values[:SHOWN])
    return shown + (f" and {len(values) - SHOWN:,} more" if len(values) > SHOWN else "")


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def is_are(count: int) -> str:
    return "is" if count == 1 else "are"


def items_text(values: list[Any]) -> str:
    return f"item{'' if len(values) == 1 else 's'} {few(values)}"


@dataclasses.dataclass
class DataProblem:
    """One finding of :meth:`nbtrainer.Trainer.check_data`.

    Attributes:
        kind: one of :data:`KINDS`: ``"duplicates_across"``, ``"duplicates_within"``, ``"conflicting_labels"``,
            ``"nonfinite"``, ``"scale"``, ``"constant"``, ``"shift"``, ``"imbalance"``, ``"label_range"``,
            ``"unseen_class"``, ``"missing_class"``, ``"unreadable"``.
        message: what was found, where and how many items, in one sentence.
        advice: what to do about it (empty when there is nothing to do).
        data: the numbers behind it, plain values: the dataset ``indices`` concerned (``train_indices`` /
            ``val_indices`` for a leak, ``groups`` of copies), ``field``, ``features``, ``counts``, ``labels``...
        level: ``"problem"`` (``label_range`` refuses the fit) or ``"warning"``.

    Example:
        >>> p = DataProblem("imbalance", "class 1 has 5 items, class 0 95", "weight the loss", {"ratio": 19.0})
        >>> p.area, str(p)
        ('targets', 'data problem: class 1 has 5 items, class 0 95 weight the loss')
    """

    kind: str
    message: str
    advice: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    level: str = "problem"

    @property
    def area(self) -> str:
        """The light this problem belongs to (:data:`KINDS`)."""
        return KINDS.get(self.kind, "values")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        tail = f" {self.advice}" if self.advice else ""
        return f"data {self.level}: {self.message}{tail}"

    def _repr_html_(self) -> str:
        advice = f"<br><i>{html.escape(self.advice)}</i>" if self.advice else ""
        return (
            f"<div class='nbt-data-problem nbt-data-problem-{html.escape(self.level)}' data-kind='"
            f"{html.escape(self.kind)}' style='font-size:12px;border-left:3px solid {_COLOURS.get(self.level, '')};"
            f"padding:1px 8px;margin:2px 0'><b>{html.escape(self.kind)}</b>: {html.escape(self.message)}{advice}</div>"
        )


class DataReport:
    """The findings of one data check (:meth:`nbtrainer.Trainer.check_data`).

    Attributes:
        problems: the :class:`DataProblem` list, the ones that matter most first.
        splits: per split (``"train"``, ``"val"``): ``items`` read, ``of`` (the split's size when known, else None),
            ``sampled`` (True when ``max_items`` took a seeded sample), ``fields`` (per input field: dtype, shape,
            mean, std, min, max), ``targets`` (what they are) and ``classes`` (``{label: count}``).
        outputs: the model's number of outputs per item (its classes), when the first batch told.
        notes: plain statements about what was not or could not be checked.

    Example:
        >>> import torch
        >>> from nbtrainer import Trainer
        >>> model = torch.nn.Linear(4, 3)
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
        >>> x, y = torch.randn(40, 4, generator=torch.Generator().manual_seed(0)), torch.arange(40) % 3
        >>> report = trainer.check_data((x, y), (x[:10], y[:10]))
        >>> [p.kind for p in report.problems]
        ['duplicates_across']
        >>> report.problems[0].data["val_indices"][:3]
        [0, 1, 2]
    """

    def __init__(
        self,
        problems: list[DataProblem],
        splits: dict[str, dict[str, Any]],
        *,
        outputs: int | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.problems = sorted(problems, key=lambda p: -_RANK.get(p.level, 1))
        self.splits = splits
        self.outputs = outputs
        self.notes = list(notes or [])
        self.sources: tuple[Any, Any] | None = None  # the loaders checked (a fit reuses the report of the same ones)
        self.max_items: int | None = None

    @property
    def ok(self) -> bool:
        """No finding at the ``"problem"`` level."""
        return not any(p.level == "problem" for p in self.problems)

    def by_kind(self, kind: str) -> list[DataProblem]:
        return [p for p in self.problems if p.kind == kind]

    def lights(self) -> dict[str, str]:
        """Per area (:data:`AREAS`): ``"ok"``, ``"warning"`` or ``"problem"`` (the worst of its findings)."""
        levels = dict.fromkeys(AREAS, "ok")
        for p in self.problems:
            if _RANK.get(p.level, 1) > _RANK[levels.get(p.area, "ok")]:
                levels[p.area] = p.level
        return levels

    def to_dict(self) -> dict[str, Any]:
        return {
            "problems": [p.to_dict() for p in self.problems],
            "splits": self.splits,
            "outputs": self.outputs,
            "notes": self.notes,
        }

    # -- display -----------------------------------------------------------------------------------
    def summary(self) -> str:
        parts = []
        for name, split in self.splits.items():
            of = split.get("of")
            read = f"{split['items']:,}"
            if split.get("sampled"):
                read = f"{read} sampled of {of:,}" if of else f"first {read}"
            parts.append(f"{name} {read} items")
        found = (
            f"{len(self.problems)} finding{'s' if len(self.problems) != 1 else ''}" if self.problems else "no problem"
        )
        return " · ".join([*parts, found])

    def __repr__(self) -> str:
        return f"DataReport({self.summary()})"

    def __str__(self) -> str:
        lines = [f"data check: {self.summary()}"]
        lines += [f"  {p}" for p in self.problems]
        lines += [f"  note: {n}" for n in self.notes]
        for name, split in self.splits.items():
            for field, s in split.get("fields", {}).items():
                head = f"  {name} {field}: {s['dtype']} {list(s['shape'])}"
                if s["mean"] != s["mean"]:  # NaN: an integer field (token ids, indices) has no moments
                    lines.append(head)
                    continue
                lines.append(
                    f"{head} mean {format_number(s['mean'])} std {format_number(s['std'])} min "
                    f"{format_number(s['min'])} max {format_number(s['max'])}"
                )
            if split.get("classes"):
                counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(split["classes"].items())[:20])
                lines.append(f"  {name} classes: {counts}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        # a light is a coloured disc (not a coloured glyph: text in those colours is too faint on a dark theme), the
        # text keeps the page's colour; a finding's level is the colour of its left border
        lights = "".join(
            f"<span class='nbt-data-light nbt-data-{level}' title='{html.escape(area)}: {level}' style='display:"
            f"inline-flex;align-items:center;gap:5px;margin-right:12px'><span style='width:10px;height:10px;"
            f"border-radius:50%;background:{_COLOURS[level]}'></span>{html.escape(area)}</span>"
            for area, level in self.lights().items()
        )
        blocks = [f"<div><b>Data check</b> · {html.escape(self.summary())}</div>", f"<div>{lights}</div>"]
        if self.problems:
            blocks.append("<div style='margin:4px 0'>" + "".join(p._repr_html_() for p in self.problems) + "</div>")
        rows = [
            {
                "split": name,
                "field": field,
                "dtype": s["dtype"],
                "shape": str(list(s["shape"])),
                # an integer field (token ids, indices) has no moments (NaN): blank, as the text form leaves them out
                **{k: s[k] if s["mean"] == s["mean"] else "" for k in ("mean", "std", "min", "max")},
            }
            for name, split in self.splits.items()
            for field, s in split.get("fields", {}).items()
        ]
        if rows:
            blocks.append(rows_html(rows))
        for note in self.notes:
            blocks.append(f"<div class='nbt-data-note'>{html.escape(note)}</div>")
        return f"<div class='nbt-data-report' style='font-size:12px'>{''.join(blocks)}</div>"
