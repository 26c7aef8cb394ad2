"""The memory planner's per-rank rows against the measured per-rank peaks, for tests/plan/test_plan_ranks.py, run as
``torchrun --standalone --nproc_per_node=2 plan_scenario.py STRATEGY OUTDIR``.

Each rank trains two optimizer steps of a small Llama under each row's switches with ``strategy=STRATEGY`` and
measures its own peak of the second step (``measure_step_peak``: the live tensors of this process, DTensor shards by
their local storage); it writes ``OUTDIR/STRATEGY.rank{r}.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plan_common as pc

from nbtrainer import Trainer
from nbtrainer._compare._run_measure import measure_step_peak, stored_batches

RANK = int(os.environ["RANK"])


def main(strategy: str, out: str) -> None:
    torch.set_num_threads(1)
    peaks: list[int] = []
    for switches in pc.ROWS:
        options = dict(switches)
        accum = int(options.pop("grad_accum_steps", 1))
        batches = pc.batches(RANK, accum)

        def make(callbacks: list[Any], options: dict[str, Any] = options, accum: int = accum) -> Trainer:
            return Trainer(
                pc.llama(), None, "adamw", lr=1e-3, grad_accum_steps=accum, callbacks=callbacks, progress=False,
                device="cpu", fast_fetch=False, strategy=strategy, run_store=False, **options,
            )  # fmt: skip

        peak, _, _ = measure_step_peak(make, stored_batches(batches, len(batches)))
        peaks.append(peak)
    with open(os.path.join(out, f"{strategy}.rank{RANK}.json"), "w") as fh:
        json.dump(peaks, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
