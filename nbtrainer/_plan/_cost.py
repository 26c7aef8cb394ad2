"""The step-time model behind ``PlanRow.time_factor``: a product of per-switch factors, relative to plain fp32.

These are rough, stated costs for ranking combinations (which is faster: bf16 + checkpointing, or fp32 with an 8-bit
optimizer?), not a measurement of your model. They come from this project's benchmarks (bench/RESULTS.md: the
memory switches on an H200 and on 2 CPU cores) and the usual published figures; docs/will-it-fit.md lists them.

* mixed precision: 0.45x on CUDA (tensor cores); on a CPU bf16 autocast is 1.2x (casts around fp32 kernels) and
  fp16 is emulated on most CPUs, so it is not proposed there;
* activation checkpointing: the blocks' forward runs twice, 1.3x (checkpointing a share of the blocks: that share
  of the 0.3); the chunked loss recomputes the head, 1.05x;
* 8-bit / 4-bit AdamW: 1.1x / 1.15x (block-wise dequantize and requantize), paged 1.15x, Adafactor 1.05x;
* offload: activations cross PCIe twice, 2.5x; optimizer state on the host (the CPU steps it), 1.6x;
* a quantized (4-bit) base: 2.0x on CUDA, 1.5x on a CPU (dequantized at each matmul); LoRA alone 0.8x (no weight
  gradients for the frozen base);
* micro-batches: each halving of the micro-batch costs 8% on CUDA (smaller kernels), 3% on a CPU; the number of
  samples per optimizer step is the same.
"""

from __future__ import annotations

import math

from nbtrainer._options import MemoryOptions

__all__ = ["checkpointed_share", "time_factor"]

_FACTORS: dict[str, dict[str, float]] = {
    "cuda": {
        "bf16-mixed": 0.45,
        "fp16-mixed": 0.45,
        "checkpointing": 1.3,
        "chunked_loss": 1.05,
        "adamw8bit": 1.1,
        "paged_adamw8bit": 1.15,
        "adamw4bit": 1.15,
        "adafactor": 1.05,
        "offload_activations": 2.5,
        "offload_optimizer": 1.6,
        "quantize": 2.0,
        "lora": 0.8,
        "halving": 1.08,
    },
    "cpu": {
        "bf16-mixed": 1.2,
        "fp16-mixed": 3.0,
        "checkpointing": 1.3,
        "chunked_loss": 1.05,
        "adamw8bit": 1.1,
        "paged_adamw8bit": 1.15,
        "adamw4bit": 1.15,
        "adafactor": 1.05,
        "offload_activations": 1.0,
        "offload_optimizer": 1.6,
        "quantize": 1.5,
        "lora": 0.8,
        "halving": 1.03,
    },
}


def checkpointed_share(value: object, blocks: int | None) -> float:
    """The share of the repeated blocks ``activation_checkpointing=value`` checkpoints (1 for True or a list)."""
    from nbtrainer._setup._activation_checkpointing import checkpoint_count, is_selective

    if not is_selective(value):
        return 1.0
    if isinstance(value, float):
        return value if not blocks else checkpoint_count(value, blocks) / blocks
    return min(1.0, value / blocks) if blocks else 1.0  # type: ignore[operator]


def time_factor(device_type: str, memory: MemoryOptions, grad_accum_steps: int, blocks: int | None = None) -> float:
    """Predicted step time relative to plain fp32 with the whole batch at once (see the module docstring).

    ``blocks``: the model's repeated blocks, for selective checkpointing (``activation_checkpointing=0.5`` or ``k``):
    only the checkpointed share of the blocks runs its forward twice.

    Example:
        >>> round(time_factor("cuda", MemoryOptions(precision="bf16-mixed", activation_checkpointing=True), 1), 3)
        0.585
    """
    f = _FACTORS["cuda" if device_type == "cuda" else "cpu"]
    factor = f.get(memory.precision, 1.0)
    if memory.activation_checkpointing:
        factor *= 1 + (f["checkpointing"] - 1) * checkpointed_share(memory.activation_checkpointing, blocks)
    if memory.chunked_loss:
        factor *= f["chunked_loss"]
    factor *= f.get(memory.optimizer or "adamw", 1.0)
    if memory.offload_activations:
        factor *= f["offload_activations"]
    if memory.offload_optimizer:
        factor *= f["offload_optimizer"]
    if memory.quantize:
        factor *= f["quantize"]
    if memory.lora is not None:
        factor *= f["lora"]
    if grad_accum_steps > 1:
        factor *= f["halving"] ** math.log2(grad_accum_steps)
    return factor
