"""Overhead of the TrainerWidget panel (issue 4): the panel attached with no front end vs the headless Trainer.

Same method and workloads as ``bench/overhead.py`` (interleaved rounds in one process, median time per
step). Variants, registered into ``overhead.VARIANTS`` on import:

* ``headless``: ``Trainer(..., progress=False).fit(...)``, no callbacks at all;
* ``headless-thread``: the same fit in a plain ``threading.Thread`` (what the widget's thread adds alone);
* ``widget``:   ``TrainerWidget(...).start()``: the fit runs in the widget's background thread with the
  panel's feed attached and its UI thread pushing decimated updates to real ipywidgets/bqplot
  objects (no kernel, so comm messages go nowhere; everything up to sending is done). Timed until
  the training thread is done; the end-to-end time to ``wait()`` returning (final UI push and the
  static SVG summary included) is reported too, and so is the CPU time the panel's UI thread used
  while the run was alive, as a share of the run's wall time: on a loaded machine this is the more
  stable figure (it bounds what the panel can take from the training thread through the GIL).

    python bench/widget_overhead.py                 # tiny, medium, cnn; 7 rounds
    python bench/widget_overhead.py --rounds 9 --workloads tiny
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead

END_TO_END: dict[str, list[float]] = {}
UI_CPU: dict[str, list[float]] = {}  # the panel's UI-thread CPU time during the run / the run's wall time


def run_headless(w, device) -> float:
    from nbtrainer import Trainer

    model, opt, crit = w.fresh()
    trainer = Trainer(model, crit, opt, device=device, progress=False)
    start = time.perf_counter()
    trainer.fit(w.data, epochs=1)
    return time.perf_counter() - start


def run_headless_thread(w, device) -> float:
    """The headless fit in a plain background thread: separates the panel's cost from the thread's."""
    import threading

    from nbtrainer import Trainer

    model, opt, crit = w.fresh()
    trainer = Trainer(model, crit, opt, device=device, progress=False)
    start = time.perf_counter()
    th = threading.Thread(target=trainer.fit, args=(w.data,), kwargs={"epochs": 1})
    th.start()
    th.join()
    return time.perf_counter() - start


def run_widget(w, device) -> float:
    from nbtrainer import TrainerWidget

    model, opt, crit = w.fresh()
    widget = TrainerWidget(model, crit, opt, w.data, epochs=1, device=device, progress=False)
    start = time.perf_counter()
    widget.start()
    widget._run.done.wait()  # the training thread has returned from fit
    trained = time.perf_counter() - start
    widget.wait()
    END_TO_END.setdefault(w.name, []).append((time.perf_counter() - start) / w.steps)
    UI_CPU.setdefault(w.name, []).append(widget._pump.cpu_live_s / trained)
    assert widget.status == "finished" and widget.ui_updates >= 1
    return trained


for _mod in {sys.modules.get("__main__"), overhead}:  # also when overhead.py is the script
    if _mod is not None and hasattr(_mod, "VARIANTS"):
        _mod.VARIANTS.update({"headless": run_headless, "headless-thread": run_headless_thread, "widget": run_widget})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "medium", "cnn"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import bqplot
    import ipywidgets

    device = torch.device("cpu")
    print(
        f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, no GPU; torch {torch.__version__}, threads "
        f"{torch.get_num_threads()}, python {platform.python_version()}, ipywidgets {ipywidgets.__version__}, "
        f"bqplot {bqplot.__version__}; {args.rounds} interleaved rounds"
    )
    print(
        "| workload | steps/round | headless ms/step | in a thread | widget ms/step | widget / headless | "
        "widget / thread | end-to-end / headless | UI-thread CPU share |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    all_w = overhead.workloads(args.scale)
    for key in args.workloads:
        w = all_w[key]
        END_TO_END.pop(w.name, None)
        UI_CPU.pop(w.name, None)
        res = overhead.measure(w, ["headless", "headless-thread", "widget"], args.rounds, device)
        base, thr, wid = (statistics.median(res[k]) for k in ("headless", "headless-thread", "widget"))
        e2e = statistics.median(END_TO_END[w.name][1:])  # [0] is the warm-up round
        share = statistics.median(UI_CPU[w.name][1:])
        print(
            f"| {w.name} | {w.steps} | {base * 1e3:.4f} | {thr * 1e3:.4f} | {wid * 1e3:.4f} | {wid / base:.3f}x | "
            f"{wid / thr:.3f}x | {e2e / base:.3f}x | {share:.2%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
