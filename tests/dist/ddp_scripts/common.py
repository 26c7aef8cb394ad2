"""Data, models and the reference (single-process) setup shared by the DDP scenario scripts and
tests/dist/test_distributed.py. Tiny on purpose: 2 CPU cores, gloo."""

from __future__ import annotations

import torch

D, CLASSES = 8, 3
N_TRAIN, N_VAL = 64, 37  # train divisible by 2 ranks x 8 per device; val uneven on purpose
BATCH = 8  # per device under DDP; the single-process reference uses 2 * BATCH
SAMPLER_SEED = 123


def make_data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=g)
    w = torch.randn(D, CLASSES, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, CLASSES, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def train_set() -> torch.utils.data.TensorDataset:
    return make_data(N_TRAIN, 0)


def val_set() -> torch.utils.data.TensorDataset:
    return make_data(N_VAL, 1)


def make_model(seed: int | None = 0, dropout: float = 0.0) -> torch.nn.Module:
    if seed is not None:
        torch.manual_seed(seed)
    layers = [torch.nn.Linear(D, 16), torch.nn.ReLU()]
    if dropout:
        layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(16, CLASSES))
    return torch.nn.Sequential(*layers)


def acc_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).float().mean()


def metrics() -> dict:
    import torchmetrics

    return {"acc_fn": acc_fn, "acc_tm": torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)}


def ddp_loaders(shuffle: bool = True):
    """What a user writes: plain loaders; the trainer shards them under DDP."""
    train = torch.utils.data.DataLoader(train_set(), batch_size=BATCH, shuffle=shuffle)
    val = torch.utils.data.DataLoader(val_set(), batch_size=5)
    return train, val


def reference_loaders(shuffle: bool = True):
    """One process, twice the per-device batch, the same global order as DDP's sharded one: a
    DistributedSampler of one replica draws the same permutation (seed + epoch), and rank r of 2 takes
    positions r, r+2, ... of it, so each global batch of 2*BATCH holds exactly both ranks' batches."""
    from torch.utils.data.distributed import DistributedSampler

    ds = train_set()
    sampler: DistributedSampler[int] = DistributedSampler(
        ds, num_replicas=1, rank=0, shuffle=shuffle, seed=SAMPLER_SEED
    )
    train = torch.utils.data.DataLoader(ds, batch_size=2 * BATCH, sampler=sampler)
    val = torch.utils.data.DataLoader(val_set(), batch_size=7)
    return train, val


def sgd(model: torch.nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr)  # no momentum: DDP == bigger batch, up to rounding
