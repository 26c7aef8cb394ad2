"""Every notebook is a jupytext pair: ``NN_name.py`` (percent format, the source you edit and review) and
``NN_name.ipynb`` (what Jupyter, Binder and the tests open). The pair must say the same thing.

Workflow: edit the ``.py``, then ``jupytext --sync notebooks/NN_name.py`` (``ruff format`` it first: the
sources are linted and formatted with the rest of the tree). These checks fail when

* a notebook has no ``.py`` source, a source has no notebook, or the notebook is not paired
  (``jupytext.formats`` metadata ``ipynb,py:percent``);
* the notebook's cells (kind and text, in order) differ from what jupytext reads from the ``.py``;
* the notebook carries outputs, execution counts or widget state (it is saved clean; the tests execute it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import LazyModule, needs

pytestmark = needs("nbformat", "jupytext")
nbformat = LazyModule("nbformat")
jupytext = LazyModule("jupytext")

REPO = Path(__file__).resolve().parents[1]
FOLDERS = [REPO / "notebooks", REPO / "tests" / "browser" / "notebooks"]
NOTEBOOKS = sorted(p for folder in FOLDERS for p in folder.glob("*.ipynb"))
SOURCES = sorted(p for folder in FOLDERS for p in folder.glob("*.py") if not p.name.startswith("_"))
FORMATS = "ipynb,py:percent"


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(REPO)) for p in paths]


def _cells(nb: Any) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def _first_difference(want: list[tuple[str, str]], got: list[tuple[str, str]]) -> str:
    for i, (a, b) in enumerate(zip(want, got, strict=False)):
        if a != b:
            return f"cell {i}: the .py has {a[0]}\n{a[1]}\n--- the .ipynb has {b[0]}\n{b[1]}"
    return f"the .py has {len(want)} cells, the .ipynb {len(got)}"


def test_the_pairs_are_complete() -> None:
    assert NOTEBOOKS, "no notebooks found"
    assert [p.with_suffix("") for p in NOTEBOOKS] == [p.with_suffix("") for p in SOURCES], (
        "every notebook needs its jupytext .py source and every source its notebook: "
        "`jupytext --set-formats ipynb,py:percent NAME.ipynb` pairs one; `jupytext --sync NAME.py` writes the other"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_paired_with_its_percent_source(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    formats = nb.metadata.get("jupytext", {}).get("formats")
    assert formats == FORMATS, f"{path.name}: jupytext formats {formats!r}, want {FORMATS!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_cells_match_the_source(path: Path) -> None:
    source = path.with_suffix(".py")
    if not source.exists():
        pytest.fail(f"{source.name} is missing (see test_the_pairs_are_complete)")
    want = _cells(jupytext.read(source))
    got = _cells(nbformat.read(path, as_version=4))
    assert want == got, (
        f"{path.relative_to(REPO)} is out of sync with its source: run `jupytext --sync {source.relative_to(REPO)}`"
        f"\n{_first_difference(want, got)}"
    )
