"""What the panel sends to the browser over a long run: messages and bytes per second, with and without the budgets.

A browser redraws a bqplot mark from scratch for each message; a loaded one falls behind a fast stream and the
status badge queues behind chart data. ``UiPump`` therefore gives the charts a budget of points per second and
the epoch table one of cells per second, and the epoch charts keep a bounded number of epochs. This bench runs
the same ``TrainerWidget`` run (a 3-class MLP, a short sleep per step so epochs come a few per second, "show all"
open in the epoch table) with the budgets as shipped and with them lifted (the baseline: every push redraws the
charts, every epoch of the run is drawn), alternating, in one process, and counts what the widgets send
(``ipywidgets.Widget._send``: state and binary buffers, no kernel attached).

    python bench/panel_traffic.py                  # ui_interval 0.1 and 0.25, 3 rounds each, 12 s windows
    python bench/panel_traffic.py --seconds 20 --rounds 5
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time

import ipywidgets as W
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import TrainerWidget
from nbtrainer.widgets import _chart_parts, _pump

SENT: collections.Counter[str] = collections.Counter()
BYTES: collections.Counter[str] = collections.Counter()
_real_send = W.Widget._send


def _spy(self, msg, buffers=None):  # type: ignore[no-untyped-def]
    kind = type(self).__name__
    SENT[kind] += 1
    BYTES[kind] += len(json.dumps(msg, default=str)) + sum(memoryview(b).nbytes for b in buffers or ())
    return _real_send(self, msg, buffers)


class _Slow:
    def on_optimizer_step(self, trainer, step, skipped):  # type: ignore[no-untyped-def]
        time.sleep(0.01)


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(1) == targets).float().mean()


def one_round(*, budget: bool, interval: float, warmup: float, seconds: float) -> dict[str, float]:
    saved = (_pump._POINTS_PER_S, _pump._CELLS_PER_S, _chart_parts.EPOCH_POINTS, _chart_parts.HOVER_EPOCHS)
    if not budget:  # the baseline: no budgets, every epoch drawn with a hover point each
        _pump._POINTS_PER_S = _pump._CELLS_PER_S = math.inf  # type: ignore[assignment]
        _chart_parts.EPOCH_POINTS = _chart_parts.HOVER_EPOCHS = 10**9
    try:
        torch.manual_seed(0)
        x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        w = TrainerWidget(
            model,
            nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.05),
            DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32),
            DataLoader(TensorDataset(x[192:], y[192:]), batch_size=64),
            metrics={"acc": _accuracy},
            epochs=100_000,
            callbacks=[_Slow()],
            ui_interval=interval,
            progress=False,
        )
        w.start()
        time.sleep(warmup)  # some epochs first: the charts and the table hold a long run's worth
        w.view.epoch_all.value = True
        SENT.clear()
        BYTES.clear()
        n0, t0 = len(w.ui_update_times), time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        out = {
            "pushes/s": (len(w.ui_update_times) - n0) / dt,
            "msgs/s": sum(SENT.values()) / dt,
            "KB/s": sum(BYTES.values()) / dt / 1024,
            "chart KB/s": sum(v for k, v in BYTES.items() if k in ("Lines", "Scatter")) / dt / 1024,
            "epochs": len(w.trainer.history.epochs),
        }
        w.stop()
        w.wait(timeout=60)
        return out
    finally:
        _pump._POINTS_PER_S, _pump._CELLS_PER_S, _chart_parts.EPOCH_POINTS, _chart_parts.HOVER_EPOCHS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", type=float, nargs="+", default=[0.1, 0.25])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds of training before the window")
    ap.add_argument("--seconds", type=float, default=12.0, help="the measured window")
    args = ap.parse_args()
    torch.set_num_threads(1)
    W.Widget._send = _spy  # type: ignore[method-assign]
    keys = ("pushes/s", "msgs/s", "KB/s", "chart KB/s")
    print(f"| ui_interval | variant | epochs at the end | {' | '.join(keys)} |")
    print("|---|---|---:|" + "---:|" * len(keys))
    for interval in args.intervals:
        rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for _ in range(args.rounds):  # alternating: both variants see the same machine
            for budget in (False, True):
                rows[budget].append(
                    one_round(budget=budget, interval=interval, warmup=args.warmup, seconds=args.seconds)
                )
        med = {b: {k: statistics.median(r[k] for r in rs) for k in (*keys, "epochs")} for b, rs in rows.items()}
        for budget, name in ((False, "no budget (before)"), (True, "budgets (shipped)")):
            m = med[budget]
            cells = " | ".join(f"{m[k]:.1f}" for k in keys)
            print(f"| {interval} | {name} | {m['epochs']:.0f} | {cells} |", flush=True)
        msgs, kb = (med[True][k] / med[False][k] for k in ("msgs/s", "KB/s"))
        print(f"| {interval} | shipped / before | | | {msgs:.2f}x | {kb:.2f}x | |")


if __name__ == "__main__":
    main()
