"""What to do: a concrete learning rate, and what helps a loader that keeps the step waiting."""

from __future__ import annotations

import os
from typing import Any

from nbtrainer._loop._control import reference_lr
from nbtrainer._report._format import format_lr

__all__ = ["data_advice", "suggest_lr"]


def suggest_lr(optimizer: Any, lr_finder: Any) -> tuple[float, str] | None:
    """``(lr, why)``: the LR finder's valley when one was run and it is below the current reference LR, else a
    third of that reference LR (OneCycle's ``max_lr``, else the base LR: what ``Trainer.set_lr`` sets)."""
    if optimizer is None or not getattr(optimizer, "param_groups", None):
        children = getattr(optimizer, "optimizers", None) or {}
        optimizer = next(iter(children.values()), None)
        if optimizer is None:
            return None
    ref = reference_lr(optimizer)
    valley = (getattr(lr_finder, "suggestions", None) or {}).get("valley")
    if isinstance(valley, float) and 0 < valley < ref:
        return valley, f"the LR finder's valley ({format_lr(valley)})"
    return ref / 3, f"a third of the current {format_lr(ref)}"


def _in_memory(dataset: Any) -> bool:
    import torch

    if isinstance(dataset, torch.utils.data.Subset):
        return _in_memory(dataset.dataset)
    return isinstance(dataset, torch.utils.data.TensorDataset) or hasattr(dataset, "__getitems__")


def data_advice(loader: Any, *, mode: str | None, device_type: str, fast_fetch: bool) -> str:
    """What helps this loader (``mode``: how the loop fetches, ``nbtrainer._data._prefetch.DataPath.mode``)."""
    import torch

    if not isinstance(loader, torch.utils.data.DataLoader):
        return (
            f"The batches come from a {type(loader).__name__}, fetched in the training thread: wrap the data in a "
            "torch.utils.data.DataLoader with num_workers=4 (or more) so batches are prepared while the model trains."
        )
    cores = os.cpu_count() or 1
    tips: list[str] = []
    dataset = loader.dataset
    workers = int(loader.num_workers or 0)
    if mode in ("batched", "device", "pinned"):
        tips.append(
            "the data is in memory and already fetched with one indexing call per batch: the time is in the "
            "dataset's own code (its __getitem__ / __getitems__) or the transfer; precompute transforms once"
        )
    elif _in_memory(dataset) and workers == 0 and not fast_fetch:
        tips.append("the data is in memory: Trainer(fast_fetch=True) fetches each batch with one indexing call")
    elif _in_memory(dataset) and workers > 0:
        tips.append(
            "the data is in memory: num_workers=0 lets the trainer fetch each batch with one indexing call "
            "(fast_fetch); worker processes only add copies"
        )
    elif workers == 0:
        tips.append(f"DataLoader(num_workers={min(max(cores - 1, 1), 8)}) prepares batches in parallel ({cores} cores)")
    elif workers < cores - 1:
        tips.append(f"more workers: num_workers={min(cores - 1, max(2 * workers, workers + 1))} ({cores} cores)")
    if device_type == "cuda" and not getattr(loader, "pin_memory", False) and mode not in ("device", "pinned"):
        tips.append("pin_memory=True lets the copy to the GPU overlap the step")
    if workers > 0 and not getattr(loader, "persistent_workers", False):
        tips.append("persistent_workers=True keeps the workers between epochs instead of starting them again")
    if workers > 0 and (getattr(loader, "prefetch_factor", None) or 2) < 4:
        tips.append("prefetch_factor=4 keeps more batches ready")
    return ("Try: " + "; ".join(tips) + ".") if tips else "The loader is set up well: the dataset itself is slow."
