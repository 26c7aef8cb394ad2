"""``Interpretation``: what one pass of ``trainer.interpret(loader)`` kept, and the questions it answers.

Per item (sorted by dataset index): its loss, and for a classifier its target, prediction and the probabilities
given to both; a multi-label classifier one 0/1 target and prediction per label; a regression its predictions and
targets (when an item has at most 16 values). Never the inputs: :meth:`Interpretation.show` fetches those again
from the dataset by index, for the few items it shows.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from nbtrainer._data._cleaned import CleanedDataset, DataEdits
from nbtrainer._look._gallery import heatmap_html, input_html, rows_html
from nbtrainer._report._format import format_number

__all__ = ["Gallery", "Interpretation", "ItemTable", "Rows"]

_CLASSIFIERS = ("classification", "binary", "multilabel")


class ItemTable:
    """The per-item columns of a pass, on the CPU, sorted by dataset index: ``index``, ``loss``, and (by task)
    ``target``, ``prediction``, ``p_target``, ``p_prediction``."""

    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        order = torch.argsort(columns["index"], stable=True) if len(columns["index"]) else None
        self.columns = {k: (v[order] if order is not None else v) for k, v in columns.items()}

    def get(self, name: str) -> torch.Tensor | None:
        return self.columns.get(name)

    def __len__(self) -> int:
        return len(self.columns["index"])


class Rows(list):  # list[dict[str, Any]] with a notebook display
    """A list of dict rows that displays as a table in a notebook (``to_pandas()`` with pandas installed)."""

    def _repr_html_(self) -> str:
        return rows_html(self)

    def to_pandas(self) -> Any:
        from nbtrainer._optional import import_optional

        pd = import_optional("pandas", "Rows.to_pandas()", "pip install pandas")
        return pd.DataFrame(list(self))


class Gallery:
    """Items of an :class:`Interpretation` with their inputs fetched back from the dataset (``html``, displayed
    in a notebook)."""

    def __init__(self, html_text: str, indices: list[int], cards: list[str] | None = None) -> None:
        self.html = html_text
        self.indices = indices
        self.cards = cards if cards is not None else []  # each item's own HTML (a cleaner puts controls beside it)

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"Gallery(items={self.indices})"


class Interpretation:
    """Error analysis of a model over a loader (from :meth:`nbtrainer.Trainer.interpret`).

    Attributes:
        task: ``"classification"``, ``"binary"``, ``"multilabel"``, ``"regression"``, ``"lm"`` (a causal language
            model: each sequence's mean token loss), ``"tokens"`` or ``"other"`` (losses only).
        losses: one loss per item, by dataset index (``indices[i]`` is the index of ``losses[i]``; when the pass saw
            the whole dataset, ``losses[i]`` is item ``i``'s).
        indices: the dataset index of each item (the position in the loader when it cannot be indexed).
        classes: the class (or label) names, when known.

    Example:
        >>> import torch
        >>> from nbtrainer import Trainer
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> model = torch.nn.Linear(4, 3)
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False, run_store=False)
        >>> x, y = torch.randn(20, 4), torch.randint(0, 3, (20,))
        >>> interp = trainer.interpret((x, y), batch_size=8)
        >>> interp.task, len(interp.losses), int(interp.confusion_matrix().sum())
        ('classification', 20, 20)
        >>> sorted(interp.top_losses(2)[0])
        ['index', 'loss', 'prediction', 'probability', 'target']
    """

    def __init__(
        self,
        items: ItemTable,
        *,
        task: str,
        n_classes: int | None = None,
        classes: Sequence[Any] | None = None,
        dataset: Any = None,
        decode: Any = None,
        feature_names: Sequence[str] | None = None,
        layout: tuple[Any, bool] = (None, False),
    ) -> None:
        self.items, self.task, self.dataset = items, task, dataset
        self._layout = layout  # (BatchSpec, compute_loss given): where an item's label is, for cleaned(relabel=)
        self.decode, self.feature_names = decode, feature_names
        target = items.get("target")
        if task == "multilabel" and target is not None:
            n_classes = int(target.shape[1])
        self.n_classes = n_classes
        if classes is not None and n_classes is not None and len(classes) != n_classes:
            raise ValueError(f"classes= names {len(classes)} classes, the model predicts {n_classes}.")
        self.classes: list[str] | None = [str(c) for c in classes] if classes is not None else None
        self.edits = DataEdits()  # keep / relabel / drop per item: the panel's cleaner in the errors view

    # -- the columns -------------------------------------------------------------------------------
    @property
    def losses(self) -> torch.Tensor:
        return self.items.columns["loss"]

    @property
    def indices(self) -> torch.Tensor:
        return self.items.columns["index"]

    @property
    def targets(self) -> torch.Tensor | None:
        return self.items.get("target")

    @property
    def predictions(self) -> torch.Tensor | None:
        return self.items.get("prediction")

    def _name(self, c: int) -> str | int:
        return self.classes[c] if self.classes is not None and 0 <= c < len(self.classes) else c

    def _labeled(self) -> torch.Tensor:
        """Per item: its target is a class (not an ignored label such as CrossEntropyLoss's -100)."""
        target = self.targets
        assert target is not None
        if self.task != "classification" or self.n_classes is None:
            return torch.ones(len(target), dtype=torch.bool)
        return (target >= 0) & (target < self.n_classes)

    def _labels(self) -> list[str]:
        return [str(self._name(c)) for c in range(self.n_classes or 0)]

    def _needs_classes(self, what: str) -> None:
        if self.task not in _CLASSIFIERS or self.targets is None:
            raise ValueError(
                f"{what} is for classifiers; this interpretation is of a {self.task!r} task (its per-item losses, "
                "top_losses() and show() apply)."
            )

    # -- the questions -----------------------------------------------------------------------------
    def top_losses(self, k: int = 9, largest: bool = True) -> Rows:
        """The ``k`` items with the largest (``largest=False``: smallest) loss: ``index``, ``loss``, and for a
        classifier ``target``, ``prediction`` and ``probability`` (given to the target); for a regression
        ``target``, ``prediction`` and ``residual`` (prediction - target); for a language model ``perplexity``."""
        losses = torch.nan_to_num(self.losses, nan=-math.inf if largest else math.inf)
        k = min(int(k), len(losses))
        picked = torch.topk(losses, k, largest=largest).indices.tolist() if k else []
        return Rows(self._row(i) for i in picked)

    def _row(self, i: int) -> dict[str, Any]:
        row: dict[str, Any] = {"index": int(self.indices[i]), "loss": float(self.losses[i])}
        target, pred, p = self.targets, self.predictions, self.items.get("p_target")
        if self.task in ("classification", "binary") and target is not None and pred is not None:
            row.update(target=self._name(int(target[i])), prediction=self._name(int(pred[i])))
            row["probability"] = float(p[i]) if p is not None else None
        elif self.task == "multilabel" and target is not None and pred is not None:
            row["target"] = [self._name(j) for j in target[i].nonzero().flatten().tolist()]
            row["prediction"] = [self._name(j) for j in pred[i].nonzero().flatten().tolist()]
            row["probability"] = float(p[i]) if p is not None else None
        elif self.task == "regression" and target is not None and pred is not None:
            t, y = target[i], pred[i]
            row["target"] = float(t[0]) if t.numel() == 1 else t.tolist()
            row["prediction"] = float(y[0]) if y.numel() == 1 else y.tolist()
            residual = y - t
            row["residual"] = float(residual[0]) if residual.numel() == 1 else float(residual.abs().max())
        elif self.task == "lm":
            row["perplexity"] = math.exp(min(row["loss"], 700.0))
        return row

    def confusion_matrix(self) -> torch.Tensor:
        """Counts, rows the target and columns the prediction: ``(C, C)``; for multi-label targets one ``2 x 2``
        matrix per label, ``(L, 2, 2)`` (``[[true negatives, false positives], [false negatives, true positives]]``)."""
        self._needs_classes("confusion_matrix()")
        target, pred = self.targets, self.predictions
        assert target is not None and pred is not None
        if self.task == "multilabel":
            t, y = target.long(), pred.long()
            cells = torch.stack([(1 - t) * (1 - y), (1 - t) * y, t * (1 - y), t * y], dim=-1).sum(0)
            return cells.reshape(-1, 2, 2)
        keep = self._labeled()
        target, pred = target[keep], pred[keep]
        n = self.n_classes or (int(max(int(target.max()), int(pred.max())) + 1) if len(target) else 0)
        return torch.bincount(target.long() * n + pred.long(), minlength=n * n).reshape(n, n)

    def most_confused(self, k: int = 10, min_count: int = 1) -> list[tuple[Any, Any, int]]:
        """The ``k`` most frequent mistakes as ``(target, predicted, count)``, most frequent first; multi-label:
        ``(label, "missed" | "false alarm", count)``."""
        matrix = self.confusion_matrix()
        found: list[tuple[Any, Any, int]] = []
        if self.task == "multilabel":
            for label, m in enumerate(matrix.tolist()):
                found += [(self._name(label), "missed", m[1][0]), (self._name(label), "false alarm", m[0][1])]
        else:
            counts = matrix.tolist()
            found = [
                (self._name(i), self._name(j), n) for i, row in enumerate(counts) for j, n in enumerate(row) if i != j
            ]
        found = [f for f in found if f[2] >= min_count]
        found.sort(key=lambda f: -f[2])
        return found[: int(k)]

    def most_confused_html(self, k: int = 10) -> str:
        """:meth:`most_confused` as a small table with its title (what a notebook, the report and the panel show;
        empty for a task without classes)."""
        if self.task not in _CLASSIFIERS or self.targets is None:
            return ""
        columns = ("label", "mistake") if self.task == "multilabel" else ("target", "predicted")
        rows = [{columns[0]: a, columns[1]: b, "count": n} for a, b, n in self.most_confused(k)]
        return "<div class='nbt-most-confused'><div>most confused</div>" + rows_html(rows) + "</div>"

    def per_class(self) -> Rows:
        """Per class (per label for multi-label): ``precision``, ``recall``, ``f1`` and ``support`` (its items)."""
        matrix = self.confusion_matrix()
        rows = Rows()
        if self.task == "multilabel":
            stats = [(m[1][1], m[0][1], m[1][0]) for m in matrix.tolist()]
        else:
            m = matrix.tolist()
            stats = [(m[c][c], sum(r[c] for r in m) - m[c][c], sum(m[c]) - m[c][c]) for c in range(len(m))]
        for c, (tp, fp, fn) in enumerate(stats):
            precision = tp / (tp + fp) if tp + fp else 0.0
            recall = tp / (tp + fn) if tp + fn else 0.0
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            row = {"class": self._name(c), "precision": precision, "recall": recall, "f1": f1, "support": tp + fn}
            rows.append(row)
        return rows

    def where(self, target: int | None = None, prediction: int | None = None) -> list[int]:
        """Dataset indices of the items with this target and / or prediction (class numbers), largest loss first
        (a confusion-matrix cell's examples)."""
        self._needs_classes("where()")
        keep = torch.ones(len(self.losses), dtype=torch.bool)
        if self.task == "multilabel":
            raise ValueError("where() picks a cell of a multi-class matrix; for multi-label use top_losses().")
        if target is not None:
            keep &= self.targets == int(target)
        if prediction is not None:
            keep &= self.predictions == int(prediction)
        picked = keep.nonzero().flatten()
        order = torch.argsort(self.losses[picked], descending=True)
        return [int(self.indices[i]) for i in picked[order].tolist()]

    def cleaned(
        self,
        dataset: Any = None,
        *,
        drop: Iterable[Any] | None = None,
        relabel: Mapping[Any, Any] | None = None,
        target: int | str | None = None,
    ) -> CleanedDataset:
        """``dataset`` (default: the one interpreted) without the items dropped and with the ones relabeled, in the
        panel's cleaner (:attr:`edits`) and here (``drop``: indices or a boolean mask, ``relabel``: ``{index:
        label}``), as a view for the next fit: nothing is copied (``nbtrainer.CleanedDataset``). The new labels go
        where the Trainer read each item's label (its ``num_inputs=`` / ``target_keys=``), or at ``target=`` (a
        position in each item, or a key) where it cannot tell (a ``compute_loss=``).

        Example:
            >>> # clean_val = interp.cleaned(drop=[r["index"] for r in interp.top_losses(5)])
        """
        dataset = dataset if dataset is not None else self.dataset
        if dataset is None:
            raise ValueError(
                "cleaned(): this interpretation has no dataset to index (a list of batches or an IterableDataset was "
                "interpreted); pass the dataset: interp.cleaned(dataset, drop=[...])."
            )
        spec, custom = self._layout
        # a new label past the model's classes would fail the next fit at its batch, after the steps before
        classes = self.n_classes if self.task == "classification" else 2 if self.task == "binary" else None
        return self.edits.cleaned(
            dataset, drop=drop, relabel=relabel, target=target, spec=spec, custom=custom, classes=classes
        )

    # -- pictures ----------------------------------------------------------------------------------
    def show(self, items: Sequence[int] | None = None, k: int = 9, *, decode: Any = None) -> Gallery:
        """A gallery of items (dataset indices, at most ``k`` of them; default: the ``k`` largest losses), each
        input fetched again from the dataset: pictures, text (``decode=``: a function or a tokenizer) or tabular
        rows (``feature_names``), captioned with its loss, target and prediction."""
        if items is None:
            items = [r["index"] for r in self.top_losses(k)]
        items = [int(i) for i in items][: max(int(k), 0) if k is not None else None]
        if self.dataset is None:
            note = (
                "<div class='nbt-gallery-note'>The items cannot be shown: the loader is not a DataLoader over a "
                "dataset that can be indexed (a list of batches, an IterableDataset...), so an item cannot be "
                "fetched again. The losses, top_losses() and confusion_matrix() hold all the same; pass "
                "DataLoader(dataset) to see the inputs.</div>"
            )
            return Gallery(note, items)
        position = {int(ix): i for i, ix in enumerate(self.indices.tolist())}
        decode = decode if decode is not None else self.decode
        cards = []
        for ix in items:
            i = position.get(ix)
            parts = [f"#{ix}", *(self._caption_parts(i) if i is not None else ["not in this interpretation"])]
            # each part on one line ("p(true) 0.06" never splits, nor lands alone on a line of its own)
            caption = " · ".join(f"<span style='white-space:nowrap'>{html.escape(p)}</span>" for p in parts)
            body = input_html(self.dataset[ix], decode=decode, feature_names=self.feature_names)
            cards.append(
                f"<div class='nbt-gallery-item' style='margin:0 8px 8px 0;max-width:260px;font-size:11px'>{body}"
                f"<div class='nbt-gallery-caption'>{caption}</div></div>"
            )
        # tops aligned: the pictures of a row sit at one height whatever their captions' lengths
        style = "display:flex;flex-flow:row wrap;align-items:flex-start"
        return Gallery(f"<div class='nbt-gallery' style='{style}'>{''.join(cards)}</div>", items, cards)

    def _caption_parts(self, i: int) -> list[str]:
        row = self._row(i)
        parts = [f"loss {format_number(row['loss'])}"]
        if "target" in row:
            parts += [f"true {_short(row['target'])}", f"pred {_short(row['prediction'])}"]
        if row.get("probability") is not None:
            parts.append(f"p(true) {row['probability']:.2f}")
        if "residual" in row:
            parts.append(f"residual {format_number(row['residual'])}")
        return parts

    # -- display -----------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line: the task, the items, the mean loss (and a classifier's accuracy)."""
        finite = self.losses[torch.isfinite(self.losses)]
        mean = float(finite.mean()) if len(finite) else math.nan
        parts = [self.task, f"{len(self.losses):,} items", f"mean loss {format_number(mean)}"]
        if self.task in ("classification", "binary") and self.targets is not None and self.predictions is not None:
            keep = self._labeled()
            right = (self.targets == self.predictions)[keep]
            if len(right):
                parts.append(f"accuracy {float(right.float().mean()):.3f}")
        return " · ".join(parts)

    def _repr_html_(self) -> str:
        blocks = [f"<div><b>Interpretation</b> · {html.escape(self.summary())}</div>"]
        if self.task in _CLASSIFIERS and self.targets is not None:
            matrix = self.confusion_matrix()
            if self.task != "multilabel" and len(matrix) <= 30:
                blocks.append(heatmap_html(matrix, self._labels(), title="confusion matrix"))
            else:
                blocks.append(self.most_confused_html(10))
            blocks.append("<div style='margin-top:6px'>per class</div>" + rows_html(self.per_class()))
        blocks.append("<div style='margin-top:6px'>top losses</div>" + rows_html(self.top_losses(9)))
        return f"<div class='nbt-interpretation' style='font-size:12px'>{''.join(blocks)}</div>"

    def __repr__(self) -> str:
        return f"Interpretation({self.summary()})"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, list):
        return "{" + ", ".join(_short(v) for v in value[:6]) + ("..." if len(value) > 6 else "") + "}"
    return str(value)
