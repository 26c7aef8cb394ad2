# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The same training in a script
#
# **Usage:** run all cells (*Run → Run All Cells*); about 10 s on 2 CPU cores (measured 9-10 s; up to 20 s when
# other jobs share the cores). Nothing in nbtrainer needs a notebook: the cells below run Python scripts as you
# would in a terminal (`!` runs a shell command; in a terminal, drop the `!` and write `python` instead of
# `{sys.executable}`). `Trainer.fit` shows console progress bars there, and the very same `TrainerWidget(...).fit()`
# code that shows the panel in a notebook trains in the foreground with console bars in a plain script. Long runs
# then come back to the notebook as a saved `History`.

# %%
import os
import sys
import tempfile
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"  # for the scripts below: small models run fastest on one thread
workdir = Path(tempfile.mkdtemp(prefix="nbtrainer-scripts-"))
sys.executable

# %% [markdown]
# ## The repository's headless demo
#
# `examples/train_digits.py` is a small CNN on scikit-learn's digits with a OneCycle schedule and early stopping;
# `--precision`, `--accum` and `--epochs` are options (`--help` lists them). The bars are tqdm's console bars.

# %%
# !{sys.executable} ../examples/train_digits.py --epochs 3

# %% [markdown]
# ## A notebook's code as a script
#
# The quickstart's cells, pasted into a file. `TrainerWidget(...).fit()` sees there is no notebook front end,
# says so once, trains in the foreground with console bars and returns the `History`, which the script saves.

# %%
script = workdir / "train_quickstart.py"  # %%writefile below expands {script}

# %%
# %%writefile {script}
"""The quickstart's training as a plain script: TrainerWidget(...).fit() trains in the foreground here."""
import sys

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import TrainerWidget

torch.set_num_threads(1)
torch.manual_seed(0)
x, y = load_digits(return_X_y=True)
x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
y = torch.tensor(y, dtype=torch.long)
x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
train_loader = DataLoader(
    TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
)
val_loader = DataLoader(TensorDataset(x_va, y_va), batch_size=256)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1),
    nn.BatchNorm2d(16),
    nn.ReLU(),
    nn.Conv2d(16, 32, 3, padding=1),
    nn.BatchNorm2d(32),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Dropout(0.2),
    nn.Linear(32 * 4 * 4, 64),
    nn.ReLU(),
    nn.Linear(64, 10),
)


def accuracy(outputs, targets):
    return (outputs.argmax(dim=1) == targets).float().mean()


w = TrainerWidget(
    model,
    nn.CrossEntropyLoss(),
    torch.optim.AdamW(model.parameters(), lr=3e-3),
    train_loader,
    val_loader,
    metrics={"acc": accuracy},
    epochs=3,
    seed=0,
)
history = w.fit()  # no notebook here: console progress bars, then the History
history.to_json(sys.argv[1] if len(sys.argv) > 1 else "history.json")
print(history)

# %%
history_file = workdir / "history.json"
# !{sys.executable} {script} {history_file}

# %% [markdown]
# ## Back in the notebook: load the script's History

# %%
from nbtrainer import History

history = History.from_json(str(history_file))
history.to_pandas()[["loss", "acc", "val_loss", "val_acc", "time"]].round(4)

# %%
assert history.status == "finished" and len(history) == 3, history
history.last["val_acc"]

# %% [markdown]
# The script and its saved `History` were written to a temporary folder, removed here so that each run of this
# notebook leaves nothing behind (copy them elsewhere first to keep them).

# %%
import shutil

print(f"removing {workdir}")
shutil.rmtree(workdir)
