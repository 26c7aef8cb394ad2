"""The data path: a hand-written loop over the standard DataLoader vs nbtrainer on the same loader.

Every variant trains one epoch over the same in-memory tensors, shuffled, with AdamW:

* ``hand``: ``for x, y in DataLoader(TensorDataset(X, y), batch_size, shuffle=True)``: move, forward,
  backward, step, the loss summed on the device and read once (what everyone writes);
* ``nbtrainer``: ``Trainer.fit`` on that same kind of loader (batched fetch; on CUDA device-resident);
* ``arrays``: ``Trainer.fit((X, y), batch_size=..., shuffle=True)``;
* ``per-sample``: ``Trainer(fast_fetch=False)`` on the loader: the loader's own iterator (for reference);
* ``hand-slice``: a hand loop that slices a shuffled index, ``X[idx], y[idx]`` (the floor a hand loop
  can reach; on CUDA with ``X`` already on the GPU).

Method: one process; a warm-up round, then ``--rounds`` rounds, each running every variant once in a rotated
order (interleaved, so drift and background load hit all alike). Reported: the median wall time per epoch,
its ratio to ``hand``'s median, the spread of the per-round ratios (min-max over rounds, each round's
variant time divided by the same round's ``hand`` time), the ratio of the fastest rounds (least disturbed),
and the same medians in process CPU time (on a shared machine the CPU time leaves out the time other
processes held the core; on CUDA it is host time).

    python bench/data_path.py --threads 1                   # CPU, every workload
    python bench/data_path.py --device cuda --rounds 9      # the GPU table
    python bench/data_path.py --threads 1 --fetch-only      # only the batches: us per batch
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
from _models import medium_mlp, small_cnn, tiny_mlp
from _rounds import interleaved, machine_line
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Workload:
    def __init__(self, name: str, make_model: Callable[[], nn.Module], shape: tuple[int, ...], n: int, batch: int):
        self.name, self.make_model, self.batch = name, make_model, batch
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, *shape, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def fresh(self, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = self.make_model().to(device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch, shuffle=True)


def workloads() -> dict[str, Workload]:
    return {
        "tiny32": Workload("tiny MLP 32-64-10, batch 32, 8,192 samples", tiny_mlp, (32,), 8192, 32),
        "tiny256": Workload("tiny MLP 32-64-10, batch 256, 8,192 samples", tiny_mlp, (32,), 8192, 256),
        "medium": Workload("medium MLP 784-1024-1024-10, batch 128, 4,096 samples", medium_mlp, (784,), 4096, 128),
        "cnn": Workload("small CNN 1x28x28, batch 64, 4,096 samples", small_cnn, (1, 28, 28), 4096, 64),
    }


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since ``start``: the process's CPU time does not count the time other processes
    held the core, so on a shared machine it resolves what wall time cannot (torch uses 1 thread here)."""
    return time.perf_counter() - start[0], time.process_time() - start[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_hand(w: Workload, device: torch.device) -> tuple[float, float]:
    model, opt = w.fresh(device)
    crit = nn.CrossEntropyLoss()
    loader = w.loader()
    _sync(device)
    start = _clock()
    running = torch.zeros((), device=device)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.detach()
    running.item()  # the one read at the end of the epoch
    return _since(start)


def run_hand_slice(w: Workload, device: torch.device) -> tuple[float, float]:
    model, opt = w.fresh(device)
    crit = nn.CrossEntropyLoss()
    x_all, y_all = w.x.to(device), w.y.to(device)
    _sync(device)
    start = _clock()
    running = torch.zeros((), device=device)
    perm = torch.randperm(len(x_all), device=device)
    for i in range(0, len(perm), w.batch):
        idx = perm[i : i + w.batch]
        loss = crit(model(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.detach()
    running.item()
    return _since(start)


def _trainer(w: Workload, device: torch.device, **kw):
    from nbtrainer import Trainer

    model, opt = w.fresh(device)
    return Trainer(model, nn.CrossEntropyLoss(), opt, device=device, progress=False, **kw)


def run_nbtrainer(w: Workload, device: torch.device) -> tuple[float, float]:
    trainer, loader = _trainer(w, device), w.loader()
    _sync(device)
    start = _clock()
    trainer.fit(loader, epochs=1)
    return _since(start)


def run_arrays(w: Workload, device: torch.device) -> tuple[float, float]:
    trainer = _trainer(w, device)
    _sync(device)
    start = _clock()
    trainer.fit((w.x, w.y), batch_size=w.batch, shuffle=True, epochs=1)
    return _since(start)


def run_per_sample(w: Workload, device: torch.device) -> tuple[float, float]:
    trainer, loader = _trainer(w, device, fast_fetch=False), w.loader()
    _sync(device)
    start = _clock()
    trainer.fit(loader, epochs=1)
    return _since(start)


VARIANTS: dict[str, Callable[[Workload, torch.device], tuple[float, float]]] = {
    "hand": run_hand,
    "nbtrainer": run_nbtrainer,
    "arrays": run_arrays,
    "per-sample": run_per_sample,
    "hand-slice": run_hand_slice,
}


def fetch_only(rounds: int) -> None:
    """Just the data: one epoch of batches of the tiny workloads' 8,192 x 32 tensors, per batch (the
    fastest of ``rounds`` epochs, process CPU time): the loader's iterator vs the batched fetch vs only
    iterating the batch sampler (the index lists both start from)."""
    from nbtrainer._data._prefetch import DataPath

    print("| batch | DataLoader us / batch | batched fetch us / batch | batch sampler alone us / batch |")
    print("|---:|---:|---:|---:|")
    for key in ("tiny32", "tiny256"):
        w = workloads()[key]
        loader = w.loader()
        path = DataPath(loader, device=torch.device("cpu"), enabled=True, fraction=0.0)
        cells = []
        for source in (loader.__iter__, path.batches, loader.batch_sampler.__iter__):
            best = math.inf
            for _ in range(rounds + 1):
                start = time.process_time()
                for _batch in source():
                    pass
                best = min(best, time.process_time() - start)
            cells.append(f"{best / len(loader) * 1e6:.1f}")
        print(f"| {w.batch} | {' | '.join(cells)} |", flush=True)


def measure(w: Workload, names: list[str], rounds: int, device: torch.device) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds per epoch of each variant, interleaved rounds."""
    return interleaved(lambda n: VARIANTS[n](w, device), names, rounds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--workloads", nargs="+", default=list(workloads()))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--fetch-only", action="store_true", help="time only the batches (no training)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fetch_only:
        fetch_only(args.rounds)
        return
    device = torch.device(args.device)
    names = ["hand", *[v for v in args.variants if v != "hand"]]
    print(f"{machine_line(device)}; {args.rounds} interleaved rounds; load average at start {os.getloadavg()[0]:.2f}")
    print(
        "| workload | variant | wall ms / epoch (median) | wall ratio to hand | per-round wall ratio min-max "
        "| best round ratio | CPU ms / epoch (median) | CPU ratio to hand |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    all_w = workloads()
    for key in args.workloads:
        w = all_w[key]
        res = measure(w, names, args.rounds, device)
        wall_base = statistics.median(t[0] for t in res["hand"])
        cpu_base = statistics.median(t[1] for t in res["hand"])
        for name in names:
            wall = statistics.median(t[0] for t in res[name])
            cpu = statistics.median(t[1] for t in res[name])
            ratios = [t[0] / h[0] for t, h in zip(res[name], res["hand"], strict=True)]
            best = min(t[0] for t in res[name]) / min(t[0] for t in res["hand"])
            print(
                f"| {w.name} | {name} | {wall * 1e3:.1f} | {wall / wall_base:.3f}x | "
                f"{min(ratios):.2f}-{max(ratios):.2f} | {best:.3f}x | {cpu * 1e3:.1f} | {cpu / cpu_base:.3f}x |",
                flush=True,
            )
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
