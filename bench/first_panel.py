"""A panel's construction in a fresh interpreter, as a user's first cell meets it: ``TrainerWidget(...)`` on a tiny
MLP, no front end, timed alone (torch, ``nbtrainer.widgets`` and torch's first optimizer, which imports
``torch._dynamo`` in any loop, are imported before the clock starts), how many widgets it made (each one a comm the
kernel opens and the front end builds when the panel is displayed), and whether it imported bitsandbytes.

With ``--old REV`` the same is run for that revision too, in alternating order, each round a fresh interpreter per
revision whose ``nbtrainer`` (and ``nbtrainer.widgets``) is that revision's, copied from a ``git worktree``.

    python bench/first_panel.py --rounds 7
    python bench/first_panel.py --old add8bee --rounds 7
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _revisions import worktree

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
sys.path[:0] = [PACKAGES]
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import nbtrainer, nbtrainer.widgets
torch.manual_seed(0)
x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.AdamW(model.parameters())
from nbtrainer import TrainerWidget
import ipywidgets
live = getattr(ipywidgets.Widget, "_active_widgets", None) or ipywidgets.Widget.widgets
before = len(live)
cpu, wall = time.process_time(), time.perf_counter()
w = TrainerWidget(model, nn.CrossEntropyLoss(), optimizer, DataLoader(TensorDataset(x, y), batch_size=16), epochs=1)
print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "widgets": len(live) - before,
                  "bitsandbytes": "bitsandbytes" in sys.modules, "from": nbtrainer.widgets.__file__}))
"""


def packages(tree: Path, dest: Path) -> Path:
    """``tree``'s nbtrainer with its widgets/ where they install (``nbtrainer/widgets``), importable from ``dest``."""
    shutil.copytree(tree / "nbtrainer", dest / "nbtrainer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(tree / "widgets", dest / "nbtrainer" / "widgets", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def construct(where: Path) -> dict:
    code = CHILD.replace("PACKAGES", repr(str(where)))
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(where)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=where, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(out.stderr[-3000:])
    result = json.loads(lines[-1])
    assert result["from"].startswith(str(where)), result["from"]  # that revision's code, not the installed one
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--old", help="a revision to compare with")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": packages(ROOT, Path(tmp) / "new")}
        if args.old:
            with worktree(args.old, Path(tmp) / "worktree") as work:
                trees = {args.old: packages(work, Path(tmp) / "old"), **trees}
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for r in range(args.rounds + 1):  # round 0 warms the page cache and writes the bytecode
            for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
                row = construct(trees[name])
                if r:
                    results[name].append(row)
    print(f"TrainerWidget(...) in a fresh interpreter, {args.rounds} rounds, alternating; medians [min-max]")
    print("| revision | construction, CPU s | wall s | widgets (comms) | imports bitsandbytes |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        cpu = [r["cpu"] for r in rows]
        wall = statistics.median(r["wall"] for r in rows)
        print(f"| {name} | {statistics.median(cpu):.3f} [{min(cpu):.3f}-{max(cpu):.3f}] | {wall:.3f} | "
              f"{rows[0].get('widgets', '?')} | {'yes' if rows[0]['bitsandbytes'] else 'no'} |")  # fmt: skip


if __name__ == "__main__":
    main()
