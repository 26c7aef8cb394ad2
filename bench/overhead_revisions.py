"""bench/overhead.py for two revisions of nbtrainer, alternated in one run: did a refactor change the per-step cost?

Each round runs ``bench/overhead.py --variants hand nbtrainer`` once per revision, in a fresh interpreter whose
``nbtrainer`` is that revision's (a ``git worktree`` of ``--old``, the working tree for ``new``), in alternating
order; the figure compared is each run's nbtrainer / hand-loop ratio (the hand loop in the same process absorbs
the machine's speed at that moment), then the median over rounds per revision and workload.

    python bench/overhead_revisions.py --old d963100 --rounds 4
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _revisions import worktree

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| (?P<workload>[^|]+?) \| nbtrainer \| (?P<ms>[\d.]+) \| (?P<ratio>[\d.]+)x \|$", re.M)


def run(tree: Path, workloads: list[str], inner_rounds: int) -> dict[str, float]:
    """One overhead.py run with ``tree``'s nbtrainer first on the path: {workload: nbtrainer / hand}."""
    cmd = [sys.executable, str(ROOT / "bench" / "overhead.py"), "--variants", "hand", "nbtrainer"]
    cmd += ["--workloads", *workloads, "--rounds", str(inner_rounds), "--threads", "1"]
    env = {"PYTHONPATH": f"{tree}:{tree / 'bench'}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tree, check=True).stdout
    rows = [float(m["ratio"]) for m in ROW.finditer(out)]  # in the order of --workloads
    if len(rows) != len(workloads):
        raise RuntimeError(f"could not read the ratios from:\n{out}")
    return dict(zip(workloads, rows, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the revision to compare with (a commit or branch)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--inner-rounds", type=int, default=5)
    parser.add_argument("--workloads", nargs="+", default=["tiny", "medium"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, worktree(args.old, Path(tmp) / "old") as old:
        ratios: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
        for r in range(args.rounds):
            order = [("old", old), ("new", ROOT)] if r % 2 == 0 else [("new", ROOT), ("old", old)]
            for name, tree in order:
                for workload, ratio in run(tree, args.workloads, args.inner_rounds).items():
                    ratios[name].setdefault(workload, []).append(ratio)
    new_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"old = {args.old}, new = {new_rev.stdout.strip()} (+ working tree); {args.rounds} alternating rounds")
    print("| workload | old: nbtrainer / hand | new: nbtrainer / hand | new / old | each round (old; new) |")
    print("|---|---|---|---|---|")
    for workload in args.workloads:
        o, n = ratios["old"][workload], ratios["new"][workload]
        mo, mn = statistics.median(o), statistics.median(n)
        spread = f"{', '.join(f'{x:.3f}' for x in o)}; {', '.join(f'{x:.3f}' for x in n)}"
        print(f"| {workload} | {mo:.3f}x | {mn:.3f}x | {mn / mo:.3f} | {spread} |")


if __name__ == "__main__":
    main()
