"""``trainer.interpret(loader)``: one streamed pass that keeps, per item, its loss, prediction, target and dataset
index, never its inputs.

Where each item's dataset index comes from: a ``DataLoader`` over a map-style dataset has its batch sampler's index
lists drawn once (a shuffled loader's draw is undone with the random generators, ``_side``), then its batches are
read by those lists, with one indexing call each where the Trainer's batched fetch applies (``_data._fetch``) or
through a loader with the same dataset, collate function and workers. Any other iterable (a list of batches, an
``IterableDataset``) is read as it is, its items numbered in order: losses and matrices work, the gallery cannot
fetch them back and says so.

Per batch, the values stay on the device (a few numbers per item) and come to the host once, at the end: memory
grows by some bytes per item, whatever the inputs' size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._batch import move_to_device
from nbtrainer._data._fetch import batched_fetch
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._look._interpretation import Interpretation, ItemTable
from nbtrainer._look._per_item import NoPerItemLoss, is_causal_lm, per_item_loss
from nbtrainer._look._side import side_pass
from nbtrainer._loop._metrics import metric_input
from nbtrainer._setup._seed import kept_rng

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["indexed_batches", "interpret", "task_of"]

Tensor = torch.Tensor
_SMALL = 16  # a regression keeps its predictions and targets when each item has at most this many values


def indexed_batches(
    loader: Any, *, fast: bool, lists: list[list[int]] | None = None
) -> tuple[Iterator[tuple[Tensor | None, Any]], Any]:
    """``((dataset indices or None, batch) ..., dataset or None)`` (see the module docstring); ``lists``: read these
    index lists of the loader's dataset instead of its sampler's."""
    sampler, dataset = getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)
    indexable = (
        isinstance(loader, torch.utils.data.DataLoader)
        and sampler is not None
        and not isinstance(dataset, torch.utils.data.IterableDataset)
        and callable(getattr(dataset, "__getitem__", None))
    )
    if not indexable or sampler is None or dataset is None:
        return _numbered(loader, None), None
    if lists is None:
        with kept_rng(loader):  # a shuffled loader draws its order from a generator of the run's: it must not move
            lists = [list(ix) for ix in sampler]
    fetch = batched_fetch(loader) if fast else None
    if fetch is not None:
        read: Callable[[list[int]], Any] = fetch.read
        batches: Any = map(read, lists)
    else:
        workers = loader.num_workers
        batches = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=lists,
            num_workers=workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            worker_init_fn=loader.worker_init_fn,
            **({"prefetch_factor": loader.prefetch_factor} if workers else {}),
        )
    return _numbered(batches, lists), dataset


def _numbered(batches: Any, lists: list[list[int]] | None) -> Iterator[tuple[Tensor | None, Any]]:
    # A generator function, so that iter(loader) (which may draw a seed from the global generator) runs at the
    # first batch, inside the pass's side_pass, not when the pass is set up.
    if lists is None:
        for batch in batches:
            yield None, batch
        return
    for ix, batch in zip(lists, batches, strict=True):
        yield torch.tensor(ix, dtype=torch.int64), batch


def task_of(criterion: Any, model: Any, logits: Any, targets: Any) -> str:
    """``classification``, ``binary``, ``multilabel``, ``regression``, ``lm`` (a causal LM's tokens), ``tokens``
    (per-token labels) or ``other`` (losses only), from the first batch."""
    if not isinstance(logits, Tensor) or not isinstance(targets, Tensor) or targets.ndim == 0:
        return "other"
    integer = not targets.is_floating_point()
    config = getattr(unwrap_model(model), "config", None) if model is not None else None
    if logits.ndim == 3 and targets.ndim == 2 and integer:
        return "lm" if criterion is None and is_causal_lm(unwrap_model(model)) else "tokens"
    bce = isinstance(criterion, (torch.nn.BCEWithLogitsLoss, torch.nn.BCELoss)) or (
        criterion is None and getattr(config, "problem_type", None) == "multi_label_classification"
    )
    b = targets.shape[0]
    if logits.ndim == 2 and logits.shape[1] >= 2 and targets.ndim == 1 and integer:
        return "classification"
    if bce and logits.ndim == 2 and logits.shape == targets.shape and logits.shape[1] >= 2:
        return "multilabel"
    if bce and logits.numel() == b == targets.numel():
        return "binary"
    ce = isinstance(criterion, torch.nn.CrossEntropyLoss) and logits.ndim == 2 and logits.shape == targets.shape
    if ce:  # class probabilities as targets
        return "classification"
    if targets.is_floating_point() and logits.numel() == targets.numel():
        return "regression"
    return "other"


def _columns(task: str, logits: Tensor, targets: Tensor, probabilities: bool) -> dict[str, Tensor]:
    """What an item keeps beside its loss, on the device (see :class:`ItemTable`)."""
    b = targets.shape[0]
    if task == "classification":
        probs = logits.float().softmax(-1)
        target = targets.argmax(-1) if targets.is_floating_point() else targets
        p_pred, pred = probs.max(-1)
        # A label outside the classes (CrossEntropyLoss's ignore_index, -100 by default) marks an unlabeled item:
        # it keeps its label, gets no probability, and the class figures leave it out.
        labeled = (target >= 0) & (target < probs.shape[1])
        p_target = probs.gather(1, torch.where(labeled, target, 0)[:, None])[:, 0]
        return {"target": target.int(), "prediction": pred.int(),
                "p_target": torch.where(labeled, p_target, torch.nan), "p_prediction": p_pred}  # fmt: skip
    if task in ("binary", "multilabel"):
        p = logits.float() if probabilities else torch.sigmoid(logits.float())
        p, t = p.reshape(b, -1), targets.reshape(b, -1) > 0.5
        right = torch.where(t, p, 1 - p)
        if task == "binary":
            return {"target": t[:, 0].int(), "prediction": (p[:, 0] > 0.5).int(), "p_target": right[:, 0],
                    "p_prediction": torch.maximum(p[:, 0], 1 - p[:, 0])}  # fmt: skip
        return {"target": t.to(torch.uint8), "prediction": (p > 0.5).to(torch.uint8), "p_target": right.mean(1)}
    if task == "regression":
        pred, target = logits.float().reshape(b, -1), targets.float().reshape(b, -1)
        if pred.shape[1] > _SMALL:
            return {}
        return {"target": target, "prediction": pred}
    return {}


def interpret(
    trainer: LoopHost,
    loader: Any,
    *,
    max_items: int | None = None,
    loss_per_item: Callable[[Any, Any], Tensor] | None = None,
    classes: Any = None,
    decode: Any = None,
    feature_names: Any = None,
    batch_size: int | None = None,
) -> Interpretation:
    """The pass of :meth:`nbtrainer.Trainer.interpret` (see the module docstring and that method)."""
    if max_items is not None and (not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1):
        raise ValueError(f"max_items must be an int >= 1 or None, got {max_items!r}.")
    loader = _arrays.eval_loader(loader, batch_size, name="interpret() loader")
    steps, model = trainer.batch_steps, trainer.model
    fn = per_item_loss(trainer.criterion, unwrap_model(model), loss_per_item, custom=steps.custom_loss)
    batches, dataset = indexed_batches(loader, fast=trainer.options.data.fast_fetch)
    device, seen = trainer.device, 0
    task: str | None = None
    probabilities = isinstance(trainer.criterion, torch.nn.BCELoss)
    parts: dict[str, list[Tensor]] = {"loss": [], "index": []}
    n_classes: int | None = None
    plain = steps.default_compute()  # (x, y) batches: model(x) alone (the batch's mean loss is not needed)
    # The loader's own generator (not only the global ones side_pass puts back) gives its workers' seed.
    with kept_rng(loader), side_pass(model, steps.autocast(), grad=steps.inference), no_cache(model):
        for indices, batch in batches:
            batch = move_to_device(batch, device, trainer.options.data.non_blocking)
            if plain and type(batch) in (tuple, list) and len(batch) == 2 and isinstance(batch[0], Tensor):
                outputs, targets = model(batch[0]), batch[1]
            else:
                _, outputs, targets = steps.compute(batch, training=False)
            if outputs is None:
                raise NoPerItemLoss(
                    "interpret needs the model's outputs, and compute_loss= returned a loss alone: return "
                    "(loss, outputs, targets) from it."
                )
            losses = fn(outputs, targets)
            b = losses.shape[0] if isinstance(losses, Tensor) and losses.ndim == 1 else None
            if b is None or (isinstance(targets, Tensor) and targets.ndim and targets.shape[0] != b):
                raise NoPerItemLoss(
                    f"interpret: the per-item loss has shape {tuple(getattr(losses, 'shape', ()))}, not one value per "
                    "item of the batch. loss_per_item=fn(outputs, targets) must return a 1-d tensor of the batch's "
                    "size."
                )
            logits = metric_input(outputs)
            if task is None:
                task = task_of(trainer.criterion, model, logits, targets)
                if task == "classification" and isinstance(logits, Tensor):
                    n_classes = int(logits.shape[1])
                elif task == "binary":
                    n_classes = 2
            take = b if max_items is None else min(b, max_items - seen)
            columns = _columns(task, logits, targets, probabilities) if isinstance(logits, Tensor) else {}
            if indices is None:
                indices = torch.arange(seen, seen + b)
            parts["loss"].append(losses.detach().float()[:take])
            parts["index"].append(indices[:take])
            for key, value in columns.items():
                parts.setdefault(key, []).append(value.detach()[:take])
            seen += take
            del outputs, targets, batch, logits, losses
            if max_items is not None and seen >= max_items:
                break
    host = {key: torch.cat(values).cpu() if values else torch.empty(0) for key, values in parts.items()}  # SYNC: once
    return Interpretation(
        ItemTable(host),
        task=task or "other",
        n_classes=n_classes,
        classes=classes if classes is not None else _label_names(model, n_classes),
        dataset=dataset,
        decode=decode,
        feature_names=feature_names,
        layout=(trainer.batch_spec, steps.custom_loss),
    )


def _label_names(model: Any, n: int | None) -> list[str] | None:
    """A Hugging Face model's ``config.id2label`` when it names every class."""
    config = getattr(unwrap_model(model), "config", None)
    names = getattr(config, "id2label", None)
    if not isinstance(names, dict) or n is None or len(names) != n:
        return None
    return [str(names.get(i, i)) for i in range(n)]
