"""One vocabulary of memory switches (issue 53): ``MemoryOptions`` is the one list of switches, each has one name
everywhere, ``nbtrainer._optimizer_kinds.OPTIMIZERS`` is the one registry of optimizers by name, and short display
labels come from one table (``LABELS``). Outside ``_options.py`` and the module that implements a switch, code names
a switch through ``SWITCH.<name>`` or the option groups' fields, never as a string literal."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._options import LABELS, SWITCH, MemoryOptions

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "nbtrainer"

# The switch names that are nothing but switch names ("precision", "optimizer" and "attention" are also plain words:
# a checkpoint's "optimizer" entry is its state), and the planner's old word for checkpointing.
NAMES = (
    "activation_checkpointing",
    "optimizer_in_backward",
    "chunked_loss",
    "quantize",
    "lora",
    "offload_activations",
    "offload_optimizer",
    "checkpointing",
)
# where a switch's own name may be written: the vocabulary, and the module that implements it
HOME = {
    "_options.py": set(NAMES),
    "_setup/_activation_checkpointing.py": {"activation_checkpointing", "checkpointing"},
    "_loop/_in_backward.py": {"optimizer_in_backward"},
    "_setup/_chunked_loss.py": {"chunked_loss"},
    "_setup/_quantize.py": {"quantize"},
    "_setup/_lora.py": {"lora"},
    "_setup/_offload.py": {"offload_activations"},
    "_setup/_offload_optimizer.py": {"offload_optimizer"},
    # the planner's simulator takes its own parameter names (nbtrainer._plan._context.Context.terms)
    "_plan/_steps.py": {"checkpointing"},
}


def switch_literals(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every string constant (docstrings left out) that is a switch's name, or one followed by a
    value (``"quantize:nf4"``)."""
    tree = ast.parse(source)
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docs
        and any(node.value == name or node.value.startswith(name + ":") for name in NAMES)
    )


def test_no_switch_name_is_a_literal_outside_its_home() -> None:
    """In the core and in the widgets (which name them through ``MemoryOptions.SWITCH``)."""
    found = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "widgets").rglob("*.py")]):
        allowed = HOME.get(str(path.relative_to(PACKAGE)), set()) if path.is_relative_to(PACKAGE) else set()
        for line, text in switch_literals(path.read_text(encoding="utf-8")):
            if text.split(":")[0] not in allowed:
                found.append(f"{path.relative_to(REPO)}:{line}: {text!r}")
    assert not found, "switch names written as strings (use SWITCH.<name> or the option group's field):\n" + "\n".join(
        found
    )


def test_the_literal_finder_sees_them() -> None:
    source = '"""quantize in a docstring"""\nx = {"quantize": 1, "lora": 2}\ny = "quantize:nf4"\nz = "quantized"\n'
    assert switch_literals(source) == [(2, "lora"), (2, "quantize"), (3, "quantize:nf4")]


def test_switch_names_and_labels_are_memory_options_fields() -> None:
    fields = [f.name for f in dataclasses.fields(MemoryOptions)]
    assert [getattr(SWITCH, name) for name in fields] == fields
    assert MemoryOptions.SWITCH is SWITCH  # the public way to them
    assert "SWITCH" not in {f.name for f in dataclasses.fields(MemoryOptions)}
    with pytest.raises(AttributeError, match="is no memory switch"):
        SWITCH.quantise
    assert set(LABELS) <= set(fields)


def test_one_optimizer_registry() -> None:
    """No module but the registry's writes a table of optimizers by name (eight tables in six modules did)."""
    names = set(OPTIMIZERS)
    tables = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("_optimizer_kinds.py", "_presets.py"):  # the registry; the compare presets' own names
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if isinstance(node, ast.Dict | ast.Tuple | ast.List | ast.Set) and items:
                named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
                if len(named) >= 2:
                    tables.append(f"{path.relative_to(REPO)}:{node.lineno}: {sorted(named)}")
    assert not tables, "tables of optimizers by name outside nbtrainer._optimizer_kinds:\n" + "\n".join(tables)
