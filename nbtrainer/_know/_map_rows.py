"""What one ``DataMap`` reduction writes per training row: the label's probability, the margin and the strongest
other class of each row, and, for an item with several rows in one reduction, which row is its last visit; and what a
map follows (``map_mode``: class labels, each item's loss, or nothing), chosen at a fit's first batch.

An item has several rows when a sampler with replacement draws it twice in a batch, or when a reduction holds
several steps' rows (a tiny dataset, a long refresh interval). The running sums add every row; the label and the
suggestion keep what the last visit said, and ``scatter_`` with repeated indices writes them in no defined order
(a GPU's threads race), so only each item's last row is written.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch.utils.data import RandomSampler, SequentialSampler

from nbtrainer._data._order import item_sampler
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._look._interpret import task_of
from nbtrainer._look._per_item import NoPerItemLoss, per_item_loss

__all__ = ["MapMode", "classify", "last_visits", "map_mode", "may_repeat"]

Tensor = torch.Tensor
_WHAT = {
    "multilabel": "multi-label targets",
    "regression": "regression targets",
    "lm": "a language model's tokens",
    "tokens": "per-token labels",
}


class MapMode(NamedTuple):
    mode: str  # "classification", "binary", "loss" or "off"
    loss_fn: Any = None  # loss mode: fn(outputs, targets) -> one loss per item
    outputs: int | None = None  # the model's classes (binary: 2), which a relabel must stay within
    note: str | None = None


def map_mode(trainer: Any, logits: Any, targets: Any, loss_per_item: Any) -> MapMode:
    """What a map follows for this fit's first batch: the label's probability (class labels), else each item's loss
    where it can be split per item, else nothing (``"off"``, with a note saying why)."""
    criterion = trainer.criterion
    task = task_of(criterion, trainer.model, logits, targets)
    if task in ("classification", "binary"):
        classes = 2 if task == "binary" else int(logits.shape[1]) if isinstance(logits, Tensor) else None
        return MapMode(task, outputs=classes)
    what = _WHAT.get(task, "targets that are not class labels")
    try:
        custom = trainer.batch_steps.custom_loss
        loss_fn = per_item_loss(criterion, unwrap_model(trainer.model), loss_per_item, custom=custom)
    except NoPerItemLoss as exc:
        why = str(exc).removeprefix("interpret: ").replace("interpret(..., loss_", "DataMap(loss_")
        return MapMode("off", note=f"no data map: {what}, and the loss cannot be split per item ({why})")
    note = (
        f"{what}: the map follows each item's loss (confidence = exp(-loss)); correctness and the margin are for "
        "class labels"
    )
    return MapMode("loss", loss_fn=loss_fn, note=note)


def classify(mode: str | None, probabilities: bool, logits: Tensor, targets: Tensor) -> tuple[Tensor, ...]:
    """label, valid, probability of the label, margin, strongest other class (per row); ``logits`` is written
    over (its label column), the reduction's own concatenation."""
    if mode == "binary":
        z = logits.reshape(-1)
        if probabilities:  # BCELoss: the outputs are probabilities already
            z = torch.logit(z.clamp(1e-6, 1 - 1e-6))
        label = (targets.reshape(-1) > 0.5).long()
        margin = torch.where(label.bool(), z, -z)
        return label, torch.isfinite(margin), torch.sigmoid(margin), margin, 1 - label
    c = logits.shape[1]
    label = targets.argmax(1) if targets.is_floating_point() and targets.ndim == 2 else targets.reshape(-1).long()
    safe = label.clamp(0, c - 1)
    if logits.device.type == "cpu" and c <= _CLASS_MAJOR and logits.dtype in (torch.float32, torch.float64):
        return _classify_class_major(logits, label, safe)
    # A CPU is slow at ops along rows this short (10 classes: logsumexp 320 us, softmax 1 ms, max with its indices
    # 190 us, scatter_ 80 us for 12,800 rows), so the label's column is reached through the flat view (take,
    # index_fill_: 15-25 us), and the label's probability is exp(chosen - top) / sum(exp(logits - top)) with the row's
    # amax for top (60 us) instead of a logsumexp. Its exp() runs before the label's column becomes -inf: a vectorized
    # exp of -inf takes the slow path (8x). A row with a NaN or an infinity has no finite margin: not counted (valid)
    flat = torch.arange(0, logits.numel(), c, device=logits.device).add_(safe)
    chosen = logits.view(-1).take(flat)
    top = logits.amax(1)
    p = (chosen - top).exp_().div_((logits - top[:, None]).exp_().sum(1))
    # then the logits themselves (joined for this reduction: no one else holds them) lose the label's column
    best_other, other = logits.view(-1).index_fill_(0, flat, -math.inf).view_as(logits).max(1)
    margin = chosen - best_other
    return label, (safe == label) & torch.isfinite(margin), p, margin, other


# Up to this many classes a CPU reduces a refresh's rows faster across a (classes, rows) copy: 14,720 rows of 10
# classes took 0.72-0.82 ms against 0.99-1.10 ms along the rows; at 16 classes the two were even, and a max with its
# indices along the rows wins from there (bench/RESULTS.md, "The data map's rows on a CPU").
_CLASS_MAJOR = 12


def _classify_class_major(logits: Tensor, label: Tensor, safe: Tensor) -> tuple[Tensor, ...]:
    """``classify`` of a few classes on a CPU: the same per-row values, from a (classes, rows) copy whose reductions
    over the classes are elementwise ops over the rows (amax over 10 short rows: 130-210 us; over 10 long ones: 9-13
    us). The copy is torch's (numpy's is 3x faster, but a ``.numpy()`` per reduction is a host read to the sync
    budget's count, tests/loop/test_sync_budget.py)."""
    m, c = logits.shape
    lt = logits.T.contiguous()
    flat = safe.mul(m).add_(torch.arange(m))
    chosen = lt.view(-1).take(flat)
    top = lt.amax(0)
    p = (chosen - top).exp_().div_((lt - top).exp_().sum(0))  # before the label's row becomes -inf (see classify)
    masked = lt.view(-1).index_fill_(0, flat, -math.inf).view_as(lt)
    best_other = masked.amax(0)
    # its class: the first that reaches it, as max() along a row answers (weights c..1 on the classes that reach it;
    # the largest is the first). A row with a NaN reaches nothing: class c-1, in a row that is not counted anyway
    first = torch.arange(c, 0, -1, dtype=torch.uint8)[:, None]
    other = (masked == best_other).to(torch.uint8).mul_(first).amax(0).long().neg_().add_(c).clamp_(max=c - 1)
    margin = chosen - best_other
    return label, (safe == label) & torch.isfinite(margin), p, margin, other


def may_repeat(loader: Any) -> bool:
    """Whether one epoch of ``loader`` may hand out an item twice, so that a reduction (never wider than an epoch: the
    epoch's end reduces) may hold several rows of it. Only torch's own samplers are known not to: sequential, shuffled
    without replacement, and a list of ready batches (numbered in order). A sampler with replacement, a batch sampler
    of one's own or a subclass may (``last_visits`` then orders the rows: two sorts and a dozen ops a reduction,
    measured at 3.4% of a tiny MLP's fit when done for every loader: 1.072x against 1.038x, bench/data_map.py)."""
    if isinstance(loader, (list, tuple)):
        return False
    sampler = item_sampler(loader)
    if sampler is None:
        return True
    if type(sampler) is SequentialSampler:
        return False
    return not (type(sampler) is RandomSampler and not sampler.replacement)


def last_visits(idx: Tensor, trash: int) -> Tensor:
    """``idx`` (the item of each row, in the order the rows were trained) with every row but each item's last sent
    to ``trash``: no index then repeats but ``trash``, whose values nobody reads. On the device, nothing read.

    Example:
        >>> last_visits(torch.tensor([4, 1, 4, 2, 1]), trash=9).tolist()
        [9, 9, 4, 2, 1]
    """
    ordered, rows = torch.sort(idx, stable=True)  # an item's rows stay in their order
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    keep = torch.empty_like(last).scatter_(0, rows, last)  # rows is a permutation: each index written once
    return torch.where(keep, idx, trash)
