"""A quantized, frozen base: ``Trainer(quantize="nf4" | "nf4-dq" | "fp4" | "int8")``.

The base model's ``nn.Linear`` layers become frozen bitsandbytes layers (``Linear4bit`` for nf4 / fp4,
``Linear8bitLt`` for LLM.int8) on any ``nn.Module``, not only Hugging Face models loaded with a
``quantization_config``. Left in full precision: the output head (its logits feed the loss directly and it is
often tied to the embedding), and every layer whose parameters ``trainable=`` keeps training (a quantized
weight cannot take a gradient step). The 4-bit compute dtype follows the Trainer's precision.

Each layer is quantized straight onto the training device, one at a time, so a model whose fp32 weights do
not fit the GPU can still be quantized into it. bitsandbytes is imported only here, when asked for.
"""

from __future__ import annotations

import copy
import functools
import importlib
import logging
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from nbtrainer._options import QUANTIZE
from nbtrainer._quiet import quiet_imports
from nbtrainer._setup._seed import rng_untouched

__all__ = [
    "INSTALL_QUANT",
    "QUANTIZE",
    "bnb",
    "check_quantize",
    "compute_dtype",
    "dequantize_linear",
    "is_quantized_linear",
    "normalize_quantize",
    "output_head_name",
    "quantizable_linears",
    "quantize_model",
    "quantized_weight_bytes",
]

log = logging.getLogger(__name__)

# The quantize= names (nbtrainer._options.QUANTIZE): bitsandbytes 4-bit NormalFloat (-dq: double quantization of
# the block scales, about 0.4 bit less per weight), 4-bit float, and LLM.int8.
INSTALL_QUANT = 'pip install "nbtrainer[quant]"'


class _NoHubKernelNotice(logging.Filter):
    """bitsandbytes, on a CPU with AVX512-BF16, tries to fetch a 4-bit matmul kernel from the Hugging Face Hub
    through the ``kernels`` package at import, and logs a warning advising ``pip install kernels`` when it is
    absent. nbtrainer never downloads code at run time (that package does), and bitsandbytes' built-in kernel
    runs instead, so the advice would only be red text in every notebook that builds a Trainer."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community")


# before anything imports bitsandbytes (here, or PEFT / transformers when they check for it)
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoHubKernelNotice())


def require_module(module: str, what: str) -> ModuleType:
    """``import module`` or an ImportError naming the feature and the extra that installs it."""
    try:
        with quiet_imports():  # torchao's CPU-build noise (its import, or transformers' import of it)
            return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs {module}, which is not installed here. Install it with: {INSTALL_QUANT}"
        ) from exc


def bnb(what: str) -> Any:
    """The bitsandbytes module, or an ImportError that says how to install it."""
    return require_module("bitsandbytes", what)


def normalize_quantize(value: Any) -> str | None:
    """``None`` or one of :data:`QUANTIZE` (case-insensitive); anything else is refused with the choices."""
    if value is None or value is False:
        return None
    key = str(value).strip().lower() if isinstance(value, str) else None
    if key not in QUANTIZE:
        raise ValueError(
            f"quantize={value!r} is not a quantization: use one of {list(QUANTIZE)} (bitsandbytes 4-bit nf4, "
            "nf4 with double quantization, 4-bit fp4, 8-bit LLM.int8) or None for full-precision weights."
        )
    return key


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype 4-bit layers compute in: the autocast dtype of ``precision``, else float32."""
    from nbtrainer._setup._precision import autocast_dtype

    return autocast_dtype(precision) or torch.float32


def is_quantized_linear(module: nn.Module) -> bool:
    """A bitsandbytes 4-bit or 8-bit linear layer (checked without importing bitsandbytes)."""
    return type(module).__module__.startswith("bitsandbytes") and type(module).__name__ in (
        "Linear4bit",
        "LinearNF4",
        "LinearFP4",
        "Linear8bitLt",
    )


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2's linear layers, weight stored ``(in, out)``), checked without importing it."""
    cls = type(module)
    return cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers")


def is_linear(module: nn.Module) -> bool:
    """A linear layer as PEFT's ``"all-linear"`` counts them: ``nn.Linear``, transformers' ``Conv1D``, bitsandbytes'."""
    return isinstance(module, nn.Linear) or is_conv1d(module) or is_quantized_linear(module)


def conv1d_as_linear(module: nn.Module) -> nn.Linear:
    """An ``nn.Linear`` computing what a ``Conv1D`` does (``x @ W + b`` with ``W`` of shape ``(in, out)``)."""
    weight: Any = module.weight
    n_in, n_out = weight.shape
    linear = nn.Linear(n_in, n_out, bias=getattr(module, "bias", None) is not None, device=weight.device,
                       dtype=weight.dtype)  # fmt: skip
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        if linear.bias is not None:
            linear.bias.copy_(module.bias)  # type: ignore[arg-type]
    linear.weight.requires_grad_(weight.requires_grad)
    return linear


def output_head_name(model: nn.Module) -> str | None:
    """The output layer's qualified name: a Hugging Face model's output embeddings, else the last
    ``nn.Linear`` registered (the usual place of a classifier / LM head)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    last = None
    for name, module in model.named_modules():
        if head is not None and module is head:
            return name
        if is_linear(module):
            last = name
    return last if head is None else None


def quantizable_linears(model: nn.Module, keep: Iterable[str] = ()) -> list[str]:
    """Qualified names of the ``nn.Linear`` (and transformers ``Conv1D``) layers :func:`quantize_model` replaces:
    all but the output head and those whose parameters are named in ``keep`` (the ones that stay trainable)."""
    keep = set(keep)
    head = output_head_name(model)
    names = []
    for name, module in model.named_modules():
        # subclasses of nn.Linear may carry behaviour we would drop
        if not (type(module) is nn.Linear or is_conv1d(module)) or name == head:
            continue
        if any(f"{name}.{p}" in keep for p, _ in module.named_parameters()):
            continue
        names.append(name)
    return names


@functools.cache
def _probe(device_key: str, method: str, dtype: torch.dtype) -> str:
    """Why a quantized layer cannot run forward + backward on this device ("" if it can)."""
    device = torch.device(device_key)
    try:
        # cached, so it runs in the first Trainer only: its random draws must not shift the caller's RNG (the
        # LoRA adapters' init right after it would differ from a later Trainer's, and no resume would match)
        with rng_untouched(device):
            lib = bnb("quantize=")
            layer = _quantized_copy(lib, nn.Linear(64, 64), method, dtype, device)
            x = torch.randn(4, 64, device=device, dtype=dtype, requires_grad=True)
            layer(x).float().sum().backward()
    except Exception as exc:
        log.debug("this quantized layer cannot run here: the reason is returned", exc_info=True)
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return ""


def check_quantize(
    model: nn.Module,
    quantize: Any,
    *,
    device: torch.device,
    precision: str = "fp32",
    keep: Iterable[str] = (),
) -> tuple[str | None, list[str]]:
    """Check ``quantize=`` before anything changes: ``(name, layers to quantize)``.

    Refused with the reason and the fix: an unknown name, bitsandbytes missing, a device that cannot run
    the quantized layer, a model with no ``nn.Linear`` to quantize.
    """
    name = normalize_quantize(quantize)
    if name is None:
        return None, []
    bnb(f"quantize={name!r}")
    names = quantizable_linears(model, keep)
    if not names:
        present = [n for n, m in model.named_modules() if is_linear(m)]
        why = (
            f"its only nn.Linear layers are the output head or trainable ({present})"
            if present
            else "it has no nn.Linear layer"
        )
        raise ValueError(
            f"quantize={name!r} has nothing to quantize in {type(model).__name__}: {why}. bitsandbytes "
            "quantizes nn.Linear weights; use quantize=None for this model, or unfreeze fewer layers."
        )
    reason = _probe(str(device), name, compute_dtype(precision))
    if reason:
        raise ValueError(
            f"quantize={name!r} cannot run on {device} with precision={precision!r}: a bitsandbytes test layer "
            f"failed ({reason}). bitsandbytes needs CUDA, or an x86-64 CPU with AVX2; use quantize=None, "
            "another device, or another precision."
        )
    return name, names


def _quantized_copy(lib: Any, linear: nn.Linear, method: str, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """A frozen bitsandbytes layer with ``linear``'s weights, quantized on ``device``."""
    weight = linear.weight.data
    bias = linear.bias.data if linear.bias is not None else None
    if method == "int8":
        layer = lib.nn.Linear8bitLt(
            linear.in_features, linear.out_features, bias=bias is not None, has_fp16_weights=False, device="meta"
        )
        layer.weight = lib.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        quant_type = "fp4" if method == "fp4" else "nf4"
        double = method == "nf4-dq"
        layer = lib.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=bias is not None,
            compute_dtype=dtype,
            compress_statistics=double,
            quant_type=quant_type,
            device="meta",
        )
        layer.weight = lib.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type, compress_statistics=double)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    if hasattr(layer, "support_avx512bf16_for_cpu"):
        # On AVX512-BF16 CPUs an eval-mode forward repacks the weight in place into an inference layout whose
        # kernel has no backward: after a validation pass, training would silently stop propagating gradients
        # through the base (into earlier adapters), and eval would round differently from training.
        layer.support_avx512bf16_for_cpu = False
    return layer.to(device)  # quantizes (Params4bit / Int8Params quantize on .to)


def quantize_model(
    model: nn.Module, names: Iterable[str], method: str, *, dtype: torch.dtype, device: torch.device
) -> int:
    """Replace the named ``nn.Linear`` layers by frozen bitsandbytes layers, in place; returns how many.

    The model is flagged ``is_loaded_in_4bit`` / ``is_loaded_in_8bit`` (the attributes Hugging Face sets
    when it loads quantized weights), so PEFT wraps these layers with its quantization-aware LoRA layers.
    """
    lib = bnb(f"quantize={method!r}")
    count = 0
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if is_conv1d(linear):  # GPT-2's layers: the same product as an nn.Linear with the weight transposed
            linear = conv1d_as_linear(linear)
        setattr(parent, child, _quantized_copy(lib, linear, method, dtype, device))
        count += 1
    flag = "is_loaded_in_8bit" if method == "int8" else "is_loaded_in_4bit"
    setattr(model, flag, True)
    return count


def quantized_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """``(bytes stored, bytes as fp32)`` of the weights of the quantized layers (packed weights plus their
    scales and code books; biases left out, they stay in full precision)."""
    stored = full = 0
    module: Any
    for module in model.modules():
        if not is_quantized_linear(module):
            continue
        for key, value in module.state_dict().items():
            if isinstance(value, torch.Tensor) and key != "bias" and not key.endswith(".bias"):
                stored += value.numel() * value.element_size()
        full += int(module.in_features) * int(module.out_features) * 4
    return stored, full


def dequantize_linear(module: Any, dtype: torch.dtype = torch.float32) -> nn.Linear:
    """A plain ``nn.Linear`` with a bitsandbytes layer's weights dequantized (for merging and inference)."""
    lib = bnb("dequantizing")
    weight = module.weight
    if isinstance(module, lib.nn.Linear8bitLt):
        scb = getattr(weight, "SCB", None)
        if scb is None:
            scb = module.state.SCB
        dense = weight.data.float() * (scb.float().unsqueeze(1) / 127.0)
    else:
        data, state = weight.data, weight.quant_state
        if getattr(state, "packing_format_for_cpu", False):  # a layer bitsandbytes repacked for CPU inference
            data, state = lib.functional._convert_weight_packed_for_cpu_inverse(data, copy.deepcopy(state))
        dense = lib.functional.dequantize_4bit(data, state).float()
    out = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device=dense.device)
    out.weight.data = dense.to(dtype)
    if module.bias is not None:
        out.bias.data = module.bias.data.detach().to(dtype).clone()
    return out
