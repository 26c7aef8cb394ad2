"""``Trainer(memory_budget_gb=X)`` on the planner's reference families: what it chose, and its measured peak against X.

For each family of ``bench/plan_vs_measured.py`` and each budget (a share of plain fp32's predicted peak, so that
the plan must switch something on), a Trainer with ``optimizer="auto"`` and ``memory_budget_gb`` trains a few
optimizer steps on copies of the family's batch while ``nbtrainer._memory._peak.PeakTracker`` follows every tensor from
the first batch on (after the plan: planning allocates fake tensors only). Printed: the row applied, any step down,
the measured peak of the whole fit and its ratio to the budget (must stay <= 1).

    python bench/memory_budget.py [--only mlp cnn llama] [--shares 0.5 0.75]
"""

from __future__ import annotations

import argparse
import copy

import torch
from _rounds import machine_line
from plan_vs_measured import FAMILIES

from nbtrainer import Trainer, plan_memory
from nbtrainer._memory._peak import FitPeak


def run(name: str, share: float) -> tuple[str, str, int, int, float]:
    model, batch, criterion = FAMILIES[name]()
    plain = plan_memory(model, batch, budget_gb=1024, device="cpu", criterion=criterion).predict(optimizer="adamw")
    budget = plain.peak_bytes * share
    peak = FitPeak()
    trainer = Trainer(
        copy.deepcopy(model), criterion, "auto", lr=1e-3, memory_budget_gb=budget / 2**30, device="cpu",
        progress=False, run_store=False, callbacks=[peak], seed=0,
    )  # fmt: skip
    try:
        trainer.fit([batch] * 4, epochs=1)
    except ValueError as exc:  # nothing fits: refused before the first step (its message says what would help)
        return name, f"nothing fits: {str(exc).split(': ', 2)[-1][:90]}...", int(budget), 0, 0.0
    assert trainer.memory_plan is not None and trainer.memory_plan.best is not None
    downs = [e for e in trainer.history.events if e["kind"] == "memory_step_down"]
    chosen = trainer.memory_plan.best.describe() + (f" -> {downs[-1]['new']}" if downs else "")
    measured = peak.peak_bytes
    return name, chosen, int(budget), measured, measured / budget


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=["mlp", "cnn", "encoder", "llama"], choices=list(FAMILIES))
    ap.add_argument("--shares", nargs="*", type=float, default=[0.6, 0.8])
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(machine_line(torch.device("cpu")))
    print("| family | budget (share of plain fp32) | row applied | measured peak | measured / budget |")
    print("|---|---|---|---:|---:|")
    worst = 0.0
    for name in args.only:
        for share in args.shares:
            fam, chosen, budget, measured, ratio = run(name, share)
            worst = max(worst, ratio)
            print(
                f"| {fam} | {budget / 2**20:.1f} MiB ({share:.0%}) | {chosen} | {measured / 2**20:.1f} MiB "
                f"| {ratio:.3f} |"
            )
    print(f"\nhighest measured / budget: {worst:.3f} ({'within' if worst <= 1 else 'OVER'} every budget)")


if __name__ == "__main__":
    main()
