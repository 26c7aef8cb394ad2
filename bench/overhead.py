"""Per-step overhead of nbtrainer vs a hand-written loop (and Lightning), measured in one process.

Method: for each workload, every round runs each variant for one epoch of ``steps`` batches in a
rotating order (interleaved, so drift and background load hit all variants alike); the per-step
time of a round is its wall time / steps; we report the median over rounds and its ratio to the
hand-written loop (a). Data is a pre-built in-memory iterable, so what is measured is the loop.

    python bench/overhead.py                      # all workloads, variants: hand, nbtrainer, lightning
    python bench/overhead.py --variants hand nbtrainer --rounds 9 --workloads tiny

Variants register in ``VARIANTS`` (name -> fn(workload, steps) -> seconds). The benchmarks built on this one
(``widget_overhead.py``, ``health_overhead.py``) import it and add theirs; it imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from _models import medium_mlp, small_cnn, tiny_mlp
from _rounds import interleaved, machine_line
from torch import nn


class Batches:
    """A cheap re-iterable of pre-made batches (has len, so it works for every trainer)."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)


class Workload:
    def __init__(self, name: str, make_model: Callable[[], nn.Module], make_batch: Callable[[], tuple], steps: int):
        self.name, self.make_model, self.steps = name, make_model, steps
        torch.manual_seed(0)
        self.data = Batches([make_batch() for _ in range(steps)])

    def fresh(self):
        torch.manual_seed(0)
        model = self.make_model()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), nn.CrossEntropyLoss()


def workloads(scale: float = 1.0) -> dict[str, Workload]:
    return {
        "tiny": Workload(
            "tiny MLP 32-64-10, batch 32",
            tiny_mlp,
            lambda: (torch.randn(32, 32), torch.randint(0, 10, (32,))),
            int(3000 * scale),
        ),
        "medium": Workload(
            "medium MLP 784-1024-1024-10, batch 128",
            medium_mlp,
            lambda: (torch.randn(128, 784), torch.randint(0, 10, (128,))),
            int(150 * scale),
        ),
        "cnn": Workload(
            "small CNN 1x28x28, batch 64",
            small_cnn,
            lambda: (torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))),
            int(150 * scale),
        ),
    }


# -- variants ------------------------------------------------------------------------------------
def run_hand(w: Workload, device: torch.device) -> float:
    model, opt, crit = w.fresh()
    model.to(device).train()
    start = time.perf_counter()
    running = torch.zeros((), device=device)
    for x, y in w.data:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = crit(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running += loss.detach()
    running.item()  # the one read at the end of the epoch
    return time.perf_counter() - start


def run_nbtrainer(w: Workload, device: torch.device) -> float:
    from nbtrainer import ProgressBar, Trainer

    model, opt, crit = w.fresh()
    with open(os.devnull, "w") as sink:
        trainer = Trainer(
            model, crit, opt, device=device, progress=False, callbacks=[ProgressBar(file=sink, mode="bars")]
        )
        start = time.perf_counter()
        trainer.fit(w.data, epochs=1)
        return time.perf_counter() - start


def run_nbtrainer_health(w: Workload, device: torch.device) -> float:
    """``run_nbtrainer`` with ``nbtrainer.Health()`` at its defaults (issue 47)."""
    from nbtrainer import Health, ProgressBar, Trainer

    model, opt, crit = w.fresh()
    with open(os.devnull, "w") as sink:
        trainer = Trainer(
            model, crit, opt, device=device, progress=False, callbacks=[ProgressBar(file=sink, mode="bars"), Health()]
        )
        start = time.perf_counter()
        trainer.fit(w.data, epochs=1)
        return time.perf_counter() - start


def run_lightning(w: Workload, device: torch.device) -> float:
    import lightning as L

    model, _opt, crit = w.fresh()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, _):
            x, y = batch
            return crit(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.net.parameters(), lr=1e-3)

    with (
        warnings.catch_warnings(),
        contextlib.redirect_stderr(io.StringIO()),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            max_epochs=1,
            accelerator="gpu" if device.type == "cuda" else "cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=True,
            num_sanity_val_steps=0,
        )
        module = Module()
        start = time.perf_counter()
        trainer.fit(module, train_dataloaders=w.data)
        return time.perf_counter() - start


VARIANTS: dict[str, Callable[[Workload, torch.device], float]] = {
    "hand": run_hand,
    "nbtrainer": run_nbtrainer,
    "health": run_nbtrainer_health,
    "lightning": run_lightning,
}


def measure(w: Workload, names: list[str], rounds: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per step of each variant, interleaved rounds."""
    return interleaved(lambda n: VARIANTS[n](w, device) / w.steps, names, rounds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["hand", "nbtrainer", "lightning"])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "medium", "cnn"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply steps per round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    missing = [v for v in args.variants if v not in VARIANTS]
    if missing:
        raise SystemExit(f"unknown variants {missing}; known: {sorted(VARIANTS)}")
    print(machine_line(device))
    try:
        import lightning

        print(f"# lightning {lightning.__version__}")
    except ImportError:
        pass
    all_w = workloads(args.scale)
    print("| workload | variant | median ms/step | ratio to hand |")
    print("|---|---|---|---|")
    for key in args.workloads:
        w = all_w[key]
        res = measure(w, args.variants, args.rounds, device)
        base = statistics.median(res["hand"]) if "hand" in res else None
        for name in args.variants:
            med = statistics.median(res[name])
            ratio = f"{med / base:.3f}x" if base else "-"
            print(f"| {w.name} | {name} | {med * 1e3:.4f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
