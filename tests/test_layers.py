"""The floor plan holds: each concept folder of ``nbtrainer/`` imports only the folders below it.

Read from the source (``ast``), counting imports inside functions (where a layering break usually hides) and those
under ``if TYPE_CHECKING:`` (a type-only import is still a dependency a reader follows; a lower folder that needs
something of a higher one types it against a small Protocol of its own). ``from nbtrainer import Name`` counts as an
import of the folder that defines ``Name`` (the facade's ``_LAZY``). The layers, lowest first, are the ones
docs/architecture.md draws; a new folder must be placed in LAYERS before it can be imported by anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "nbtrainer"

# Lowest first. A folder may import its own layer's other folders and any layer below; never one above.
LAYERS: list[set[str]] = [
    # no torch: optional imports (and their known import noise), atomic files, the options groups, numbers and SVG
    # ... the OpenMP pools of threads that train (_threads: ctypes only, no torch import), the Event that ends a long
    # call from another thread (_cancel)
    {
        "_optional",
        "_quiet",
        "_atomic",
        "_keywords",
        "_options",
        "_optimizer_kinds",
        "_report",
        "plotting",
        "_threads",
        "_cancel",
    },
    # model setup before the first step: precision, seeds, optimizers, memory switches
    {"_setup"},
    {"_dist"},  # placement: one device, DDP, FSDP2, launchers
    {"_data"},  # loaders and arrays -> device batches; predictions back
    {"_memory"},  # every memory measurement: the peak over a block, one step's breakdown, the refresh window's
    {"_events"},  # the event stream and its consumers (callbacks, progress, history, loggers)
    {"_loop"},  # the fit loop, the training step, metrics, NaN gate, control, OOM
    {"_resume"},  # checkpoint contents, continue, checkpoint files
    {"_runs"},  # the run store and trackers: consumers of the event stream that the Trainer attaches
    {"_health"},  # training health: a consumer of the event stream that reports and acts (pause, stop)
    {"_plan"},  # the memory planner: a step on fake tensors plus arithmetic (the Trainer will plan at fit start)
    {"_look"},  # samples during training, error analysis (interpret): event-stream consumers the Trainer delegates to
    {"_know"},  # knowing the data: check_data, show_batch, the DataMap (it reuses _look's per-item passes)
    {"_trainer"},  # the facade users hold
    {"_profile", "_compare", "_inference"},  # tools built on the Trainer
    {"_shell"},  # magics, CLI, doctor
    {"profile", "compare", "inference", "runs", "dist"},  # public submodules: re-exports of the folders below
]
LEVEL = {folder: level for level, folders in enumerate(LAYERS) for folder in folders}


def _folder_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "nbtrainer" or len(parts) < 2:
        return None
    return parts[1]


def _lazy() -> dict[str, str]:
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "_LAZY":
            assert node.value is not None
            return ast.literal_eval(node.value)
    raise AssertionError("nbtrainer/__init__.py has no _LAZY")


def imported_folders(path: Path, lazy: dict[str, str]) -> dict[str, int]:
    """``{folder: first line}`` for every nbtrainer folder that the file at ``path`` imports, at run time or for
    types only (a type-only import still points the dependency up the floor plan: issue 34)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        targets: list[str] = []
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif node.level == 0 and node.module:
            if node.module == "nbtrainer":
                targets = [lazy.get(alias.name, f"nbtrainer.{alias.name}") for alias in node.names]
            else:
                targets = [node.module]
        for target in targets:
            folder = _folder_of(target)
            if folder is not None and folder != "widgets":
                found.setdefault(folder, node.lineno)
    return found


def _folders() -> list[str]:
    names = [p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    names += [p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    return sorted(names)


def test_every_folder_has_a_layer():
    missing = [f for f in _folders() if f not in LEVEL]
    assert not missing, f"place these in tests/test_layers.py LAYERS (and docs/architecture.md): {missing}"


@pytest.mark.parametrize("folder", _folders())
def test_folder_imports_only_lower_layers(folder: str):
    if folder not in LEVEL:
        pytest.skip("not placed yet (test_every_folder_has_a_layer fails)")
    lazy = _lazy()
    root = PACKAGE / folder
    files = sorted(root.rglob("*.py")) if root.is_dir() else [PACKAGE / f"{folder}.py"]
    upward = []
    for path in files:
        for target, line in imported_folders(path, lazy).items():
            if target != folder and LEVEL.get(target, -1) > LEVEL[folder]:
                upward.append(
                    f"{path.relative_to(REPO)}:{line} imports {target} (layer {LEVEL[target]} > {LEVEL[folder]})"
                )
    assert not upward, "imports that point up the floor plan:\n" + "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path: Path):
    # The check can fail: a data module importing the Trainer for types only, or inside a function, is found.
    bad = tmp_path / "m.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from nbtrainer._trainer._trainer import Trainer\n"
        "def f():\n    from nbtrainer import Trainer\n    return Trainer\n"
    )
    found = imported_folders(bad, _lazy())
    assert found == {"_trainer": 3}  # the first of the two: the TYPE_CHECKING one
    assert LEVEL["_trainer"] > LEVEL["_data"] and LEVEL["_trainer"] > LEVEL["_loop"]
