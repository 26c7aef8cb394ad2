"""Shared data and models for the inference tests: scikit-learn's digits (8x8 images, 10 classes) as tensors."""

from __future__ import annotations

import torch
from torch import nn


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_val, y_val): 1,437 / 360 samples, pixels scaled to [0, 1], a fixed split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def batches(x: torch.Tensor, y: torch.Tensor, size: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def mlp(hidden: int, seed: int, *, dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(64, hidden), nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train(model: nn.Module, data: list, epochs: int = 8, lr: float = 3e-3) -> nn.Module:
    """A few epochs of AdamW in a plain loop (the Trainer is what the tests test, not what builds fixtures)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for x, y in data:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    opt.zero_grad(set_to_none=True)
    return model.eval()


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
