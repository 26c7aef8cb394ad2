"""A BatchNorm that would meet an epoch's last batch of one item, found at the first batch of a fit.

In training, torch's BatchNorm normalizes each channel over the batch's items times their other positions (a
sequence's steps, an image's pixels); where an item has one value per channel (``[batch, channels]`` features)
a batch of one item leaves one value, and ``F.batch_norm`` raises "Expected more than 1 value per channel when
training". A loader whose last batch holds one item (``len(dataset) % batch_size == 1``, no ``drop_last``) gets
there only at the end of the first epoch, after its optimizer steps. The first batch's forward shows what each
BatchNorm gets (:func:`batch_norm_inputs`, a forward pre-hook, nothing read from the device) and the loader's
size what its last batch holds (:func:`check_last_batch`): the fit is refused before its first optimizer step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["batch_norm_inputs", "check_last_batch"]


@contextlib.contextmanager
def batch_norm_inputs(model: torch.nn.Module) -> Iterator[dict[str, int]]:
    """Inside, each BatchNorm that normalizes over the batch (in training, or without running statistics) records
    the values per channel of one item in the first input it gets; the dict maps its qualified name to that count."""
    seen: dict[str, int] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and _batch_statistics(module):

            def record(mod: torch.nn.Module, args: tuple, name: str = name) -> None:
                if name not in seen and args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
                    seen[name] = math.prod(args[0].shape[2:])

            hooks.append(module.register_forward_pre_hook(record))
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _batch_statistics(module: torch.nn.Module) -> bool:
    if isinstance(module, torch.nn.SyncBatchNorm) and torch.distributed.is_initialized():
        return False  # it counts the items of every rank
    return module.training or (getattr(module, "running_mean", None) is None)


def check_last_batch(
    seen: dict[str, int], size: dict[str, int | None] | None, *, max_steps: int | None, accum: int, model: Any
) -> None:
    """Refuse a fit whose epochs end on a batch of one item that a BatchNorm in ``seen`` (:func:`batch_norm_inputs`)
    cannot take. ``size``: the loader's ``batches``, ``batch_size`` and ``samples`` (``_data._order.loader_size``);
    ``max_steps`` / ``accum``: a fit that ends before the epoch's last batch never meets it."""
    single = [name for name, per_item in seen.items() if per_item == 1]
    if not single or not size:
        return
    batches, batch_size, samples = size.get("batches"), size.get("batch_size"), size.get("samples")
    if batches is None or batch_size is None or samples is None or batch_size < 2:
        return
    if samples - (batches - 1) * batch_size != 1:
        return
    if max_steps is not None and max_steps < math.ceil(batches / max(accum, 1)):
        return
    module = dict(model.named_modules())[single[0]]
    fits = next(
        b for d in range(1, batch_size + 1) for b in (batch_size - d, batch_size + d) if b > 1 and samples % b != 1
    )
    raise ValueError(
        f"The train_loader's last batch of each epoch holds 1 item ({samples} samples in batches of {batch_size}), "
        f"and {type(module).__name__} '{single[0]}' normalizes each channel over the batch's items alone (it gets one "
        'value per channel per item): in training torch refuses a batch of one item ("Expected more than 1 value '
        'per channel when training"), so the fit would fail at the end of epoch 1, after its optimizer steps. Build '
        f"the DataLoader with drop_last=True, or pick a batch_size that leaves no single item (batch_size={fits})."
    )
