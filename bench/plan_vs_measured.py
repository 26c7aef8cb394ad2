"""The memory planner's predicted peak against the measured peak of the same Trainer step, on four model families.

For each family (an MLP, a CNN, a BERT-style encoder and a Llama-style decoder, the last two Hugging Face models
built from small configs) and each row of switches, ``plan_memory(...).predict(**switches)`` gives the predicted
peak, and a Trainer with those switches trains two optimizer steps on a copy of the model while
``nbtrainer._memory._peak.track_peak`` follows every tensor storage; the measured peak is the second (steady-state)
step's
(``nbtrainer._compare._run_measure.measure_step_peak``, the strategy table's measurement). Also: the time to plan an 8B
Llama built on the meta device, and the extra resident memory that took.

    python bench/plan_vs_measured.py              # every family, then the 8B plan
    python bench/plan_vs_measured.py --only mlp llama --skip-8b
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from _rounds import interleaved, kendall_tau, machine_line
from torch import nn

from nbtrainer import Trainer, plan_memory
from nbtrainer._compare._run_measure import measure_step_peak, stored_batches


def _split(batch: Any, parts: int) -> list[Any]:
    if isinstance(batch, dict):
        chunks = {k: v.chunk(parts) for k, v in batch.items()}
        return [{k: c[i] for k, c in chunks.items()} for i in range(parts)]
    return [tuple(t.chunk(parts)[i] for t in batch) for i in range(parts)]


def mlp() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    return model, (torch.randn(256, 784), torch.randint(0, 10, (256,))), nn.CrossEntropyLoss()


def cnn() -> tuple[nn.Module, Any, Any]:
    torch.manual_seed(0)

    def block(c_in: int, c_out: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU())

    model = nn.Sequential(
        block(3, 64),
        nn.Sequential(*[block(64, 64) for _ in range(4)]),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    return model, (torch.randn(32, 3, 64, 64), torch.randint(0, 10, (32,))), nn.CrossEntropyLoss()


def encoder() -> tuple[nn.Module, Any, Any]:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        max_position_embeddings=256, num_labels=4, attn_implementation="sdpa",
    )  # fmt: skip
    model = BertForSequenceClassification(cfg)
    ids = torch.randint(0, 8000, (16, 256))
    return model, {"input_ids": ids, "labels": torch.randint(0, 4, (16,))}, None


def llama() -> tuple[nn.Module, Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=4000, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(0, 4000, (8, 256))
    return model, {"input_ids": ids, "labels": ids.clone()}, None


FAMILIES: dict[str, Callable[[], tuple[nn.Module, Any, Any]]] = {
    "mlp": mlp,
    "cnn": cnn,
    "encoder": encoder,
    "llama": llama,
}

# each family's rows: Trainer switches (the optimizer by name, as the planner names it)
ROWS: dict[str, list[dict[str, Any]]] = {
    "mlp": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adafactor"},
        {"optimizer": "adamw", "optimizer_in_backward": True},
        {"optimizer": "adamw", "grad_accum_steps": 4},
    ],
    "cnn": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adamw", "grad_accum_steps": 2},
    ],
    "encoder": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adamw8bit"},
    ],
    "llama": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed", "activation_checkpointing": True},
        {"optimizer": "adamw", "chunked_loss": True},
        {"optimizer": "adamw", "optimizer_in_backward": True, "activation_checkpointing": True},
        {"optimizer": "adafactor", "grad_accum_steps": 2},
    ],
}


# each family's rows for the step-time check: what the cost model ranks (precision, checkpointing and its shares,
# the optimizer kinds, accumulation), on the CPU
TIME_ROWS: dict[str, list[dict[str, Any]]] = {
    "mlp": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adafactor"},
        {"optimizer": "adamw8bit"},
        {"optimizer": "adamw", "grad_accum_steps": 2},
        {"optimizer": "adamw", "grad_accum_steps": 8},
    ],
    "cnn": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": 0.5},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adamw", "grad_accum_steps": 4},
        {"optimizer": "adafactor"},
    ],
    "encoder": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": 0.5},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adamw", "grad_accum_steps": 4},
        {"optimizer": "adamw8bit"},
    ],
    "llama": [
        {"optimizer": "adamw"},
        {"optimizer": "adamw", "activation_checkpointing": 0.5},
        {"optimizer": "adamw", "activation_checkpointing": True},
        {"optimizer": "adamw", "precision": "bf16-mixed"},
        {"optimizer": "adamw", "precision": "bf16-mixed", "activation_checkpointing": True},
        {"optimizer": "adamw", "chunked_loss": True},
        {"optimizer": "adamw", "grad_accum_steps": 4},
    ],
}


def step_times(
    model: nn.Module, batch: Any, criterion: Any, rows: list[dict[str, Any]], *, steps: int, rounds: int
) -> list[float]:
    """Median seconds per optimizer step of each row: a Trainer per row (a copy of the model, built once), ``steps``
    + 1 optimizer steps per round, timed from one step's end to the next (the fit's own start and end left out),
    rounds alternated across the rows (bench/_rounds.py) so the load spreads alike."""
    trainers, data, clocks = [], [], []
    for switches in rows:
        switches = dict(switches)
        accum = int(switches.pop("grad_accum_steps", 1))
        batches = _split(batch, accum) * (steps + 1) if accum > 1 else [batch] * (steps + 1)
        clock = _StepClock()
        trainer = Trainer(
            copy.deepcopy(model), criterion, lr=1e-4, grad_accum_steps=accum, progress=False, device="cpu",
            seed=0, run_store=False, refresh_interval=3600, callbacks=[clock], **switches,
        )  # fmt: skip
        trainers.append(trainer)
        data.append(batches)
        clocks.append(clock)

    def run(name: str) -> float:
        i = int(name)
        clocks[i].times.clear()
        trainers[i].fit(data[i], epochs=1)
        ticks = clocks[i].times
        return statistics.median(b - a for a, b in itertools.pairwise(ticks))

    times = interleaved(run, [str(i) for i in range(len(rows))], rounds)
    return [statistics.median(times[str(i)]) for i in range(len(rows))]


class _StepClock:
    """The time at the end of each optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        self.times.append(time.perf_counter())


def measure(model: nn.Module, batch: Any, criterion: Any, switches: dict[str, Any]) -> int:
    switches = dict(switches)
    accum = int(switches.pop("grad_accum_steps", 1))
    batches = _split(batch, accum) * 2 if accum > 1 else [batch, batch]

    private = copy.deepcopy(model)  # copied before the measurement: the source model is no part of the step

    def make(callbacks: list[Any]) -> Trainer:
        return Trainer(
            private, criterion, lr=1e-3, grad_accum_steps=accum, callbacks=callbacks, progress=False,
            device="cpu", fast_fetch=False, seed=0, **switches,
        )  # fmt: skip

    peak, _, _ = measure_step_peak(make, stored_batches(batches, len(batches)))
    return peak


def plan_8b() -> tuple[float, float]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    ids = torch.zeros(1, 2048, dtype=torch.long, device="meta")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    plan_memory(model, {"input_ids": ids, "labels": ids}, budget_gb=24, device="cuda")
    seconds = time.perf_counter() - t0
    return seconds, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def step_time_table(args: Any) -> None:
    """Each family's rows timed (median s per optimizer step) against ``time_factor``: Kendall's tau per family and
    over every row (measured time relative to the family's plain fp32 row against the predicted factor)."""
    print("\n| family | switches | predicted time_factor | measured s / step | measured / plain fp32 |")
    print("|---|---|---:|---:|---:|")
    pooled_x: list[float] = []
    pooled_y: list[float] = []
    taus = {}
    for name in args.only:
        model, batch, criterion = FAMILIES[name]()
        plan = plan_memory(model, batch, budget_gb=64, device="cpu", criterion=criterion)
        rows = TIME_ROWS[name]
        predicted = [plan.predict(**switches).time_factor for switches in rows]
        measured = step_times(model, batch, criterion, rows, steps=args.steps, rounds=args.rounds)
        for switches, p, m in zip(rows, predicted, measured, strict=True):
            text = ", ".join(f"{k}={v}" for k, v in switches.items())
            print(f"| {name} | {text} | {p:.3f} | {m:.4f} | {m / measured[0]:.3f} |")
        taus[name] = kendall_tau(predicted, measured)
        pooled_x += predicted
        pooled_y += [m / measured[0] for m in measured]
    print(
        "\nKendall tau of predicted time_factor against measured step time (target >= 0.7): "
        + ", ".join(f"{name} {tau:.2f}" for name, tau in taus.items())
        + f"; every row (measured relative to its family's plain fp32) {kendall_tau(pooled_x, pooled_y):.2f}"
    )
    print(f"load average before / after: {os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--skip-time", action="store_true", help="leave out the step-time check of time_factor")
    ap.add_argument("--skip-memory", action="store_true", help="leave out the predicted / measured peak table")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps per timed round")
    ap.add_argument("--rounds", type=int, default=5, help="alternated rounds per row")
    args = ap.parse_args()
    torch.set_num_threads(2)
    print(machine_line(torch.device("cpu")))
    print("| family | switches | predicted | measured | predicted / measured |")
    print("|---|---|---:|---:|---:|")
    worst = 0.0
    for name in [] if args.skip_memory else args.only:
        model, batch, criterion = FAMILIES[name]()
        plan = plan_memory(model, batch, budget_gb=64, device="cpu", criterion=criterion)
        for switches in ROWS[name]:
            predicted = plan.predict(**switches).peak_bytes
            measured = measure(model, batch, criterion, switches)
            ratio = predicted / measured
            worst = max(worst, abs(ratio - 1))
            text = ", ".join(f"{k}={v}" for k, v in switches.items())
            print(f"| {name} | {text} | {predicted / 2**20:,.1f} MiB | {measured / 2**20:,.1f} MiB | {ratio:.3f} |")
    print(f"\nlargest miss: {worst:.1%}")
    if not args.skip_time:
        step_time_table(args)
    if not args.skip_8b:
        seconds, extra = plan_8b()
        print(f"plan an 8B Llama on meta (batch 1 x 2048, target cuda): {seconds:.1f} s, {extra:.0f} MiB extra RSS")


if __name__ == "__main__":
    main()
