"""Inference latency per device and precision: warm-up, synchronised timing, float milliseconds.

CPU iterations are timed with ``time.perf_counter_ns``. CUDA iterations are timed with a pair of
CUDA events each (read after one ``synchronize`` at the end, so timing adds no per-iteration sync);
the warm-up ends with a ``synchronize`` so queued warm-up work is not billed to the first iteration.
Numbers stay floats: rounding to whole milliseconds hides small models.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nbtrainer._data._inputs import call_model
from nbtrainer._setup._precision import autocast, normalize_precision

__all__ = ["latency_stats", "measure_latency"]

_MIN_AUTO, _MAX_AUTO = 10, 300  # iteration bounds when n_iters=None


def latency_stats(samples_ms: list[float], *, batch_size: int) -> dict[str, float | int]:
    """Summary of per-iteration times in ms: median, p90, mean, min, max, std and throughput.

    Example:
        >>> latency_stats([1.0, 2.0, 3.0, 4.0], batch_size=8)["median"]
        2.5
    """
    ordered = sorted(samples_ms)
    n = len(ordered)
    p90 = ordered[0] if n == 1 else statistics.quantiles(ordered, n=10, method="inclusive")[-1]
    median = statistics.median(ordered)
    return {
        "median": float(median),
        "p90": float(p90),
        "mean": float(statistics.fmean(ordered)),
        "min": float(ordered[0]),
        "max": float(ordered[-1]),
        "std": float(statistics.pstdev(ordered)),
        "n_iters": n,
        "batch_size": batch_size,
        "throughput": float(batch_size * 1000.0 / median) if median > 0 else float("inf"),
    }


def _time_cpu(step: Callable[[], Any], n_iters: int | None, time_budget_s: float) -> list[float]:
    samples: list[float] = []
    deadline = time.perf_counter() + time_budget_s
    while True:
        start = time.perf_counter_ns()
        step()
        samples.append((time.perf_counter_ns() - start) / 1e6)
        if n_iters is not None:
            if len(samples) >= n_iters:
                return samples
        elif len(samples) >= _MAX_AUTO or (len(samples) >= _MIN_AUTO and time.perf_counter() > deadline):
            return samples


def _time_cuda(step: Callable[[], Any], n_iters: int | None, time_budget_s: float, device: torch.device) -> list[float]:
    if n_iters is None:  # size the run from one synchronised probe iteration
        probe_start = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        probe_s = max(time.perf_counter() - probe_start, 1e-6)
        n_iters = int(min(_MAX_AUTO, max(_MIN_AUTO, time_budget_s / probe_s)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n_iters)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize(device)
    return [float(start.elapsed_time(end)) for start, end in events]


def measure_latency(
    model: nn.Module,
    inputs: Any,
    *,
    device: torch.device,
    precision: str,
    batch_size: int,
    n_warmup: int = 5,
    n_iters: int | None = None,
    time_budget_s: float = 1.0,
) -> dict[str, float | int]:
    """Time ``model(inputs)`` in eval mode under ``no_grad`` and autocast(``precision``).

    Args:
        model: A private copy already on ``device`` (it is put in eval mode).
        inputs: Example inputs already on ``device``.
        device: Where to run.
        precision: ``"fp32"``, ``"fp16-mixed"`` or ``"bf16-mixed"`` (or an alias).
        batch_size: Samples per call, for throughput.
        n_warmup: Untimed iterations first.
        n_iters: Timed iterations; ``None`` runs as many as fit in ``time_budget_s`` (10 to 300).
        time_budget_s: Time budget for ``n_iters=None``.

    Returns:
        :func:`latency_stats` in ms plus ``"throughput"`` in samples/s.

    Example:
        >>> stats = measure_latency(nn.Linear(4, 2), torch.randn(8, 4), device=torch.device("cpu"),
        ...                         precision="fp32", batch_size=8, n_iters=20)
        >>> stats["n_iters"], stats["median"] > 0
        (20, True)
    """
    precision = normalize_precision(precision)
    model.eval()

    def step() -> Any:
        with torch.no_grad(), autocast(precision, device):
            return call_model(model, inputs)

    for _ in range(max(n_warmup, 0)):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        samples = _time_cuda(step, n_iters, time_budget_s, device)
    else:
        samples = _time_cpu(step, n_iters, time_budget_s)
    return latency_stats(samples, batch_size=batch_size)
