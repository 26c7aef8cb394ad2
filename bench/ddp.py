"""DDP scaling: time per epoch of the same Trainer on 1 process vs N processes (issue 8).

Every configuration runs in fresh processes started by ``nbtrainer.launch`` (so the timings include
what a user gets: DistributedSampler sharding, DDP's gradient all-reduce, the epoch-end reductions);
rounds are interleaved so background load hits every configuration alike. The global batch is the
same everywhere (N processes get ``batch / N`` each), so every configuration does the same work per
epoch. Time per epoch = median over the epochs after the first (warm-up), rank 0's clock (ranks run
in lock step).

    python bench/ddp.py                          # CPU, gloo: 1 proc x 2 threads, 1 x 1, 2 procs x 1 thread
    python bench/ddp.py --quick                  # fewer rounds / smaller data
    python bench/ddp.py --device cuda            # GPU: single device, DDP world size 1 (NCCL smoke), and
                                                 #      DDP on every visible GPU when there are more than one
    python bench/ddp.py --strategy fsdp          # CPU: 1 process vs 2 processes with DDP and with FSDP2
                                                 #      (AdamW), plus the bytes each rank holds (issue 23)

With ``--strategy fsdp`` every configuration trains with AdamW (so there is optimizer state to shard) and
reports, per rank, the bytes of parameters and optimizer state it holds (local shards under FSDP, measured
on the tensors after the fit) and its peak resident memory (``ru_maxrss``, which includes torch itself).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time

import torch
from _models import small_cnn
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import nbtrainer
from nbtrainer import Trainer


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    if name == "cnn":
        return small_cnn()
    raise ValueError(name)


def dataset(n: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 28, 28, generator=g)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 10, (n,), generator=g))


def _held_bytes(trainer: Trainer) -> tuple[int, int]:
    """(parameter bytes, optimizer-state bytes) this rank holds: local shards of DTensors, else whole tensors."""

    def local(t: torch.Tensor) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    assert trainer.optimizer is not None
    params = sum(local(p) for p in trainer.model.parameters())
    state = sum(local(v) for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step")
    return params, state


def worker(model_name: str, samples: int, global_batch: int, epochs: int, device: str, strategy: str) -> dict:
    """One configuration, on every rank of a launch; rank 0's numbers are reported."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = make_model(model_name)
    loader = torch.utils.data.DataLoader(dataset(samples), batch_size=global_batch // world, shuffle=True)
    adamw = strategy.endswith("+adamw")
    strategy = strategy.removesuffix("+adamw")
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=1e-3)
        if adamw
        else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    )
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        progress=False,
        seed=0,
        device=device,
        strategy=strategy,
        timing_every=0,
    )
    t0 = time.perf_counter()
    history = trainer.fit(loader, epochs=epochs)
    wall = time.perf_counter() - t0
    times = [e["time"] for e in history.epochs]
    params, state = _held_bytes(trainer)
    return {
        "param_bytes": params,
        "optim_bytes": state,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": trainer.global_step,
        "rank": trainer.strategy.rank,
        "world": trainer.strategy.world_size,
        "strategy": type(trainer.strategy).__name__,
        "backend": getattr(trainer.strategy, "backend", None),
        "device": str(trainer.device),
        "epoch_times": times,
        "wall": wall,
        "threads": torch.get_num_threads(),
        "loss": history.epochs[-1]["loss"],
        "batches_per_rank": trainer.progress.batches,
    }


def configs(device: str, strategy: str = "ddp") -> list[dict]:
    if strategy == "fsdp":  # CPU: the same AdamW run on 1 process, 2 with DDP, 2 with FSDP2
        return [
            {"name": "1 proc x 1 thread", "nprocs": 1, "threads": 1, "strategy": "single+adamw"},
            {"name": "2 procs x 1 thread, DDP", "nprocs": 2, "threads": 1, "strategy": "ddp+adamw"},
            {"name": "2 procs x 1 thread, FSDP2", "nprocs": 2, "threads": 1, "strategy": "fsdp+adamw"},
        ]
    if device == "cpu":
        cores = os.cpu_count() or 2
        return [
            {"name": "1 proc x 1 thread", "nprocs": 1, "threads": 1, "strategy": "auto"},
            {"name": f"1 proc x {cores} threads", "nprocs": 1, "threads": cores, "strategy": "auto"},
            {"name": f"{cores} procs x 1 thread (DDP gloo)", "nprocs": cores, "threads": 1, "strategy": "auto"},
        ]
    gpus = torch.cuda.device_count()  # does not initialise CUDA (launch forks)
    out = [
        {"name": "1 GPU, single device", "nprocs": 1, "threads": None, "strategy": "single"},
        {"name": "1 GPU, DDP world size 1 (NCCL)", "nprocs": 1, "threads": None, "strategy": "ddp"},
    ]
    if gpus > 1:
        out.append({"name": f"{gpus} GPUs, DDP (NCCL)", "nprocs": gpus, "threads": None, "strategy": "auto"})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=128, help="global batch (split over the processes)")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"], help="fsdp: 1 vs 2 procs, DDP vs FSDP2")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=None, help="write the raw results here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.epochs, args.samples = 1, 3, 4096
    if args.device == "cuda" and args.samples == 8192:
        args.samples = 65536
    results: dict = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "device": args.device,
            "loadavg_start": os.getloadavg(),
            "gpus": torch.cuda.device_count() if args.device == "cuda" else 0,
        },
        "args": vars(args),
        "runs": {},
    }
    cfgs = configs(args.device, args.strategy)
    for model_name in args.models:
        per_cfg: dict[str, list[float]] = {c["name"]: [] for c in cfgs}
        info: dict[str, dict] = {}
        for rnd in range(args.rounds):
            order = cfgs[rnd % len(cfgs) :] + cfgs[: rnd % len(cfgs)]  # rotate: drift hits all alike
            for cfg in order:
                out = nbtrainer.launch(
                    worker,
                    model_name,
                    args.samples,
                    args.batch,
                    args.epochs,
                    args.device,
                    cfg["strategy"],
                    nprocs=cfg["nprocs"],
                    threads_per_process=cfg["threads"],
                )
                r0 = out[0]
                per_cfg[cfg["name"]].append(statistics.median(r0["epoch_times"][1:]))
                keys = ("world", "strategy", "backend", "device", "threads", "batches_per_rank", "loss", "steps")
                info[cfg["name"]] = {k: r0[k] for k in keys}
                info[cfg["name"]]["memory"] = [
                    {k: r[k] for k in ("param_bytes", "optim_bytes", "max_rss_mb")} for r in out
                ]
                print(
                    f"[{model_name}] round {rnd + 1} {cfg['name']:<34} "
                    f"{per_cfg[cfg['name']][-1] * 1e3:8.1f} ms/epoch  ({r0['strategy']}, world {r0['world']})",
                    flush=True,
                )
        base = statistics.median(per_cfg[cfgs[0]["name"]])
        rows = {}
        for cfg in cfgs:
            vals = per_cfg[cfg["name"]]
            med = statistics.median(vals)
            rows[cfg["name"]] = {
                "ms_per_epoch": med * 1e3,
                "min_ms": min(vals) * 1e3,
                "max_ms": max(vals) * 1e3,
                "samples_per_s": args.samples / med,
                "vs_first": med / base,
                **info[cfg["name"]],
            }
        results["runs"][model_name] = rows
    results["machine"]["loadavg_end"] = os.getloadavg()
    print(
        f"\nload average (1/5/15 min) at start {results['machine']['loadavg_start']}, "
        f"at end {results['machine']['loadavg_end']}"
    )
    print("| model | configuration | ms / epoch (median) | range | samples/s | vs first row |")
    print("|---|---|---:|---:|---:|---:|")  # "vs first row": time ratio to the first configuration
    for model_name, rows in results["runs"].items():
        for name, row in rows.items():
            print(
                f"| {model_name} | {name} | {row['ms_per_epoch']:.0f} | {row['min_ms']:.0f}-{row['max_ms']:.0f} | "
                f"{row['samples_per_s']:,.0f} | {row['vs_first']:.2f}x |"
            )
    if args.strategy == "fsdp":
        print("\n| model | configuration | ms / step | vs first row | params + optimizer state per rank (KiB) |")
        print("|---|---|---:|---:|---|")
        for model_name, rows in results["runs"].items():
            for name, row in rows.items():
                per_rank = ", ".join(
                    f"{(m['param_bytes'] + m['optim_bytes']) / 1024:,.0f} (peak RSS {m['max_rss_mb']:,.0f} MiB)"
                    for m in row["memory"]
                )
                ms_step = row["ms_per_epoch"] / (row["steps"] / args.epochs)
                print(f"| {model_name} | {name} | {ms_step:.2f} | {row['vs_first']:.2f}x | {per_rank} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
