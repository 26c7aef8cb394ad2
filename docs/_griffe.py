"""A griffe extension for the API reference (mkdocs.yml: mkdocstrings' ``extensions``).

The project's docstrings are Google style with an ``Example:`` section of doctest lines (``tests/test_docs.py`` runs
them). Griffe's Google parser knows only ``Examples:``; without this, an ``Example:`` section is read as prose and
its ``>>> x["lr"]`` lines as Markdown reference links. The source keeps its spelling; the reference reads it right.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
