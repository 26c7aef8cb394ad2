"""A script's first fit, as a user meets it: the whole process (interpreter start, imports, one epoch, exit) of the
same 1-epoch tiny-MLP training written by hand, with nbtrainer and with Lightning.

Each variant is a fresh ``python -c`` process; rounds rotate the order (interleaved) so drift and background load
hit every variant alike, after one warm-up round that fills the page cache. Reported: the median wall time and the
peak resident memory per variant (``os.wait4``'s rusage of that child alone), and ratios to the hand loop.

    python bench/first_fit.py                  # hand, nbtrainer, lightning; 7 rounds
    python bench/first_fit.py --rounds 11 --variants hand nbtrainer
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from _rounds import interleaved, machine_line

COMMON = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 10, (4096,)))
loader = DataLoader(data, batch_size=32, shuffle=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
"""

SCRIPTS = {
    "hand": COMMON
    + """
total = torch.zeros(())
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total += loss.detach()
print(f"epoch 1/1  loss={(total / len(loader)).item():.4f}")
""",
    "nbtrainer": COMMON
    + """
from nbtrainer import Trainer
Trainer(model, nn.CrossEntropyLoss(), optimizer).fit(loader, epochs=1)
""",
    "lightning": COMMON
    + """
import lightning as L
class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = model
    def training_step(self, batch, i):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        self.log("loss", loss, on_epoch=True, prog_bar=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_model_summary=False,
          accelerator="cpu", devices=1).fit(Module(), loader)
""",
}


def run_once(name: str) -> tuple[float, float]:
    """(seconds, peak RSS in MiB) of one fresh process running the variant's script."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPTS[name]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{err[-2000:]}")
    return seconds, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--variants", nargs="+", default=list(SCRIPTS), choices=list(SCRIPTS))
    args = parser.parse_args()
    names = args.variants if "hand" in args.variants else ["hand", *args.variants]
    results = interleaved(run_once, names, args.rounds)
    print(machine_line(torch.device("cpu")) + f"; {args.rounds} interleaved rounds, fresh process each")
    hand_s = statistics.median(s for s, _ in results["hand"])
    hand_mb = statistics.median(m for _, m in results["hand"])
    print("| variant | median s | vs hand | peak RSS MiB | vs hand |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        s = statistics.median(x for x, _ in results[name])
        mb = statistics.median(m for _, m in results[name])
        print(f"| {name} | {s:.2f} | {s / hand_s:.3f}x | {mb:.0f} | {mb - hand_mb:+.0f} |")


if __name__ == "__main__":
    main()
