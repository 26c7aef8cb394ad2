"""Smaller and faster after training (issue 24): post-training quantization and distillation on scikit-learn's
digits, CPU.

Part 1, quantization: a 301K-parameter MLP (64-512-512-10) trained with the Trainer, then
``nbtrainer.compare_inference`` over the validation set: fp32, bf16 and the four ``quantize_model`` methods.
Targets (the issue): ``int8-weight`` at most 0.30x of fp32's size on disk and within 1 accuracy point;
``codebook4`` at most 0.20x (codebooks and scales counted) and within 2 points. Size on disk is ``torch.save`` of
the state dict with torchao's tensor subclasses flattened into the tensors they hold (``_inference/_size_latency.py``).

Part 2, distillation: a 9K-parameter student (64-64-64-10) trained alone (cross-entropy) and distilled from the
teacher (``DistillationLoss``, T=4, kd_weight=0.7: common defaults, not tuned on this validation set), with the
same seed (initial weights and data order), epochs, optimizer and data; several seeds; mean, spread and the
paired difference. Run on the full training set and on a small one (where soft targets are said to help most),
there with the default epochs and with 5x more (the 200-sample set gives 4 steps per epoch).

    python bench/inference.py                     # both parts
    python bench/inference.py --seeds 5 --rounds 9 --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _rounds import machine_line

from nbtrainer import DistillationLoss, Trainer, compare_inference, seed_everything


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def mlp(hidden: int, seed: int) -> nn.Module:
    seed_everything(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def accuracy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (out.argmax(-1) == y).float().mean()


def fit(model: nn.Module, criterion: nn.Module, train: tuple, val: tuple, epochs: int, seed: int) -> float:
    trainer = Trainer(
        model,
        criterion,
        torch.optim.AdamW(model.parameters(), lr=3e-3),
        metrics={"acc": accuracy},
        seed=seed,
        progress=False,
    )
    history = trainer.fit(train, val_data=val, epochs=epochs, batch_size=64)
    return float(history.epochs[-1]["val_acc"])


def quantization(args: argparse.Namespace, data: tuple) -> tuple[nn.Module, str]:
    xt, yt, xv, yv = data
    teacher = mlp(512, seed=0)
    start = time.perf_counter()
    acc = fit(teacher, nn.CrossEntropyLoss(), (xt, yt), (xv, yv), args.teacher_epochs, seed=0)
    params = sum(p.numel() for p in teacher.parameters())
    print(f"teacher 64-512-512-10: {params:,} parameters, val acc {acc:.2%} ({time.perf_counter() - start:.0f} s)")
    val = [(xv[i : i + args.batch], yv[i : i + args.batch]) for i in range(0, len(xv), args.batch)]
    start = time.perf_counter()
    table = compare_inference(teacher.eval(), val, rounds=args.rounds)
    print(f"compare_inference: {time.perf_counter() - start:.0f} s")
    print(table)
    lines = [table.to_markdown(), ""]
    for method, size_max, points in (("int8-weight", 0.30, 1.0), ("codebook4", 0.20, 2.0)):
        row = table[method]
        ok = row["status"] == "ok" and row["size_ratio"] <= size_max and abs(row["metric_delta"]) * 100 <= points
        lines.append(
            f"- `{method}`: size {row['size_ratio']:.3f}x of fp32 (target <= {size_max:.2f}x), accuracy "
            f"{row['metric_delta'] * 100:+.2f} points (target within {points:g}): **{'met' if ok else 'NOT met'}**"
        )
    return teacher, "\n".join(lines)


def distillation(args: argparse.Namespace, data: tuple, teacher: nn.Module, n_train: int, epochs: int) -> str:
    xt, yt, xv, yv = data
    train = (xt[:n_train], yt[:n_train])
    alone, distilled = [], []
    start = time.perf_counter()
    for seed in range(args.seeds):
        alone.append(fit(mlp(64, seed + 100), nn.CrossEntropyLoss(), train, (xv, yv), epochs, seed + 100))
        loss = DistillationLoss(teacher, temperature=4.0, kd_weight=0.7)
        distilled.append(fit(mlp(64, seed + 100), loss, train, (xv, yv), epochs, seed + 100))
        print(f"  seed {seed + 100}: alone {alone[-1]:.2%}, distilled {distilled[-1]:.2%}")
    diffs = [(d - a) * 100 for a, d in zip(alone, distilled, strict=True)]

    def summary(values: list[float]) -> str:
        return f"{statistics.mean(values):.2%} ± {statistics.stdev(values):.2%}"

    wins, ties = sum(d > 0 for d in diffs), sum(d == 0 for d in diffs)
    losses = len(diffs) - wins - ties
    text = (
        f"| {n_train} | {epochs} | {summary(alone)} | {summary(distilled)} | "
        f"{statistics.mean(diffs):+.2f} ± {statistics.stdev(diffs):.2f} | {wins} / {ties} / {losses} |"
    )
    print(text, f"({time.perf_counter() - start:.0f} s)")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds of compare_inference")
    parser.add_argument("--batch", type=int, default=60, help="validation batch size (360 samples)")
    parser.add_argument("--teacher-epochs", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=20, help="student epochs (alone and distilled)")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--small", type=int, default=200, help="the small training set's size")
    parser.add_argument("--small-epochs", type=int, default=100, help="epochs on the small set (the same steps)")
    parser.add_argument("--skip-distill", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(torch.device("cpu")))
    print(f"# load average at start: {os.getloadavg()[0]:.2f}")
    data = digits()
    teacher, quant = quantization(args, data)
    print(quant)
    if not args.skip_distill:
        print(f"\nstudent 64-64-64-10: {sum(p.numel() for p in mlp(64, 0).parameters()):,} parameters")
        print("| train samples | epochs | alone | distilled | distilled - alone (points) | better / same / worse |")
        print("|---:|---:|---|---|---|---|")
        for n, epochs in ((len(data[0]), args.epochs), (args.small, args.epochs), (args.small, args.small_epochs)):
            distillation(args, data, teacher, n, epochs)
    print(f"# load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
