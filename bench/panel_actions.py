"""The panel's LR finder and Profile buttons against the same work on the main thread (issue 49).

Both buttons run their work in a helper thread (the kernel stays free for clicks): the LR range test trains the
model for ``steps`` steps, Profile times training steps. Before issue 49 that thread's OpenMP regions were
throttled by the main thread's idle pool: the sweep took longer and Profile *reported* slower steps than the
model really takes. Interleaved rounds in one process, as ``bench/overhead.py``:

* LR finder: seconds of ``w.lr_find(steps=N)`` called on the main thread vs a click on the panel's button (until
  the sweep's chart is shown);
* Profile: the median training-step latency Profile reports, ``w.profile()`` on the main thread vs a click on the
  panel's Profile button.

    python bench/panel_actions.py [--before] [--rounds 7] [--workloads tiny cnn]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead
from _rounds import interleaved


def _panel(w):
    from nbtrainer import TrainerWidget

    model, opt, crit = w.fresh()
    return TrainerWidget(model, crit, opt, w.data, epochs=1, progress=False)


def _click_and_wait(panel, button, action: str) -> float:
    start = time.perf_counter()
    button.click()  # the handler starts the helper thread and returns
    while action in panel._actions.busy:  # a benchmark may read the panel's state
        time.sleep(0.001)
    return time.perf_counter() - start


def lr_find_main(w, steps: int) -> float:
    panel = _panel(w)
    start = time.perf_counter()
    panel.lr_find(steps=steps)
    return time.perf_counter() - start


def lr_find_click(w, steps: int) -> float:
    panel = _panel(w)
    panel._actions.lr_find = lambda: type(panel._actions).lr_find(panel._actions, steps=steps)
    return _click_and_wait(panel, panel.view.lrfind, "lrfind")


def _step_ms(prof) -> float:
    return float(prof.latency_ms["cpu"]["fp32"]["median"])


def profile_main(w) -> float:
    return _step_ms(_panel(w).profile(precisions=("fp32",)))


def profile_click(w) -> float:
    panel = _panel(w)
    panel._actions.profile = lambda: type(panel._actions).profile(panel._actions, precisions=("fp32",))
    _click_and_wait(panel, panel.view.profile, "profile")
    return _step_ms(panel.view.profile_section.body.children[0].profile)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "cnn"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="LR finder steps")
    parser.add_argument("--before", action="store_true", help="as before issue 49 (the idle pool is kept)")
    args = parser.parse_args(argv)
    if args.before:
        import widget_overhead

        widget_overhead.before_issue_49()
    print(
        f"# {os.cpu_count()} CPUs, torch {torch.__version__}, threads {torch.get_num_threads()}, {args.rounds} "
        f"interleaved rounds{'; BEFORE issue 49' if args.before else ''}; load average {os.getloadavg()[0]:.1f}"
    )
    print("| workload | LR finder on main s | click / main | Profile step ms on main | click / main |")
    print("|---|---:|---:|---:|---:|")
    all_w = overhead.workloads(0.3)
    for key in args.workloads:
        w = all_w[key]
        runs = {
            "lr-main": lambda w=w: lr_find_main(w, min(args.steps, w.steps)),
            "lr-click": lambda w=w: lr_find_click(w, min(args.steps, w.steps)),
            "prof-main": lambda w=w: profile_main(w),
            "prof-click": lambda w=w: profile_click(w),
        }
        res = {
            k: statistics.median(v)
            for k, v in interleaved(lambda n, runs=runs: runs[n](), list(runs), args.rounds).items()
        }
        print(
            f"| {w.name} | {res['lr-main']:.3f} | {res['lr-click'] / res['lr-main']:.3f}x | "
            f"{res['prof-main']:.4f} | {res['prof-click'] / res['prof-main']:.3f}x |",
            flush=True,
        )
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
