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
# # Smaller and faster after training: distillation and quantization
#
# **Usage:** run all cells (*Run → Run All Cells*, or `jupyter execute 07_distill_quantize.ipynb` in a terminal);
# about half a minute on 2 CPU cores, no GPU, no download. Needs the project with its quantization extra
# (`pip install -e ".[quant]"`: torchao). A teacher MLP learns scikit-learn's handwritten digits; a student with
# a quarter of its parameters learns from the teacher's softened outputs in the training panel
# (`DistillationLoss`); then one table compares the teacher, the student and their quantized copies: size on disk,
# latency, accuracy and how far each one's outputs move from the teacher's.

# %%
import itertools

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Models this small run fastest on one intra-op thread, and it leaves a core for the kernel and the panel.
torch.set_num_threads(1)
_ = torch.manual_seed(0)

# 1,797 handwritten digits, 8x8 pixels as 64 features, bundled with scikit-learn (no download)
x, y = load_digits(return_X_y=True)
x = torch.tensor(x, dtype=torch.float32) / 16.0
y = torch.tensor(y, dtype=torch.long)
x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
train_loader = DataLoader(
    TensorDataset(x_tr, y_tr), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
)
val_loader = DataLoader(TensorDataset(x_va, y_va), batch_size=120)


def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])  # no ReLU after the output layer


def accuracy(outputs, targets):
    return (outputs.argmax(dim=1) == targets).float().mean()


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# %% [markdown]
# ## The teacher
#
# A 64-256-256-10 MLP, trained headless with `Trainer` (no panel needed for this one).

# %%
from nbtrainer import Trainer

teacher = mlp(64, 256, 256, 10)
trainer = Trainer(
    teacher,
    nn.CrossEntropyLoss(),
    torch.optim.AdamW(teacher.parameters(), lr=3e-3),
    metrics={"acc": accuracy},
    seed=0,
    progress=False,
)
teacher_history = trainer.fit(train_loader, val_loader, epochs=10)
print(f"teacher: {params(teacher):,} parameters, val_acc {teacher_history.epochs[-1]['val_acc']:.1%}")

# %% [markdown]
# ## The student, taught by the teacher in the panel
#
# `DistillationLoss(teacher, temperature=4.0, kd_weight=0.7)` is the student's criterion: 70% of the loss is the
# KL divergence between the softened class probabilities of student and teacher (scaled by T²), 30% the usual
# cross-entropy on the labels. The teacher is frozen, in `eval()`, runs on the student's inputs in the trainer's
# precision and is never saved in the student's checkpoints. The panel plots the two parts, `kd_loss` and
# `base_loss`, and `agreement`: how often the student picks the teacher's class.

# %%
from nbtrainer import DistillationLoss, TrainerWidget

student = mlp(64, 160, 64, 10)
print(f"student: {params(student):,} parameters ({params(student) / params(teacher):.0%} of the teacher)")
w = TrainerWidget(
    student,
    DistillationLoss(teacher, temperature=4.0, kd_weight=0.7),
    torch.optim.AdamW(student.parameters(), lr=3e-3),
    train_loader,
    val_loader,
    metrics={"acc": accuracy},
    epochs=10,
    seed=0,
)
w

# %%
history = w.fit()
history.to_pandas()[["loss", "kd_loss", "base_loss", "agreement", "val_acc", "val_agreement"]].round(4)

# %% [markdown]
# ## One table: teacher, student and their quantized copies
#
# `compare_inference` applies each method to the teacher (fp32 is the baseline, bf16 a bfloat16 copy, then
# torchao's int8 dynamic, int8 and int4 weight-only, and 4-bit weight clustering, `codebook4`) and runs the other
# models as they are: here the student and two `quantize_model` copies of it. Every variant sees the same
# validation batches. Size on disk is the saved state dict (quantized tensors as the tensors they hold); latency
# is per batch after a warm-up, over interleaved rounds, with its spread; when two variants are closer than that
# spread the table says they cannot be ranked. `max |Δ output|` is the largest difference of the logits from
# the teacher's.

# %%
from nbtrainer import CompareWidget, compare_inference, quantize_model

table = compare_inference(
    teacher,
    val_loader,
    models={
        "student": student,
        "student int8-weight": quantize_model(student, "int8-weight"),
        "student codebook4": quantize_model(student, "codebook4"),
    },
    rounds=5,
)
CompareWidget(table)

# %% [markdown]
# The same table as text (`table.to_pandas()` gives a DataFrame, `table.rows` the numbers):

# %%
print(table)
