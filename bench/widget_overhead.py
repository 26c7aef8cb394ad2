"""Overhead of the TrainerWidget panel (issues 4, 49, 54): the panel vs the headless Trainer on the main thread.

Same method and workloads as ``bench/overhead.py`` (interleaved rounds in one process, median time per
step), at torch's default intra-op threads (``--threads`` to change them). Variants, registered into
``overhead.VARIANTS`` when this module is imported (``overhead.py`` does not import it):

* ``headless``: ``Trainer(..., progress=False).fit(...)`` on the main thread, no callbacks at all;
* ``headless-thread``: the same fit in a plain ``threading.Thread``: the main thread keeps its idle OpenMP pool, so
  the thread's parallel regions are throttled (what every training thread did before issue 49);
* ``helper-thread``: the same fit in ``nbtrainer.start_training_thread`` (the main thread's idle pool given back);
* ``widget``:   ``TrainerWidget(...).start()``: the fit runs in the widget's background thread with the
  panel's feed attached and its UI thread pushing decimated updates to real ipywidgets/bqplot
  objects (no kernel, so comm messages go nowhere; everything up to sending is done). Timed until
  the training thread is done; the end-to-end time to ``wait()`` returning (final UI push and the
  static SVG summary included) is reported too, and so is the CPU time the panel's UI thread used
  while the run was alive, as a share of the run's wall time: on a loaded machine this is the more
  stable figure (it bounds what the panel can take from the training thread through the GIL).

With ``--kernel`` the panel is measured in a real Jupyter kernel instead: ``w.fit()`` (the cell blocks) and Start
(the cell returns; the kernel's main thread is idle) against a headless fit in the same kernel
(``bench/_kernel_panel.py``). ``--before`` runs either as the code was before issue 49 (the starting thread keeps
its idle OpenMP pool), for the before/after table.

    python bench/widget_overhead.py                 # tiny, medium, cnn; 7 rounds
    python bench/widget_overhead.py --rounds 9 --workloads tiny
    python bench/widget_overhead.py --panel-only --loader   # a shuffled DataLoader: the panel's DataMap records
    python bench/widget_overhead.py --kernel --rounds 5 [--before]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead
from _machine import machine_speed
from _rounds import spread

THREADS: dict[str, int] = {}  # variant -> threads of the process at the end of its last fit
END_TO_END: dict[str, list[float]] = {}
UI_CPU: dict[str, list[float]] = {}  # the panel's UI-thread CPU time during the run / the run's wall time
FIXED: dict[str, list[tuple[float, float]]] = {}  # variant -> (start to first step, last step to idle), seconds
CHECK: dict[str, list[float]] = {}  # workload -> the panel's data check at construction (a helper thread), seconds


class Marks:
    """The times of the first and the last optimizer step, through scheduled deliveries (no call per step)."""

    def __init__(self, last: int) -> None:
        self.last, self.t = last, {}
        self.next_optimizer_step: int | None = 1

    def on_optimizer_step(self, trainer, step, skipped) -> None:
        self.t[step] = time.perf_counter()
        self.next_optimizer_step = self.last if step < self.last else None

    def fixed(self, start: float, idle: float) -> tuple[float, float]:
        return self.t[1] - start, idle - self.t[self.last]


class CountThreads:
    """A callback: the process's threads when the fit ends (the training thread and its OpenMP pool still alive)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def on_fit_end(self, trainer, history) -> None:
        THREADS[self.name] = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1


def run_headless(w, device) -> float:
    from nbtrainer import Trainer

    model, opt, crit = w.fresh()
    marks = Marks(w.steps)
    trainer = Trainer(model, crit, opt, device=device, progress=False, callbacks=[CountThreads("headless"), marks])
    start = time.perf_counter()
    trainer.fit(w.data, epochs=1)
    end = time.perf_counter()
    FIXED.setdefault("headless", []).append(marks.fixed(start, end))
    return end - start


def run_headless_thread(w, device) -> float:
    """The headless fit in a plain background thread: what a thread costs when nothing is done about the pools."""
    import threading

    from nbtrainer import Trainer

    model, opt, crit = w.fresh()
    trainer = Trainer(model, crit, opt, device=device, progress=False, callbacks=[CountThreads("headless-thread")])
    start = time.perf_counter()
    th = threading.Thread(target=trainer.fit, args=(w.data,), kwargs={"epochs": 1})
    th.start()
    th.join()
    return time.perf_counter() - start


def run_helper_thread(w, device) -> float:
    """The headless fit in ``nbtrainer.start_training_thread``: the fix alone, no panel."""
    from nbtrainer import Trainer, start_training_thread

    model, opt, crit = w.fresh()
    trainer = Trainer(model, crit, opt, device=device, progress=False, callbacks=[CountThreads("helper-thread")])
    start = time.perf_counter()
    start_training_thread(trainer.fit, args=(w.data,), kwargs={"epochs": 1}).join()
    return time.perf_counter() - start


def run_widget(w, device) -> float:
    from nbtrainer import TrainerWidget

    model, opt, crit = w.fresh()
    marks = Marks(w.steps)
    built = time.perf_counter()
    widget = TrainerWidget(
        model, crit, opt, w.data, epochs=1, device=device, progress=False, callbacks=[CountThreads("widget"), marks]
    )
    # the data check runs at construction, in a helper thread, so that its lights show before Start: a person
    # clicks Start after it; Start (as here, at once) would wait for it. Its time is its own column.
    widget.looks.data.wait_check()
    CHECK.setdefault(w.name, []).append(time.perf_counter() - built)
    start = time.perf_counter()
    widget.start()
    widget._run.done.wait()  # the training thread has returned from fit
    trained = time.perf_counter() - start
    widget.wait()
    idle = time.perf_counter()
    FIXED.setdefault("widget", []).append(marks.fixed(start, idle))
    END_TO_END.setdefault(w.name, []).append((idle - start) / w.steps)
    UI_CPU.setdefault(w.name, []).append(widget._pump.cpu_live_s / trained)
    assert widget.status == "finished" and widget.ui_updates >= 1
    return trained


overhead.VARIANTS.update(
    {
        "headless": run_headless,
        "headless-thread": run_headless_thread,
        "helper-thread": run_helper_thread,
        "widget": run_widget,
    }
)


def before_issue_49() -> None:
    """Run as before issue 49: a training thread's starter keeps its idle OpenMP pool."""
    import nbtrainer._threads as threads

    threads.release_openmp_pool = lambda: False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "medium", "cnn"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--panel-only", action="store_true", help="only headless and the panel (no plain or helper thread)"
    )
    parser.add_argument("--kernel", action="store_true", help="w.fit() and Start in a real Jupyter kernel")
    parser.add_argument("--before", action="store_true", help="as before issue 49 (the idle pool is kept)")
    parser.add_argument(
        "--loader",
        action="store_true",
        help="the same batches as a shuffled DataLoader: the panel's DataMap records (it cannot tell the items of "
        "a re-iterable of ready batches, so without this the map's cost is not in the figures)",
    )
    args = parser.parse_args(argv)
    if args.kernel:
        import _kernel_panel

        print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; {args.rounds} rounds")
        rows = _kernel_panel.measure(args.workloads, args.rounds, args.scale, args.before)
        _kernel_panel.table(rows, "before issue 49" if args.before else "after")
        print(f"# load average {os.getloadavg()[0]:.1f} at the end")
        return
    if args.before:
        before_issue_49()
    if args.threads:
        torch.set_num_threads(args.threads)
    import bqplot
    import ipywidgets

    device = torch.device("cpu")
    print(
        f"# machine: {machine_speed()}, no GPU; torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, python {platform.python_version()}, ipywidgets {ipywidgets.__version__}, "
        f"bqplot {bqplot.__version__}; {args.rounds} interleaved rounds{'; BEFORE issue 49' if args.before else ''}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| workload | steps/round | headless ms/step | plain thread / headless | start_training_thread / headless | "
        "widget / headless, median [IQR of rounds] | end-to-end / headless [IQR] | UI-thread CPU share | "
        "Start to first step, ms: headless / panel | last step to idle, ms: headless / panel | "
        "threads: headless / plain / helper / widget | the panel's construction with its data check, ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    all_w = overhead.workloads(args.scale)
    if args.loader:
        for w in all_w.values():
            w.data = as_loader(w.data)
    names = ["headless", "widget"] if args.panel_only else ["headless", "headless-thread", "helper-thread", "widget"]
    for key in args.workloads:
        w = all_w[key]
        END_TO_END.pop(w.name, None)
        CHECK.pop(w.name, None)
        UI_CPU.pop(w.name, None)
        FIXED.clear()
        THREADS.clear()
        res = overhead.measure(w, names, args.rounds, device)
        med = {k: statistics.median(v) for k, v in res.items()}
        base = med["headless"]
        # each round's ratio to that round's headless run (the rounds rotate the order: load hits both sides)
        wid = spread([x / h for x, h in zip(res["widget"], res["headless"], strict=True)])
        e2e = spread([x / h for x, h in zip(END_TO_END[w.name][1:], res["headless"], strict=True)])
        share = statistics.median(UI_CPU[w.name][1:])
        first = {k: statistics.median(f for f, _ in FIXED[k][1:]) * 1e3 for k in ("headless", "widget")}
        last = {k: statistics.median(t for _, t in FIXED[k][1:]) * 1e3 for k in ("headless", "widget")}
        thr, helper = (f"{med[k] / base:.3f}x" if k in med else "-" for k in ("headless-thread", "helper-thread"))
        threads = " / ".join(
            str(THREADS.get(k, "-")) for k in ("headless", "headless-thread", "helper-thread", "widget")
        )
        print(
            f"| {w.name} | {w.steps} | {base * 1e3:.4f} | {thr} | {helper} | {wid} | {e2e} | {share:.2%} | "
            f"{first['headless']:.1f} / {first['widget']:.1f} | {last['headless']:.1f} / {last['widget']:.1f} | "
            f"{threads} | {statistics.median(CHECK[w.name][1:]) * 1e3:.0f} |",
            flush=True,
        )
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")


def as_loader(batches: Any) -> Any:
    """The ready batches as one shuffled DataLoader of the same batch size (each item's index known to the loop)."""
    from torch.utils.data import DataLoader, TensorDataset

    xs, ys = zip(*batches, strict=True)
    data = TensorDataset(torch.cat(xs), torch.cat(ys))
    return DataLoader(data, batch_size=len(xs[0]), shuffle=True, generator=torch.Generator().manual_seed(0))


if __name__ == "__main__":
    main()
