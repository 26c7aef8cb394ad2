"""Headless demo: a small CNN on scikit-learn's bundled handwritten digits (8x8, 1,797 images).

Runs in a plain script (nothing from Jupyter is imported), shows console progress bars, prints the
metrics of every epoch and reaches >= 95% validation accuracy in seconds on 2 CPU cores.

    python examples/train_digits.py [--epochs 15] [--precision bf16-mixed] [--accum 2]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import EarlyStopping, Trainer, seed_everything

TARGET = 0.95  # the validation accuracy the demo must reach (exit status 1 below it, with the reason)


def digits_loaders(batch_size: int = 64, seed: int = 0) -> tuple[DataLoader, DataLoader]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(x_tr, y_tr), batch_size=batch_size, shuffle=True, generator=g)
    val = DataLoader(TensorDataset(x_va, y_va), batch_size=256)
    return train, val


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(32 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).float().mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    seed_everything(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    train, val = digits_loaders(seed=args.seed)
    model = small_cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    trainer = Trainer(
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        metrics={"acc": accuracy},
        precision=args.precision,
        grad_accum_steps=args.accum,
        seed=args.seed,
        callbacks=[EarlyStopping("val_acc", patience=5)],
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=trainer.total_steps(train, args.epochs)
    )
    trainer.set_scheduler(scheduler, interval="step")
    start = time.perf_counter()
    history = trainer.fit(train, val, epochs=args.epochs)
    took = time.perf_counter() - start
    best = history.best("val_acc", mode="max")
    ok = best is not None and best["val_acc"] >= TARGET
    if trainer.is_global_zero:  # under torchrun every rank ends with the same status; rank 0 says why
        print(
            f"\n{history.status}: {len(history)} epochs in {took:.1f} s on {trainer.device} ({trainer.precision}); "
            + (
                f"best val_acc={best['val_acc']:.4f} at epoch {best['epoch']}, "
                f"final val_acc={history.last['val_acc']:.4f}"
                if best is not None
                else "no validation accuracy was logged"
            )
        )
        if not ok:
            got = f"best val_acc={best['val_acc']:.4f}" if best is not None else "no val_acc"
            print(
                f"FAILED: {got} is below the target {TARGET} (status {history.status}"
                + (f", {history.stop_reason}" if history.stop_reason else "")
                + "): train longer (--epochs) or check --lr / --precision / --accum.",
                file=sys.stderr,
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
