"""What watching adds to a fit, counted in instructions instead of seconds (issues 54 and 55).

On the shared 2-core VMs this project runs on, a core's speed moves by a third within minutes (``_machine.py``'s
loop read 58-92 ms in one session), so the timed benchmarks' rounds spread 0.12-0.38 between quartiles: ten times
the 1-5% that issues 54 and 55 ask of ``Health`` and ``DataMap``. The number of instructions a fit executes does not
depend on the machine's load. This counts them with valgrind (``cachegrind --cache-sim=no``: every instruction the
process runs, all its threads), one torch thread, ``PYTHONHASHSEED=0``:

* each case runs in two interpreters: both run a short warm-up fit and then make the measured fit's data, model and
  ``Trainer``; only the second runs that fit. Their difference is the fit's instructions, without the imports, the
  first fit's lazy set-up or the data's making;
* the ratio is that difference with a consumer against the same without one (``none``);
* ``none`` runs twice, and the difference between its two counts is printed as the count's own noise (hash seeds,
  the allocator and the garbage collector make it deterministic up to a few parts per million).

An instruction count is the work the consumers do: their Python, their reductions, the copies a Health sample makes.
It does not see what the work does to the caches, nor a memory-bound stretch, so it is a lower bound of the time
ratio, and the timed benchmarks (``health_overhead.py``, ``data_map.py``, ``widget_overhead.py``) stay the measure
of time. What it settles is whether the work itself fits the target.

    python bench/instructions.py                      # every workload below (about 15 minutes on 2 cores)
    python bench/instructions.py --workloads tiny-sgd --consumers health

Workloads: ``tiny-sgd`` (issue 54's Health target 1.03x: MLP 64-128-10, SGD, batch 64, 2 epochs of 128 steps),
``medium`` (issue 54's Health target 1.01x: MLP 784-1024-1024-10, Adam, batch 128, 150 steps) and ``map-tiny``
(issue 55's data map target 1.03x: MLP 32-64-10, SGD, 12,800 in-memory items, batch 32, 3 epochs; ``data_map.py``'s
overhead run). Consumers: ``health`` (``Health()``), ``map`` (``DataMap()``) and ``both`` (the two the panel adds
to the training thread).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ["tiny-sgd", "medium", "map-tiny"]
CONSUMERS = {"tiny-sgd": ["health"], "medium": ["health"], "map-tiny": ["map", "health", "both"]}


def _prepare(workload: str, consumer: str, warm: bool) -> Callable[[], object]:
    """The data, the model and the ``Trainer`` of one fit of ``workload`` watched by ``consumer`` (``none``,
    ``health``, ``map``, ``both``), and the fit to run: what is counted is the fit alone, as the timed benchmarks
    time it. ``warm`` makes it short (a few steps: the lazy imports and first-fit set-up that the measured fit then
    skips)."""
    import torch
    from torch import nn

    sys.path.insert(0, _HERE)
    from health_overhead import workload as health_workload

    from nbtrainer import DataMap, Health, Trainer

    callbacks: list[Any] = []
    if consumer in ("health", "both"):
        callbacks.append(Health())
    if consumer in ("map", "both"):
        callbacks.append(DataMap())
    torch.manual_seed(0)
    if workload == "map-tiny":
        from _models import tiny_mlp

        g = torch.Generator().manual_seed(0)
        n = 320 if warm else 12800
        x, y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        trainer = Trainer(tiny_mlp(), nn.CrossEntropyLoss(), "sgd", lr=0.05, callbacks=callbacks, progress=False,
                          run_store=False, seed=0)  # fmt: skip
        return lambda: trainer.fit((x, y), batch_size=32, epochs=1 if warm else 3)
    w = health_workload(workload, scale=0.1 if warm else 1.0)
    model = w.make_model()
    sgd = getattr(w, "sgd", False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if sgd else torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(model, nn.CrossEntropyLoss(), opt, progress=False, run_store=False, callbacks=callbacks)
    return lambda: trainer.fit(w.data, epochs=1 if warm else getattr(w, "epochs", 1))


def _child(workload: str, consumer: str, measured: bool) -> None:
    """The two interpreters of a case: both warm up and prepare the measured fit; only the second runs it."""
    import torch

    torch.set_num_threads(1)
    _prepare(workload, consumer, warm=True)()
    fit = _prepare(workload, consumer, warm=False)
    if measured:
        fit()


def _count(workload: str, consumer: str, measured: bool) -> int:
    """Instructions of one interpreter running ``_child`` under cachegrind."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", NBTRAINER_DEVICE="cpu")
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable,
           os.path.abspath(__file__), "--child", workload, consumer, "1" if measured else "0"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd[-4:])} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return int(match.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--consumers", nargs="+", default=None, help="default: each workload's (see the docstring)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs side by side")
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "CONSUMER", "MEASURED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.child[2] == "1")
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind): it counts the instructions")
    sys.path.insert(0, _HERE)
    import torch
    from _rounds import machine_line

    torch.set_num_threads(1)
    print(machine_line(torch.device("cpu")))
    cases: list[tuple[str, str, bool]] = []
    for w in args.workloads:
        # "none" twice: the second pair is the count's own noise
        for c in ["none", "none", *(args.consumers or CONSUMERS[w])]:
            cases += [(w, c, False), (w, c, True)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = list(pool.map(lambda case: _count(*case), cases))
    print(f"# {len(cases)} interpreters under valgrind in {time.perf_counter() - start:.0f} s\n")
    print("| workload | consumer | instructions of the fit | against none | noise (none's two counts) |")
    print("|---|---|---:|---:|---:|")
    for w in args.workloads:
        fits: dict[str, list[int]] = {}
        for i, (cw, c, measured) in enumerate(cases):
            if cw == w and measured:
                fits.setdefault(c, []).append(counts[i] - counts[i - 1])
        none = fits["none"]
        base = sum(none) / len(none)
        noise = abs(none[0] - none[1]) / base
        for c, got in fits.items():
            if c == "none":
                print(f"| {w} | none | {base:,.0f} | 1 | {noise * 1e6:.0f} ppm |")
            else:
                print(f"| {w} | {c} | {got[0]:,.0f} | {got[0] / base:.4f}x | |")


if __name__ == "__main__":
    main()
