"""The widget layer's seams: no module of ``widgets/`` touches a private attribute that another module defines.

A part that needs something from the panel (the UI thread, the side actions) asks through a small protocol of
public members (``PumpHost``, ``ActionsHost``) that ``TrainerWidget`` implements; a mixin that reads the panel's
private attributes through ``self`` counts as reaching into another module too. Read from the source (``ast``):
every ``x._name`` must name something its own module defines (a ``def``, a class attribute with a value, or a
``self._name = ...``), or a private of a third-party library listed below with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from widget_helpers import make_widget

from nbtrainer.widgets._actions import ActionsHost
from nbtrainer.widgets._pump import PumpHost

WIDGETS = Path(__file__).resolve().parents[2] / "widgets"

# Third-party private names the widget layer has to use, and why.
THIRD_PARTY = {
    # IPython's display protocol: underscored by convention, documented as the way to display an object.
    "_repr_mimebundle_": "IPython display protocol",
    "_repr_html_": "IPython display protocol",
    "_ipython_display_": "IPython display protocol",
    # ipykernel 7 has no public way to route a comm's replies to a subshell while a cell blocks (_poll.py).
    "_create_subshell": "ipykernel subshell manager",
    "_shell_channel_io_loop": "ipykernel subshell manager",
    "_reply_subshell_for": "ipykernel comm routing",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_privates(tree: ast.Module) -> set[str]:
    """Private names a module defines: functions and methods, class attributes with a value, ``self._x = ...``
    (or ``with ... as self._x``).

    A bare annotation (``_run: Any`` in a class body) defines nothing: it is how a mixin declares the attributes
    it expects another module's class to set.
    """
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = [node.target]
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:  # with ... as self._x
            targets = [node.optional_vars]
        else:
            continue
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
                elif isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    names.add(leaf.attr)
    return {n for n in names if _private(n)}


def foreign_private_uses(source: str, module: str = "<source>") -> list[str]:
    """``module:line: x._name`` for each private attribute used in ``source`` that it does not define."""
    tree = ast.parse(source)
    own = defined_privates(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and node.attr not in own
            and node.attr not in THIRD_PARTY
        ):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_widget_module_uses_another_modules_private_attributes() -> None:
    found = []
    for path in sorted(WIDGETS.glob("*.py")):
        found += foreign_private_uses(path.read_text(encoding="utf-8"), path.name)
    assert not found, "private attributes of another module (make them public, or pass a protocol):\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # the old UiPump: the panel's private methods called through a reference to the panel
        ("class UiPump:\n    def push(self):\n        self.w._notify('info', 'x')\n", ["<source>:3: self.w._notify"]),
        # a mixin reading attributes that the class it is mixed into sets in another module
        ("class Actions:\n    _busy: set\n    def f(self):\n        return self._busy\n", ["<source>:4: self._busy"]),
        # defined here: fine
        ("class A:\n    def __init__(self):\n        self._n = 1\n    def f(self, o):\n        return o._n\n", []),
    ],
)
def test_the_check_sees_foreign_private_uses(source: str, expected: list[str]) -> None:
    assert foreign_private_uses(source) == expected


def test_the_panel_is_what_its_parts_call_back() -> None:
    w = make_widget(n=32, epochs=1)
    for protocol in (PumpHost, ActionsHost):
        assert isinstance(w, protocol), protocol  # runtime_checkable: every member is there
    assert w.pause_requested is False and w.running is False
    w.notify("warning", "from a part")
    assert ("warning", "from a part") in w.view.message_log
