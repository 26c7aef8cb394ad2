"""Deliberately broken runs, and what Health's one click does to each (issue 56).

The model of issue 56: an MLP 64-64-10 on scikit-learn's digits (1,400 training images, 397 validation), SGD at
lr=0.5, batch 32, 10 epochs (440 steps); ``Health(every_n_steps=10, on_problem="pause")``. Each fault is run in a
training thread; whenever Health pauses it, the script does what one click on the health card does: the card's
apply button (``Health.apply_advice``, when the report has an action), else its skip button for a skipped
non-finite step (resume), else nothing but resume (no button to click). Then the run trains on. The final
validation accuracy is compared with the same run without the fault (same data order and initialization).

    python bench/health_fixes.py            # the table for bench/RESULTS.md, in about a minute

Faults:

* ``lr x100``: SGD at 50;
* ``lr /1000``: SGD at 5e-4;
* ``NaN layer``: a module that turns a sample far out of range into NaN, and two such samples in the training set
  (``on_nonfinite="skip"``: the step is skipped and Health names the module);
* ``exploding``: no clipping, and batch 40 of each epoch scaled by 100 (a corrupted batch): its gradient is
  hundreds of times the others;
* ``dead at init``: the first layer's weights all negative and its bias -1: every ReLU unit is off from the start.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from nbtrainer import Health, Trainer, start_training_thread

LR = 0.5
EPOCHS = 10


class Fragile(nn.Module):
    """NaN wherever its input is far out of range: a bug that only some samples reach."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x.abs() > 1e3, torch.full_like(x, float("nan")), x)


class Corrupted:
    """The loader with its batch ``batch`` of each epoch scaled by 100 (a corrupted batch: exploding gradients)."""

    def __init__(self, loader: Any, batch: int) -> None:
        self.loader, self.batch = loader, batch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for i, (xb, yb) in enumerate(self.loader):
            yield (xb * 100.0 if i == self.batch else xb), yb


def data() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    y = torch.tensor(y, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    return (x[perm[:1400]], y[perm[:1400]]), (x[perm[1400:]], y[perm[1400:]])


def model(nan_layer: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)]
    if nan_layer:
        layers.insert(0, Fragile())
    return nn.Sequential(*layers)


def run(fault: str, train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    x, y = train[0].clone(), train[1]
    lr, kwargs = LR, {}
    net = model(nan_layer=fault == "NaN layer")
    if fault == "lr x100":
        lr = LR * 100
    elif fault == "lr /1000":
        lr = LR / 1000
    elif fault == "NaN layer":
        x[[100, 900]] = 1e5  # two samples out of range: their batches turn NaN in Fragile
        kwargs["on_nonfinite"] = "skip"
    elif fault == "exploding":
        pass  # the loader below corrupts one batch an epoch
    elif fault == "dead at init":
        first = net[0]
        with torch.no_grad():
            first.weight.copy_(-first.weight.abs())  # type: ignore[operator]
            first.bias.fill_(-1.0)  # type: ignore[operator]
    health = Health(every_n_steps=10, on_problem="pause")
    trainer = Trainer(
        net,
        nn.CrossEntropyLoss(),
        torch.optim.SGD(net.parameters(), lr=lr),
        callbacks=[health],
        progress=False,
        **kwargs,
    )
    loader: Any = DataLoader(
        TensorDataset(x, y), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    if fault == "exploding":
        loader = Corrupted(loader, batch=40)
    thread = start_training_thread(trainer.fit, args=(loader,), kwargs={"epochs": EPOCHS})
    clicks: list[str] = []
    seen = 0
    while thread.is_alive():
        if trainer.status == "paused" and len(health.reports) > seen:
            report = health.last_problem
            seen = len(health.reports)
            if report is not None and report.action:
                clicks.append(f"step {report.step}: {health.apply_advice(trainer, report)}")
            elif report is not None and report.kind == "nonfinite" and report.data.get("skipped"):
                clicks.append(f"step {report.step}: skip the batch and resume")
            else:
                clicks.append(f"step {trainer.global_step}: resume (nothing to apply)")
            trainer.resume()
        time.sleep(0.005)
    thread.join()
    with torch.no_grad():
        accuracy = (net(val[0]).argmax(1) == val[1]).float().mean().item()
    problems = [r for r in health.reports if r.level == "problem"]
    return {
        "fault": fault,
        "first": problems[0] if problems else None,
        "reports": problems,
        "clicks": clicks,
        "fixes": health.fixes,
        "accuracy": accuracy,
        "status": trainer.history.status,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--faults", nargs="+", default=["lr x100", "lr /1000", "NaN layer", "exploding", "dead at init"]
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    train, val = data()
    base = run("none", train, val)
    print(f"# digits MLP 64-64-10, SGD lr={LR}, {EPOCHS} epochs; without a fault: val accuracy {base['accuracy']:.3f}")
    print("| fault | Health reported (first problem) | one click did | fix verdict | val acc | vs no fault |")
    print("|---|---|---|---|---:|---:|")
    for fault in args.faults:
        r = run(fault, train, val)
        first = r["first"]
        said = f"step {first.step}, {first.kind}: {first.message}" if first is not None else "nothing"
        clicks = "; ".join(r["clicks"]) or "-"
        verdicts = ", ".join(
            "worked" if f.get("worked") else "did not work" if f.get("worked") is False else "not judged"
            for f in r["fixes"]
        )
        delta = (r["accuracy"] - base["accuracy"]) * 100
        print(
            f"| {fault} | {said} | {clicks} | {verdicts or '-'} | {r['accuracy']:.3f} | {delta:+.1f} points |",
            flush=True,
        )


if __name__ == "__main__":
    main()
