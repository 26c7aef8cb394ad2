"""What every benchmark table shares: interleaved rounds in one process, and the machine line above it."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def interleaved(run: Callable[[str], T], names: list[str], rounds: int) -> dict[str, list[T]]:
    """``run(name)`` once per name to warm up (allocator, lazy imports, autograd caches), then ``rounds``
    rounds in rotated order, so drift on a shared machine spreads over every variant alike."""
    results: dict[str, list[T]] = {n: [] for n in names}
    for n in names:
        run(n)
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            results[n].append(run(n))
    return results


def machine_line(device: torch.device) -> str:
    """``# machine: ...``: processor, CPUs, device (with the GPU's name), torch, threads and Python."""
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return (
        f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, device={device}{gpu}; "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, python {platform.python_version()}"
    )
