"""docs/data.md: every python block runs as written (a fresh namespace each), and gives what the text says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _run(index: int, capsys: Any) -> tuple[dict[str, Any], str]:
    torch.manual_seed(0)
    namespace: dict[str, Any] = {"__name__": f"data_{index}"}
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), namespace)
    return namespace, capsys.readouterr().out


def test_the_page_has_its_snippets() -> None:
    assert len(BLOCKS) == 3  # check_data, show_batch, DataMap


def test_the_check_finds_the_leak_the_nan_and_the_constant_pixels_and_refuses_a_bad_label(capsys: Any) -> None:
    ns, out = _run(0, capsys)
    assert sorted(p.kind for p in ns["report"].problems) == ["constant", "duplicates_across", "nonfinite"]
    assert "[0, 1, 2, 3, 4] [0, 1, 2, 3, 4]" in out
    assert "refused before any step: training labels 12 are outside the model's 10 outputs" in out
    assert ns["checked"].global_step == 0 and "data problem: training labels 12" in ns["out"].getvalue()


def test_show_batch_shows_pictures_rows_and_text(capsys: Any) -> None:
    ns, out = _run(1, capsys)
    assert ns["view"].items == 8 and ns["view"]._repr_html_().count("<img") == 8
    assert ">age<" in ns["rows"]._repr_html_() and "b c d -> 0" in out


def test_the_map_finds_the_flipped_labels(capsys: Any) -> None:
    ns, out = _run(2, capsys)
    assert ns["found"] >= 26, out  # >= 85% of 30
    assert len(ns["clean"]) == 600 and len(ns["clean"].changes["relabeled"]) == 30
