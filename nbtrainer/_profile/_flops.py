"""MACs and FLOPs from two counters, each number labelled with the counter that produced it.

* **ptflops** (``backend="aten"``) counts **MACs** of ``mm``/``bmm``/``addmm``/``convolution`` at the
  aten level, so it sees functional ops such as ``q @ k.transpose(-2, -1)``. It counts a bias add as
  one MAC per output element. It has no rule for the fused attention kernels, so we add one
  (``_scaled_dot_product_*`` ops, 2 matmuls) through its ``custom_modules_hooks``; it has no
  backward rules, so its count is forward only.
* **torch.utils.flop_counter.FlopCounterMode** counts **FLOPs** (2 per multiply-accumulate) of
  matmuls, convolutions and attention, forward and backward, and ignores bias adds and elementwise
  ops. torch 2.13 has no formula for the CPU attention kernel
  (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), so we register torch's own
  SDPA formulas for it.

Convention: 1 MAC = 2 FLOPs. ``2 * ptflops_MACs - FlopCounterMode_FLOPs == 2 * bias adds`` for
models made of Linear/Conv/attention layers.

Counting runs with autograd enabled on a copy whose parameters all require grad: PyTorch's inference
fast paths (``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` under ``no_grad``) call fused
kernels that neither counter understands.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter as _fc

from nbtrainer._data._inputs import call_model, scalar_loss

__all__ = ["CONVENTION", "count_flops"]

CONVENTION = (
    "1 MAC = 2 FLOPs. macs: ptflops (aten backend) forward MACs, bias adds counted as MACs. "
    "flops: torch.utils.flop_counter.FlopCounterMode FLOPs (matmul/conv/attention; no bias, "
    "no elementwise). Per sample = per batch / batch_size."
)

aten = torch.ops.aten

# Fused attention kernels: (query, key, value, ...) come first in each of them.
_SDPA_FORWARD = [
    name
    for name in (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(aten, name)
]


def _ptflops_sdpa_macs(inputs: Any, outputs: Any) -> int:
    q, k, v = (t.shape for t in inputs[:3])
    return _fc.sdpa_flop_count(q, k, v) // 2


def _sdpa_forward_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _fc.sdpa_flop_count(query, key, value)


def _sdpa_backward_flops(
    grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return _fc.sdpa_backward_flop_count(grad_out, query, key, value)


def _torch_cpu_sdpa_mapping() -> dict[Any, Any]:
    """FlopCounterMode formulas for the CPU attention kernel, where torch lacks them."""
    mapping: dict[Any, Any] = {}
    fwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and fwd not in _fc.flop_registry:
        mapping[fwd] = _sdpa_forward_flops  # shapes in, as torch's own sdpa formula
    if bwd is not None and bwd not in _fc.flop_registry:
        mapping[bwd] = _sdpa_backward_flops
    return mapping


class _Adapter(nn.Module):
    """Lets ptflops (which calls ``model(**dict)``) feed tensors, tuples and dicts alike."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, nbt_inputs: Any) -> Any:
        return call_model(self.inner, nbt_inputs)


def _ptflops_macs(model: nn.Module, inputs: Any) -> tuple[int | None, str]:
    from ptflops import get_model_complexity_info

    hooks = {getattr(aten, name): _ptflops_sdpa_macs for name in _SDPA_FORWARD}
    sink = io.StringIO()  # ptflops prints failures instead of raising; keep them for the report
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        macs, _ = get_model_complexity_info(
            _Adapter(model),
            (1,),
            input_constructor=lambda _: {"nbt_inputs": inputs},
            print_per_layer_stat=False,
            as_strings=False,
            backend="aten",
            custom_modules_hooks=hooks,
            ost=sink,
        )
    return (int(macs) if macs is not None else None), ("" if macs is not None else sink.getvalue()[-500:])


def _torch_flops(model: nn.Module, inputs: Any, *, backward: bool) -> int:
    counter = _fc.FlopCounterMode(display=False, custom_mapping=_torch_cpu_sdpa_mapping())
    with counter:
        out = call_model(model, inputs)
        if backward:
            scalar_loss(out).backward()
    return int(counter.get_total_flops())


def _per(value: int | None, batch_size: int) -> dict[str, float | int | None]:
    if value is None:
        return {"per_batch": None, "per_sample": None}
    return {"per_batch": value, "per_sample": value / batch_size}


def count_flops(model: nn.Module, inputs: Any, *, batch_size: int) -> dict[str, Any]:
    """Count MACs (ptflops) and FLOPs (FlopCounterMode) of one forward and one forward+backward.

    Args:
        model: A private copy (it is put in eval mode and its ``requires_grad`` flags changed).
        inputs: Example inputs on the model's device (tensor, tuple of tensors or dict of tensors).
        batch_size: Samples in ``inputs``, for the per-sample numbers.

    Returns:
        ``{"convention", "batch_size", "counters": {...versions}, "ptflops_macs": {"forward":
        {"per_batch", "per_sample"}}, "flop_counter_flops": {"forward": {...}, "forward_backward":
        {...}}, "ptflops_error": str}``. ``forward_backward`` counts the backward of parameters that
        required grad in the caller's model (``None`` when there are none).

    Example:
        >>> import copy
        >>> counts = count_flops(copy.deepcopy(nn.Linear(8, 4, bias=False)), torch.randn(2, 8), batch_size=2)
        >>> counts["ptflops_macs"]["forward"]["per_batch"], counts["flop_counter_flops"]["forward"]["per_batch"]
        (64, 128)
    """
    trainable = [p.requires_grad for p in model.parameters()]
    model.eval()
    for p in model.parameters():
        if p.is_floating_point():
            p.requires_grad_(True)  # disables fused inference fast paths that no counter understands
    macs, error = _ptflops_macs(model, inputs)
    fwd = _torch_flops(model, inputs, backward=False)
    for p, flag in zip(model.parameters(), trainable, strict=True):
        p.requires_grad_(flag)
    model.train()
    fwd_bwd = _torch_flops(model, inputs, backward=True) if any(trainable) else None
    model.zero_grad(set_to_none=True)
    return {
        "convention": CONVENTION,
        "batch_size": batch_size,
        "counters": {
            "macs": f"ptflops {importlib.metadata.version('ptflops')} (aten backend, + nbtrainer SDPA rule)",
            "flops": f"torch {torch.__version__} torch.utils.flop_counter.FlopCounterMode",
        },
        "ptflops_macs": {"forward": _per(macs, batch_size)},
        "flop_counter_flops": {"forward": _per(fwd, batch_size), "forward_backward": _per(fwd_bwd, batch_size)},
        "ptflops_error": error,
    }
