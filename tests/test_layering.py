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
    t.evaluate(dl); t.predict(torch.utils.data.DataLoader(dl.dataset, batch_size=16))  # in order: no shuffle
    h2 = History.from_json(h.to_json(os.path.join(d, "h.json")) and os.path.join(d, "h.json"))
    assert h2.epochs == h.epochs
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("ipywidgets", "bqplot", "IPython", "ipykernel"))
    assert not leaked, leaked
    print("OK", h.status, len(h), sorted(os.listdir(d)))
""")


@pytest.mark.slow
def test_full_fit_with_jupyter_packages_blocked(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK finished 3" in proc.stdout


def test_import_is_cheap():
    code = (
        "import sys, nbtrainer; "
        "print(sorted(m for m in ('torch', 'ipywidgets', 'IPython', 'bqplot') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    assert out == "[]"  # names resolve lazily: not even torch is imported by `import nbtrainer`


# What a plain run must not import (each costs from 0.3 s to 3 s of a script's start, and memory): torchmetrics
# alone pulled in scipy and transformers. torch._dynamo is checked where no optimizer exists: building any
# torch.optim optimizer imports it (torch's own add_param_group), in a hand-written loop too.
HEAVY = ("torchmetrics", "transformers", "scipy", "bitsandbytes", "peft", "torchao", "mlflow", "optuna", "sklearn")

PLAIN_RUN = textwrap.dedent(r"""
    import sys
    import torch
    from torch import nn
    HEAVY = sys.argv[1].split(",")
    assert not [m for m in HEAVY + ["torch._dynamo"] if m in sys.modules], "loaded before the test began"
    x = torch.randn(256, 6); y = (x[:, 0] > 0).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    from nbtrainer import Trainer
    # no optimizer: evaluate and predict, which must not bring in torch._dynamo either
    Trainer(model, nn.CrossEntropyLoss(), metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()},
            progress="lines").evaluate(dl)
    ordered = torch.utils.data.DataLoader(dl.dataset, batch_size=16)  # predict refuses a loader that shuffles
    Trainer(model, None).predict(ordered)
    dynamo_before_fit = "torch._dynamo" in sys.modules
    t = Trainer(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 1e-3), progress="lines",
                metrics={"acc": lambda o, t: (o.argmax(1) == t).float().mean()}, precision="bf16-mixed",
                grad_accum_steps=2, max_grad_norm=1.0)
    h = t.fit(dl, dl, epochs=2)
    t.evaluate(dl); t.predict(ordered)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
    print("DYNAMO", dynamo_before_fit, "LOADED", loaded, "STATUS", h.status)
    # then the other side of the sys.modules checks, in the same interpreter (one start, not two): a user who
    # imported torchmetrics gets its metrics treated as such (state reset per epoch, compute at the end)
    import torchmetrics
    x = torch.randn(64, 6); y = (x[:, 0] > 0).long()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    model = nn.Sequential(nn.Linear(6, 2))
    acc = torchmetrics.Accuracy(task="multiclass", num_classes=2)
    out = Trainer(model, nn.CrossEntropyLoss(), metrics={"acc": acc}, progress=False).evaluate(dl)
    expected = (model(x).argmax(1) == y).float().mean().item()
    print("MATCH", abs(out["val_acc"] - expected) < 1e-6, acc.update_count)
""")


@pytest.mark.slow  # starts an interpreter (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_a_plain_run_imports_nothing_it_does_not_use_and_a_torchmetrics_run_finds_its_metrics(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", PLAIN_RUN, ",".join(HEAVY)], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DYNAMO False LOADED [] STATUS finished" in proc.stdout, proc.stdout[-2000:]
    assert "MATCH True" in proc.stdout, proc.stdout  # torchmetrics imported by the user: its metrics found
