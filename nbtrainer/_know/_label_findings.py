"""The findings about a check's targets: labels the model has no output for (refused before the first step), classes
much rarer than others, outputs no training item has as its label, validation classes training lacks; and the notes
on how the targets were read (class labels, class probabilities, a tuple's first part, multi-label)."""

from __future__ import annotations

import numpy as np

from nbtrainer._know._data_report import DataProblem, few, is_are, items_text, plural
from nbtrainer._know._stats import Split

__all__ = ["IMBALANCE", "imbalance", "label_range", "missing_classes", "target_notes", "unseen_classes"]

#: A split's largest class over its smallest, from which the imbalance is reported.
IMBALANCE = 5.0


def missing_classes(train: Split, val: Split | None, outputs: int | None) -> list[DataProblem]:
    """Classes the model has an output for and the training data no item of (class numbers from 0); those the
    validation data has are ``unseen_class``'s."""
    if train.targets.kind != "labels" or outputs is None or outputs < 2 or train.sampled:
        return []
    in_val = val.targets.counts if val is not None and val.targets.kind == "labels" else {}
    missing = [c for c in range(outputs) if not train.targets.counts.get(c) and not in_val.get(c)]
    if not missing or len(missing) == outputs:
        return []
    return [
        DataProblem(
            "missing_class",
            f"{plural(len(missing), 'class')} of the model's {outputs} outputs {is_are(len(missing))} never a training "
            f"label (class{'' if len(missing) == 1 else 'es'} {few(missing)}): the model will never predict "
            f"{'it' if len(missing) == 1 else 'them'}.",
            "Check the labels are 0-based and complete, or give the model as many outputs as there are classes.",
            {"classes": missing, "outputs": outputs},
            level="warning",
        )
    ]


def imbalance(train: Split, outputs: int | None, ignore: int) -> list[DataProblem]:
    if train.targets.kind == "binary":
        return _binary_imbalance(train)
    counts = {k: v for k, v in train.targets.counts.items() if k != ignore and (outputs is None or 0 <= k < outputs)}
    if train.targets.kind != "labels" or len(counts) < 2:
        return []
    present = {k: v for k, v in counts.items() if v > 0}
    big, small = max(present, key=lambda k: present[k]), min(present, key=lambda k: present[k])
    ratio = present[big] / present[small]
    if ratio < IMBALANCE:
        return []
    total = sum(present.values())
    n_classes = outputs or (max(present) + 1)
    weights = [round(total / (len(present) * present[c]), 3) if present.get(c) else 0.0 for c in range(n_classes)]
    return [
        DataProblem(
            "imbalance",
            f"class {small} has {plural(present[small], 'training item')}, class {big} {present[big]:,} ({ratio:.1f} "
            "to 1): a model can score well by ignoring the rare classes.",
            f"Weight the loss: CrossEntropyLoss(weight=torch.tensor({weights})), or sample evenly: "
            "WeightedRandomSampler(weights=1 / count[label] per item); watch per-class scores "
            "(interpret().per_class()).",
            {"counts": dict(sorted(present.items())), "ratio": ratio, "weights": weights},
            level="warning",
        )
    ]


def _binary_imbalance(train: Split) -> list[DataProblem]:
    pos, neg = train.targets.counts.get(1, 0), train.targets.counts.get(0, 0)
    if not pos or not neg:
        return []
    ratio = max(pos, neg) / min(pos, neg)
    if ratio < IMBALANCE:
        return []
    rare = "positive" if pos < neg else "negative"
    return [
        DataProblem(
            "imbalance",
            f"{plural(pos, 'positive training item')} against {neg:,} negative ({ratio:.1f} to 1): a model can score "
            f"well by predicting the {'negative' if rare == 'positive' else 'positive'} class every time.",
            f"Weight the positives: BCEWithLogitsLoss(pos_weight=torch.tensor([{neg / pos:.3g}])) (negatives / "
            "positives), or sample evenly with a WeightedRandomSampler; watch precision and recall, not accuracy.",
            {"counts": {0: neg, 1: pos}, "ratio": ratio, "pos_weight": neg / pos},
            level="warning",
        )
    ]


def label_range(splits: list[Split], outputs: int, ignore: int) -> list[DataProblem]:
    problems = []
    for split in splits:
        if split.targets.kind not in ("labels", "other"):  # 0/1 floats of a binary head: not class numbers
            continue
        bad = sorted(k for k in split.targets.counts if k != ignore and not 0 <= k < outputs)
        if not bad:
            continue
        _, indices, labels = split.hashes.arrays()
        wrong = indices[np.isin(labels, bad)].tolist() if split.targets.kind == "labels" else []
        n = sum(split.targets.counts[k] for k in bad)
        where = "training" if split.name == "train" else "validation"
        problems.append(
            DataProblem(
                "label_range",
                f"{where} labels {few(bad)} are outside the model's {outputs} outputs (0..{outputs - 1}): "
                f"{plural(n, 'item' if split.targets.kind == 'labels' else 'value')}"
                + (f", e.g. {items_text(sorted(wrong))}." if wrong else "."),
                (
                    f"Give the model {max(bad) + 1} outputs (its last layer as wide as the number of classes) or map "
                    f"the labels to 0..{outputs - 1} (0-based class numbers)."
                    if min(bad) >= 0
                    else f"Map the labels to 0..{outputs - 1} (0-based class numbers); a label to leave out of the "
                    f"loss is {ignore} (the criterion's ignore_index)."
                ),
                {"split": split.name, "labels": bad, "outputs": outputs, "indices": sorted(wrong)},
            )
        )
    return problems


def unseen_classes(train: Split, val: Split, ignore: int) -> list[DataProblem]:
    if train.targets.kind != "labels" or val.targets.kind != "labels":
        return []
    missing = sorted(k for k in val.targets.counts if k not in train.targets.counts and k != ignore)
    if not missing:
        return []
    _, indices, labels = val.hashes.arrays()
    items = sorted(indices[np.isin(labels, missing)].tolist())
    n = sum(val.targets.counts[k] for k in missing)
    said, advice, level = (
        f"validation has classes {few(missing)} that the training data lacks ({plural(n, 'item')}): the model cannot "
        "learn them.",
        "Move some of their items into training, or drop them from validation (check the split is stratified).",
        "problem",
    )
    if train.sampled:  # a rare class may be in the training items the sample left out: not a finding to act on
        of = f" of {train.of:,}" if train.of else ""
        said = (
            f"validation has classes {few(missing)} ({plural(n, 'item')}) that none of the {train.items:,} training "
            f"items sampled{of} has: check_data(max_items=None) reads every training item to tell whether training "
            "lacks them."
        )
        advice, level = f"If training lacks them: {advice[0].lower()}{advice[1:]}", "warning"
    return [DataProblem("unseen_class", said, advice, {"classes": missing, "indices": items}, level=level)]


def target_notes(split: Split, *, train: bool) -> list[str]:
    """Plain statements on how a split's targets were read (a tuple's first part, class probabilities) or why the
    class checks skipped them (``train``: the training split, whose skipped checks are said once)."""
    t, notes = split.targets, []
    if t.parts and train:
        notes.append(
            f"{split.name}: targets are a tuple of {t.parts} (a label and per-item extras, such as a weight): the "
            "class checks read its first part"
        )
    if t.kind == "labels" and t.probabilities and t.values.items:
        notes.append(
            f"{split.name}: targets are class probabilities (float rows with CrossEntropyLoss): each item is counted "
            "as its largest class"
        )
    elif t.kind == "multilabel":
        notes.append(f"{split.name}: multi-label targets (0/1 per label): per-label counts only")
    elif t.kind in ("none", "other") and train:
        notes.append(f"{split.name}: targets are not one class label per item: class checks skipped")
    return notes
