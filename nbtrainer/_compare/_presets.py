"""The strategies to compare: named presets (``"bf16"``, ``"ckpt"``, ``"accumN"`` ...) or your own Trainer options."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from nbtrainer._options import MemoryOptions

__all__ = ["DEFAULT", "PRESETS", "inapplicable", "resolve_strategies"]

#: ``compare_strategies``' list when none is given, less what cannot apply to the model (:func:`inapplicable`)
DEFAULT: tuple[str, ...] = ("fp32", "bf16", "ckpt", "accum4", "adafactor")

_LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"}


def _memory(**switches: Any) -> dict[str, Any]:
    """Memory switches as Trainer options, through the one place they are declared (a misspelt name fails here)."""
    return MemoryOptions(**switches).changed()


#: Strategy presets by name (``compare_strategies(strategies=["fp32", "bf16", "ckpt", "accum4"])``).
PRESETS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": _memory(precision="fp16-mixed"),
    "bf16": _memory(precision="bf16-mixed"),
    "ckpt": _memory(activation_checkpointing=True),
    "accum4": {"grad_accum_steps": 4},
    "adafactor": _memory(optimizer="adafactor"),
    # Training what does not fit (nbtrainer._setup._memory_savers): a frozen nf4 base with LoRA adapters, 8-bit
    # AdamW state, saved activations in CPU memory, the flash SDPA kernel.
    "qlora": _memory(quantize="nf4", lora=dict(_LORA), optimizer="adamw"),  # by name: built after the adapters
    "adamw8bit": _memory(optimizer="adamw8bit"),
    "offload": _memory(offload_activations=True),
    "flash": _memory(attention="flash"),
    # each parameter updated inside backward, its gradient freed at once (no clipping / accumulation / fp16)
    "in_backward": _memory(optimizer_in_backward=True),
    # Every saver that runs on any device, together (offload_optimizer needs CUDA; flash needs half precision
    # on some GPUs, and "auto" picks it where it can run).
    "all": {
        **_memory(
            precision="bf16-mixed",
            activation_checkpointing=True,
            quantize="nf4",
            lora=dict(_LORA),
            optimizer="adamw8bit",
            offload_activations=True,
        ),
        "grad_accum_steps": 4,
    },
}


def resolve_strategies(strategies: Mapping[str, Mapping[str, Any]] | Sequence[str] | None) -> dict[str, dict]:
    """``{name: trainer options}`` from a dict, or from preset names (``"accumN"`` for any N).

    Example:
        >>> resolve_strategies(["fp32", "accum8"])
        {'fp32': {}, 'accum8': {'grad_accum_steps': 8}}
    """
    if strategies is None:
        strategies = list(DEFAULT)
    if isinstance(strategies, str):
        strategies = [s for s in re.split(r"[,\s]+", strategies) if s]
    if isinstance(strategies, Mapping):
        out = {}
        for name, options in strategies.items():
            if not isinstance(options, Mapping):
                raise TypeError(f"strategy {name!r}: options must be a dict of Trainer options, got {options!r}")
            out[str(name)] = dict(options)
    else:
        out = {}
        for name in strategies:
            m = re.fullmatch(r"accum(\d+)", str(name))
            if name in PRESETS:
                out[name] = {k: dict(v) if isinstance(v, dict) else v for k, v in PRESETS[name].items()}
            elif m:
                out[name] = {"grad_accum_steps": int(m.group(1))}
            else:
                raise ValueError(
                    f"Unknown strategy preset {name!r}: use one of {sorted(PRESETS)} or 'accumN', "
                    "or pass a dict {name: {trainer options}}."
                )
    if not out:
        raise ValueError("No strategies to compare.")
    return out


def inapplicable(model: Any, device: Any) -> dict[str, str]:
    """The default strategies that cannot apply to ``model`` on ``device``, each with the reason: left out of the
    default list (a row that can only fail tells nothing); named in a list, they still run and fail with it.

    Example:
        >>> import torch
        >>> inapplicable(torch.nn.Linear(4, 2), torch.device("cpu"))
        {'ckpt': 'the model has no repeated blocks to checkpoint'}
    """
    from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks
    from nbtrainer._setup._precision import precision_support

    out: dict[str, str] = {}
    own = any(callable(getattr(model, f"{p}_checkpointing_enable", None)) for p in ("activation", "gradient"))
    if not own and not find_checkpointable_blocks(model):
        out["ckpt"] = "the model has no repeated blocks to checkpoint"
    supported, reason = precision_support(device).get("bf16-mixed", (True, ""))
    if not supported:
        out["bf16"] = f"bf16-mixed does not run on {device}: {reason}"
    return out
