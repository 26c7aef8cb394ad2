"""Precision: names, device support (checked, never guessed), autocast and the fp16 GradScaler.

We never downgrade silently: a precision the device can't run raises before training with the
reason and the alternatives (Accelerate trains fp32 when fp16 is asked on CPU; Lightning switches
to bf16).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch

from nbtrainer._setup._seed import rng_untouched

__all__ = [
    "PRECISIONS",
    "PrecisionError",
    "autocast",
    "autocast_dtype",
    "make_scaler",
    "normalize_precision",
    "precision_support",
    "require_precision",
    "resolve_device",
]

log = logging.getLogger(__name__)

PRECISIONS: tuple[str, ...] = ("fp32", "fp16-mixed", "bf16-mixed")

_ALIASES = {
    "fp32": "fp32",
    "32": "fp32",
    "32-true": "fp32",
    "float32": "fp32",
    "f32": "fp32",
    "full": "fp32",
    "fp16-mixed": "fp16-mixed",
    "16": "fp16-mixed",
    "16-mixed": "fp16-mixed",
    "fp16": "fp16-mixed",
    "float16": "fp16-mixed",
    "half": "fp16-mixed",
    "amp": "fp16-mixed",
    "bf16-mixed": "bf16-mixed",
    "bf16": "bf16-mixed",
    "bfloat16": "bf16-mixed",
}


class PrecisionError(ValueError):
    """The requested precision is unknown or the device cannot run it."""


def normalize_precision(precision: str | int) -> str:
    """Map a precision name or alias (``"16"``, ``"bf16"``, ``32`` ...) to its canonical name."""
    key = str(precision).strip().lower()
    if key not in _ALIASES:
        raise PrecisionError(
            f"Unknown precision {precision!r}. Use one of {', '.join(PRECISIONS)} "
            f"(aliases: {', '.join(sorted(k for k in _ALIASES if k not in PRECISIONS))})."
        )
    return _ALIASES[key]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` picks ``$NBTRAINER_DEVICE`` when set (e.g. ``cpu`` on a GPU machine), else CUDA, then MPS,
    then CPU; anything else is passed to ``torch.device``."""
    if device is None or (isinstance(device, str) and device == "auto"):
        chosen = os.environ.get("NBTRAINER_DEVICE", "").strip()
        if chosen and chosen != "auto":
            return resolve_device(chosen)
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def autocast_dtype(precision: str) -> torch.dtype | None:
    precision = normalize_precision(precision)
    return {"fp32": None, "fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}[precision]


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast context for forward + loss (fp32: a no-op context)."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16-mixed (CUDA and CPU alike); None otherwise."""
    if normalize_precision(precision) != "fp16-mixed":
        return None
    return torch.amp.GradScaler(device.type)


def _trial(device: torch.device, dtype: torch.dtype) -> None:
    # A real forward+backward under autocast: the only reliable way to know a backend runs it. Cached by
    # _support, so it runs once per process: its random draws must not shift the caller's RNG streams.
    with rng_untouched(device):
        a = torch.randn(8, 8, device=device, requires_grad=True)
        with torch.autocast(device_type=device.type, dtype=dtype):
            out = torch.nn.functional.linear(a, a).relu().sum()
        out.backward()


@functools.cache
def _support(device_key: str) -> tuple[tuple[str, bool, str], ...]:
    device = torch.device(device_key)
    rows: list[tuple[str, bool, str]] = [("fp32", True, "")]
    for name, dtype in (("fp16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)):
        reason = ""
        # The default is_bf16_supported() also says True where bf16 is only emulated (T4, V100).
        if (
            device.type == "cuda"
            and dtype is torch.bfloat16
            and not torch.cuda.is_bf16_supported(including_emulation=False)
        ):
            cap = torch.cuda.get_device_capability(device)
            reason = (
                f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) "
                "has no native bf16; it would be emulated and slow. Use fp16-mixed."
            )
        if not reason:
            try:
                _trial(device, dtype)
            except Exception as exc:
                log.debug("autocast cannot run this precision here: the reason is returned", exc_info=True)
                reason = f"autocast({device.type}, {dtype}) failed here: {type(exc).__name__}: {exc}"
        rows.append((name, not reason, reason))
    return tuple(rows)


def precision_support(device: str | torch.device = "auto") -> dict[str, tuple[bool, str]]:
    """Which precisions run on ``device``, checked with a tiny autocast forward+backward.

    Returns:
        ``{"fp32": (True, ""), "fp16-mixed": (ok, reason), "bf16-mixed": (ok, reason)}``; the reason is
        empty when supported and says why (and what to use instead) when not.

    Example:
        >>> precision_support("cpu")["fp32"]
        (True, '')
    """
    dev = resolve_device(device)
    return {name: (ok, reason) for name, ok, reason in _support(str(dev))}


def require_precision(precision: str, device: torch.device) -> str:
    """Normalize ``precision`` and raise :class:`PrecisionError` if ``device`` can't run it."""
    name = normalize_precision(precision)
    ok, reason = precision_support(device)[name]
    if not ok:
        alternatives = [p for p, (good, _) in precision_support(device).items() if good and p != name]
        raise PrecisionError(
            f"precision={name!r} is not available on {device}: {reason} "
            f"Choose one of {alternatives} or another device; nbtrainer never switches precision silently."
        )
    return name
