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
# # Profiling a model before training it
#
# **Usage:** run all cells (*Run → Run All Cells*); about 15 s on 2 CPU cores (measured 12-14 s; up to 25 s when
# other jobs share the cores). `profile_model` measures a model on example inputs (parameters and size, MACs/FLOPs,
# latency per precision, and the memory one training step needs, broken down) without touching the model itself;
# `fits()` says whether a batch size fits a memory budget and suggests micro-batch × accumulation when it does not.
# The same report is one magic away: `%load_ext nbtrainer`, then `%nbtrainer profile MODEL --input-shape 1,3,32,32`
# (or `--inputs VAR`). Try it on your own model by replacing the two below.

# %%
import torch
from torch import nn

torch.set_num_threads(1)  # small models: one thread is fastest and leaves a core for the kernel
_ = torch.manual_seed(0)  # (it returns a Generator: not worth printing)

# %% [markdown]
# Two small models: a CNN for 32×32 colour images and a transformer encoder that classifies token sequences.

# %%
cnn = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1),
    nn.BatchNorm2d(32),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1),
    nn.BatchNorm2d(64),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Flatten(),
    nn.Linear(64 * 8 * 8, 128),
    nn.ReLU(),
    nn.Linear(128, 10),
)


class TinyEncoder(nn.Module):
    """Token ids (batch, seq) -> class logits: embedding, positions, 2 encoder layers, mean pooling."""

    def __init__(
        self, vocab: int = 1000, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 64, classes: int = 2
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, seq, d))
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens) + self.pos[:, : tokens.shape[1]])
        return self.head(h.mean(dim=1))


encoder = TinyEncoder()
tokens = torch.randint(0, 1000, (16, 64))  # a batch of 16 sequences of 64 tokens

# %% [markdown]
# ## `profile_model`
#
# Latency is timed for each precision on each device (`devices=("cpu", "cuda")` on a GPU machine); memory is
# measured by running one real training step on a copy. The result shows as a report in a notebook.

# %%
from nbtrainer import profile_model

prof = profile_model(cnn, torch.randn(32, 3, 32, 32), precisions=("fp32", "bf16-mixed"), time_budget_s=0.3)
prof

# %% [markdown]
# Every number is also data: `to_pandas()` gives one long table, a row per number in sections `model`, `compute`,
# `latency` and `memory` (and `to_dict()` plain JSON-able data).

# %%
frame = prof.to_pandas()
frame[frame.section.isin(["model", "compute"])].head(12)

# %% [markdown]
# Would a batch of 4,096 fit in 64 MiB for training? If not, `fits()` suggests a micro-batch and the gradient
# accumulation that keeps the effective batch size.

# %%
plan = prof.fits(budget_gb=64 / 1024, batch_size=4096)
print(plan)

# %% [markdown]
# `ProfileCard` is the same report as a widget (the panel's **Profile** button shows it too). Here for the
# encoder, whose inputs are integer token ids:

# %%
from nbtrainer import ProfileCard

enc_prof = profile_model(encoder, tokens, precisions=("fp32", "bf16-mixed"), time_budget_s=0.3)
ProfileCard(enc_prof)

# %% [markdown]
# ## The magics
#
# `%load_ext nbtrainer` adds one line magic, `%nbtrainer`, with subcommands (`%nbtrainer help` lists them).
# `profile` works on any model in the namespace: give an input shape (random floats) or the name of an input
# variable. The profile is kept as `_nbt_profile`.

# %%
# %load_ext nbtrainer

# %%
# %nbtrainer profile cnn --input-shape 32,3,32,32

# %%
# %nbtrainer profile encoder --inputs tokens --precision fp32,bf16-mixed

# %%
_nbt_profile.latency_ms["cpu"]

# %% [markdown]
# `%nbtrainer doctor` checks this environment: torch build, devices and the precisions they really run,
# the notebook packages and their front-end extensions, each problem with a fix.

# %%
# %nbtrainer doctor
