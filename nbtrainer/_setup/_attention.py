"""The attention kernel: ``Trainer(attention="auto" | "flash" | "efficient" | "cudnn" | "math")``.

Every ``torch.nn.functional.scaled_dot_product_attention`` call in the model's forward runs on the named
backend (``torch.nn.attention.sdpa_kernel`` entered by a forward pre-hook, left by a forward hook). The
backward uses the kernel its forward chose. ``"auto"`` leaves torch's choice (the fastest backend that can
run each call) and the model alone. A Hugging Face model is switched to ``attn_implementation="sdpa"``
(an "eager" model never calls SDPA, and the choice would do nothing).

Checked up front like precision: a tiny SDPA forward + backward on this device, in the dtype the model
computes in, under the backend alone. A backend that cannot run it (flash on a GPU that needs half
precision for it while training in fp32, memory-efficient on a CPU...) is refused with the ones that can.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

from nbtrainer._setup._seed import rng_untouched

__all__ = ["ATTENTION", "AttentionKernel", "attention_support", "check_attention"]

log = logging.getLogger(__name__)

#: ``attention=`` names -> ``torch.nn.attention.SDPBackend`` member names.
ATTENTION: dict[str, str | None] = {
    "auto": None,
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def _backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend

    member = ATTENTION[name]
    return getattr(SDPBackend, member) if member else None


@functools.cache
def _probe(device_key: str, name: str, dtype: torch.dtype) -> str:
    """Why SDPA under backend ``name`` cannot run forward + backward here ("" when it can)."""
    from torch.nn.attention import sdpa_kernel

    device = torch.device(device_key)
    try:
        # cached (runs once per process): its random draws must not shift the caller's RNG streams
        with rng_untouched(device):
            q, k, v = (torch.randn(1, 2, 16, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            with sdpa_kernel(_backend(name)):
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.float().sum().backward()
    except Exception as exc:
        log.debug("this attention backend cannot run here: the reason is returned", exc_info=True)
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"
    return ""


def attention_support(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> dict[str, tuple[bool, str]]:
    """Which ``attention=`` backends run on ``device`` in ``dtype``: ``{name: (ok, reason)}``.

    Example:
        >>> attention_support("cpu")["math"]
        (True, '')
    """
    dev = torch.device(device)
    rows = {"auto": (True, "")}
    for name in ATTENTION:
        if name != "auto":
            reason = _probe(str(dev), name, dtype)
            rows[name] = (not reason, reason)
    return rows


def check_attention(value: Any, device: torch.device, dtype: torch.dtype) -> str:
    """The ``attention=`` name, refused with the alternatives when this device / dtype cannot run it."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in ATTENTION:
        raise ValueError(f"attention={value!r} is not an SDPA backend: use one of {list(ATTENTION)}.")
    if key == "auto":
        return key
    reason = _probe(str(device), key, dtype)
    if reason:
        ok = [n for n, (good, _) in attention_support(device, dtype).items() if good and n != "auto"]
        dtype_name = str(dtype).replace("torch.", "")
        raise ValueError(
            f"attention={key!r} cannot run on {device} in {dtype_name} (a test attention call failed: {reason}). "
            f"Backends that run here: {[*ok, 'auto']}"
            + (
                "; flash and efficient kernels often need half precision: precision='bf16-mixed' or 'fp16-mixed'."
                if dtype == torch.float32 and device.type == "cuda"
                else "."
            )
        )
    return key


class AttentionKernel:
    """Hooks that run the model's forward under ``sdpa_kernel(backend)``; :meth:`remove` takes them off."""

    def __init__(self, model: nn.Module, name: str) -> None:
        self.name = name
        self.switched_hf = False
        setter = getattr(model, "set_attn_implementation", None)
        config = getattr(model, "config", None)
        if callable(setter) and getattr(config, "_attn_implementation", "sdpa") != "sdpa":
            setter("sdpa")
            self.switched_hf = True
        self._stack: list[Any] = []
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._exit, always_call=True),
        ]

    def _enter(self, module: nn.Module, args: Any) -> None:
        from torch.nn.attention import sdpa_kernel

        ctx = sdpa_kernel(_backend(self.name))
        ctx.__enter__()
        self._stack.append(ctx)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
