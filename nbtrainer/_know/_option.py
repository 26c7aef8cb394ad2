"""``Trainer(check_data=...)`` checked when the Trainer is built, importing nothing else (a plain fit stays light)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_option"]


def check_option(value: Any) -> bool | int:
    """``Trainer(check_data=...)``: True (every item), False, or an int (a seeded sample of that many items)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 1:
        return value
    raise TypeError(
        f"check_data must be True, False or an int >= 1 (check a seeded sample of that many items), got {value!r}."
    )
