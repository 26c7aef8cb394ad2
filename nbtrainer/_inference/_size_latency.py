"""What compare_inference measures: sizes (quantized tensors flattened into the plain tensors they hold) and
per-batch latency in interleaved rounds.

Size on disk is the length of ``torch.save`` of the model's state dict with every tensor subclass (torchao's
``Int8Tensor``, ``IntxUnpackedToInt8Tensor``, ``CodebookQuantizedTensor``...) replaced by its inner tensors
(``__tensor_flatten__``): what a deployable file holds. Saving a codebook tensor as it is would write the
*dequantized* float weights (its pickling goes through ``__torch_function__``), which says nothing about the
method. Size in memory is the bytes of the distinct storages of those same tensors.
"""

from __future__ import annotations

import io
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from nbtrainer._setup._model_setup import param_numel

__all__ = ["disk_bytes", "flat_state", "memory_bytes", "param_count", "spread_of", "time_rounds"]


def _flatten(key: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    if type(tensor) in (torch.Tensor, nn.Parameter) or not hasattr(tensor, "__tensor_flatten__"):
        yield key, tensor
        return
    names, _ = tensor.__tensor_flatten__()
    for name in names:
        inner = getattr(tensor, name)
        if isinstance(inner, torch.Tensor):
            yield from _flatten(f"{key}.{name}", inner)


def flat_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with tensor subclasses replaced by the plain tensors they are made of."""
    flat: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if isinstance(value, torch.Tensor):
            for name, tensor in _flatten(key, value.detach()):
                flat[name] = tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor
    return flat


def disk_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(flat_state(model))``."""
    buffer = io.BytesIO()
    torch.save(flat_state(model), buffer)
    return buffer.getbuffer().nbytes


def memory_bytes(model: nn.Module) -> int:
    """Bytes of the distinct storages behind the model's parameters and buffers (flattened)."""
    seen: dict[tuple[str, int], int] = {}
    for tensor in flat_state(model).values():
        storage = tensor.untyped_storage()
        seen[(str(tensor.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def param_count(model: nn.Module) -> int:
    """Parameters as the model's shapes count them (a quantized 64x32 weight is 2,048 parameters)."""
    return sum(param_numel(p) for p in model.parameters())


def time_rounds(
    runs: dict[str, Callable[[int], Any]], n_batches: int, *, rounds: int, sync: Callable[[], None]
) -> dict[str, list[list[float]]]:
    """Seconds per batch for each variant, ``rounds`` times; the variants take turns within every round (the
    first variant rotates), so a machine that slows down or speeds up is shared by all of them."""
    names = list(runs)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            run, laps = runs[name], []
            for i in range(n_batches):
                start = time.perf_counter()
                run(i)
                sync()
                laps.append(time.perf_counter() - start)
            times[name].append(laps)
    return times


def spread_of(round_medians: list[float]) -> float:
    """Half the range of the per-round medians, relative to their median (0.05: ±5%)."""
    if len(round_medians) < 2:
        return math.nan
    mid = statistics.median(round_medians)
    return (max(round_medians) - min(round_medians)) / (2 * mid) if mid > 0 else math.nan
