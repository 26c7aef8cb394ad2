"""What every benchmark table shares: interleaved rounds in one process, and the machine line above it."""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from typing import TypeVar

import torch
from _machine import machine_speed

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


def spread(ratios: list[float]) -> str:
    """Paired ratios as ``**median x** [lower quartile-upper quartile]`` (one round: no spread).

    Example:
        >>> spread([1.0, 1.1, 1.2, 1.3])
        '**1.150x** [1.025-1.275]'
    """
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return f"**{statistics.median(ratios):.3f}x** [{q[0]:.3f}-{q[2]:.3f}]"


def machine_line(device: torch.device) -> str:
    """``# machine: ...``: processor and its speed (``_machine``), device (with the GPU's name), torch, threads and
    Python."""
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    return (
        f"# machine: {machine_speed()}; device={device}{gpu}; "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, python {platform.python_version()}"
    )


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two rankings (ties in either count as neither concordant nor discordant).

    Example:
        >>> kendall_tau([1, 2, 3], [1.0, 2.5, 2.0])
        0.3333333333333333
    """
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = ((concordant + discordant + ties_x) * (concordant + discordant + ties_y)) ** 0.5
    return (concordant - discordant) / denominator if denominator else 0.0
