"""What ``nbtrainer.Health()`` at its defaults costs (issues 47, 54): a fit with and without it, interleaved rounds in
one process, each round's ratio paired (with / without, run back to back).

    python bench/health_overhead.py --workloads tiny-sgd tiny medium --rounds 15 --threads 1

Workloads: ``tiny-sgd`` is issue 54's (MLP 64-128-10, SGD, batch 64, 2 epochs of 128 steps: a short run, where a
per-fit cost shows); ``tiny`` and ``medium`` are ``overhead.py``'s models (MLP 32-64-10 and 784-1024-1024-10, Adam,
one epoch of 3,000 and 150 steps), without the progress bar. The labels come from a linear teacher, so the runs
learn: what is measured is the cost of watching a healthy run.

The ratio of each round is taken between the two runs of that round (back to back), so a burst of load on a
shared machine hits both sides of one ratio; the table gives the median ratio and its interquartile range, and the
load average before and after. ``--clock cpu`` times the process's CPU seconds instead of the wall clock (one torch
thread, no loader workers: the training thread's own work), which other processes on a loaded machine disturb
far less than the wall time they take from it.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from typing import Any

import overhead
import torch
from _models import medium_mlp, tiny_mlp
from _rounds import machine_line, spread


def _taught(d: int, batch: int) -> Any:
    """A batch whose labels a linear teacher gives: a task the model learns, so Health watches a healthy run (on
    random labels the loss stays at chance, and Health rightly reports a network that does not learn)."""
    teacher = torch.randn(d, 10, generator=torch.Generator().manual_seed(1))

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch, d)
        return x, (x @ teacher).argmax(1)

    return make


def workload(key: str, scale: float = 1.0) -> overhead.Workload:
    """Issue 54's workloads (see the module docstring), on learnable data."""
    from torch import nn

    if key == "tiny-sgd":
        w = overhead.Workload(
            "tiny MLP 64-128-10, SGD, batch 64, 2 x 128 steps",
            lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
            _taught(64, 64),
            int(128 * scale),
        )
        w.epochs, w.sgd = 2, True  # type: ignore[attr-defined]
        return w
    if key == "tiny":
        return overhead.Workload("tiny MLP 32-64-10, batch 32", tiny_mlp, _taught(32, 32), int(3000 * scale))
    return overhead.Workload("medium MLP 784-1024-1024-10, batch 128", medium_mlp, _taught(784, 128), int(150 * scale))


def _fit(w: overhead.Workload, device: torch.device, health: bool) -> float:
    from nbtrainer import Health, Trainer

    torch.manual_seed(0)
    model = w.make_model()
    sgd = getattr(w, "sgd", False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if sgd else torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), opt, device=device, progress=False, callbacks=[Health()] if health else []
    )
    start = time.perf_counter()
    trainer.fit(w.data, epochs=getattr(w, "epochs", 1))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny-sgd", "tiny", "medium"])
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
    print(f"# clock: {args.clock}; {args.rounds} paired rounds, order alternating")
    print(f"# load average before: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print(
        "| workload | steps | ms/step without | ms/step with Health() | with / without: median [IQR] of paired rounds |"
    )
    print("|---|---:|---:|---:|---|")
    for key in args.workloads:
        w = workload(key, args.scale)
        steps = w.steps * getattr(w, "epochs", 1)
        base, health = (
            _timed(functools.partial(_fit, w, device, False), args.clock),
            _timed(functools.partial(_fit, w, device, True), args.clock),
        )
        base(), health(), base(), health()  # warm-up
        pairs = []
        for r in range(args.rounds):
            if r % 2:
                h, b = health(), base()
            else:
                b, h = base(), health()
            pairs.append((b / steps, h / steps))
        ratios = sorted(h / b for b, h in pairs)
        without = statistics.median(b for b, _ in pairs) * 1e3
        with_ = statistics.median(h for _, h in pairs) * 1e3
        print(
            f"| {w.name} | {steps} | {without:.4f} | {with_:.4f} | {spread(ratios)} |",
            flush=True,
        )
    print(f"# load average after: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def _timed(run, clock: str):
    if clock == "wall":
        return run

    def timed():
        start = time.process_time()
        run()
        return time.process_time() - start

    return timed


if __name__ == "__main__":
    main()
