"""Pictures in HTML, written once for every place that shows one (a sample in the History's summary, an input in error
analysis, the panel's samples): the PNG bytes of pixels (:func:`encode_png`), its width (:func:`png_width`), a data
URI (:func:`data_uri`) and the ``<img>`` (:func:`png_img`). NumPy only: public through ``nbtrainer.plotting``.
"""

from __future__ import annotations

import base64
import html
import struct
import zlib

import numpy as np

__all__ = ["data_uri", "encode_png", "png_img", "png_width"]

_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type (grey, grey+alpha, RGB, RGBA)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(pixels: np.ndarray) -> bytes:
    """An 8-bit PNG of ``pixels``: uint8 ``(H, W)`` or ``(H, W, C)``, C in 1-4.

    Example:
        >>> png = encode_png(np.zeros((2, 3), dtype=np.uint8))
        >>> png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", png_width(png)
        (True, 3)
    """
    if pixels.dtype != np.uint8:
        raise TypeError(f"encode_png takes uint8 pixels, got {pixels.dtype}.")
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    h, w, c = pixels.shape
    # each row is prefixed with filter type 0 (none)
    rows = np.concatenate([np.zeros((h, 1), dtype=np.uint8), np.ascontiguousarray(pixels).reshape(h, w * c)], axis=1)
    header = struct.pack(">IIBBBBB", w, h, 8, _COLOR_TYPE[c], 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + _chunk(b"IEND", b"")
    )


def png_width(png: bytes) -> int:
    """The width in pixels written in a PNG's header (``IHDR``); 0 for bytes too short to hold one."""
    return struct.unpack(">I", png[16:20])[0] if len(png) >= 24 else 0


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for an ``<img src=...>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_img(png: bytes | str, *, alt: str, fit: int = 256, style: str = "") -> str:
    """The ``<img>`` of ``png`` (its bytes, or the base64 text a History stores): a small picture enlarged (at most 8
    times, to about ``fit`` pixels wide) with its pixels kept sharp; ``style`` is added to that.

    Example:
        >>> png_img(encode_png(np.zeros((4, 4), dtype=np.uint8)), alt="x", fit=32)[:50]
        "<img src='data:image/png;base64,iVBORw0KGgoAAAANSU"
    """
    data = base64.b64decode(png) if isinstance(png, str) else bytes(png)
    width = png_width(data) or 64
    shown = width * max(1, min(8, fit // max(width, 1)))
    return (
        f"<img src='{data_uri(data)}' alt='{html.escape(alt)}' width='{shown}' "
        f"style='image-rendering:pixelated;{style}'>"
    )
