"""8-bit and 4-bit optimizers by name: ``"adamw8bit"``, ``"paged_adamw8bit"``, ``"adamw4bit"``.

Which library, and why:

* ``adamw8bit`` and ``paged_adamw8bit``: **bitsandbytes** (``bnb.optim.AdamW8bit`` / ``PagedAdamW8bit``).
  Block-wise 8-bit state (two uint8 moments plus one fp32 scale per 256 values), the same optimizer the
  Hugging Face Trainer and Lightning users know, it runs at its first step without compiling anything, and
  its state is plain tensors (uint8 moments, fp32 scales, code books), so it round-trips through our
  ``torch.load(weights_only=True)`` checkpoints as it is. The paged variant keeps the state in CUDA unified
  memory that the driver pages out to CPU RAM under memory pressure (on a CPU it behaves as ``adamw8bit``).
  Tensors under 4096 values keep 32-bit state (bitsandbytes' ``min_8bit_size``): their state is negligible
  and 8-bit blocks would hurt them most.
* ``adamw4bit``: **torchao** (``torchao.optim.AdamW4bit``): bitsandbytes has no 4-bit optimizer. Its state
  is a tensor subclass (``OptimState4bit``: 4-bit codes, scales, code book) that torchao registers as safe
  for ``weights_only`` loading. Its first step compiles the update with ``torch.compile`` (seconds to tens
  of seconds on a CPU, once per process and shape).

Defaults follow ``torch.optim.AdamW`` (lr 1e-3, weight decay 1e-2, betas (0.9, 0.999)), so switching the
name changes only the state's precision.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from nbtrainer._optimizer_kinds import OPTIMIZERS, OptimizerKind
from nbtrainer._setup._quantize import require_module

__all__ = ["KBIT_OPTIMIZERS", "build_kbit_optimizer", "kbit_backend"]

#: name -> the registry's row, for the k-bit kinds (those not in torch.optim)
KBIT_OPTIMIZERS: dict[str, OptimizerKind] = {name: k for name, k in OPTIMIZERS.items() if k.library != "torch"}


def kbit_backend(name: str) -> str:
    """Which library implements optimizer ``name`` and why (for ``describe()`` and reports)."""
    return KBIT_OPTIMIZERS[name].why


def build_kbit_optimizer(
    name: str, params: Iterable[torch.Tensor] | nn.Module, lr: float | None = None, **kwargs: Any
) -> torch.optim.Optimizer:
    """An 8-bit / 4-bit AdamW by name (see the module docstring for which library and why).

    Example:
        >>> opt = build_kbit_optimizer("adamw8bit", nn.Linear(4, 2), lr=1e-3)
        >>> type(opt).__name__
        'AdamW8bit'
    """
    key = name.strip().lower()
    kind = KBIT_OPTIMIZERS[key]
    library, cls_name = kind.library, kind.cls
    if isinstance(params, nn.Module):
        params = [p for p in params.parameters() if p.requires_grad]
    params = list(params)
    if not params:
        raise ValueError(
            f"optimizer={name!r} has nothing to train: every parameter is frozen (requires_grad=False). "
            "Unfreeze some (trainable=[...]) or add adapters (lora=dict(r=8))."
        )
    floating = [p for p in params if not p.is_floating_point()]
    if floating:
        raise ValueError(
            f"optimizer={name!r} updates floating-point parameters only; {len(floating)} trainable parameters are "
            f"{floating[0].dtype} (quantized weights cannot train: freeze them, or use quantize= with lora=)."
        )
    options: dict[str, Any] = {"weight_decay": 1e-2}
    if lr is not None:
        options["lr"] = float(lr)
    options.update(kwargs)
    if library == "bitsandbytes":
        lib = require_module("bitsandbytes", f"optimizer={name!r}")
        return getattr(lib.optim, cls_name)(params, **options)
    optim = require_module("torchao.optim", f"optimizer={name!r}")
    return getattr(optim, cls_name)(params, **options)
