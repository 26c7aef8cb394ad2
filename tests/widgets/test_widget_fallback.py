"""No notebook front end: ``TrainerWidget(...).fit()`` trains in the foreground with console bars, and the
widget layer touches only the core's public API."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nbtrainer.widgets

SCRIPT = textwrap.dedent(r"""
    import sys, threading, torch
    from nbtrainer import TrainerWidget, History
    torch.manual_seed(0)
    x = torch.randn(256, 6); y = (x[:, 0] > 0).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    w = TrainerWidget(model, torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), 1e-2), dl, dl,
                      epochs=2)
    h = w.fit()
    assert isinstance(h, History) and h is w.history and h.status == "finished" and len(h) == 2, h
    extra = [t.name for t in threading.enumerate() if t.name.startswith("nbtrainer")]
    assert not extra, extra   # trained in the foreground: no training or UI thread
    print("OK", h.status, len(h.steps["step"]))
""")


@pytest.mark.slow
def test_fit_without_a_frontend_trains_in_the_foreground_with_console_bars(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TQDM_", "NBTRAINER_"))}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK finished 16" in proc.stdout
    lines = proc.stderr.splitlines()
    notes = [line for line in lines if line.startswith("nbtrainer: no notebook front end")]
    assert len(notes) == 1, proc.stderr  # one short message
    # the core's console progress: captured output is not a TTY, so plain epoch lines rather than bars
    assert "epoch 2/2" in proc.stdout and "training finished" in proc.stdout and "\r" not in proc.stdout + proc.stderr


def test_fit_without_a_frontend_in_process(capsys):
    from widget_helpers import make_widget

    w = make_widget(epochs=1, progress=True)
    h = w.fit()
    err = capsys.readouterr().err
    assert h.status == "finished" and w.history is h and "no notebook front end" in err
    assert w.charts.sent_points()["loss"] == 0  # the panel was not driven: plain console training


def _private_uses(path: Path) -> list[str]:
    """Imports of private nbtrainer modules/names and private attributes of trainer-like objects."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("nbtrainer"):
            parts = node.module.split(".") + [a.name for a in node.names]
            if any(p.startswith("_") for p in parts):
                bad.append(f"{path.name}:{node.lineno} from {node.module} import ...")
        elif isinstance(node, ast.Import):
            bad += [
                f"{path.name}:{node.lineno} import {a.name}"
                for a in node.names
                if a.name.startswith("nbtrainer") and any(p.startswith("_") for p in a.name.split("."))
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = ast.unparse(node.value)
            if base.endswith(("trainer", ".model")) or base in ("t", "nbtrainer"):
                bad.append(f"{path.name}:{node.lineno} {base}.{node.attr}")
    return bad


def test_widget_layer_uses_only_public_core_names():
    folder = Path(nbtrainer.widgets.__file__).parent
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 8
    bad = [b for f in files for b in _private_uses(f)]
    assert not bad, bad
    for f in files:  # small modules
        assert len(f.read_text().splitlines()) <= 400, f


@pytest.mark.parametrize("value,expected", [("console", False), ("notebook", True)])
def test_frontend_override(monkeypatch, value, expected):
    from nbtrainer.widgets._notebook import in_notebook

    monkeypatch.setenv("NBTRAINER_FRONTEND", value)
    assert in_notebook() is expected
