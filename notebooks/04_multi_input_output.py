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
# # Multiple inputs, multiple outputs, dict batches
#
# **Usage:** run all cells (*Run → Run All Cells*); about 10 s on 2 CPU cores (measured 9-10 s; up to 20 s when
# other jobs share the cores). The `Trainer` (and the panel) takes batches in the shapes models really use: `(x,
# y)`, `(x1, x2, ..., y)` → `model(x1, x2, ...)`, `num_inputs=k` when there are several targets, and dicts →
# `model(**inputs)` with the targets picked by `target_keys`; outputs can be tuples or dicts, and the loss and
# metrics receive them as the model returned them. Each section below trains the same digits data in one of these
# shapes; copy the one that looks like your data.

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
import torch.nn.functional as F

x, y = load_digits(return_X_y=True)
image = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
# a second input: the "ink profile" of each digit (row sums and column sums, 16 numbers)
profile = torch.cat([image.sum(dim=3).flatten(1), image.sum(dim=2).flatten(1)], dim=1) / 8.0
digit = torch.tensor(y, dtype=torch.long)
parity = digit % 2  # a second target: is the digit odd?
idx_tr, idx_va = train_test_split(torch.arange(len(digit)), test_size=0.2, random_state=0, stratify=digit)
image.shape, profile.shape


# %%
class TwoInputNet(nn.Module):
    """An image branch and a profile branch, joined; one head per task (one or two outputs)."""

    def __init__(self, two_heads: bool = False, as_dict: bool = False) -> None:
        super().__init__()
        self.image_branch = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 4 * 4, 64),
            nn.ReLU(),
        )
        self.profile_branch = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.digit_head = nn.Linear(96, 10)
        self.parity_head = nn.Linear(96, 2) if two_heads else None
        self.as_dict = as_dict

    def forward(self, image, profile):
        h = torch.cat([self.image_branch(image), self.profile_branch(profile)], dim=1)
        if self.parity_head is None:
            return self.digit_head(h)
        digit, parity = self.digit_head(h), self.parity_head(h)
        return {"digit": digit, "parity": parity} if self.as_dict else (digit, parity)


def loader(*tensors, train=True):
    idx = idx_tr if train else idx_va
    return DataLoader(
        TensorDataset(*(t[idx] for t in tensors)),
        batch_size=64 if train else 256,
        shuffle=train,
        generator=torch.Generator().manual_seed(0),
    )


# %% [markdown]
# ## Two inputs, one target: `(image, profile, digit)`
#
# With no other hint the last element of a tuple batch is the target and the others are the model's
# positional inputs.

# %%
from nbtrainer import Trainer

torch.manual_seed(0)
model = TwoInputNet()
trainer = Trainer(
    model,
    nn.CrossEntropyLoss(),
    torch.optim.AdamW(model.parameters(), lr=3e-3),
    metrics={"acc": lambda out, t: (out.argmax(1) == t).float().mean()},
    seed=0,
    progress=False,
)
history = trainer.fit(loader(image, profile, digit), loader(image, profile, digit, train=False), epochs=3)
history.to_pandas()[["loss", "acc", "val_loss", "val_acc"]].round(4)


# %% [markdown]
# ## Two inputs, two outputs, two targets: `(image, profile, digit, parity)` with `num_inputs=2`
#
# The model returns a tuple; the loss and the metrics get `(digit_logits, parity_logits)` and
# `(digit, parity)`.


# %%
def multitask_loss(outputs, targets):
    (digit_logits, parity_logits), (digit_t, parity_t) = outputs, targets
    return F.cross_entropy(digit_logits, digit_t) + 0.5 * F.cross_entropy(parity_logits, parity_t)


tuple_metrics = {
    "digit_acc": lambda out, t: (out[0].argmax(1) == t[0]).float().mean(),
    "parity_acc": lambda out, t: (out[1].argmax(1) == t[1]).float().mean(),
}
torch.manual_seed(0)
model = TwoInputNet(two_heads=True)
trainer = Trainer(
    model,
    multitask_loss,
    torch.optim.AdamW(model.parameters(), lr=3e-3),
    num_inputs=2,
    metrics=tuple_metrics,
    seed=0,
    progress=False,
)
history = trainer.fit(
    loader(image, profile, digit, parity), loader(image, profile, digit, parity, train=False), epochs=3
)
history.to_pandas()[["loss", "digit_acc", "parity_acc", "val_digit_acc", "val_parity_acc"]].round(4)

# %% [markdown]
# ## Dict batches and dict outputs, in the panel
#
# A dataset that yields dicts (the default collate keeps them dicts). The keys named in `target_keys` are the
# targets (here two, passed to the loss as a tuple in that order); every other key is a keyword argument of
# the model, so `model(image=..., profile=...)`. The model returns a dict. `TrainerWidget` takes the same
# options as `Trainer`.

# %%
from torch.utils.data import Dataset


class DigitsDict(Dataset):
    def __init__(self, idx):
        self.idx = idx

    def __len__(self):
        return len(self.idx)

    def __getitem__(self, i):
        j = self.idx[i]
        return {"image": image[j], "profile": profile[j], "digit": digit[j], "parity": parity[j]}


dict_train = DataLoader(DigitsDict(idx_tr), batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
dict_val = DataLoader(DigitsDict(idx_va), batch_size=256)
next(iter(dict_val)).keys()

# %%
from nbtrainer import TrainerWidget


def dict_loss(outputs, targets):
    digit_t, parity_t = targets  # in target_keys order
    return F.cross_entropy(outputs["digit"], digit_t) + 0.5 * F.cross_entropy(outputs["parity"], parity_t)


dict_metrics = {
    "digit_acc": lambda out, t: (out["digit"].argmax(1) == t[0]).float().mean(),
    "parity_acc": lambda out, t: (out["parity"].argmax(1) == t[1]).float().mean(),
}
torch.manual_seed(0)
dict_model = TwoInputNet(two_heads=True, as_dict=True)
w = TrainerWidget(
    dict_model,
    dict_loss,
    torch.optim.AdamW(dict_model.parameters(), lr=3e-3),
    dict_train,
    dict_val,
    metrics=dict_metrics,
    target_keys=("digit", "parity"),
    epochs=3,
    seed=0,
)
w

# %%
history = w.fit()  # the same as pressing Start and waiting
history.to_pandas()[["loss", "digit_acc", "parity_acc", "val_digit_acc", "val_parity_acc"]].round(4)

# %% [markdown]
# `predict` returns the outputs for a whole loader, concatenated and in the model's own structure (here a dict):

# %%
predictions = w.trainer.predict(dict_val)
{k: tuple(v.shape) for k, v in predictions.items()}

# %%
(predictions["digit"].argmax(1) == digit[idx_va]).float().mean().item()
