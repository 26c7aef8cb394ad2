"""The step-time model behind ``PlanRow.time_factor``: a product of per-switch factors, relative to plain fp32.

These are rough, stated costs for ranking combinations (which is faster: bf16 + checkpointing, or fp32 with an 8-bit
optimizer?), not a measurement of your model. They come from this project's benchmarks (bench/RESULTS.md: the
memory switches on an H200 and on 2 CPU cores) and the usual published figures; docs/will-it-fit.md lists them.

* mixed precision: 0.45x on CUDA (tensor cores); on a CPU bf16 autocast is 1.0x where the CPU computes bf16
  natively (AMX, AVX512-BF16), else 1.2x (casts around fp32 kernels); fp16 is emulated on most CPUs, so it is not
  proposed there;
* activation checkpointing: the blocks' forward runs twice, 1.3x on CUDA, 1.45x on a CPU (checkpointing a share of
  the blocks: that share of it); the chunked loss recomputes the head, 1.15x (1.3x on a CPU);
* 8-bit / 4-bit AdamW: 1.1x / 1.15x (block-wise dequantize and requantize), paged 1.15x, Adafactor 1.3x; on a CPU
  1.6x and 1.3x (bitsandbytes' and torchao's CPU kernels, torch's Adafactor);
* offload: activations cross PCIe twice, 2.5x; optimizer state on the host (the CPU steps it), 1.6x;
* a quantized (4-bit) base: 2.0x on CUDA, 1.5x on a CPU (dequantized at each matmul); LoRA alone 0.8x (no weight
  gradients for the frozen base);
* micro-batches: each halving of the micro-batch costs 60% on CUDA (measured 1.56-1.8x on an H200 with ~100M-parameter
  models, launch-bound at small micro-batches; a model that fills the GPU pays less), 35% on a CPU (measured: a small
  model's step is mostly per-pass overhead there); the number of samples per optimizer step is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._options import MemoryOptions

__all__ = ["CPU", "CUDA", "Factors", "checkpointed_share", "cpu_factors", "time_factor"]


@dataclasses.dataclass(frozen=True)
class Factors:
    """The step-time factors of one kind of device, per switch (the optimizer kinds' are in the registry,
    ``nbtrainer._options.OPTIMIZERS``: ``OptimizerKind.time``)."""

    bf16_mixed: float
    fp16_mixed: float
    activation_checkpointing: float
    chunked_loss: float
    offload_activations: float
    offload_optimizer: float
    quantize: float
    lora: float
    halving: float  # each halving of the micro-batch
    column: int  # which of OptimizerKind.time: 0 CUDA, 1 CPU

    def precision(self, name: str) -> float:
        return {"bf16-mixed": self.bf16_mixed, "fp16-mixed": self.fp16_mixed}.get(name, 1.0)

    def optimizer(self, kind: str | None) -> float:
        found = OPTIMIZERS.get(kind or "adamw")
        return found.time[self.column] if found is not None else 1.0


# corrected from the H200's step times (bench/RESULTS.md, GPU check 2026-11-30, issue 52): the 106M Llama's rows
# (bf16, batch 8 x 512 tokens) ranked at Kendall's tau 0.64 with a halving at 1.08, since ~100M-parameter models
# are launch-bound at small micro-batches there (each halving 1.8x on the Llama, 1.56x on the BERT-base strategy
# table); the chunked loss cost 1.15x with a 32k vocabulary, Adafactor 1.32x and 1.35x (the registry's CUDA column)
CUDA = Factors(
    bf16_mixed=0.45,
    fp16_mixed=0.45,
    activation_checkpointing=1.3,
    chunked_loss=1.15,
    offload_activations=2.5,
    offload_optimizer=1.6,
    quantize=2.0,
    lora=0.8,
    halving=1.6,
    column=0,
)
# corrected from bench/plan_vs_measured.py's step times on the 2-core VM (bench/RESULTS.md, issue 48): a CPU
# pays per micro-batch far more than a GPU (each halving 1.35x, not 1.03x), recomputes a block at its full cost
# (1.45x), and runs bitsandbytes' 8-bit and torch's Adafactor steps slowly; bf16 autocast is about as fast as
# fp32 where the CPU computes bf16 natively (AMX / AVX512-BF16), slower where it converts (see cpu_factors)
CPU = Factors(
    bf16_mixed=1.2,
    fp16_mixed=3.0,
    activation_checkpointing=1.45,
    chunked_loss=1.3,
    offload_activations=1.0,
    offload_optimizer=1.6,
    quantize=1.5,
    lora=0.8,
    halving=1.35,
    column=1,
)


@functools.cache
def cpu_factors() -> Factors:
    """The CPU column, with bf16 autocast at 1.0x where this CPU computes bf16 natively (oneDNN says so: AMX or
    AVX512-BF16; measured 0.78-1.22x of fp32 on the VM's AMX CPU, 0.97x their geometric mean: no faster, so a plan
    keeps fp32 when it fits) and 1.2x where it converts around fp32 kernels."""
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return dataclasses.replace(CPU, bf16_mixed=1.0) if native else CPU


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
    f = CUDA if device_type == "cuda" else cpu_factors()
    factor = f.precision(memory.precision)
    if memory.activation_checkpointing:
        share = checkpointed_share(memory.activation_checkpointing, blocks)
        factor *= 1 + (f.activation_checkpointing - 1) * share
    if memory.chunked_loss:
        factor *= f.chunked_loss
    factor *= f.optimizer(memory.optimizer)
    if memory.offload_activations:
        factor *= f.offload_activations
    if memory.offload_optimizer:
        factor *= f.offload_optimizer
    if memory.quantize:
        factor *= f.quantize
    if memory.lora is not None:
        factor *= f.lora
    if grad_accum_steps > 1:
        factor *= f.halving ** math.log2(grad_accum_steps)
    return factor
