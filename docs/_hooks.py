"""mkdocs hook (mkdocs.yml `hooks:`): `::: nbtrainer.Name` in a page becomes `::: <defining module>.Name`.

The root namespace exports its names lazily (PEP 562, ``nbtrainer._LAZY``), which mkdocstrings' static analysis
cannot follow; the table in ``nbtrainer/__init__.py`` is the one place that says where each name lives, so the API
pages name the public spelling and stay right when a name moves between private modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

_INIT = Path(__file__).resolve().parent.parent / "nbtrainer" / "__init__.py"


def _lazy_table() -> dict[str, str]:
    # read, not imported: the build must not depend on importing torch
    tree = ast.parse(_INIT.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_LAZY":
            value = ast.literal_eval(node.value)  # type: ignore[arg-type]
            return {str(k): str(v) for k, v in value.items()}
    raise RuntimeError("nbtrainer/__init__.py has no _LAZY table")


def on_page_markdown(markdown: str, **_: Any) -> str:
    table = _lazy_table()

    def resolve(match: re.Match[str]) -> str:
        name = match.group(2)
        module = table.get(name)
        if module is None:
            return match.group(0)
        if module == "nbtrainer.widgets":
            module = "widgets"  # the folder widgets/ installs as nbtrainer.widgets
        return f"{match.group(1)}{module}.{name}"

    return re.sub(r"^(:::\s+)nbtrainer\.(\w+)\s*$", resolve, markdown, flags=re.M)
