"""A table of named rows (the strategy and inference comparisons): look a row up by name, count, list the names."""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["NamedRows"]


class NamedRows:
    """Mixin for a result whose ``rows`` are dicts with a ``"name"``; ``row_kind`` words the missing-name error."""

    rows: list[dict[str, Any]]
    row_kind: ClassVar[str] = "row"

    def __getitem__(self, name: str) -> dict[str, Any]:
        for row in self.rows:
            if row["name"] == name:
                return row
        raise KeyError(f"No {self.row_kind} {name!r}; have {self.names}")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def names(self) -> list[str]:
        return [r["name"] for r in self.rows]
