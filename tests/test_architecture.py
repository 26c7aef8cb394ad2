"""The package's shape: no import cycles, small modules, and the widget layer on the core's public names only.

The import graph is read from the source (``ast``), not from ``sys.modules``, so it sees every import a
module *could* run: module level and inside functions (the usual way a cycle gets hidden); absolute or
relative. Imports under ``if TYPE_CHECKING:`` never run, yet a reader follows them: no cycle may pass through them
either (a module below the Trainer types it against a Protocol of its own layer instead). ``widgets/`` is part of it
as ``nbtrainer.widgets``.

* ``from nbtrainer import Name`` is an edge to the module that defines ``Name`` (``nbtrainer._LAZY``):
  that is what the lazy ``__getattr__`` imports. ``nbtrainer/__init__.py`` itself is the facade and
  is not a node: its names resolve lazily, and its ``TYPE_CHECKING`` block mirrors ``_LAZY``.
* ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# import name -> folder (widgets/ is installed as nbtrainer.widgets)
ROOTS = {"nbtrainer": REPO / "nbtrainer", "nbtrainer.widgets": REPO / "widgets"}
FACADE = "nbtrainer"
MAX_LINES = 500
# The one exception: the Trainer facade is one class (no mixins, issue 34), and its public verbs with their
# docstrings and examples are what users read; the mechanics it delegates to follow the rule (issue 53: 1,193
# lines down to under 600 once building it and running a fit moved to _assemble and _fit_run).
FACADE_MODULE, FACADE_MAX_LINES = "nbtrainer/_trainer/_trainer.py", 599  # under 600 (issue 53)
# The typed seams (issue 53: twelve overlapping Protocols, mostly typed Any, became these four).
SEAMS = {
    "nbtrainer._dist._placement": {"Strategy"},
    "nbtrainer._events._trainer_view": {"TrainerView"},
    "nbtrainer._loop._host": {"LoopHost"},
    "nbtrainer._loop._run_state": {"RunningLoop"},
}


def parsed(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per worker: every check here walks the same ~200 files (read-only). Keyed
    on the text, not the path: the checks' own tests rewrite files in a temp package."""
    return _parse(path.read_text(encoding="utf-8"))


@functools.cache
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def find_modules(roots: Mapping[str, Path]) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` for every ``.py`` file under each root."""
    found: dict[str, tuple[Path, bool]] = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join([package, *parts])] = (path, is_package)
    return found


def lazy_names(facade: Path) -> dict[str, str]:
    """The facade's ``_LAZY`` literal: public name -> defining module."""
    for node in ast.walk(parsed(facade)):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets) and node.value is not None:
                return ast.literal_eval(node.value)
    return {}


def _type_only(tree: ast.AST) -> set[int]:
    """``id`` of every node under ``if TYPE_CHECKING:`` (never run: annotations may name any module)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def _imports(tree: ast.AST, package: str, *, runtime_only: bool = True) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import statement anywhere in ``tree`` that can run
    (``runtime_only``: ``if TYPE_CHECKING:`` imports left out, a type-only import is no dependency at run time)."""
    type_only = _type_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield module, alias.name


def import_graph(
    modules: Mapping[str, tuple[Path, bool]],
    lazy: Mapping[str, str],
    facade: str = FACADE,
    *,
    runtime_only: bool = True,
) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` among ``modules`` (the facade left out, see the module docstring);
    ``runtime_only=False`` counts the imports under ``if TYPE_CHECKING:`` too."""
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        if name == facade:
            continue
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for module, imported in _imports(parsed(path), package, runtime_only=runtime_only):
            submodule = f"{module}.{imported}" if imported else ""
            if submodule in modules:
                targets.add(submodule)
            elif module == facade and imported is not None and imported in lazy:
                targets.add(lazy[imported])
            elif module in modules:
                targets.add(module)
        graph[name] = targets - {name, facade}
    return graph


@functools.cache
def package_graph(*, runtime_only: bool = True) -> dict[str, set[str]]:
    """The import graph of the whole package (every module parsed once per test process, not once per test)."""
    return import_graph(MODULES, lazy_names(ROOTS[FACADE] / "__init__.py"), runtime_only=runtime_only)


def find_components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each holds at least one cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component, as a path ``[a, b, ..., a]``."""
    return [_cycle_in(graph, set(c)) for c in find_components(graph)]


def _cycle_in(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first inside the component)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"no cycle in {component}")  # pragma: no cover - a component always has one


MODULES = find_modules(ROOTS)
SOURCES = sorted(str(path.relative_to(REPO)) for path, _ in MODULES.values())


def test_the_graph_sees_the_whole_package() -> None:
    graph = package_graph()
    assert {"nbtrainer._trainer._trainer", "nbtrainer._profile._model", "nbtrainer.widgets._panel"} <= set(graph)
    assert "nbtrainer._trainer._assemble" in graph["nbtrainer._trainer._trainer"]  # module level
    assert "nbtrainer._loop._lr_find" in graph["nbtrainer._trainer._trainer"]  # inside a method
    assert "nbtrainer._data._inputs" in graph["nbtrainer._profile._flops"]  # inside a subpackage
    assert "nbtrainer._compare._run" in graph["nbtrainer.widgets._compare_view"]  # `from nbtrainer import X`


@pytest.mark.parametrize("runtime_only", [True, False], ids=["at-run-time", "type-only-too"])
def test_no_import_cycles(runtime_only: bool) -> None:
    graph = package_graph(runtime_only=runtime_only)
    cycles = [
        f"{' -> '.join(_cycle_in(graph, set(c)))}  (modules in cycles together: {', '.join(c)})"
        for c in find_components(graph)
    ]
    assert not cycles, (
        "import cycles (counting imports inside functions and under TYPE_CHECKING); move the shared piece to the "
        "module it belongs to, or type it against a Protocol of the lower module:\n" + "\n".join(cycles)
    )


def protocols(modules: Mapping[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """``{module: {names of the classes it defines that are typing Protocols}}``."""
    found: dict[str, set[str]] = {}
    for name, (path, _) in modules.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ClassDef) and any(
                (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "") == "Protocol"
                for b in node.bases
            ):
                found.setdefault(name, set()).add(node.name)
    return found


def test_the_core_has_a_few_typed_seams() -> None:
    """At most four Protocols in nbtrainer/ (the widgets have their own), each of them a seam listed in SEAMS."""
    core = {m: names for m, names in protocols(MODULES).items() if not m.startswith("nbtrainer.widgets")}
    assert sum(len(n) for n in core.values()) <= 4, core
    assert core == SEAMS, "a new Protocol in the core: extend a seam of SEAMS (or list it there, on purpose)"


# The floor plan: the folders below the Trainer never import it, type-only imports included (issue 34); they are
# typed against the seams it satisfies (the callbacks: TrainerView; the loop and the tools around a run: LoopHost)
# or take the parts they need (the data path, the placement).
BELOW_THE_TRAINER: tuple[str, ...] = (
    "_loop",
    "_data",
    "_memory",
    "_events",
    "_report",
    "_setup",
    "_dist",
    "_resume",
    "_runs",
    "_plan",
)
BELOW_THE_TRAINER += ("_look",)  # samples and error analysis (issue 46)


@pytest.mark.parametrize("folder", BELOW_THE_TRAINER)
def test_folders_below_the_trainer_do_not_import_it(folder: str) -> None:
    graph = package_graph(runtime_only=False)
    prefix = f"{FACADE}.{folder}"
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name == prefix or name.startswith(prefix + ".")
        for target in targets
        if target.startswith(f"{FACADE}._trainer")
    )
    assert not upward, (
        f"nbtrainer/{folder}/ imports the Trainer (type it against a Protocol of what it needs):\n" + "\n".join(upward)
    )


# Names under which a module holds the Trainer (its hooks' ``trainer=``, a callback's ``self.trainer``).
TRAINER_NAMES = ("trainer", "_trainer")
_REFLECTION = ("getattr", "hasattr", "setattr", "delattr")


def _holds_trainer(expr: ast.expr) -> bool:
    if isinstance(expr, ast.Name):
        return expr.id in TRAINER_NAMES
    return isinstance(expr, ast.Attribute) and expr.attr in TRAINER_NAMES


def _private(name: object) -> bool:
    return isinstance(name, str) and name.startswith("_") and not name.startswith("__")


def trainer_private_reads(source: str) -> list[tuple[int, str]]:
    """``(line, "trainer._x")`` for every use of a private attribute of something named ``trainer`` in ``source``:
    ``trainer._x``, ``self.trainer._x`` and ``getattr(trainer, "_x")`` (and has/set/delattr)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(_parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _holds_trainer(node.value):
            found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _REFLECTION
            and len(node.args) >= 2
            and _holds_trainer(node.args[0])
            and isinstance(node.args[1], ast.Constant)
            and _private(node.args[1].value)
        ):
            found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, {node.args[1].value!r})"))
    return found


def test_only_the_trainer_reads_its_private_state() -> None:
    """Outside ``_trainer/`` the Trainer is reached through its public, typed attributes (``run_state``,
    ``batch_steps``, ``model_setup``...) or what it hands over (the loop: a LoopHost), never ``trainer._x``."""
    reads = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for name, (path, _) in MODULES.items()
        if not name.startswith(f"{FACADE}._trainer")
        for line, what in trainer_private_reads(path.read_text(encoding="utf-8"))
    ]
    assert not reads, "modules that read the Trainer's private attributes (give it a public home):\n" + "\n".join(reads)


def test_the_private_read_finder_sees_them() -> None:
    source = (
        "def f(trainer, self):\n"
        "    a = trainer._state\n"
        "    b = getattr(trainer, '_loop', None)\n"
        "    c = self.trainer._control\n"
        "    d = trainer.run_state, trainer.__class__, other._x\n"
    )
    assert trainer_private_reads(source) == [
        (2, "trainer._state"),
        (3, "getattr(trainer, '_loop')"),
        (4, "self.trainer._control"),
    ]


def test_the_cycle_finder_finds_hidden_cycles(tmp_path: Path) -> None:
    """The checker itself: a cycle hidden in a function, through a relative import and the facade, is found."""
    pkg = tmp_path / "pkg"
    (pkg / "_sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('_LAZY: dict[str, str] = {"Thing": "pkg._c"}\n')
    (pkg / "_a.py").write_text("from pkg._sub import _b\n")
    (pkg / "_sub" / "__init__.py").write_text("")
    (pkg / "_sub" / "_b.py").write_text("def f():\n    from pkg import Thing\n")
    (pkg / "_c.py").write_text("def g():\n    from ._a import x\n")
    (pkg / "_d.py").write_text("from ._c import y\n")  # points into the cycle, not part of it
    modules = find_modules({"pkg": pkg})
    graph = import_graph(modules, lazy_names(pkg / "__init__.py"), facade="pkg")
    assert find_cycles(graph) == [["pkg._a", "pkg._sub._b", "pkg._c", "pkg._a"]]
    # a type-only import never runs: no edge, no cycle
    (pkg / "_c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import x\n")
    assert find_cycles(import_graph(find_modules({"pkg": pkg}), {"Thing": "pkg._c"}, facade="pkg")) == []
    (pkg / "_c.py").write_text("x = 1\n")
    assert find_cycles(import_graph(find_modules({"pkg": pkg}), {"Thing": "pkg._c"}, facade="pkg")) == []


def test_widgets_use_only_the_cores_public_names() -> None:
    private = []
    for name, (path, is_package) in MODULES.items():
        if not name.startswith("nbtrainer.widgets"):
            continue
        package = name if is_package else name.rpartition(".")[0]
        tree = parsed(path)
        for module, imported in _imports(tree, package, runtime_only=False):  # type-only imports too
            if module.startswith("nbtrainer._") or (module == "nbtrainer" and (imported or "").startswith("_")):
                private.append(f"{path.relative_to(REPO)}: {module}" + (f" import {imported}" if imported else ""))
    assert not private, "widgets/ imports private core names (use what nbtrainer exports):\n" + "\n".join(private)


@pytest.mark.parametrize(
    "source",
    SOURCES,
)
def test_module_is_at_most_500_lines(source: str) -> None:
    lines = len((REPO / source).read_text(encoding="utf-8").splitlines())
    limit = FACADE_MAX_LINES if source == FACADE_MODULE else MAX_LINES
    assert lines <= limit, f"{source} has {lines} lines (> {limit}): split it by concept"


def test_module_names_are_distinct_across_folders() -> None:
    """One name, one module (issue 34): ``_table`` or ``_measure`` in two folders made a reader open both."""
    seen: dict[str, list[str]] = {}
    for name, (path, is_package) in MODULES.items():
        if not is_package:
            seen.setdefault(name.rpartition(".")[2], []).append(str(path.relative_to(REPO)))
    repeated = {short: paths for short, paths in seen.items() if len(paths) > 1 and short.startswith("_")}
    assert not repeated, repeated


# -- issue 53: typed seams, no probing, no names across packages, no silenced failures -----------------------------
PRODUCT = {name: path for name, (path, _) in MODULES.items()}


def _broad(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(getattr(t, "id", getattr(t, "attr", "")) in ("Exception", "BaseException") for t in types)


def _raises_or_logs(handler: ast.ExceptHandler) -> bool:
    body = ast.Module(body=handler.body, type_ignores=[])
    return any(
        isinstance(n, ast.Raise)
        or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "debug")
        for n in ast.walk(body)
    )


def broad_excepts(source: str) -> list[int]:
    """Lines of ``except Exception`` / ``except BaseException`` / bare ``except`` handlers that neither raise nor log at
    debug level (a failure handled there must be narrowed to what is expected, or leave its reason in the log)."""
    return [
        n.lineno
        for n in ast.walk(_parse(source))
        if isinstance(n, ast.ExceptHandler) and _broad(n) and not _raises_or_logs(n)
    ]


def test_every_broad_except_raises_or_logs_its_reason() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}" for path in PRODUCT.values() for line in broad_excepts(path.read_text())
    ]
    assert not found, "broad excepts that swallow the failure (narrow them, or log.debug the reason):\n" + "\n".join(
        found
    )


def test_the_broad_except_finder_sees_them() -> None:
    source = (
        "try:\n    f()\nexcept Exception:\n    pass\n"
        "try:\n    f()\nexcept (ValueError, BaseException):\n    x = 1\n"
        "try:\n    f()\nexcept Exception:\n    log.debug('why', exc_info=True)\n"
        "try:\n    f()\nexcept Exception:\n    raise\n"
        "try:\n    f()\nexcept ValueError:\n    pass\n"
    )
    assert broad_excepts(source) == [3, 7]


def trainer_probes(source: str) -> list[int]:
    """Lines that ask the Trainer whether it has an attribute (``getattr(trainer, "x", default)``, ``hasattr``,
    ``getattr(trainer.strategy, ...)``): the seams say what it has, with a real type."""
    found = []
    for node in ast.walk(_parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and (
                _holds_trainer(node.args[0])
                or (isinstance(node.args[0], ast.Attribute) and _roots_in_trainer(node.args[0]))
            )
        ):
            found.append(node.lineno)
    return found


def _roots_in_trainer(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        if _holds_trainer(expr):
            return True
        expr = expr.value
    return _holds_trainer(expr)


def test_consumers_do_not_probe_the_trainer() -> None:
    probes = [
        f"{path.relative_to(REPO)}:{line}"
        for name, path in PRODUCT.items()
        if not name.startswith(f"{FACADE}._trainer")
        for line in trainer_probes(path.read_text())
    ]
    assert not probes, "getattr / hasattr on the Trainer (read what its seam declares):\n" + "\n".join(probes)


def test_no_private_name_crosses_a_package() -> None:
    """A name that starts with ``_`` is private to its folder: another folder imports only public names."""
    crossing = []
    for name, path in PRODUCT.items():
        folder = name.split(".")[1] if name.count(".") >= 2 else None
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{FACADE}._"):
                target = node.module.split(".")[1]
                private = [
                    a.name
                    for a in node.names
                    if a.name.startswith("_") and f"{node.module}.{a.name}" not in MODULES  # a module is no name
                ]
                if target != folder and private:
                    crossing.append(f"{path.relative_to(REPO)}: {node.module} import {', '.join(private)}")
    assert not crossing, "private names imported from another package:\n" + "\n".join(crossing)


def _named_class(expr: ast.expr) -> bool:
    """A class name written in the code: a string, a collection of them, or a constant holding them (``_PACKED``)."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    if isinstance(expr, ast.Tuple | ast.List | ast.Set):
        return all(_named_class(e) for e in expr.elts)
    return isinstance(expr, ast.Name) and expr.id.lstrip("_").isupper()


def test_no_type_check_by_class_name() -> None:
    """``type(x).__name__ == "LBFGS"`` breaks on a subclass and hides the dependency: isinstance does neither. Only a
    class of an optional library is told by name (so the library is not imported), and then by its module too. (A
    name compared with one a checkpoint saved is a comparison of records, not a type check.)"""
    found = []
    for path in PRODUCT.values():
        for func in ast.walk(parsed(path)):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            names = [
                n
                for n in ast.walk(func)
                if isinstance(n, ast.Compare)
                and any(isinstance(x, ast.Attribute) and x.attr == "__name__" for x in [n.left, *n.comparators])
                and any(_named_class(x) for x in [n.left, *n.comparators])
            ]
            modules = any(isinstance(n, ast.Attribute) and n.attr == "__module__" for n in ast.walk(func))
            if names and not modules:
                found += [f"{path.relative_to(REPO)}:{n.lineno}" for n in names]
    assert not found, "type checks by class name (use isinstance):\n" + "\n".join(sorted(set(found)))


def test_the_probe_finder_sees_them() -> None:
    source = (
        "a = getattr(trainer, 'timing_every', 1)\n"
        "b = hasattr(self.trainer, 'fit')\n"
        "c = getattr(trainer.run_state.loop, 'step', None)\n"
        "d = getattr(optimizer, 'optimizers', None)\n"
    )
    assert trainer_probes(source) == [1, 2, 3]
