"""The attention kernel: ``Trainer(attention="auto" | "flash" | "efficient" | "cudnn" | "math")``.

Every ``torch.nn.functional.scaled_dot_product_attention`` call in the model's forward runs on the named
backend (``torch.nn.attention.sdpa_kernel`` entered by a forward pre-hook, left by a forward hook). The
backward uses the kernel its forward chose. ``"auto"`` leaves torch's choice (the fastest backend that can
run each call) and the model alone. A Hugging Face model is switched to ``attn_implementation="sdpa"``
(an "eager" model never calls SDPA, and the choice would do nothing).

Checked up front like precision: a tiny SDPA forward + backward on this device, in the dtype the model
computes in, under the backend alone. A backend that cannot run it (flash on a GPU that needs half
precision for it while training in fp32, memory-efficient on a CPU...) is refused with the ones that can.
A model that drops out attention weights while training (``nn.MultiheadAttention(dropout=0.1)``, as in
``nn.TransformerEncoderLayer``; a Hugging Face config's ``attention_dropout`` / ``attention_probs_dropout_prob``)
passes ``dropout_p > 0`` to SDPA, which some backends cannot run here (torch's CPU flash kernel): the probe is
then run with dropout too, and a backend that fails it is refused, naming the modules and the fix, rather than
failing at the first batch with "No available kernel".
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

import torch
from torch import nn

from nbtrainer._setup._seed import rng_untouched

__all__ = ["ATTENTION", "AttentionKernel", "attention_dropouts", "attention_support", "check_attention"]

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


#: Hugging Face config fields that hold the attention dropout (BERT / RoBERTa, Llama / Mistral / Qwen, GPT-2...).
_HF_DROPOUT = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop", "attn_dropout")
#: The dropout ``_probe(..., dropout=True)`` asks for.
_PROBE_DROPOUT = 0.1


@functools.cache
def _probe(device_key: str, name: str, dtype: torch.dtype, dropout: bool = False) -> str:
    """Why SDPA under backend ``name`` cannot run forward + backward here, with ``dropout_p > 0`` when ``dropout``
    ("" when it can)."""
    from torch.nn.attention import sdpa_kernel

    device = torch.device(device_key)
    try:
        # cached (runs once per process): its random draws must not shift the caller's RNG streams
        # a backend's refusal is the answer, said by the caller: not a warning of torch's ("...non-zero dropout")
        with rng_untouched(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q, k, v = (torch.randn(1, 2, 16, 32, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
            with sdpa_kernel(_backend(name)):
                p = _PROBE_DROPOUT if dropout else 0.0
                out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
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


def _config_dropouts(config: Any, where: str, seen: set[int]) -> list[tuple[str, str]]:
    """The attention dropouts above 0 of a Hugging Face config and its sub-configs (a multimodal text_config)."""
    if config is None or id(config) in seen or not callable(getattr(config, "to_dict", None)):
        return []
    seen.add(id(config))
    found = []
    for key in _HF_DROPOUT:
        value = getattr(config, key, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            found.append((f"{where}.{key}={value}", f"build the model with {key}=0.0: from_pretrained(..., {key}=0.0)"))
    for sub in getattr(config, "sub_configs", None) or {}:
        found += _config_dropouts(getattr(config, sub, None), f"{where}.{sub}", seen)
    return found


def attention_dropouts(model: nn.Module) -> list[tuple[str, str]]:
    """Where ``model`` drops out attention weights while training: ``[(what, how to set it to 0)]``.

    ``nn.MultiheadAttention(dropout=...)`` (``nn.TransformerEncoderLayer``'s ``dropout`` sets it too), a Hugging Face
    config's ``attention_dropout`` / ``attention_probs_dropout_prob`` / ``attn_pdrop``, and timm-style
    ``attn_drop`` dropout layers.

    Example:
        >>> attention_dropouts(nn.TransformerEncoderLayer(32, 4, batch_first=True))
        [('self_attn (nn.MultiheadAttention) dropout=0.1', 'model.self_attn.dropout = 0.0')]
    """
    found: list[tuple[str, str]] = []
    seen: set[int] = set()
    for path, module in model.named_modules():
        where = path or "model"
        attr = f"model.{path}" if path else "model"
        if isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
            found.append((f"{where} (nn.MultiheadAttention) dropout={module.dropout}", f"{attr}.dropout = 0.0"))
        drop = getattr(module, "attn_drop", None)
        if isinstance(drop, nn.Dropout) and drop.p > 0:
            found.append((f"{where}.attn_drop (nn.Dropout) p={drop.p}", f"{attr}.attn_drop.p = 0.0"))
        found += _config_dropouts(getattr(module, "config", None), f"{where}.config", seen)
    return found


def check_attention(value: Any, device: torch.device, dtype: torch.dtype, model: nn.Module | None = None) -> str:
    """The ``attention=`` name, refused with the alternatives when this device / dtype cannot run it, or cannot run
    the attention dropout ``model`` sets."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key not in ATTENTION:
        raise ValueError(f"attention={value!r} is not an SDPA backend: use one of {list(ATTENTION)}.")
    if key == "auto":
        return key
    dtype_name = str(dtype).replace("torch.", "")
    reason = _probe(str(device), key, dtype)
    if reason:
        ok = [n for n, (good, _) in attention_support(device, dtype).items() if good and n != "auto"]
        raise ValueError(
            f"attention={key!r} cannot run on {device} in {dtype_name} (a test attention call failed: {reason}). "
            f"Backends that run here: {[*ok, 'auto']}"
            + (
                "; flash and efficient kernels often need half precision: precision='bf16-mixed' or 'fp16-mixed'."
                if dtype == torch.float32 and device.type == "cuda"
                else "."
            )
        )
    dropouts = attention_dropouts(model) if model is not None else []
    reason = _probe(str(device), key, dtype, True) if dropouts else ""
    if reason:
        ok = [n for n in ATTENTION if n != "auto" and not _probe(str(device), n, dtype, True)]
        shown = "; ".join(what for what, _ in dropouts[:3]) + (f" (and {len(dropouts) - 3} more)" * (len(dropouts) > 3))
        fixes = list(dict.fromkeys(fix for _, fix in dropouts))
        raise ValueError(
            f"attention={key!r} cannot run attention dropout on {device} in {dtype_name} (a test attention call with "
            f"dropout_p={_PROBE_DROPOUT} failed: {reason}), and the model drops out attention weights while "
            f"training: {shown}. Set the attention dropout to 0 ({'; '.join(fixes[:3])}), or use a backend that "
            f"runs it here: {' or '.join(f'attention={n!r}' for n in [*ok, 'auto'])}."
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
