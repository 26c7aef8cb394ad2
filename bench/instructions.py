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
    python bench/instructions.py --workloads panel-tiny --keep /tmp/cg   # the whole panel (about 13 min)

(``medium`` runs its matrix products under valgrind too, for much longer; RESULTS.md says why it is not counted.)

Workloads: ``tiny-sgd`` (issue 54's Health target 1.03x: MLP 64-128-10, SGD, batch 64, 2 epochs of 128 steps),
``medium`` (issue 54's Health target 1.01x: MLP 784-1024-1024-10, Adam, batch 128, 150 steps) and ``map-tiny``
(issue 55's data map target 1.03x: MLP 32-64-10, SGD, 12,800 in-memory items, batch 32, 3 epochs; ``data_map.py``'s
overhead run) and ``panel-tiny`` (issue 54's panel target 1.05x: ``widget_overhead.py``'s tiny MLP 32-64-10, Adam,
batch 32, 3,000 steps). Consumers: ``health`` (``Health()``), ``map`` (``DataMap()``), ``both`` (the two the panel
adds to the training thread) and ``panel`` (``TrainerWidget(...).start(); wait()``: its training thread, its UI
thread's pushes to real widgets with no page, its start and its end; valgrind runs one thread at a time, and counts
them all).

The panel's own clocks (the UI thread's ``ui_interval``, the charts' and epoch table's budgets) run slower by
valgrind's slowdown of the headless fit, measured first (``--slowdown`` gives it), with the loop's refreshes: then the
panel pushes about as often per step as it does natively, and the table prints the counts under valgrind beside the
native ones. ``--keep DIR`` keeps cachegrind's counts per C function (``cg_annotate``; Python code shows as the
interpreter's own functions: a Python-level profile of the native run says which code).
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
WORKLOADS = ["tiny-sgd", "medium", "map-tiny", "panel-tiny"]
# The loop refreshes (reads the running values and calls on_refresh) every refresh_interval seconds of wall time,
# and a fit under valgrind takes about 50x its time: at the default 0.25 s it would refresh 50x as often per step as
# it does natively, and count the refreshes' work (Health's loss statistics, the data map's reductions) 50x over.
# These fits are shorter than 0.25 s natively, where the loop refreshes at the first step and at each epoch's end:
# so here too.
_REFRESH = 1e6
CONSUMERS = {
    "tiny-sgd": ["health"],
    "medium": ["health"],
    "map-tiny": ["map", "health", "both"],
    "panel-tiny": ["panel"],
}


class Refreshes:
    """Counts the loop's refreshes (a hook called at a refresh only: nothing per step)."""

    def __init__(self) -> None:
        self.n = 0

    def on_refresh(self, trainer: Any, progress: Any) -> None:
        self.n += 1


def _panel(consumer: str, warm: bool, slow: float) -> Callable[[], dict[str, float]]:
    """``panel-tiny``: ``widget_overhead.py``'s tiny MLP (32-64-10, Adam, batch 32, 3,000 ready batches), a headless
    fit (``none``) or ``TrainerWidget(...).start(); wait()`` (``panel``: its training thread with ``Health`` and the
    feed, its UI thread's pushes to real widgets without a page, its start and its end). The panel's clocks run
    ``slow`` times slower, valgrind's own slowdown of this fit: the loop's refreshes, the UI thread's pushes and the
    charts' and epoch table's budgets then fall per step as they do natively (the table prints both counts)."""
    sys.path.insert(0, _HERE)
    from overhead import workloads

    from nbtrainer import Trainer

    w = workloads(0.02 if warm else 1.0)["tiny"]
    model, opt, crit = w.fresh()
    counter = Refreshes()
    refresh = 0.25 * slow  # the Trainer's default refresh_interval, and the panel's default ui_interval
    if consumer == "none":
        trainer = Trainer(model, crit, opt, progress=False, callbacks=[counter], refresh_interval=refresh)

        def fit() -> dict[str, float]:
            start = time.perf_counter()
            trainer.fit(w.data, epochs=1)
            return {"wall": time.perf_counter() - start, "refreshes": counter.n}

        return fit
    import nbtrainer.widgets._pump as pump
    from nbtrainer.widgets import TrainerWidget

    # per second of the panel's clock (bench-only: the budgets are the UI thread's constants)
    pump._POINTS_PER_S, pump._CELLS_PER_S = 8_000 / slow, 2_000 / slow  # type: ignore[attr-defined]
    widget = TrainerWidget(model, crit, opt, w.data, epochs=1, progress=False, callbacks=[counter],
                           refresh_interval=refresh, ui_interval=refresh)  # fmt: skip
    widget.looks.data.wait_check()  # the data check runs at construction, before a person clicks Start

    def run() -> dict[str, float]:
        start = time.perf_counter()
        widget.start()
        history = widget.wait()
        samples = len(history.health.get("grad_norm", {}).get("total", []))
        return {"wall": time.perf_counter() - start, "refreshes": counter.n, "pushes": len(widget.ui_update_times),
                "samples": samples}  # fmt: skip

    return run


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


def _child(workload: str, consumer: str, measured: bool, every: int | None, slow: float) -> None:
    """The two interpreters of a case: both warm up and prepare the measured fit; only the second runs it, and
    prints how many steps ``Health`` sampled in it (and, for the panel, its wall time, refreshes and pushes)."""
    import torch

    torch.set_num_threads(1)
    if workload == "panel-tiny":
        _panel(consumer, warm=True, slow=slow)()
        run = _panel(consumer, warm=False, slow=slow)
        if measured:
            print(" ".join(f"{k} {v}" for k, v in run().items()))
        return
    _prepare(workload, consumer, warm=True, every=every)()
    fit = _prepare(workload, consumer, warm=False, every=every)
    if measured:
        history = fit()
        print(f"samples {len(history.health.get('grad_norm', {}).get('total', []))}")


def _count(
    workload: str,
    consumer: str,
    measured: bool,
    every: int | None,
    slow: float = 1.0,
    *,
    native: bool = False,
    keep: str | None = None,
) -> tuple[int, dict[str, float]]:
    """Instructions of one interpreter running ``_child`` under cachegrind (0 when ``native``: run as is), and
    what its fit printed (Health's samples; the panel's wall time, refreshes and pushes). ``keep``: a folder for
    cachegrind's per-function counts (``cg_annotate``)."""
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", NBTRAINER_DEVICE="cpu")
    child = [workload, consumer, "1" if measured else "0", str(every or 0), repr(slow)]
    out = os.path.join(keep, f"{workload}-{consumer}-{int(measured)}.out") if keep else "/dev/null"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", *child]
    if not native:
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    match = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode != 0 or not (match or native):
        raise RuntimeError(f"{' '.join(cmd[-5:])} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    last = proc.stdout.strip().splitlines()[-1:]  # the measured fit's figures (none from the other interpreter)
    stats = {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+)", last[0])} if last else {}
    return (int(match.group(1).replace(",", "")) if match else 0), stats


def _slowdown(given: float | None) -> tuple[float, dict[str, dict[str, float]]]:
    """valgrind's slowdown of the panel workload's fit (its wall time under valgrind over its time natively), and
    the native runs' figures (median of three: the refreshes, pushes and samples the counted runs should match)."""
    import statistics

    native: dict[str, dict[str, float]] = {}
    for consumer in ("none", "panel"):
        runs = [_count("panel-tiny", consumer, True, None, native=True)[1] for _ in range(3)]
        native[consumer] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    if given:
        return given, native
    _, under = _count("panel-tiny", "none", True, None)
    return under["wall"] / native["none"]["wall"], native


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--consumers", nargs="+", default=None, help="default: each workload's (see the docstring)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs side by side")
    parser.add_argument("--every", type=int, default=None, help="Health(every_n_steps=N): a fixed schedule of samples")
    parser.add_argument("--slowdown", type=float, default=None, help="the panel's clocks' factor (default: measured)")
    parser.add_argument("--keep", default=None, help="a folder for cachegrind's per-function counts (cg_annotate)")
    child = ("WORKLOAD", "CONSUMER", "MEASURED", "EVERY", "SLOW")
    parser.add_argument("--child", nargs=5, metavar=child, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], args.child[2] == "1", int(args.child[3]) or None, float(args.child[4]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind): it counts the instructions")
    sys.path.insert(0, _HERE)
    import torch
    from _rounds import machine_line

    torch.set_num_threads(1)
    print(machine_line(torch.device("cpu")))
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    slow, native = 1.0, {}
    if "panel-tiny" in args.workloads:
        slow, native = _slowdown(args.slowdown)
        print(f"# the panel's clocks slowed {slow:.1f}x (valgrind's slowdown of the headless fit); natively: {native}")
    cases: list[tuple[str, str, bool]] = []
    for w in args.workloads:
        # "none" twice: the second pair is the count's own noise
        for c in ["none", "none", *(args.consumers or CONSUMERS[w])]:
            cases += [(w, c, False), (w, c, True)]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        counts = list(pool.map(lambda c: _count(c[0], c[1], c[2], args.every, slow, keep=args.keep), cases))
    print(f"# {len(cases)} interpreters under valgrind in {time.perf_counter() - start:.0f} s\n")
    schedule = f"every {args.every} steps" if args.every else "paced (the default)"
    print(f"| workload | consumer | instructions of the fit | against none | Health's samples ({schedule}) | "
          "refreshes / pushes (natively) |")  # fmt: skip
    print("|---|---|---:|---:|---:|---|")
    for w in args.workloads:
        fits: dict[str, list[tuple[int, dict[str, float]]]] = {}
        for i, (cw, c, measured) in enumerate(cases):
            if cw == w and measured:
                fits.setdefault(c, []).append((counts[i][0] - counts[i - 1][0], counts[i][1]))
        none = [n for n, _ in fits["none"]]
        base = sum(none) / len(none)
        noise = abs(none[0] - none[1]) / base
        for c, got in fits.items():
            n, st = got[0]
            clocks = ""
            if "refreshes" in st:
                nat = native.get(c, {})
                clocks = f"{st['refreshes']:.0f} ({nat.get('refreshes', 0):.0f})"
                if "pushes" in st:
                    clocks += f" / {st['pushes']:.0f} ({nat.get('pushes', 0):.0f})"
            if c == "none":
                print(f"| {w} | none | {base:,.0f} (two counts {noise * 1e6:.0f} ppm apart) | 1 | | {clocks} |")
            else:
                samples = f"{st.get('samples', 0):.0f}" if c in ("health", "both", "panel") else ""
                if c == "panel":
                    samples += f" ({native.get(c, {}).get('samples', 0):.0f})"
                print(f"| {w} | {c} | {n:,.0f} | {n / base:.4f}x | {samples} | {clocks} |")


if __name__ == "__main__":
    main()
