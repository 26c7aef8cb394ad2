"""What looking at the model costs (issue 46): Samples and the panel's errors section, and interpret() itself.

1. **Step time.** A tiny CNN on scikit-learn's digits (8x8), in the panel (``TrainerWidget``, no front end: the UI
   thread draws into real widgets) with and without ``Samples`` every epoch (8 fixed images as a strip and their
   predicted classes) and ``interpret=True`` (the validation set interpreted after each validation, the matrix and
   gallery drawn), in alternated rounds in one process; the same headless (``Trainer`` with and without the
   ``Samples``). The steady-state step time is the median time between two optimizer steps inside an epoch (the
   epoch-end work, where sampling and the interpretation happen, is not a step); target: within 3%.
2. **Memory.** ``interpret`` over 20,000 digits-sized items (1x8x8, batch 256): the process's resident memory
   before, at its peak during the pass (sampled every millisecond) and after, against the same for ``evaluate``;
   target: < 10 MiB beyond the model.
3. **Time.** ``interpret`` vs ``evaluate`` over the same loader, alternated rounds; target: <= 1.2x.

    python bench/look_overhead.py [--rounds 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import threading
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import interleaved, machine_line


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0, torch.tensor(y)


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(128, 32), nn.ReLU(),
        nn.Linear(32, 10),
    )  # fmt: skip


class StepClock:
    """Times between consecutive optimizer steps inside an epoch (the first step of an epoch is not timed)."""

    def __init__(self) -> None:
        self.deltas: list[float] = []
        self._last: float | None = None

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self._last = None

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.deltas.append(now - self._last)
        self._last = now


def samples_callback(x: torch.Tensor) -> Any:
    from nbtrainer import Samples

    fixed = x[1400:1408]

    def predictions(model: nn.Module) -> dict[str, Any]:
        strip = fixed[:, 0].permute(1, 0, 2).reshape(8, 64)
        return {"images": strip, "predicted": " ".join(str(int(c)) for c in model(fixed).argmax(1))}

    return Samples(predictions)


def step_time(epochs: int, rounds: int) -> list[str]:
    from nbtrainer import Trainer, TrainerWidget

    x, y = digits()
    val = DataLoader(TensorDataset(x[1400:], y[1400:]), batch_size=128)

    def run(name: str) -> float:
        clock = StepClock()
        train = DataLoader(TensorDataset(x[:1400], y[:1400]), batch_size=32, shuffle=True,
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
        model = tiny_cnn()
        look = name.endswith("+look")
        callbacks: list[Any] = [clock, *([samples_callback(x)] if look else [])]
        options = {"run_store": False, "progress": False, "callbacks": callbacks}
        if name.startswith("panel"):
            w = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.AdamW(model.parameters(), 3e-3), train, val,
                              epochs=epochs, interpret=look, **options)  # fmt: skip
            w.start()
            w.wait()
            assert not look or (w.looks.errors.interpretation is not None and w.looks.samples.steps)
        else:
            Trainer(model, nn.CrossEntropyLoss(), "adamw", lr=3e-3, **options).fit(train, val, epochs=epochs)
        return statistics.median(clock.deltas)

    names = ["panel", "panel+look", "headless", "headless+look"]
    res = interleaved(run, names, rounds)
    med = {n: statistics.median(v) for n, v in res.items()}
    lines = [
        "| variant | steady-state step time (median of rounds' medians) | vs without | rounds' spread |",
        "|---|---|---|---|",
    ]
    for n in names:
        base = med[n.replace("+look", "")]
        spread = (max(res[n]) - min(res[n])) / med[n]
        lines.append(f"| {n} | {med[n] * 1e3:.3f} ms | {med[n] / base:.3f}x | {spread:.0%} |")
    return lines


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """The highest resident memory seen while the block runs (sampled every millisecond by a thread)."""

    def __enter__(self) -> PeakRSS:
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def big_loader(n: int = 20_000) -> DataLoader:
    x, y = digits()
    reps = -(-n // len(x))
    g = torch.Generator().manual_seed(0)
    xs = (x.repeat(reps, 1, 1, 1)[:n] + 0.05 * torch.randn(n, 1, 8, 8, generator=g)).contiguous()
    return DataLoader(TensorDataset(xs, y.repeat(reps)[:n].contiguous()), batch_size=256)


def memory_and_time(rounds: int) -> list[str]:
    from nbtrainer import Trainer

    loader = big_loader()
    trainer = Trainer(tiny_cnn(), nn.CrossEntropyLoss(), progress=False, run_store=False)
    small = DataLoader(loader.dataset, batch_size=256, sampler=range(512))
    trainer.evaluate(small)
    trainer.interpret(small)  # warm: code paths, allocator
    lines = [
        "| pass | RSS before | peak growth | kept after | median time | vs evaluate |",
        "|---|---|---|---|---|---|",
    ]
    growth: dict[str, tuple[int, int, int]] = {}
    for name in ("evaluate", "interpret"):
        gc.collect()
        before = rss()
        with PeakRSS() as peak:
            result = trainer.evaluate(loader) if name == "evaluate" else trainer.interpret(loader)
        after = rss()
        growth[name] = (before, peak.peak - before, after - before)
        del result
    res = interleaved(lambda n: _timed(trainer, loader, n), ["evaluate", "interpret"], rounds)
    t_eval = statistics.median(res["evaluate"])
    for name in ("evaluate", "interpret"):
        before, peak, kept = growth[name]
        t = statistics.median(res[name])
        lines.append(
            f"| {name} | {before / 2**20:.1f} MiB | {peak / 2**20:+.2f} MiB | {kept / 2**20:+.2f} MiB | "
            f"{t * 1e3:.1f} ms | {t / t_eval:.3f}x |"
        )
    return lines


def _timed(trainer: Any, loader: DataLoader, name: str) -> float:
    start = time.perf_counter()
    trainer.evaluate(loader) if name == "evaluate" else trainer.interpret(loader)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=["steps", "interpret"], default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_line(torch.device("cpu")))
    print(f"# load average before: {os.getloadavg()}; {args.rounds} alternated rounds")
    if args.only != "interpret":
        print(f"\n1. Step time: tiny CNN on digits, 1,400 training images, batch 32, {args.epochs} epochs a round\n")
        print("\n".join(step_time(args.epochs, args.rounds)), flush=True)
    if args.only != "steps":
        print("\n2-3. interpret vs evaluate over 20,000 digits-sized items (1x8x8), batch 256\n")
        print("\n".join(memory_and_time(args.rounds)), flush=True)
    print(f"\n# load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
