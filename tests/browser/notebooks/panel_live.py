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
# # Panel for the real-browser tests (not a demo)
#
# The quickstart's panel, but nothing starts training: the test presses **Start** and **Stop** in the browser.
# Each forward pass sleeps a little so that a run lasts long enough to watch the charts grow, and it is
# 1,000 epochs long: every test stops it, and none may meet its natural end first (with 40 epochs, a
# loaded CI machine once reached the last step while a test was still at its screenshots, and the
# Stop clicked then found a finished run).

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


# %%
import time

from nbtrainer import TrainerWidget


class Slow(nn.Module):
    """Wraps a model and sleeps in each forward: about 20 steps/s here, so the browser can watch the run."""

    def __init__(self, inner: nn.Module, delay: float = 0.02) -> None:
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, x):
        time.sleep(self.delay)
        return self.inner(x)


model = Slow(small_cnn())
w = TrainerWidget(
    model,
    nn.CrossEntropyLoss(),
    torch.optim.AdamW(model.parameters(), lr=3e-3),
    train_loader,
    val_loader,
    metrics={"acc": accuracy},
    epochs=1000,
    seed=0,
)
w
