"""The core runs a full fit in a plain process with ipywidgets, bqplot and IPython blocked from import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r"""
    import importlib.abc, sys

    BLOCKED = ("ipywidgets", "bqplot", "IPython", "ipykernel", "traitlets", "tqdm.notebook")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                raise ImportError(f"blocked by test: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import torch, torchmetrics, tempfile, os
    import nbtrainer
    from nbtrainer import Trainer, EarlyStopping, ModelCheckpoint, History
    x = torch.randn(128, 6); y = (x[:, 0] > 0).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    d = tempfile.mkdtemp()
    t = Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters(), 1e-2),
                metrics={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)},
                callbacks=[EarlyStopping("val_loss"), ModelCheckpoint(d, monitor="val_acc", save_last=True)],
                precision="bf16", grad_accum_steps=2, progress=True)
    h = t.fit(dl, dl, epochs=3)
    t.evaluate(dl); t.predict(dl)
    h2 = History.from_json(h.to_json(os.path.join(d, "h.json")) and os.path.join(d, "h.json"))
    assert h2.epochs == h.epochs
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("ipywidgets", "bqplot", "IPython", "ipykernel"))
    assert not leaked, leaked
    print("OK", h.status, len(h), sorted(os.listdir(d)))
""")


@pytest.mark.slow
def test_full_fit_with_jupyter_packages_blocked(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK finished 3" in proc.stdout


def test_import_is_cheap():
    code = (
        "import sys, nbtrainer; "
        "print(sorted(m for m in ('torch', 'ipywidgets', 'IPython', 'bqplot') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.strip()
    assert out == "[]"  # names resolve lazily: not even torch is imported by `import nbtrainer`
