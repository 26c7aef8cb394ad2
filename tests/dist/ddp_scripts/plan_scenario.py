"""The memory planner's per-rank rows against the measured per-rank peaks, for tests/plan/test_plan_ranks.py, run as
``torchrun --standalone --nproc_per_node=2 plan_scenario.py STRATEGY[,STRATEGY] OUTDIR [budget | both]``.

Each rank trains two optimizer steps of a small Llama under each row's switches with ``strategy=STRATEGY`` and
measures its own peak of the second step (``measure_step_peak``: the live tensors of this process, DTensor shards by
their local storage); it writes ``OUTDIR/STRATEGY.rank{r}.json``. ``budget``: the memory budget's run instead
(``OUTDIR/STRATEGY-budget.rank{r}.json``); ``both``: both in one launch. ``ddp,fsdp``: each strategy in turn, in the
same ranks (the test module shares one launch: each starts two ranks that import torch, transformers and nbtrainer).
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


def budget(strategy: str, out: str) -> None:
    """``Trainer(strategy=STRATEGY, memory_budget_gb=X)``: X between the plan's whole-batch and split-batch rows,
    so every rank must leave the plain row (split the batch or checkpoint blocks, whichever the planner finds
    fastest) and all the same way: a step down is decided on the largest rank's peak."""
    from nbtrainer import plan_memory
    from nbtrainer._memory._peak import FitPeak

    torch.set_num_threads(1)
    plan = plan_memory(pc.llama(), pc.example(), budget_gb=16, device="cpu", world_size=2, strategy=strategy)
    whole, half = (plan.predict(optimizer="adamw", grad_accum_steps=k).peak_bytes for k in (1, 2))
    budget_gb = (whole + half) / 2 / 0.9 / 2**30
    peak = FitPeak()
    trainer = Trainer(
        pc.llama(), None, "adamw", lr=1e-3, device="cpu", progress=False, strategy=strategy, run_store=False,
        memory_budget_gb=budget_gb, callbacks=[peak], precision="fp32",
    )  # fmt: skip
    trainer.fit(pc.batches(RANK, 1)[:1] * 4, epochs=1)  # 2 a rank (the data is sharded)
    best = trainer.memory_plan.best  # type: ignore[union-attr]
    result = {"split": trainer.micro_split, "peak": peak.peak_bytes, "budget": budget_gb * 2**30,
              "row": best.describe() if best else None, "steps": trainer.global_step,
              "plain": plan.predict(optimizer="adamw").describe()}  # fmt: skip
    with open(os.path.join(out, f"{strategy}-budget.rank{RANK}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    what = sys.argv[3] if len(sys.argv) > 3 else "rows"
    for strategy in sys.argv[1].split(","):  # "ddp,fsdp": one after the other in the same ranks (one process group)
        if what in ("rows", "both"):
            main(strategy, sys.argv[2])
        if what in ("budget", "both"):
            budget(strategy, sys.argv[2])
