"""What to do, computed from what was measured: a learning rate, a clipping norm, and what helps a slow loader.

The LR: a step's update-to-weight ratio (``|change| / |weights|``) grows with the LR (in proportion for SGD and
Adam-like updates), and healthy steps move the weights by about 0.1% to 1% of their norm. So the advised LR scales
the current one to move them by about 1%: ``lr x 1% / measured ratio`` (down when the steps are too large, up when
a run does not move), rounded to 1, 2 or 5 times a power of ten, and never above the LR finder's valley when the
finder has run (``trainer.lr_find``). The clipping norm: about twice the median gradient norm of the healthy
steps measured before. Each advice says how it was computed.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

from nbtrainer._health._health_report import readable
from nbtrainer._loop._control import reference_lr

__all__ = ["HEALTHY_RATIO", "advise_clip", "advise_lr", "data_advice", "main_optimizer", "reference", "round_readable"]

#: update-to-weight ratios of healthy steps (the LR advice aims at the top of this band)
HEALTHY_RATIO = (1e-3, 1e-2)


def round_readable(value: float) -> float:
    """The nearest of 1, 2 and 5 times a power of ten (in log scale).

    Example:
        >>> round_readable(0.121), round_readable(0.0958), round_readable(3.4), round_readable(0.00068)
        (0.1, 0.1, 5.0, 0.0005)
    """
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"round_readable takes a positive finite number, got {value!r}")
    exponent = math.floor(math.log10(value))
    candidates = [m * 10.0**e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 2, 5)]
    best = min(candidates, key=lambda c: abs(math.log(c / value)))
    return float(f"{best:.1g}")


def main_optimizer(optimizer: Any) -> Any:
    """The optimizer whose LR the advice names: the one, or the first of several named ones (None: none)."""
    if optimizer is not None and getattr(optimizer, "param_groups", None):
        return optimizer
    children = getattr(optimizer, "optimizers", None) or {}
    return next(iter(children.values()), None)


def _pct(ratio: float) -> str:
    """A ratio as a percentage with two significant digits: ``414%``, ``1%``, ``0.0045%``."""
    return f"{ratio * 100:.2g}%" if ratio < 1 else f"{ratio:.0%}"


def advise_lr(
    lr: float,
    ratio: float | None,
    *,
    valley: float | None = None,
    raise_: bool = False,
    at_lr: float | None = None,
    unmeasured: str = "no update was measured",
) -> tuple[float, str]:
    """``(advised LR, how it was computed)`` from the current reference ``lr`` and a measured update ratio
    (``None``: a tenth, or ten times with ``raise_``, said as ``unmeasured``), measured at ``at_lr`` (default:
    ``lr``; the ratio then scales in proportion); bounded above by the LR finder's ``valley``.

    Example:
        >>> lr, how = advise_lr(50.0, 4.14)
        >>> lr
        0.1
        >>> how.split("; ")[1]
        'healthy steps move them by 0.1% to 1%, so LR 50 x 1% / 414% = 0.12, rounded to 0.1'
        >>> advise_lr(0.3, 0.0127, at_lr=0.01)[1].split(";")[0]
        'a step moved the weights by 1.3% of their norm at LR 0.01, so about 38% at LR 0.3'
    """
    target = HEALTHY_RATIO[1]
    measured = ratio is not None and ratio > 0 and math.isfinite(ratio)
    if measured:
        assert ratio is not None
        how = f"a step moved the weights by {_pct(ratio)} of their norm at LR {readable(at_lr or lr)}"
        if at_lr is not None and at_lr != lr:
            ratio = ratio * lr / at_lr
            how += f", so about {_pct(ratio)} at LR {readable(lr)}"
        raw = lr * target / ratio
        how += (
            f"; healthy steps move them by {_pct(HEALTHY_RATIO[0])} to {_pct(target)}, so LR {readable(lr)} x "
            f"{_pct(target)} / {_pct(ratio)} = {raw:.2g}"
        )
    else:
        raw = lr * 10 if raise_ else lr / 10
        how = f"{unmeasured}: {'ten times' if raise_ else 'a tenth of'} the current {readable(lr)}"
    advised = round_readable(raw)
    if measured:
        how += f", rounded to {readable(advised)}"
    if isinstance(valley, float) and 0 < valley < advised:
        advised = valley
        how += f"; kept at the LR finder's valley {readable(valley)}"
    return advised, how


def advise_clip(norms: list[float], exploded: float | None = None) -> tuple[float, str] | None:
    """``(max_grad_norm, how)``: about twice the median of the healthy total gradient norms measured so far."""
    finite = [n for n in norms if math.isfinite(n) and n > 0]
    if not finite:
        return None
    median = statistics.median(finite)
    value = round_readable(2 * median)
    seen = f" before it reached {readable(exploded)}" if exploded is not None and math.isfinite(exploded) else ""
    how = (
        f"the gradient norm was {median:.2g} (median of {len(finite)} measured step{'s' * (len(finite) > 1)}){seen}; "
        f"clipping at about twice that, {readable(value)}, leaves normal steps alone and caps the large ones"
    )
    return value, how


def reference(optimizer: Any) -> float | None:
    """The reference LR of the main optimizer (OneCycle's ``max_lr``, else the base LR), or None."""
    opt = main_optimizer(optimizer)
    return reference_lr(opt) if opt is not None else None


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
