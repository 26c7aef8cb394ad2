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
# # Quickstart: train a small CNN with a live panel
#
# **Usage:** run all cells (*Run → Run All Cells*, or `jupyter execute 01_quickstart.ipynb` in a terminal); about 10
# s on 2 CPU cores (measured 9-12 s, kernel start included; up to twice that when other jobs share the cores), with
# no GPU and no download. A small CNN learns scikit-learn's handwritten digits while the panel shows the loss,
# learning rate and accuracy live. When the run ends, press **Start** to train on, **Pause** / **Stop** it at any
# step, move the learning-rate slider or the accumulation steps mid-run, or press **Profile**; the last cells turn
# the run's `History` into a table and a chart. Needs the project installed (`pip install -e .` from the repository
# root; Binder does it).

# %%
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Models this small run fastest on one intra-op thread, and it leaves a core for the kernel and the
# panel (on a busy 2-core machine, 2 threads can be many times slower).
torch.set_num_threads(1)
_ = torch.manual_seed(0)  # (it returns a Generator: not worth printing)

# %%
# 1,797 handwritten digits, 8x8 pixels, bundled with scikit-learn (no download)
x, y = load_digits(return_X_y=True)
x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
y = torch.tensor(y, dtype=torch.long)
x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
train_loader = DataLoader(
    TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
)
val_loader = DataLoader(TensorDataset(x_va, y_va), batch_size=256)
len(x_tr), len(x_va)


# %%
def small_cnn() -> nn.Module:
    return nn.Sequential(
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


# %% [markdown]
# ## The panel
#
# `TrainerWidget` takes what `nbtrainer.Trainer` takes (model, loss, optimizer, loaders, metrics, options such as
# `precision=` or `grad_accum_steps=`). Displaying it shows the panel; training runs in a background thread, so the
# buttons keep working while it trains.

# %%
from nbtrainer import TrainerWidget

model = small_cnn()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
w = TrainerWidget(
    model, nn.CrossEntropyLoss(), optimizer, train_loader, val_loader, metrics={"acc": accuracy}, epochs=5, seed=0
)
w

# %% [markdown]
# `w.fit()` is the same as pressing **Start** and waiting: the cell returns the `History` when the run ends
# (`w.start()` returns at once instead; `w.wait()` waits later). While this cell runs, the panel keeps
# responding: **Pause**, **Resume**, **Stop** and the LR control work mid-run (Kernel → Interrupt stops the run
# too, and the cell still returns the `History`). When the run ends the panel keeps a summary of it, and a
# plain-HTML copy is left under the panel for places where widgets are not rendered (GitHub, nbviewer).

# %%
history = w.fit()

# %% [markdown]
# ## The run as a report, a table and charts
#
# A `History` shows itself as a report: one row per epoch (the best value of each column in bold) and the
# charts: loss per step with validation loss per epoch, learning rate (log scale), accuracy on its own 0-1 axis.
# `history.plot()` gives the charts alone (`history.plot().save("run.svg")` writes them to a file), and
# `history.to_pandas()` a DataFrame (`history.to_pandas("steps")` has one row per optimizer step).

# %%
history

# %%
table = history.to_pandas()
table[["loss", "acc", "val_loss", "val_acc", "lr", "time", "samples_per_s"]].round(4)

# %%
best = history.best("val_acc", mode="max")
print(f"{history.status}: best val_acc {best['val_acc']:.3f} at epoch {best['epoch']}")
