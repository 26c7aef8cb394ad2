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

Two of the consumers' choices follow the wall clock, which valgrind stretches about 50 times: the loop's refreshes
(every 0.25 s; here only at the first step and at each epoch's end, as in these fits natively, which are shorter
than that) and ``Health``'s paced samples (``--every N`` fixes them; the table says how many were taken).

An instruction count is the work the consumers do: their Python, their reductions, the copies a Health sample makes.
It does not see what the work does to the caches, nor a memory-bound stretch, so it is a lower bound of the time
ratio, and the timed benchmarks (``health_overhead.py``, ``data_map.py``, ``widget_overhead.py``) stay the measure
of time. What it settles is whether the work itself fits the target.

    python bench/instructions.py --workloads tiny-sgd map-tiny --every 50   # RESULTS.md's rows (about 12 min, 2 cores)
    python bench/instructions.py --workloads tiny-sgd --consumers health

(``medium`` runs its matrix products under valgrind too, for much longer; RESULTS.md says why it is not counted.)

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
# The loop refreshes (reads the running values and calls on_refresh) every refresh_interval seconds of wall time,
# and a fit under valgrind takes about 50x its time: at the default 0.25 s it would refresh 50x as often per step as
# it does natively, and count the refreshes' work (Health's loss statistics, the data map's reductions) 50x over.
# These fits are shorter than 0.25 s natively, where the loop refreshes at the first step and at each epoch's end:
# so here too.
_REFRESH = 1e6
CONSUMERS = {"tiny-sgd": ["health"], "medium": ["health"], "map-tiny": ["map", "health", "both"]}


def _prepare(workload: str, consumer: str, warm: bool, every: int | None = None) -> Callable[[], Any]:
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
        callbacks.append(Health(every_n_steps=every))
    if consumer in ("map", "both"):
        callbacks.append(DataMap())
    torch.manual_seed(0)
    if workload == "map-tiny":
        from _models import tiny_mlp

        g = torch.Generator().manual_seed(0)
        n = 320 if warm else 12800
        x, y = torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
        trainer = Trainer(tiny_mlp(), nn.CrossEntropyLoss(), "sgd", lr=0.05, callbacks=callbacks, progress=False,
                          run_store=False, seed=0, refresh_interval=_REFRESH)  # fmt: skip
        return lambda: trainer.fit((x, y), batch_size=32, epochs=1 if warm else 3)
    w = health_workload(workload, scale=0.1 if warm else 1.0)
    model = w.make_model()
    sgd = getattr(w, "sgd", False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05) if sgd else torch.optim.Adam(model.parameters(), lr=1e-3)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        opt,
        progress=False,
        run_store=False,
        callbacks=callbacks,
        refresh_interval=_REFRESH,
    )
    return lambda: trainer.fit(w.data, epochs=1 if warm else getattr(w, "epochs", 1))


def _child(workload: str, consumer: str, measured: bool, every: int | None) -> None:
    """The two interpreters of a case: both warm up and prepare the measured fit; only the second runs it, and
    prints how many steps ``Health`` sampled in it."""
    import torch

    torch.set_num_threads(1)
    _prepare(workload, consumer, warm=True, every=every)()
    fit = _prepare(workload, consumer, warm=False, every=every)
    if measured:
        history = fit()
        print(f"samples {len(history.health.get('grad_norm', {}).get('total', []))}")


def _count(workload: str, consumer: str, measured: bool, every: int | None) -> tuple[int, int]:
    """Instructions of one interpreter running ``_child`` under cachegrind, and the samples Health took."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", NBTRAINER_DEVICE="cpu")
    child = [workload, consumer, "1" if measured else "0", str(every or 0)]
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", sys.executable,
           os.path.abspath(__file__), "--child", *child]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"{' '.join(cmd[-4:])} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    samples = re.search(r"samples (\d+)", proc.stdout)
    return int(match.group(1).replace(",", "")), int(samples.group(1)) if samples else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--consumers", nargs="+", default=None, help="default: each workload's (see the docstring)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs side by side")
    parser.add_argument("--every", type=int, default=None, help="Health(every_n_steps=N): a fixed schedule of samples")
    child = ("WORKLOAD", "CONSUMER", "MEASURED", "EVERY")
    parser.add_argument("--child", nargs=4, metavar=child, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.child[2] == "1", int(args.child[3]) or None)
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
        counts = list(pool.map(lambda case: _count(*case, args.every), cases))
    print(f"# {len(cases)} interpreters under valgrind in {time.perf_counter() - start:.0f} s\n")
    schedule = f"every {args.every} steps" if args.every else "paced (the default)"
    print(f"| workload | consumer | instructions of the fit | against none | Health's samples ({schedule}) |")
    print("|---|---|---:|---:|---:|")
    for w in args.workloads:
        fits: dict[str, list[tuple[int, int]]] = {}
        for i, (cw, c, measured) in enumerate(cases):
            if cw == w and measured:
                fits.setdefault(c, []).append((counts[i][0] - counts[i - 1][0], counts[i][1]))
        none = [n for n, _ in fits["none"]]
        base = sum(none) / len(none)
        noise = abs(none[0] - none[1]) / base
        for c, got in fits.items():
            if c == "none":
                print(f"| {w} | none | {base:,.0f} (two counts {noise * 1e6:.0f} ppm apart) | 1 | |")
            else:
                samples = str(got[0][1]) if c in ("health", "both") else ""
                print(f"| {w} | {c} | {got[0][0]:,.0f} | {got[0][0] / base:.4f}x | {samples} |")


if __name__ == "__main__":
    main()
