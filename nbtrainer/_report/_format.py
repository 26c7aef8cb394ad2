"""One number format for everything nbtrainer shows: console lines, the panel, the profile card, summaries.

Each function picks its unit by magnitude and always gives the same number of significant digits, so a
value reads the same wherever it appears:

==========================  ===========================================================================
``format_number(x)``        metrics and losses: 4 significant digits, thousands separators from 10,000,
                            scientific outside ``[1e-3, 1e9)`` with a short exponent (``1.235e-4``)
``format_lr(lr)``           learning rates: always scientific, 3 significant digits (``3.00e-3``)
``format_count(n)``         parameters, MACs, samples: ``1.23M`` (``compact=False``: ``1,234,567``)
``format_bytes(n)``         memory and sizes, binary units: ``512 B``, ``1.50 KiB``, ``12.3 MiB``
``format_duration(s)``      times: ``450 µs``, ``12.3 ms``, ``4.20 s``, then ``1:02`` / ``1:02:03``
==========================  ===========================================================================

``None`` formats as ``"-"`` everywhere; non-finite floats as ``nan``, ``inf``, ``-inf``.

Example:
    >>> from nbtrainer import format_bytes, format_lr, format_number
    >>> format_number(0.123456), format_number(12345.6), format_number(0.00001234)
    ('0.1235', '12,346', '1.234e-5')
    >>> format_lr(0.003), format_bytes(3 * 2**20)
    ('3.00e-3', '3.00 MiB')
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "format_bytes",
    "format_count",
    "format_duration",
    "format_lr",
    "format_number",
    "format_value",
    "text_html",
]

MISSING = "-"


def _sci(x: float, digits: int) -> str:
    """``x`` in scientific notation with ``digits`` significant digits and an unpadded exponent."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _sig(x: float, digits: int) -> str:
    """``x`` with ``digits`` significant digits in fixed notation (``12.3``, ``0.00123``)."""
    if x == 0:
        return "0"
    decimals = max(digits - 1 - math.floor(math.log10(abs(x))), 0)
    text = f"{x:.{decimals}f}"
    # Rounding can gain a digit (9.996 -> "10.00"): recompute from the rounded value.
    if len(text.replace("-", "").replace(".", "").lstrip("0")) > digits and decimals:
        text = f"{x:.{decimals - 1}f}"
    return text


def _nonfinite(x: Any) -> str | None:
    if x is None:
        return MISSING
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return None


def format_number(value: Any) -> str:
    """A metric or loss value: 4 significant digits, ``1,234`` grouping from 10,000, scientific when tiny or huge.

    Ints are exact with grouping; bools and strings are shown as they are.

    Example:
        >>> [format_number(v) for v in (0, 1, 0.5, 2.0, 1234.56, 1e-6, 3e9, float("nan"), None)]
        ['0', '1', '0.5', '2', '1235', '1e-6', '3e9', 'nan', '-']
    """
    special = _nonfinite(value)
    if special is not None:
        return special
    if isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if x == 0:
        return "0"
    a = abs(x)
    if 1e-3 <= a < 1e4:
        text = f"{x:.4g}"
        if "e" not in text:  # 9999.7 rounds to "1e+04": fall through to grouping
            return text
    if 9999.5 <= a < 1e9:  # from 10,000 (9999.7 rounds up there): grouped, no decimals
        return f"{x:,.0f}"
    text = _sci(x, 4)
    mantissa, exponent = text.split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")  # 1.000e-6 -> 1e-6: no false precision in the tails
    return f"{mantissa}e{exponent}"


def format_lr(lr: Any) -> str:
    """A learning rate: always scientific with 3 significant digits, so changes line up (``3.00e-3 -> 1.00e-4``).

    Example:
        >>> format_lr(3e-3), format_lr(0.1), format_lr(None)
        ('3.00e-3', '1.00e-1', '-')
    """
    if lr is None:
        return MISSING
    value = float(lr)
    special = _nonfinite(value)
    if special is not None:
        return special
    if value == 0:
        return "0"
    return _sci(value, 3)


_COUNT_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"))


def format_count(n: Any, unit: str = "", *, compact: bool = True) -> str:
    """A count (parameters, MACs, FLOPs, samples): ``1.23M`` with 3 significant digits, or exact with grouping.

    Args:
        n: the count.
        unit: appended after a space (``"params"``, ``"MACs"``).
        compact: ``False`` gives every digit: ``1,234,567``.

    Example:
        >>> format_count(1_234_567), format_count(11_200, "params"), format_count(1_234_567, compact=False)
        ('1.23M', '11.2K params', '1,234,567')
    """
    special = _nonfinite(n)
    if special is not None:
        return special
    x = float(n)
    tail = f" {unit}" if unit else ""
    if not compact:
        return f"{round(x):,}{tail}"
    for scale, prefix in _COUNT_PREFIXES:
        if abs(x) >= scale * 0.9995:  # 999,999.6 is "1.00M", not "1000K"
            return f"{_sig(x / scale, 3)}{prefix}{tail}"
    return f"{_sig(x, 3) if x != int(x) else int(x)}{tail}"


_BYTE_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def format_bytes(n: Any) -> str:
    """A size in bytes with binary units and 3 significant digits (``512 B``, ``1.50 KiB``, ``12.3 GiB``).

    Example:
        >>> format_bytes(512), format_bytes(1536), format_bytes(5 * 2**30)
        ('512 B', '1.50 KiB', '5.00 GiB')
    """
    special = _nonfinite(n)
    if special is not None:
        return special
    x = float(n)
    for scale, unit in _BYTE_UNITS:
        if abs(x) >= scale * 0.9995:
            return f"{_sig(x / scale, 3)} {unit}"
    return f"{round(x)} B"


def format_duration(seconds: Any) -> str:
    """A duration: ``µs`` / ``ms`` / ``s`` with 3 significant digits below a minute, then ``m:ss`` or ``h:mm:ss``.

    Example:
        >>> [format_duration(s) for s in (0.00045, 0.0123, 4.2, 62, 3723)]
        ['450 µs', '12.3 ms', '4.20 s', '1:02', '1:02:03']
    """
    special = _nonfinite(seconds)
    if special is not None:
        return special
    s = float(seconds)
    if s < 0:
        return "-" + format_duration(-s)
    if s == 0:
        return "0 s"
    if s < 1e-3 * 0.9995:
        return f"{_sig(s * 1e6, 3)} µs"
    if s < 0.9995:
        return f"{_sig(s * 1e3, 3)} ms"
    if s < 59.95:
        return f"{_sig(s, 3)} s"
    total = round(s)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_value(key: str, value: Any) -> str:
    """One logged value by its log key (progress lines, loggers, tables): LRs with :func:`format_lr`, the
    epoch ``time`` with :func:`format_duration` (a unit), the rest with :func:`format_number`.

    Example:
        >>> format_value("lr", 0.003), format_value("loss", 0.123456), format_value("samples_per_s", 5476.37)
        ('3.00e-3', '0.1235', '5476')
        >>> format_value("time", 2.3)
        '2.30 s'
    """
    if key == "lr" or key.startswith(("lr_", "lr/")):
        return format_lr(value)
    if key in ("time", "sample_time"):
        return format_duration(value)
    return format_number(value)


def text_html(text: str) -> str:
    """A message written for a terminal, as HTML: escaped, its ```name``` spans as ``<code>`` (never a backtick
    left on the page).

    Example:
        >>> text_html("at most 23% dead (`inner`) & <rising>")
        'at most 23% dead (<code>inner</code>) &amp; &lt;rising&gt;'
    """
    import html
    import re

    parts = re.split(r"`([^`]+)`", str(text))
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))
