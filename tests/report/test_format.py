"""The one number format: digits, units and the rounding boundaries where a unit or notation changes."""

from __future__ import annotations

import math

import pytest

from nbtrainer import format_bytes, format_count, format_duration, format_lr, format_number


@pytest.mark.parametrize(
    "value,text",
    [
        (0.0, "0"),
        (0.123456, "0.1235"),
        (1.0, "1"),
        (2.5, "2.5"),
        (12.3456, "12.35"),
        (9999.4, "9999"),
        (9999.7, "10,000"),  # .4g would give '1e+04'
        (12345.6, "12,346"),
        (5476.3698, "5476"),
        (11360.2, "11,360"),
        (0.001234, "0.001234"),
        (0.00099996, "1e-3"),
        (1.234e-5, "1.234e-5"),
        (1e-6, "1e-6"),
        (-0.5, "-0.5"),
        (2.5e9, "2.5e9"),
        (7, "7"),
        (1234567, "1,234,567"),
        (True, "True"),
        (None, "-"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (-math.inf, "-inf"),
    ],
)
def test_format_number(value, text):
    assert format_number(value) == text


def test_format_number_accepts_numpy_and_0d_tensors():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    assert format_number(np.float32(0.5)) == "0.5"
    assert format_number(torch.tensor(0.25)) == "0.25"


@pytest.mark.parametrize(
    "lr,text",
    [(3e-3, "3.00e-3"), (1e-4, "1.00e-4"), (0.1, "1.00e-1"), (3.7e-2, "3.70e-2"), (9.999e-4, "1.00e-3"), (0, "0")],
)
def test_format_lr_is_always_scientific(lr, text):
    assert format_lr(lr) == text


@pytest.mark.parametrize(
    "n,kw,text",
    [
        (512, {}, "512"),
        (1_234_567, {}, "1.23M"),
        (11_200, {"unit": "params"}, "11.2K params"),
        (999_999.6, {}, "1.00M"),  # not "1000K"
        (999, {}, "999"),
        (3.2e9, {"unit": "MACs"}, "3.20G MACs"),
        (1_234_567, {"compact": False}, "1,234,567"),
        (None, {}, "-"),
    ],
)
def test_format_count(n, kw, text):
    assert format_count(n, **kw) == text


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.50 KiB"),
        (1023.9, "1.00 KiB"),
        (12.3 * 2**20, "12.3 MiB"),
        (5 * 2**30, "5.00 GiB"),
        (2**40, "1.00 TiB"),
        (None, "-"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize(
    "s,text",
    [
        (0, "0 s"),
        (0.00045, "450 µs"),
        (0.0009999, "1.00 ms"),
        (0.0123, "12.3 ms"),
        (0.99996, "1.00 s"),
        (4.2, "4.20 s"),
        (59.96, "1:00"),
        (62, "1:02"),
        (3723, "1:02:03"),
        (None, "-"),
        (math.inf, "inf"),
    ],
)
def test_format_duration(s, text):
    assert format_duration(s) == text
