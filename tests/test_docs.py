"""The examples in public docstrings run (Google-style docstrings with a short runnable example)."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _modules_with_examples() -> list[str]:
    """Every module of the package whose source holds a ``>>>`` example, ``widgets/`` as ``nbtrainer.widgets``.

    Found, not listed: a hand-kept list ran 31 of the 105 modules with examples, so a stale example
    (``show_batch``'s) and one doctest could not even parse (``LaunchView``'s) went unseen."""
    names = []
    for folder, package in ((ROOT / "nbtrainer", "nbtrainer"), (ROOT / "widgets", "nbtrainer.widgets")):
        for path in sorted(folder.rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(folder).with_suffix("").parts
                names.append(".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts))))
    return names


MODULES = _modules_with_examples()


def test_the_examples_are_found_in_the_core_and_the_widgets():
    assert {"nbtrainer", "nbtrainer._trainer._trainer", "nbtrainer._know._show_batch"} <= set(MODULES)
    assert "nbtrainer.widgets._launch_view" in MODULES and len(MODULES) >= 100


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    # torch's global generator's state is what the worker's earlier tests left (their order varies run to run): an
    # example drawing random tensors unseeded depends on it
    torch.manual_seed(0)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_public_names_have_docstrings():
    import nbtrainer

    core = [n for n in nbtrainer.__all__ if n not in ("TrainerWidget", "ProfileCard", "__version__", "EVENTS")]
    missing = [n for n in core if not (getattr(nbtrainer, n).__doc__ or "").strip()]
    assert not missing, missing
    # the public submodules' names, and every name the root still imports (lazily, outside __all__)
    subs = [importlib.import_module(f"nbtrainer.{m}") for m in ("profile", "compare", "inference", "runs", "dist")]
    assert all((m.__doc__ or "").strip() for m in subs)
    names = {(m.__name__, n): getattr(m, n) for m in subs for n in m.__all__ if n != "PRESETS"}
    names |= {("nbtrainer", n): getattr(nbtrainer, n) for n in nbtrainer._LAZY if n not in ("EVENTS",)}
    missing_sub = [key for key, value in names.items() if not (getattr(value, "__doc__", "") or "").strip()]
    assert not missing_sub, missing_sub


def test_the_root_namespace_is_short_and_every_old_name_still_imports():
    import nbtrainer

    assert len(nbtrainer.__all__) <= 25
    for name in nbtrainer._LAZY:  # the 52 names of the earlier root: importable still, lazily
        assert getattr(nbtrainer, name) is not None, name
    for sub in ("profile", "compare", "inference", "runs", "dist"):
        module = getattr(nbtrainer, sub)
        for name in module.__all__:
            if name in nbtrainer._LAZY:
                assert getattr(module, name) is getattr(nbtrainer, name), (sub, name)


def _installed(name: str) -> bool:
    """An installed module, not a folder of this repository's tests (tests/trainer/ is importable as ``trainer``
    while pytest runs, and ``trainer.fit(...)`` in a snippet is a variable)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return not all(str(p).startswith(str(ROOT / "tests")) for p in places if p)


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_doc_snippets_import_the_modules_they_use(doc):
    """A snippet that writes ``torchmetrics.Accuracy(...)`` must import torchmetrics: every installed module
    used as ``name.attr`` is bound in the snippet (placeholders like ``build_model()`` are left alone)."""
    path = ROOT / doc if (ROOT / doc).exists() else ROOT / "docs" / doc
    for block in _python_blocks(path):
        tree = ast.parse(block)
        bound = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                bound.add(node.name)
                bound |= {a.arg for a in node.args.args} if isinstance(node, ast.FunctionDef) else set()
        used = {
            node.value.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        }
        missing = sorted(n for n in used - bound if _installed(n))
        assert not missing, f"{doc}: a snippet uses {missing} without importing it:\n{block[:300]}"


@pytest.mark.parametrize("name,args", [("ModelCheckpoint", ("ckpts",)), ("CSVLogger", ("runs",)), ("ProgressBar", ())])
def test_public_attributes_are_documented(name, args, tmp_path, monkeypatch):
    """Every public attribute an instance has is named in its class docstring (``best_model_path``...)."""
    import nbtrainer

    monkeypatch.chdir(tmp_path)
    cls = getattr(nbtrainer, name)
    instance = cls(*args)
    doc = cls.__doc__ or ""
    missing = [attr for attr in vars(instance) if not attr.startswith("_") and attr not in doc]
    assert not missing, f"{name}: undocumented attributes {missing}"


def test_resource_limits_names_what_a_cpu_refuses():
    # The page said offload_activations, attention="flash" and optimizer_in_backward were each refused on a CPU:
    # they train there; offload_optimizer (and a backend the CPU has no kernel for) is what a CPU refuses.
    import torch

    from nbtrainer import Trainer

    text = (ROOT / "docs" / "resource-limits.md").read_text(encoding="utf-8")
    assert "each is refused on a CPU" not in text
    assert "None of them is refused on a CPU" in text

    def trainer(**switches) -> Trainer:
        layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        return Trainer(layer, torch.nn.MSELoss(), "adamw", lr=1e-3, device="cpu", progress=False, **switches)

    x = torch.randn(4, 8, 16)
    for switches in ({"offload_activations": True}, {"attention": "flash"}, {"optimizer_in_backward": True}):
        runs = trainer(**switches)
        runs.fit([(x, x)] * 2, epochs=1)
        assert runs.global_step == 2, switches
    with pytest.raises(ValueError, match="nothing to offload to"):
        trainer(offload_optimizer=True)
    with pytest.raises(ValueError, match=r"attention='cudnn' cannot run on cpu"):
        trainer(attention="cudnn")
