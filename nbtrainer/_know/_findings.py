"""From the statistics of a data check's splits to its findings: each :class:`DataProblem` with its message, advice
and the items it concerns (dataset indices), plus plain notes on what could not be checked. The inputs' findings
(duplicates, leaks, NaN / Inf, scale, constant features, a shifted validation set) are here; the targets' are
``_label_findings``'."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from nbtrainer._know._data_report import DataProblem, few, is_are, items_text, plural
from nbtrainer._know._label_findings import imbalance, label_range, missing_classes, target_notes, unseen_classes
from nbtrainer._know._stats import Split
from nbtrainer._report._format import format_number

__all__ = ["findings"]


def _groups(hashes: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    """Indices of the items sharing a hash, one array per group of two or more, in dataset order."""
    if len(hashes) < 2:
        return []
    order = np.lexsort((indices, hashes))
    h, ix = hashes[order], indices[order]
    cuts = np.flatnonzero(h[1:] != h[:-1]) + 1
    return [g for g in np.split(ix, cuts) if len(g) > 1]


def _duplicates(split: Split) -> list[DataProblem]:
    hashes, indices, labels = split.hashes.arrays()
    groups = _groups(hashes, indices)
    if not groups:
        return []
    copies = sorted(int(i) for g in groups for i in g[1:])
    where = "training" if split.name == "train" else "validation"
    name = "train_set" if split.name == "train" else "val_set"
    problems = [
        DataProblem(
            "duplicates_within",
            f"{plural(len(copies), where + ' item')} "
            f"{'is an exact copy of another' if len(copies) == 1 else 'are exact copies of others'} "
            f"({plural(len(groups), 'group')}; e.g. {items_text([int(i) for i in groups[0]])}).",
            "Copies weigh those items more and inflate scores on them: drop them, e.g. "
            f"{name} = nbtrainer.CleanedDataset.of({name}, drop=report.by_kind('duplicates_within')[0].data['indices']"
            ").",
            {
                "split": split.name,
                "count": len(copies),
                "indices": copies,
                "groups": [[int(i) for i in g] for g in groups[:100]],
            },
            level="warning",
        )
    ]
    if split.targets.kind == "labels":
        label_of = dict(zip(indices.tolist(), labels.tolist(), strict=True))
        clashes = [g for g in groups if len({label_of[int(i)] for i in g}) > 1]
        if clashes:
            items = sorted(int(i) for g in clashes for i in g)
            example = ", ".join(f"#{int(i)}: {label_of[int(i)]}" for i in clashes[0][:4])
            problems.append(
                DataProblem(
                    "conflicting_labels",
                    f"{plural(len(items), where + ' item')} {is_are(len(items))} copies with different labels "
                    f"({plural(len(clashes), 'group')}; e.g. {example}).",
                    "At most one label of each group can be right: relabel or drop the others.",
                    {"split": split.name, "indices": items, "groups": [[int(i) for i in g] for g in clashes[:100]]},
                    level="warning",
                )
            )
    return problems


def _across(train: Split, val: Split) -> list[DataProblem]:
    th, ti, _ = train.hashes.arrays()
    vh, vi, _ = val.hashes.arrays()
    if not len(th) or not len(vh):
        return []
    order = np.argsort(th, kind="stable")
    sorted_h = th[order]
    pos = np.searchsorted(sorted_h, vh)
    pos = np.minimum(pos, len(sorted_h) - 1)
    hit = sorted_h[pos] == vh
    if not hit.any():
        return []
    val_ix = vi[hit].tolist()
    train_ix = ti[order][pos[hit]].tolist()
    pairs = sorted(zip(val_ix, train_ix, strict=True))
    n = len(pairs)
    verb = "is an exact copy" if n == 1 and not train.sampled else "are exact copies"
    # a sampled training split finds only the copies of the items it read: a floor, not a count
    floor = "at least " if train.sampled else ""
    sample = (
        f" (found among {train.items:,} training items sampled of {train.of:,}: check_data(max_items=None) counts "
        "them all)"
        if train.sampled and train.of
        else ""
    )
    return [
        DataProblem(
            "duplicates_across",
            f"{floor}{n:,} of {val.items:,} validation items ({floor}{percent(n, val.items)}) {verb} of training items "
            f"(e.g. validation {pairs[0][0]} = training {pairs[0][1]}){sample}: validation scores will read too high.",
            "Remove them from the validation set (or from training) before trusting its scores: val_set = "
            "nbtrainer.CleanedDataset.of(val_set, drop=report.by_kind('duplicates_across')[0].data['val_indices']) "
            "(arrays: keep the other rows).",
            {"count": n, "val_indices": [p[0] for p in pairs], "train_indices": [p[1] for p in pairs]},
        )
    ]


def percent(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage that reads 100% only when all are, and 0% only when none is: 199 copies
    among 200 items are not "100%" (a user would look for the one missing and not find it).

    Example:
        >>> percent(199, 200), percent(100, 100), percent(1, 3), percent(1, 5000), percent(0, 7)
        ('99.5%', '100%', '33%', '0.02%', '0%')
    """
    share = part / max(whole, 1)
    if not 0 < part < whole:
        return f"{share:.0%}"
    for digits in (0, 1, 2):
        text = f"{share:.{digits}%}"
        if 0 < float(text[:-1]) < 100:
            return text
    return ">99.99%" if share > 0.5 else "<0.01%"


def _field_name(split: Split, field: str) -> str:
    return f"{'training' if split.name == 'train' else 'validation'} {field}"


def _values(split: Split) -> list[DataProblem]:
    problems = []
    fields = dict(split.fields)
    # float targets' moments are kept whatever they turn out to be: a NaN in a class-probability row is named too
    if split.targets.kind == "values" or split.targets.values.nonfinite_items:
        fields["targets"] = split.targets.values
    for name, stats in fields.items():
        if stats.nonfinite_items:
            bad = stats.nonfinite.nonzero().flatten().tolist()
            axis = "channels" if stats.layout == "channels" else "features"
            where = f" ({axis} {few(bad)})" if stats.features > 1 else ""
            problems.append(
                DataProblem(
                    "nonfinite",
                    f"{_field_name(split, name)}: NaN or Inf in {plural(stats.nonfinite_items, 'item')}{where}; e.g. "
                    f"{items_text(stats.nonfinite_first)}.",
                    "A NaN target makes the loss NaN: drop those items (or fix their targets)."
                    if stats is split.targets.values
                    else "A NaN input makes the loss NaN: fill them (torch.nan_to_num, an imputer) or drop the items.",
                    {
                        "split": split.name,
                        "field": name,
                        "items": stats.nonfinite_items,
                        axis: bad,
                        "indices": stats.nonfinite_first,
                    },
                )
            )
    return problems


def _scale(split: Split, done: set[str]) -> list[DataProblem]:
    """Scale and constant features; for validation only a field whose training twin was fine (inputs scaled in
    training but not in validation), never constants (a small split has many by chance)."""
    problems = []
    train = split.name == "train"
    for name, stats in split.fields.items():
        if not stats.floating or not stats.count.sum() or name in done:
            continue
        o = stats.overall()
        mean, std = stats.moments()
        axis = "channel" if stats.layout == "channels" else "feature"
        far = abs(o["mean"]) > 10 or o["std"] > 10 or 0 < o["std"] < 1e-3
        live = std[(std > 0) & std.isfinite()]
        spread = float(live.max() / live.min()) if len(live) > 1 else 1.0
        data = {
            "split": split.name,
            "field": name,
            **o,
            f"{axis}_mean": mean.tolist()[:256],
            f"{axis}_std": std.tolist()[:256],
        }
        said = (
            f"{_field_name(split, name)}: mean {format_number(o['mean'])}, std {format_number(o['std'])}, min "
            f"{format_number(o['min'])}, max {format_number(o['max'])}"
        )
        if stats.layout == "table" and spread > 1e3:
            lo, hi = int(std.masked_fill(~(std > 0), math.inf).argmin()), int(std.nan_to_num(-1.0).argmax())
            problems.append(
                DataProblem(
                    "scale",
                    f"{_field_name(split, name)}: features on very different scales (std "
                    f"{format_number(float(std[lo]))} for feature {lo}, {format_number(float(std[hi]))} for feature "
                    f"{hi}).",
                    "Standardize each feature ((x - mean) / std per column, e.g. sklearn's StandardScaler fitted on "
                    "the training set): the large ones dominate the first layer.",
                    data,
                    level="warning",
                )
            )
        elif far:
            problems.append(
                DataProblem(
                    "scale",
                    f"{said}: far from normalized (mean about 0, std about 1).",
                    "Normalize the inputs, e.g. x = (x - mean) / std with the training set's mean and std per "
                    f"{axis} (report.problems[...].data['{axis}_mean'] / ['{axis}_std']), or divide 0-255 pixels by "
                    "255: large inputs slow training down or make it diverge.",
                    data,
                    level="warning",
                )
            )
        if train and problems and problems[-1].data.get("field") == name:
            done.add(name)
        constant = stats.constant() if split.items > 1 and train else []
        if constant:
            values = [float(stats.min[i]) for i in constant]
            problems.append(
                DataProblem(
                    "constant",
                    f"{_field_name(split, name)}: {len(constant)} of {stats.features} {axis}s {is_are(len(constant))} "
                    "constant over all "
                    f"{split.items:,} items ({axis}s {few(constant)}).",
                    "They carry no information: drop them, or check the pipeline that made them.",
                    {"split": split.name, "field": name, f"{axis}s": constant, "values": values},
                    level="warning",
                )
            )
    return problems


def _shift(train: Split, val: Split, scaled: set[str]) -> list[DataProblem]:
    """Validation inputs on another scale than training's: the field as a whole (its mean moved by more than half
    the training std, and by more than chance, or its std off by 2x), or single features that vary in training
    (with 30 validation items or more: a mean moved by a training std). The classic is a pipeline that
    normalizes one split and not the other; a model then meets inputs it never saw. Features that barely vary in
    training (a border pixel: a few rare values decide its spread) are not judged alone."""
    problems = []
    for name, t in train.fields.items():
        v = val.fields.get(name)
        if v is None or name in scaled or not t.floating or t.features != v.features or not v.count.sum():
            continue
        to, vo = t.overall(), v.overall()
        if not (to["std"] > 0 and math.isfinite(to["std"]) and math.isfinite(vo["std"])):
            continue
        chance = 4 / math.sqrt(max(val.items, 1))
        whole = abs(vo["mean"] - to["mean"]) > to["std"] * max(0.5, chance) or not 0.5 <= vo["std"] / to["std"] <= 2
        (tm, ts), (vm, vs) = t.moments(), v.moments()
        bad: list[int] = []
        if t.features > 1 and val.items >= 30:
            live = ts[(ts > 0) & ts.isfinite()]
            # a feature's own std ratio is left out: a sparse feature's spread is a few rare values, which a
            # subset may lack (digits' border pixels in 200 of 1,797 items: 0.07 against 1.04)
            floor = 0.1 * float(live.median()) if len(live) else math.inf
            moved = (ts >= floor) & vm.isfinite() & ((vm - tm).abs() > ts * max(1.0, chance))
            bad = moved.nonzero().flatten().tolist()
        if not whole and not bad:
            continue
        axis = "channel" if t.layout == "channels" else "feature"
        if whole:
            said = (
                f"mean {format_number(vo['mean'])} and std {format_number(vo['std'])}, against "
                f"{format_number(to['mean'])} and {format_number(to['std'])} in training"
            )
        else:
            i = bad[0]
            said = (
                f"{plural(len(bad), axis)} of {t.features}, e.g. {axis} {i}: mean {format_number(float(vm[i]))} and "
                f"std {format_number(float(vs[i]))}, against {format_number(float(tm[i]))} and "
                f"{format_number(float(ts[i]))} in training"
            )
        problems.append(
            DataProblem(
                "shift",
                f"validation {name} are on another scale than training's ({said}).",
                "Prepare both splits the same way (normalize the validation set with the training set's mean and "
                "std); a model scored on inputs it never saw reads worse than it is.",
                {
                    "field": name,
                    f"{axis}s": bad,
                    "train_mean": tm.tolist()[:256],
                    "val_mean": vm.tolist()[:256],
                    "train_std": ts.tolist()[:256],
                    "val_std": vs.tolist()[:256],
                },
                level="warning",
            )
        )
    return problems


def _summary(split: Split) -> dict[str, Any]:
    fields = {}
    for name, stats in split.fields.items():
        fields[name] = {
            "dtype": stats.dtype,
            "shape": stats.shape,
            **stats.overall(),
            "nonfinite_items": stats.nonfinite_items,
        }
    t = split.targets
    out: dict[str, Any] = {
        "items": split.items,
        "of": split.of,
        "sampled": split.sampled,
        "fields": fields,
        "targets": t.kind,
    }
    if t.kind in ("labels", "binary"):
        out["classes"] = dict(sorted(t.counts.items()))
    return out


def findings(
    splits: list[Split], *, outputs: int | None, ignore_index: int
) -> tuple[list[DataProblem], list[str], dict[str, dict[str, Any]]]:
    """``(problems, notes, per-split summaries)`` of a data check (see the module docstring)."""
    train, val = splits[0], splits[1] if len(splits) > 1 else None
    problems: list[DataProblem] = []
    notes: list[str] = []
    if outputs is not None:
        problems += label_range(splits, outputs, ignore_index)
    if val is not None:
        problems += _across(train, val)
    scaled: set[str] = set()  # fields whose scale was said for training
    for split in splits:
        problems += _values(split)
        problems += _duplicates(split)
        problems += _scale(split, scaled)
        for field, what in split.unreadable.items():
            notes.append(f"{split.name} {field}: {what}, not a tensor: checked for duplicates only, no statistics")
        if split.unhashed:
            notes.append(f"{split.name}: some inputs cannot be split per item: duplicates not checked")
        if split.sampled and split.of:
            notes.append(f"{split.name}: a seeded sample of {split.items:,} of {split.of:,} items was read (max_items)")
        elif split.sampled:
            notes.append(f"{split.name}: the first {split.items:,} items were read (max_items), not the rest")
        notes += target_notes(split, train=split is train)
    problems += imbalance(train, outputs, ignore_index)
    problems += missing_classes(train, val, outputs)
    if val is not None:
        problems += unseen_classes(train, val, ignore_index)
        said = {str(p.data["field"]) for p in problems if p.kind == "scale" and p.data.get("split") == "val"}
        problems += _shift(train, val, scaled | said)
    return problems, notes, {s.name: _summary(s) for s in splits}
