"""Pictures as PNG bytes, with no imaging library: what a sample or a gallery item becomes to be stored and shown.

A PNG is a signature and three chunks (``IHDR``, one zlib-compressed ``IDAT``, ``IEND``), each with its CRC32: the
standard library's ``zlib`` writes it (PNG spec, ISO/IEC 15948). Pillow is used only when the user hands a PIL image
(then it is installed); nothing here imports it.

What counts as an image (``as_pixels``): a torch tensor ``(C, H, W)`` (C = 1, 3 or 4), ``(H, W, C)`` (as NumPy and
PIL pipelines hand them) or ``(H, W)``, a NumPy array ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``; float in [0, 1]
(clipped; NaN drawn black), or integers: 0-255 as pixels whatever the type (``torch.tensor`` of a list of pixels is
int64), a 0/1 mask black and white, other ranges (16-bit) stretched to their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbtrainer._report._png import encode_png

__all__ = ["IMAGE_TYPES", "as_pixels", "is_pil", "to_png"]

#: how the accepted kinds are named in errors
IMAGE_TYPES = (
    "an image: a torch tensor (C, H, W) or (H, W, C) with C = 1, 3 or 4, or (H, W), float in [0, 1] or 0-255 "
    "integers; a NumPy array (H, W), (H, W, C) or (C, H, W); or a PIL image"
)
_CHANNELS = (1, 3, 4)


def is_pil(value: Any) -> bool:
    """A PIL image, told without importing Pillow."""
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(value).__mro__)


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * 255
    if not np.issubdtype(arr.dtype, np.number):
        raise TypeError(f"an image's values must be numbers, got {arr.dtype}")
    if np.issubdtype(arr.dtype, np.integer) and arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo >= 0 and hi <= 1:  # a 0/1 mask: black and white, not black and nearly black
            return arr.astype(np.uint8) * 255
        if lo >= 0 and hi <= 255:  # pixels in a wider type: clipping them to [0, 1] drew every non-zero one white
            return arr.astype(np.uint8)
        return ((arr.astype(np.float64) - lo) / (hi - lo) * 255.0 + 0.5).astype(np.uint8)
    values = np.nan_to_num(arr.astype(np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(values, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def as_pixels(value: Any) -> np.ndarray | None:
    """``value`` as uint8 ``(H, W)`` or ``(H, W, C)`` pixels, or ``None`` when it is not an image (see the module
    docstring). A tensor or array of another shape is not an image either."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.ndim == 3 and t.shape[0] in _CHANNELS:
            t = t.permute(1, 2, 0)
        elif not (t.ndim == 2 or (t.ndim == 3 and t.shape[-1] in _CHANNELS)):
            return None
        if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
            t = t.float()
        arr = t.cpu().numpy()
    elif isinstance(value, np.ndarray):
        arr = value
        if arr.ndim == 3 and arr.shape[-1] not in _CHANNELS and arr.shape[0] in _CHANNELS:
            arr = arr.transpose(1, 2, 0)
        if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[-1] in _CHANNELS)):
            return None
    else:
        return None
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        return None
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = arr[:, :, 0]
    return _to_uint8(arr)


def to_png(value: Any) -> bytes | None:
    """PNG bytes of an image value (a PIL image is saved by Pillow itself), or ``None`` if it is not one."""
    if is_pil(value):
        import io

        buf = io.BytesIO()
        value.save(buf, format="PNG")
        return buf.getvalue()
    pixels = as_pixels(value)
    return None if pixels is None else encode_png(pixels)
