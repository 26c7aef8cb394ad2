"""What ``nbtrainer.Health()`` at its defaults costs per step (issue 47): ``overhead.py``'s nbtrainer variant with and
without it, interleaved rounds in one process, each round's ratio paired (with / without, run back to back).

    python bench/health_overhead.py --workloads tiny medium --rounds 15 --threads 1

The ratio of each round is taken between the two runs of that round (back to back), so a burst of load on a
shared machine hits both sides of one ratio; the table gives the median ratio and its interquartile range, and the
load average before and after. ``--clock cpu`` times the process's CPU seconds instead of the wall clock (one torch
thread, no loader workers: the training thread's own work), which other processes on a loaded machine disturb
far less than the wall time they take from it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _rounds import machine_line
from overhead import VARIANTS, workloads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "medium"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(machine_line(device))
    print(f"# clock: {args.clock}")
    print(f"# load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("| workload | ms/step without | ms/step with Health() | with / without: median [IQR] of paired rounds |")
    print("|---|---:|---:|---|")
    for key in args.workloads:
        w = workloads(args.scale)[key]
        base, health = _timed(VARIANTS["nbtrainer"], args.clock), _timed(VARIANTS["health"], args.clock)
        base(w, device), health(w, device)  # warm-up
        pairs = []
        for r in range(args.rounds):
            if r % 2:
                h, b = health(w, device), base(w, device)
            else:
                b, h = base(w, device), health(w, device)
            pairs.append((b / w.steps, h / w.steps))
        ratios = sorted(h / b for b, h in pairs)
        q = statistics.quantiles(ratios, n=4)
        without = statistics.median(b for b, _ in pairs) * 1e3
        with_ = statistics.median(h for _, h in pairs) * 1e3
        print(
            f"| {w.name} | {without:.4f} | {with_:.4f} | **{statistics.median(ratios):.3f}x** "
            f"[{q[0]:.3f}-{q[2]:.3f}] |",
            flush=True,
        )
    print(f"# load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def _timed(variant, clock: str):
    if clock == "wall":
        return variant

    def run(w, device):
        start = time.process_time()
        variant(w, device)
        return time.process_time() - start

    return run


if __name__ == "__main__":
    main()
