"""The models the benchmarks share, so every table measures the same workloads (overhead, data path, DDP)."""

from __future__ import annotations

from torch import nn

__all__ = ["medium_mlp", "small_cnn", "tiny_mlp"]


def tiny_mlp() -> nn.Module:
    """32-64-10: per-step Python overhead dominates."""
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def medium_mlp() -> nn.Module:
    """784-1024-1024-10: compute dominates on CPU."""
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def small_cnn() -> nn.Module:
    """Two conv blocks on 1x28x28 inputs."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )
