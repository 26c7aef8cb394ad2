"""``trainer.check_data(train, val)``: one streamed pass over the data before the first step, and what it finds.

Each split is read once, in dataset order (or a seeded sample of ``max_items``), through the same fetch the Trainer
uses, never through the loader's own shuffling sampler: the run's random generators are left as they were (a
dataset that augments at random draws inside ``kept_rng``). Items are split into inputs and targets by the batch
protocol the fit uses (``BatchSpec``), and kept as statistics only (``_stats``: moments per feature, hashes of 16
bytes per item, class counts): memory grows by some bytes per item, whatever the inputs' size. The model runs once,
on the first batch, to learn its number of outputs (the label range). The findings are ``_findings``'.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from nbtrainer._cancel import cancel_event, raise_if_cancelled
from nbtrainer._data import _arrays
from nbtrainer._data._batch import move_to_device
from nbtrainer._data._order import item_sampler
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._know._data_report import DataReport
from nbtrainer._know._findings import findings
from nbtrainer._know._stats import FieldStats, HashLog, Split, TargetStats, row_hashes
from nbtrainer._look._interpret import indexed_batches
from nbtrainer._look._side import side_pass
from nbtrainer._loop._metrics import metric_input
from nbtrainer._setup._seed import kept_rng

__all__ = ["check_at_fit", "check_data", "check_max_items", "output_size"]

log = logging.getLogger(__name__)

Tensor = torch.Tensor
_BATCH = 256  # the batch size of the pass where the loader has none


def check_max_items(max_items: Any) -> None:
    if max_items is not None and (not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1):
        raise ValueError(f"max_items must be an int >= 1 or None (every item), got {max_items!r}.")


def _lists(loader: Any, max_items: int | None) -> tuple[list[list[int]] | None, int | None, bool]:
    """The index lists of the pass (the items the loader's sampler can draw, each once, in dataset order; or a seeded
    sample of them), the split's size, whether it was sampled."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, torch.utils.data.DataLoader) or getattr(loader, "batch_sampler", None) is None:
        return None, _length(loader), False
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return None, None, False
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None, None, False
    order = _drawn(loader, n)
    total = len(order)
    sampled = max_items is not None and total > max_items
    if sampled:
        g = torch.Generator().manual_seed(0)
        order = order[torch.randperm(len(order), generator=g)[:max_items]].sort().values
    size = loader.batch_size or _BATCH
    return [chunk.tolist() for chunk in order.split(size)], total, sampled


def _drawn(loader: Any, n: int) -> Tensor:
    """The dataset indices the loader's sampler draws from: every item for the stock samplers over the whole
    dataset (a weighted one, or one with replacement, can draw any of them), a subset sampler's own indices, else
    one epoch drawn under ``kept_rng`` (the run's generators untouched), each index once. A split made by samplers
    over one dataset (``SubsetRandomSampler``) is then checked as the split it is, not as the whole dataset twice."""
    from torch.utils.data import RandomSampler, SequentialSampler, WeightedRandomSampler

    batch_sampler, sampler = loader.batch_sampler, item_sampler(loader)
    if type(sampler) is SequentialSampler or type(sampler) is WeightedRandomSampler:
        return torch.arange(n)
    # with replacement, one epoch draws about 63% of the items; the fit's epochs can draw any of them
    if type(sampler) is RandomSampler and sampler.data_source is loader.dataset:
        return torch.arange(n)
    indices = getattr(sampler, "indices", None)  # SubsetRandomSampler, and samplers written like it
    try:
        if indices is not None:
            drawn = torch.as_tensor(list(indices), dtype=torch.int64)
        else:
            with kept_rng(loader):
                drawn = torch.as_tensor([i for batch in batch_sampler for i in batch], dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError):  # indices that are not ints (a custom sampler of keys)
        log.debug("check_data: the sampler's indices could not be read; every item is checked", exc_info=True)
        return torch.arange(n)
    return torch.unique(drawn)  # sorted, each once


def _length(loader: Any) -> int | None:
    if isinstance(loader, (list, tuple)):
        return None  # batches, not items
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return None


def _named_inputs(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    if len(args) == 1 and not kwargs:
        return {"inputs": args[0]}
    named = {f"inputs[{i}]": a for i, a in enumerate(args)}
    named.update(kwargs)
    return named


def _batch_items(targets: Any, named: dict[str, Any]) -> int | None:
    for value in (targets, *named.values()):
        if isinstance(value, Tensor) and value.ndim:
            return int(value.shape[0])
        if isinstance(value, (list, tuple)) and value and not isinstance(value[0], Tensor):
            return len(value)
    return None


def output_size(trainer: Any, batch: Any) -> tuple[int | None, int, str | None]:
    """``(outputs per item or None, the criterion's ignore index, why not known)``: the model run once on ``batch``,
    in eval mode without gradients, its modes and the random generators put back."""
    criterion = trainer.criterion
    ignore = int(getattr(criterion, "ignore_index", -100))
    steps, spec = trainer.batch_steps, trainer.batch_spec
    try:
        with side_pass(trainer.model, steps.autocast()), no_cache(trainer.model):
            batch = move_to_device(batch, trainer.device, False)
            if steps.custom_loss:  # compute_loss= knows how its batch becomes outputs
                _, outputs, targets = steps.compute(batch, training=False)
            else:  # the outputs alone: a loss over a label past them would raise before telling the outputs' size
                args, kwargs, targets = spec.split(batch)
                if spec.pass_targets_to_model:
                    kwargs = {k: v for k, v in kwargs.items() if k not in spec.target_keys_of(kwargs)}
                outputs = trainer.model(*args, **kwargs)
    except Exception as exc:  # the fit's staged first-batch checks explain it; the data check goes on
        log.debug("check_data: the model did not run on the first batch; labels not checked", exc_info=True)
        return None, ignore, f"the model could not run on the first batch ({type(exc).__name__}: {str(exc)[:200]})"
    logits = metric_input(outputs)
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor):
        return None, ignore, None
    if targets.is_floating_point():  # class probabilities: one per output
        rows = class_rows(criterion) and logits.ndim == 2 and logits.shape == targets.shape
        return (int(logits.shape[1]) if rows else None), ignore, None
    if logits.ndim == targets.ndim + 1:
        if logits.ndim == 2 or logits.shape[: targets.ndim] == targets.shape:
            return int(logits.shape[-1]), ignore, None  # (B, C) or (B, T, V)
        if logits.shape[2:] == targets.shape[1:]:
            return int(logits.shape[1]), ignore, None  # (B, C, H, W) per position
    return None, ignore, None


def class_rows(criterion: Any) -> bool | None:
    """What float target rows ``(items, classes)`` are to ``criterion``: class probabilities (True: a
    ``CrossEntropyLoss`` takes one-hot or soft rows as such), several labels per item (False), or None (unknown: a
    loss function of one's own, a model computing its own loss)."""
    if isinstance(criterion, torch.nn.CrossEntropyLoss):
        return True
    multi = (torch.nn.BCEWithLogitsLoss, torch.nn.BCELoss, torch.nn.MultiLabelSoftMarginLoss)
    return False if isinstance(criterion, multi) else None


class _Scan:
    """One split read once: its fields' statistics, its item hashes and its targets."""

    def __init__(self, name: str, *, probabilities: bool | None = None) -> None:
        self.name = name
        self.fields: dict[str, FieldStats] = {}
        self.hashes = HashLog()
        self.targets = TargetStats(probabilities=probabilities)
        self.items = 0
        self.unreadable: dict[str, str] = {}
        self.unhashed = False

    def add(self, trainer: Any, indices: np.ndarray | None, batch: Any) -> Any:
        args, kwargs, targets = trainer.batch_spec.split(batch)
        named = _named_inputs(args, kwargs)
        n = _batch_items(targets, named)
        if n is None:
            self.unreadable["batch"] = f"a batch of {type(batch).__name__} whose items cannot be counted"
            return None
        idx = indices if indices is not None else np.arange(self.items, self.items + n)
        for name, value in named.items():
            if isinstance(value, Tensor) and value.ndim and value.shape[0] == n:
                stats = self.fields.get(name)
                if stats is None:
                    stats = self.fields[name] = FieldStats(name, value)
                stats.add(value, idx)
            elif name not in self.unreadable:
                self.unreadable[name] = type(value).__name__
        labels = self.targets.add(targets, idx)
        hashes = row_hashes(list(named.values()), n, mask=named.get("attention_mask"))
        if hashes is None:
            self.unhashed = True
        else:
            self.hashes.add(hashes, idx, labels)
        self.items += n
        return targets

    def summary(self, of: int | None, sampled: bool) -> Split:
        return Split(
            self.name, self.items, of, sampled, self.fields, self.hashes, self.targets, self.unreadable, self.unhashed
        )


def _read(
    trainer: Any, loader: Any, name: str, max_items: int | None, first: list[Any], cancel: threading.Event | None
) -> Split:
    lists, of, sampled = _lists(loader, max_items)
    batches: Iterator[tuple[Tensor | None, Any]]
    batches, _ = indexed_batches(loader, fast=trainer.fast_fetch, lists=lists)
    scan = _Scan(name, probabilities=class_rows(trainer.criterion))
    try:
        with kept_rng(), torch.no_grad():
            for indices, batch in batches:
                # between batches: no half-read batch, no torch op cut
                raise_if_cancelled(cancel, f"check_data: cancelled while reading {name}")
                # a stream or a list of batches: its first items, a sample only if a batch is left over (said so)
                if max_items is not None and lists is None and scan.items >= max_items:
                    sampled = True
                    break
                if not first:
                    first.append(batch)
                scan.add(trainer, indices.numpy() if indices is not None else None, batch)
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise type(exc)(
            f"check_data could not read {name}: {type(exc).__name__}: {exc}. It reads the batches the fit would "
            "(inputs then targets, by the batch protocol): fix the dataset or collate_fn, or pass num_inputs= / "
            "target_keys= to the Trainer."
        ) from exc
    return scan.summary(of if of is not None else None, sampled)


def check_data(
    trainer: Any,
    train_loader: Any,
    val_loader: Any = None,
    *,
    max_items: int | None = None,
    batch_size: Any = None,
    cancel: threading.Event | None = None,
) -> DataReport:
    """The pass of :meth:`nbtrainer.Trainer.check_data` (see the module docstring and that method). ``cancel``: an
    event another thread may set; the pass then ends before its next batch with ``concurrent.futures.CancelledError``
    (the panel's check, when the panel closes or the interpreter exits)."""
    check_max_items(max_items)
    cancel_event(cancel, caller="check_data")
    train = _arrays.eval_loader(train_loader, batch_size, name="check_data() train_loader")
    val = (
        _arrays.eval_loader(val_loader, batch_size, name="check_data() val_loader") if val_loader is not None else None
    )
    for name, loader in (("train_loader", train), ("val_loader", val)):
        if isinstance(loader, Iterator):
            raise TypeError(
                f"check_data() got a one-shot iterator as {name} ({type(loader).__name__}): reading it would use it "
                "up before the fit. Pass a DataLoader, a list of batches or arrays."
            )
    first: list[Any] = []
    splits = [_read(trainer, train, "train", max_items, first, cancel)]
    if val is not None:
        splits.append(_read(trainer, val, "val", max_items, [], cancel))
    outputs, ignore, why = output_size(trainer, first[0]) if first else (None, -100, None)
    problems, notes, summaries = findings(splits, outputs=outputs, ignore_index=ignore)
    if why:
        notes.append(f"labels not checked against the outputs: {why}")
    report = DataReport(problems, summaries, outputs=outputs, notes=notes)
    report.sources, report.max_items = (train, val), max_items
    return report


def check_at_fit(trainer: Any, option: bool | int, train_loader: Any, val_loader: Any) -> DataReport | None:
    """``Trainer(check_data=True)`` at the start of a fit: the check (or the report of the same loaders made before,
    by ``trainer.check_data`` or the panel), one progress line and History event per finding (none for clean data),
    and labels the model has no output for refused before the first step."""
    if option is False:
        return None
    cb, st = trainer.callbacks, trainer.run_state.loop_state
    where = {"step": st.global_step, "epoch": st.epoch + 1, "kind": "data_check"}
    if any(isinstance(loader, Iterator) for loader in (train_loader, val_loader)):
        cb.call(
            "on_control",
            trainer=trainer,
            event={
                **where,
                "old": "skipped",
                "new": "data check skipped: a "
                "one-shot iterator would be used up by it (pass a DataLoader or a list of batches)",
            },
        )
        return None
    report = trainer.data_report
    max_items = None if option is True else int(option)
    stale = report is None or report.sources != (train_loader, val_loader) or report.max_items != max_items
    # a report made before (the panel's, at its construction) is reused, but never to refuse a fit: the data may
    # have been fixed in place since, and a refusal is checked against the data as it is now
    if stale or report.by_kind("label_range"):
        report = check_data(trainer, train_loader, val_loader, max_items=max_items)
    trainer.data_report = report
    if any(split.get("sampled") for split in report.splits.values()):
        # first, so each finding below is read as a sample's, and said even when the sample found nothing
        said = f"data check: {report.summary()} (check_data=True reads them all)"
        cb.call("on_control", trainer=trainer, event={**where, "old": "sample", "new": said})
    for problem in report.problems:
        cb.call("on_control", trainer=trainer, event={**where, "old": problem.kind, "new": str(problem)})
    refused = report.by_kind("label_range")
    if refused:
        p = refused[0]
        raise ValueError(f"{p.message} {p.advice} (check_data=True refused the fit before its first step.)")
    return report
