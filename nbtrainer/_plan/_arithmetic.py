"""Memory by arithmetic, exact where the arithmetic is: parameters under ``quantize=``, LoRA adapters, optimizer state
by the libraries' own rules, the optimizer step's temporaries. Shared by the planner and ``profile_model(...).fits``.

Rules (bytes):

* ``quantize``: each quantizable ``nn.Linear`` weight (every one but the output head, as the Trainer picks them)
  becomes 4-bit (0.5 byte per value, plus an fp32 ``absmax`` per block of 64 and a 16-entry code book; with
  double quantization ``"nf4-dq"`` the block scales are 8-bit, with an fp32 scale per 256 of them and a 256-entry
  code book) or int8 (1 byte per value plus an fp32 scale per output row). Biases stay in full precision.
* ``lora``: adapters of ``r * (in + out)`` fp32 parameters beside every targeted linear layer; the base is frozen.
* optimizer state: AdamW keeps 2 moments in the parameter's dtype and a scalar step; ``adamw8bit`` /
  ``paged_adamw8bit`` (bitsandbytes) 2 bytes per value plus an fp32 scale per block of 256 and two shared 256-entry
  maps; ``adamw4bit`` (torchao) 1 byte per value plus an fp32 scale per block of 128; tensors under 4096 values
  stay 32-bit. ``adafactor``: a row and a column statistic per matrix. ``sgd`` as built by name (momentum 0):
  nothing (torch's SGD keeps a momentum buffer only when momentum is set).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from nbtrainer._optimizer_kinds import OPTIMIZERS

if TYPE_CHECKING:
    from nbtrainer._options import MemoryOptions

__all__ = [
    "KBIT",
    "MIN_KBIT",
    "RowTensors",
    "adam_state_bytes",
    "lora_kept",
    "lora_saved",
    "model_structure",
    "optimizer_state_bytes",
    "quantized_bytes",
    "quantized_tensors",
    "row_tensors",
    "state_tensors",
    "step_temporaries",
    "targeted",
]

#: k-bit optimizers: bytes per value and block (the registry's, nbtrainer._options.OPTIMIZERS)
KBIT = {name: kind.kbit for name, kind in OPTIMIZERS.items() if kind.state == "kbit"}
MIN_KBIT = 4096  # bitsandbytes' min_8bit_size; torchao follows it


def model_structure(model: nn.Module) -> dict[str, Any]:
    """The layer table fits() needs: every parameter ``[name, numel, element_size, trainable, shape]`` and every
    linear layer ``[name, in, out, has_bias, quantizable]`` (quantizable: what ``Trainer(quantize=)`` replaces)."""
    from nbtrainer._setup._lora import task_heads
    from nbtrainer._setup._quantize import output_head_name, quantizable_linears

    head = output_head_name(model)
    quantizable = set(quantizable_linears(model))
    return {
        "head": head,
        "lora_heads": task_heads(model),  # trained in full beside LoRA adapters (modules_to_save)
        "params": [
            [name, p.numel(), p.element_size(), bool(p.requires_grad), list(p.shape)]
            for name, p in model.named_parameters()
        ],
        "linears": [
            [name, m.in_features, m.out_features, m.bias is not None, name in quantizable]
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name
        ],
    }


def targeted(name: str, targets: Any, quantizable: bool, head: str | None) -> bool:
    """PEFT's matching: "all-linear" (every linear but the head), a regex matched in full, or module-name suffixes."""
    if targets is None or (isinstance(targets, str) and targets.lower() == "all-linear"):
        return name != head
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _state(name: str) -> str | None:
    kind = OPTIMIZERS.get(name)
    return kind.state if kind is not None else None


def adam_state_bytes(numel: int, elem: int) -> int:
    return 2 * numel * elem + 4  # exp_avg, exp_avg_sq and a scalar fp32 step


def optimizer_state_bytes(name: str, trained: list[tuple[int, int, list[int]]]) -> int:
    """State bytes of optimizer ``name`` over ``(numel, element_size, shape)`` trained tensors (the libraries' rules:
    bitsandbytes' 8-bit blocks of 256 and shared maps, torchao's 4-bit blocks of 128, both keeping tensors under
    :data:`MIN_KBIT` values in 32 bits; Adafactor's row and column statistics; none for SGD without momentum; two
    moments otherwise)."""
    total = 0
    if _state(name) == "stateless":
        return 0
    if name in KBIT:
        per_value, block = KBIT[name]
        torchao = OPTIMIZERS[name].library == "torchao"  # torchao keeps a tensor not made of whole blocks in 32 bits
        small = [(n, e) for n, e, _ in trained if n < MIN_KBIT or (torchao and n % block)]
        big = [n for n, _, _ in trained if n >= MIN_KBIT and not (torchao and n % block)]
        total += sum(2 * n * e for n, e in small)
        total += sum(n * per_value + 2 * 4 * math.ceil(n / block) for n in big)
        maps = 2 * 256 * 4 if not torchao else 2 * 16 * 4 * len(big)  # bnb's maps are shared
        return total + (maps if big else 0)
    if _state(name) == "adafactor":
        for n, e, shape in trained:
            total += 4 + (4 * (shape[-2] + shape[-1]) * (n // (shape[-2] * shape[-1])) if len(shape) >= 2 else n * e)
        return total
    return sum(adam_state_bytes(n, e) for n, e, _ in trained)


def quantized_tensors(method: str, n_in: int, n_out: int) -> list[int]:
    """The tensors (bytes each) a quantized ``n_in x n_out`` weight is stored in: the packed values, the block
    scales (and with double quantization their scales, code book and offset), the code book."""
    n = n_in * n_out
    if method == "int8":
        return [n, 4 * n_out]
    blocks = math.ceil(n / 64)
    if method == "nf4-dq":
        return [n // 2, blocks, 4 * math.ceil(blocks / 256), 4 * 256, 4 * 16, 4]
    return [n // 2, 4 * blocks, 4 * 16]


def quantized_bytes(method: str, n_in: int, n_out: int) -> int:
    return sum(quantized_tensors(method, n_in, n_out))


def state_tensors(name: str, trained: list[tuple[int, int, list[int]]]) -> tuple[list[list[int]], list[int]]:
    """Optimizer ``name``'s state as the tensors (bytes each) it allocates: per trained tensor, and shared by all
    (bitsandbytes' two 256-entry maps). They sum to :func:`optimizer_state_bytes` (the caching allocator rounds each
    one on its own)."""
    per: list[list[int]] = []
    shared: list[int] = []
    if name in KBIT:
        per_value, block = KBIT[name]
        torchao = OPTIMIZERS[name].library == "torchao"
        for n, e, _ in trained:
            if n < MIN_KBIT or (torchao and n % block):
                per.append([n * e, n * e])
                continue
            packed, scales = n * per_value, 4 * math.ceil(n / block)
            per.append([packed // 2, packed - packed // 2, scales, scales])
            if torchao:
                per[-1] += [2 * 16 * 4 // 2, 2 * 16 * 4 // 2]
            elif not shared:
                shared = [256 * 4, 256 * 4]
        return per, shared
    for n, e, shape in trained:
        if _state(name) == "stateless":
            per.append([])
        elif _state(name) == "adafactor":
            if len(shape) >= 2:
                stacked = n // (shape[-2] * shape[-1])
                per.append([4, 4 * shape[-2] * stacked, 4 * shape[-1] * stacked])
            else:
                per.append([4, n * e])
        else:  # AdamW: a scalar step and two moments
            per.append([4, n * e, n * e])
    return per, shared


def step_temporaries(
    name: str, device_type: str, trained: list[tuple[int, int, list[int]]], *, in_backward: bool, fused: bool = True
) -> int:
    """The largest extra the optimizer's ``step()`` allocates while it runs (beyond state and gradients).

    AdamW / Adam built by name (``Trainer(optimizer="adamw")``) use torch's fused kernel where the device has one:
    no temporaries. An AdamW built with torch's defaults runs ``foreach`` on CUDA, where ``sqrt(exp_avg_sq)`` for the
    whole group is one temporary list as large as the trained parameters, and tensor by tensor on the CPU (and in
    backward), so the largest parameter's worth. The 8-bit / 4-bit kernels update block by block in place; Adafactor
    builds one parameter-sized update at a time; SGD built by name (fused, no momentum) updates in place.
    """
    moments = _state(name) == "moments"
    if not trained or name in KBIT or (fused and (moments or _state(name) == "stateless")):
        return 0
    largest = max(n * e for n, e, _ in trained)
    if moments and device_type == "cuda" and not in_backward:
        return sum(n * e for n, e, _ in trained)
    return largest


@dataclass(frozen=True)
class RowTensors:
    """What a row keeps on the device between steps, tensor by tensor (bytes), and what it trains.

    Attributes:
        params: each parameter's storage (a quantized weight: its packed values, scales and code book; LoRA's
            adapters after the model's own).
        trained: ``(numel, element_size, shape)`` of each trained tensor.
        dequant: the dequantized copy of the largest quantized weight (a 4-bit matmul's temporary), 0 without.
    """

    params: list[int]
    trained: list[tuple[int, int, list[int]]]
    dequant: int


def lora_saved(structure: dict[str, Any], lora: Mapping[str, Any]) -> list[str]:
    """The modules ``lora=`` trains in full as a copy: a Hugging Face task head (``nbtrainer._setup._lora.task_heads``:
    not once ``trainable=`` chooses what trains beside the adapters, as ``MemorySavers`` does) and
    ``modules_to_save``."""
    heads = () if lora_kept(lora) else structure.get("lora_heads", ())
    return [*heads, *(lora.get("modules_to_save") or ())]


def lora_kept(lora: Mapping[str, Any] | None) -> set[str]:
    """The parameters ``trainable=`` trains in full beside ``lora=``'s adapters (``nbtrainer._options.lora_settings``
    puts them in the settings): no copy, neither quantized nor adapted."""
    return set((lora or {}).get("trainable") or ())


def row_tensors(
    structure: dict[str, Any], memory: MemoryOptions, keep: Callable[[str], bool] | None = None
) -> RowTensors:
    """The row's parameters and trained tensors from the layer table; ``keep``: only the parameters (and linear
    layers) whose names it accepts (a shallow copy of the model's stack)."""
    rows = [row for row in structure["params"] if keep is None or keep(row[0])]
    linears = [row for row in structure["linears"] if keep is None or keep(row[0])]
    sizes = {row[0]: [row[1] * row[2]] for row in rows}
    trained = [(n, e, shape) for _, n, e, trains, shape in rows if trains]
    kept = lora_kept(memory.lora)
    dequant = 0
    if memory.quantize:
        by_name = {row[0]: row for row in rows}
        names: set[str] = set()
        for name, n_in, n_out, _, q in linears:
            if not q or f"{name}.weight" not in by_name or f"{name}.weight" in kept:
                continue
            sizes[f"{name}.weight"] = quantized_tensors(memory.quantize, n_in, n_out)
            dequant = max(dequant, n_in * n_out * (2 if memory.precision != "fp32" else 4))
            names |= {f"{name}.weight", f"{name}.bias"}
        trained = [(n, e, shape) for name, n, e, trains, shape in rows if trains and name not in names]
    adapters: list[int] = []
    if memory.lora is not None:
        from nbtrainer._setup._lora import inside_modules

        r = int(memory.lora.get("r", 8))
        saved = lora_saved(structure, memory.lora)
        targets = [
            row
            for row in linears
            if targeted(row[0], memory.lora.get("target_modules", "all-linear"), row[4], structure["head"])
            and not inside_modules(row[0], saved)
        ]
        trained = [(r * n_in, 4, [r, n_in]) for _, n_in, _, _, _ in targets]
        trained += [(r * n_out, 4, [n_out, r]) for _, _, n_out, _, _ in targets]
        # a saved module trains as a full copy beside its frozen original (PEFT's ModulesToSaveWrapper)
        trained += [(n, e, shape) for name, n, e, _, shape in rows if inside_modules(name, saved)]
        adapters = [n * e for n, e, _ in trained]
        # trainable= keeps the model's own parameters training beside the adapters: no copy, their gradient and state
        trained += [(n, e, shape) for name, n, e, _, shape in rows if name in kept and not inside_modules(name, saved)]
    params = [size for tensors in sizes.values() for size in tensors] + adapters
    return RowTensors(params, trained, dequant)
