"""Data, models and the reference (single-process) setup shared by the DDP scenario scripts and
tests/dist/test_distributed.py. Tiny on purpose: 2 CPU cores, gloo."""

from __future__ import annotations

from typing import Any

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


def tiny_val() -> torch.utils.data.DataLoader:
    """A validation set of one item: fewer than the ranks, so rank 1's share of it is empty."""
    x, y = val_set()[:1]
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=5)


def sgd(model: torch.nn.Module, lr: float = 0.1) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr)  # no momentum: DDP == bigger batch, up to rounding


def manual_optimizers(model: torch.nn.Module) -> dict[str, torch.optim.Optimizer]:
    """Two named optimizers over make_model's first and last Linear layers, for the manual training_step below."""
    layers = list(model.children())
    return {
        "body": torch.optim.SGD(layers[0].parameters(), lr=0.1),
        "head": torch.optim.SGD(layers[-1].parameters(), lr=0.1),
    }


def manual_step(step, batch):
    """A GAN-shaped training_step: the head's loss reaches only the head (a partial backward), it steps, then a
    second forward with the stepped head trains the body alone."""
    x, y = batch
    head_loss = torch.nn.functional.cross_entropy(step.model(x), y)
    step.backward(head_loss, optimizer="head")
    step.step("head")
    body_loss = torch.nn.functional.cross_entropy(step.model(x), y)
    step.backward(body_loss, optimizer="body")
    step.step("body")
    return {"loss": head_loss, "body_loss": body_loss}


def manual_validation_step(model, batch):
    x, y = batch
    return {"loss": torch.nn.functional.cross_entropy(model(x), y)}


def manual_trainer(**kwargs):
    """The manual-optimization Trainer of the DDP scenario and of its single-process reference (``strategy=`` apart)."""
    from nbtrainer import Trainer

    model = make_model(0)
    return Trainer(
        model,
        None,
        manual_optimizers(model),
        training_step=manual_step,
        validation_step=manual_validation_step,
        seed=SAMPLER_SEED,
        progress=False,
        grad_accum_steps=2,
        **kwargs,
    )


def nan_data() -> torch.utils.data.TensorDataset:
    """32 samples, one NaN input: index 5, in rank 1's first batch of 4 (unshuffled shards: rank r takes r, r+2...)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 4, generator=g), torch.randint(0, 2, (32,), generator=g)
    x[5] = float("nan")
    return torch.utils.data.TensorDataset(x, y)


def nan_trainer(mode: str, callbacks=()) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    from nbtrainer import Trainer

    return Trainer(
        model, torch.nn.CrossEntropyLoss(), opt, progress=False, on_nonfinite=mode, callbacks=list(callbacks)
    )
