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
# # Precision and gradient accumulation on a CPU
#
# **Usage:** run all cells (*Run → Run All Cells*); about 15 s on 2 CPU cores (measured 14-16 s; up to 30 s when
# other jobs share the cores). The same small CNN is trained on scikit-learn's digits under `fp32`, `bf16-mixed` and
# `fp16-mixed` autocast, with and without gradient accumulation at the same effective batch size (64), and one table
# compares wall time, measured training memory per step and validation accuracy: the classic mixed-precision
# experiment, reproduced on a laptop. Change `EPOCHS` or `CONFIGS` below and run again to try your own.

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
# Which precisions does this CPU really run? `precision_support` *checks* each one with a tiny autocast
# forward and backward (nothing is guessed); an unsupported precision is refused by the `Trainer`, never
# silently downgraded.

# %%
from nbtrainer import Trainer, precision_support, profile_model

precision_support("cpu")

# %% [markdown]
# `run()` trains a fresh copy of the model (same seed) and measures:
# * **time**: wall time of `trainer.fit`;
# * **memory**: one training step's memory, measured by `profile_model` at the micro-batch size (parameters,
#   gradients, AdamW state, and the activations saved for backward, which is what precision and accumulation
#   change);
# * **accuracy** on the validation set after the last epoch.
#
# With `accum=k` the loader yields micro-batches of `64 // k` and the trainer steps the optimizer every `k`
# micro-batches, so each update still sees 64 samples.

# %%
import time

import pandas as pd

EPOCHS = 3
BATCH = 64


def run(precision: str, accum: int = 1, epochs: int = EPOCHS) -> dict:
    torch.manual_seed(0)
    model = small_cnn()
    micro = BATCH // accum
    loader = DataLoader(
        TensorDataset(x_tr, y_tr), batch_size=micro, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        torch.optim.AdamW(model.parameters(), lr=3e-3),
        metrics={"acc": accuracy},
        precision=precision,
        grad_accum_steps=accum,
        seed=0,
        progress=False,
    )
    start = time.perf_counter()
    history = trainer.fit(loader, val_loader, epochs=epochs)
    seconds = time.perf_counter() - start
    memory = profile_model(
        model,
        x_tr[:micro],
        precisions=(precision,),
        include=("memory",),
        criterion=nn.CrossEntropyLoss(),
        targets=y_tr[:micro],
    ).memory["cpu"][precision]
    return {
        "precision": precision,
        "accum": accum,
        "micro-batch": micro,
        "time (s)": seconds,
        "samples/s": len(x_tr) * epochs / seconds,
        "step memory (KiB)": memory["total"] / 1024,
        "activations (KiB)": memory["activations"] / 1024,
        "val_acc": history.last["val_acc"],
        "fp16 skipped steps": history.last["skipped_steps"],
    }


_ = run("fp32", epochs=1)  # warm-up: the first fit in a process pays one-off costs (thread pools, kernels)

# %%
CONFIGS = [("fp32", 1), ("bf16-mixed", 1), ("fp16-mixed", 1), ("fp32", 4), ("bf16-mixed", 4)]
results = pd.DataFrame([run(p, a) for p, a in CONFIGS]).set_index(["precision", "accum"])
results.round({"time (s)": 2, "samples/s": 0, "step memory (KiB)": 0, "activations (KiB)": 0, "val_acc": 3})

# %% [markdown]
# How to read it:
# * **Memory.** Mixed precision keeps the weights, gradients and optimizer state in fp32; what shrinks is the
#   activations saved for backward (16-bit copies). Accumulation shrinks them further by running smaller
#   micro-batches, at the same effective batch size.
# * **Time.** On a CPU, low-precision autocast pays off only where the CPU has native bf16/fp16 instructions
#   (AVX-512 BF16, AMX); elsewhere the casts can cost more than they save (fp16 is often emulated on CPUs). With
#   accumulation there are `k` times more, smaller forward/backward passes, so fixed per-batch costs grow. A model
#   this small is dominated by such overheads, and timings on a shared machine are noisy: run it twice.
# * **Accuracy** is about the same everywhere. Accumulation is exact for the loss (each micro-batch is scaled
#   by its window), but BatchNorm sees micro-batches of 16 rather than 64, so the runs are not identical.
# * `fp16-mixed` uses a gradient scaler (on CPU too); steps it skipped after an overflow are counted.

# %%
base = results.loc[("fp32", 1)]
(
    results[["time (s)", "step memory (KiB)", "activations (KiB)"]]
    / base[["time (s)", "step memory (KiB)", "activations (KiB)"]]
).round(2)
