"""docs/recipes.md: every python block runs as written (a fresh namespace each, in a temporary folder)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
BLOCKS = re.findall(r"```python\n(.*?)```", RECIPES.read_text(encoding="utf-8"), flags=re.S)


def test_the_recipes_have_their_snippets() -> None:
    assert len(BLOCKS) == 5  # several optimizers, VAE, triplet, LBFGS, forward-forward


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_recipe_snippet_runs(index: int, tmp_path: Any, monkeypatch: Any) -> None:
    import torch

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(BLOCKS[index], f"{RECIPES.name}[{index}]", "exec"), {"__name__": f"recipe_{index}"})
