"""Which machine a figure comes from, and how fast its cores are: the line every benchmark table and the suite's log
start with.

The project's VMs share a name (2 cores, 24 GB) and not a speed: the same suite took 7 min 16 s on one, 9 min 50 s on
a second and 18 min 14 s on a third, and the same medium MLP's step 8.1 ms on the second and 20.3 ms on the third (no
AVX-512 there). A ratio measured in one process compares across them; a time does not, unless the line beside it
says how fast that machine was. Two readings do: a fixed pure-Python loop of 2 million additions (what the suite's
interpreters, kernels and pytest spend most of their CPU on) and a float32 matmul on one thread (what a model's
step is).

    python bench/_machine.py    # machine: AMD EPYC (AVX2), 2 CPUs; python loop 66 ms; matmul 85 GFLOP/s (1 thread)

Nothing here imports torch until the matmul is asked for (the suite prints the loop alone, before any venv).
"""

from __future__ import annotations

import os
import platform
import time

__all__ = ["cpu_model", "machine_speed", "matmul_gflops", "python_loop_s"]

LOOP = 2 * 10**6  # additions in the loop: 66-78 ms of one core on the VM of 2026-12-01
REPEAT = 15  # a shared VM's core runs 1.5-2x slower for seconds at a time (its neighbours): the best of many


def cpu_model() -> str:
    """The processor's name and its widest vector instructions (what a CPU kernel's speed follows), e.g.
    ``"AMD EPYC (AVX2)"``; the platform's name where ``/proc/cpuinfo`` is missing.

    Example:
        >>> isinstance(cpu_model(), str)
        True
    """
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = " ".join(value.split())
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if name and flags:
                    break
    except OSError:
        return platform.processor() or platform.machine()
    widest = next((label for flag, label in _VECTORS if flag in flags), "")
    return f"{name or platform.machine()}{f' ({widest})' if widest else ''}"


_VECTORS = (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def python_loop_s(n: int = LOOP, repeat: int = REPEAT) -> float:
    """Seconds one core takes for ``n`` additions in a plain Python loop, the best of ``repeat``: on a shared VM the
    same loop read 65-134 ms within one second, so one reading is the moment's, and the best is the core's."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        total = 0
        for i in range(n):
            total += i
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(size: int = 1024, repeat: int = 10) -> float:
    """A float32 ``size`` x ``size`` matmul on one torch thread, in GFLOP/s (the best of ``repeat``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return 2 * size**3 / best / 1e9


def machine_speed(*, matmul: bool = True) -> str:
    """The machine and its two readings, e.g. ``"AMD EPYC (AVX2), 2 CPUs; python loop 66 ms; matmul 85 GFLOP/s
    (1 thread)"``."""
    parts = [f"{cpu_model()}, {os.cpu_count()} CPUs", f"python loop {python_loop_s() * 1e3:.0f} ms"]
    if matmul:
        parts.append(f"matmul {matmul_gflops():.0f} GFLOP/s (1 thread)")
    return "; ".join(parts)


if __name__ == "__main__":
    import sys

    print(f"machine: {machine_speed(matmul='--loop-only' not in sys.argv)}")
