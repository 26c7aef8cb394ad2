"""GPU truth in one prepared command (issue 37): eight checks of nbtrainer on a CUDA device, each a subprocess with
its own wall-clock budget, written as one dated section at the end of ``bench/RESULTS.md``.

    bash scripts/gpu-check.sh                    # a CUDA machine: every step, 9 minutes at most; exit 2 without CUDA
    bash scripts/gpu-check.sh --only 2,6         # a subset
    bash scripts/gpu-check.sh --dry-run          # no GPU needed: the same steps on the CPU at tiny sizes, into a
                                                 # temp file (``--out PATH`` to choose), never bench/RESULTS.md

The steps (``STEPS``, with each one's budget on the GPU and in the dry run):

1. ``pytest -m gpu`` on the files that mark tests ``gpu`` (in the dry run CUDA is hidden: they run their skips).
2. Overhead against a hand-written AMP loop, bf16-mixed and fp16-mixed (``torch.amp.GradScaler``), on a small CNN
   and a ~100M-parameter decoder: nbtrainer time / hand-loop time and steps/s, interleaved rounds in one process
   (``bench/_rounds.py``).
3. Host syncs per step in the steady state, under ``torch.cuda.set_sync_debug_mode("warn")``: (syncs of a long fit
   - syncs of a short fit) / extra steps, target 0. On a CPU nothing syncs; the dry run counts the tensor reads
   that would (``tests/loop/test_sync_budget.py``'s method).
4. ``bench/strategies.py`` (fp32, fp16, accumulation, checkpointing, Adafactor, all together) beside the seed's
   published figures.
5. The memory planner's predicted peak against the measured one for 10 of its rows, on a ~100M-parameter Llama
   (skipped while ``nbtrainer.plan_memory`` does not exist).
6. ``compile=True`` against eager: the first epoch (compilation included) and the steady-state step, apart.
7. DDP and FSDP2 as a world of one under ``torchrun`` (NCCL; gloo in the dry run).
8. ``bench/crash_soak.py``: SIGKILL-and-resume cycles checked bit-exact.
9. The panel: a ``TrainerWidget`` with no front end (its training and UI threads, real ipywidgets and bqplot objects,
   no browser) through a 2-epoch fit against the plain ``Trainer``'s, interleaved rounds; target within 3%.

How it runs: this process (the orchestrator) imports torch but never initialises CUDA (``is_available`` counts the
devices without creating a context): a context here would hold device memory through every step. Each step is a
fresh process in its own session, killed with its children when its budget is spent (SIGTERM first, so that
``torchrun`` takes its workers down), and the run's total stays under ``TOTAL_BUDGET_S`` whatever the steps take.
A step's output goes to a log file; the section keeps what it measured, or the last lines of the log when it failed.
The steps measured here are subcommands of this file (``python bench/gpu_check.py measure NAME --device D --report
FILE [--tiny]``): each writes its markdown to ``--report``, and exit status 77 means skipped (its first line says
why). The sizes of both modes are in ``GPU`` and ``TINY``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from _models import small_cnn
from _rounds import interleaved, kendall_tau, machine_line
from overhead import Batches
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "RESULTS.md"
SKIP = 77  # a measuring subcommand's "skipped" (automake's convention); its report's first line is the reason
# by dry_run, counted from the wrapper's start (its wheel install included): 9 minutes on the GPU, less the grace a
# killed step gets (stop()) and the writing of the section
TOTAL_BUDGET_S = {False: 520.0, True: 540.0}
LOG_TAIL_LINES = 15


# -- sizes -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecoderSize:
    vocab: int
    d_model: int
    heads: int
    layers: int
    seq: int
    batch: int

    def describe(self, params: int, kind: str = "decoder") -> str:
        return (
            f"{params / 1e6:.3g}M-parameter {kind} (d_model {self.d_model}, layers {self.layers}, heads {self.heads}, "
            f"vocab {self.vocab}, sequence {self.seq}, batch {self.batch})"
        )


@dataclass(frozen=True)
class Scale:
    """Every size of every step, for one mode: the GPU run, or the dry run on two CPU cores."""

    overhead_rounds: int
    cnn_batch: int
    cnn_steps: int
    overhead_decoder: DecoderSize
    overhead_decoder_steps: int
    sync_batch: int
    sync_steps: tuple[int, int]  # the short fit and the long one
    planner_rows: int
    planner_llama: DecoderSize
    compile_decoder: DecoderSize
    compile_steps: int
    compile_rounds: int
    dist_decoder: DecoderSize
    dist_steps: int
    soak_trials: int
    panel_steps: int  # per epoch; the panel's fit is 2 epochs, its second is the steady state that is compared
    panel_rounds: int
    strategy_args: tuple[str, ...] = field(default=())


GPU = Scale(
    overhead_rounds=5,
    cnn_batch=256,
    cnn_steps=400,  # long enough that the fit's own setup is a small part of the epoch
    # ~106M parameters: 8 x 7.1M in the blocks, 24.6M in each of the embedding and the untied head
    overhead_decoder=DecoderSize(vocab=32000, d_model=768, heads=12, layers=8, seq=512, batch=16),
    overhead_decoder_steps=30,
    sync_batch=64,
    sync_steps=(10, 60),
    planner_rows=10,
    planner_llama=DecoderSize(vocab=32000, d_model=768, heads=12, layers=8, seq=512, batch=8),  # ~106M parameters
    # compilation time grows with the traced graph (every layer is inlined): two layers keep it inside the budget
    compile_decoder=DecoderSize(vocab=8192, d_model=512, heads=8, layers=2, seq=256, batch=16),
    compile_steps=30,
    compile_rounds=3,
    dist_decoder=DecoderSize(vocab=4096, d_model=256, heads=4, layers=4, seq=128, batch=16),
    dist_steps=20,
    # 4, not 5: about 30 s a trial on the H200 (two interpreters, each with its CUDA start), and step 9 comes after
    soak_trials=4,
    # an epoch long enough that the panel's few UI pushes are in it; 400 steps and 5 rounds (9,600 steps with the
    # warm-up round) ran past the step's 45 s on the first H200 run
    panel_steps=200,
    panel_rounds=3,
    strategy_args=("--steps", "30", "--warmup", "5"),
)
TINY = Scale(
    overhead_rounds=1,
    # batch 4, 4 steps: a CPU emulates fp16's convolutions at ~35x fp32's time (177 ms a step at batch 16), and the
    # dry run checks the path, not the ratio: 1.3 s of CPU for the CNN's four fits, not 5.7 s
    cnn_batch=4,
    cnn_steps=4,
    overhead_decoder=DecoderSize(vocab=64, d_model=32, heads=2, layers=2, seq=16, batch=4),
    overhead_decoder_steps=6,
    sync_batch=8,
    sync_steps=(3, 9),
    planner_rows=4,  # each row is a fresh model and fit: the path is the same for 4 as for 10
    # batch 2: micro-batches of 2 and 1, each simulated (a batch of 4 adds a third size to every simulated row)
    planner_llama=DecoderSize(vocab=64, d_model=32, heads=2, layers=2, seq=16, batch=2),
    compile_decoder=DecoderSize(vocab=64, d_model=32, heads=2, layers=1, seq=16, batch=4),
    compile_steps=4,
    compile_rounds=1,
    dist_decoder=DecoderSize(vocab=64, d_model=32, heads=2, layers=2, seq=16, batch=4),
    dist_steps=4,
    soak_trials=1,
    panel_steps=8,
    panel_rounds=1,
    # one intra-op thread: two shared cores are slower with two spinning OpenMP threads than with one
    strategy_args=("--steps", "2", "--warmup", "1", "--threads", "1"),
)


# -- the models --------------------------------------------------------------------------------------------------------
class Decoder(nn.Module):
    """A GPT-style causal LM in plain torch (no transformers needed): token and position embeddings, pre-norm
    ``nn.TransformerEncoderLayer`` blocks under a causal mask, a final norm and an untied LM head."""

    def __init__(self, size: DecoderSize) -> None:
        super().__init__()
        self.tokens = nn.Embedding(size.vocab, size.d_model)
        self.positions = nn.Embedding(size.seq, size.d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                size.d_model,
                size.heads,
                dim_feedforward=4 * size.d_model,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(size.layers)
        )
        self.norm = nn.LayerNorm(size.d_model)
        self.head = nn.Linear(size.d_model, size.vocab, bias=False)
        # nn.MultiheadAttention wants a mask beside is_causal=True, then gives SDPA the flag and never reads the mask
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(size.seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(seq, device=ids.device))
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:seq, :seq], is_causal=True)
        return self.head(self.norm(x))


class NextTokenLoss(nn.CrossEntropyLoss):
    """Cross-entropy over every position: (batch, seq, vocab) logits against (batch, seq) next tokens."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return super().forward(logits.flatten(0, 1), targets.flatten())


def decoder(size: DecoderSize, device: torch.device) -> Decoder:
    torch.manual_seed(0)
    with device:  # initialised where it trains: 100M parameters initialise in milliseconds on a GPU, seconds on a CPU
        return Decoder(size)


def token_data(size: DecoderSize, batches: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, next tokens), each (batches * batch, seq): sequences that count up from a random start (learnable)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, size.vocab, (batches * size.batch, 1), generator=g)
    tokens = (start + torch.arange(size.seq + 1)) % size.vocab
    return tokens[:, :-1], tokens[:, 1:]


def split(x: torch.Tensor, y: torch.Tensor, batch: int, device: torch.device) -> Batches:
    """Ready-made batches already on the device: what the loops are timed on is the step, not a data path."""
    return Batches([(x[i : i + batch].to(device), y[i : i + batch].to(device)) for i in range(0, len(x), batch)])


def image_data(batches: int, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batches * batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batches * batch,), generator=g)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


HALF = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def warm_device(device: torch.device) -> None:
    """cuBLAS handles and the autocast paths initialise on first use: not inside the first variant's timing."""
    w = torch.randn(64, 64, device=device, requires_grad=True)
    (w @ w).sum().backward()
    for dtype in HALF.values():
        with torch.autocast(device.type, dtype=dtype):
            (w @ w).sum().backward()
    sync(device)


class Skipped(Exception):
    """A measuring step that does not apply here: its message is the reason."""


class Failed(Exception):
    """A measuring step that ran and failed: its message is its report (what did run, and what failed)."""


# -- step 2: overhead against a hand-written AMP loop ------------------------------------------------------------------
@dataclass
class AmpWorkload:
    name: str
    make_model: Callable[[], nn.Module]
    criterion: nn.Module
    data: Batches

    def fresh(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        gc.collect()  # the previous run's model and optimizer state (reference cycles in the trainer) go first
        torch.manual_seed(0)
        model = self.make_model()
        return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def hand_amp(w: AmpWorkload, precision: str, device: torch.device) -> float:
    """torch's AMP recipe, as a user writes it. Its fp16 ``GradScaler.step`` reads found-inf on the host each step:
    that sync is the recipe's, and nbtrainer is compared with it as it is."""
    model, opt = w.fresh()
    model.train()
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16-mixed" else None
    running = torch.zeros((), device=device)
    sync(device)
    start = time.perf_counter()
    for x, y in w.data:
        with torch.autocast(device.type, dtype=HALF[precision]):
            loss = w.criterion(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        running += loss.detach()
    running.item()  # the one read, at the end of the epoch (it waits for the device)
    return time.perf_counter() - start


def nbtrainer_fit(w: AmpWorkload, precision: str, device: torch.device) -> float:
    from nbtrainer import Trainer

    model, opt = w.fresh()
    trainer = Trainer(model, w.criterion, opt, precision=precision, device=device, progress=False)
    sync(device)
    start = time.perf_counter()
    trainer.fit(w.data, epochs=1)
    sync(device)
    return time.perf_counter() - start


def measure_overhead(scale: Scale, device: torch.device) -> str:
    x, y = image_data(scale.cnn_steps, scale.cnn_batch)
    dec = scale.overhead_decoder
    ids, nxt = token_data(dec, scale.overhead_decoder_steps)
    params = n_params(decoder(dec, torch.device("meta")))
    workloads = [
        AmpWorkload(
            f"small CNN 1x28x28, batch {scale.cnn_batch}, {scale.cnn_steps} steps",
            lambda: small_cnn().to(device),
            nn.CrossEntropyLoss(),
            split(x, y, scale.cnn_batch, device),
        ),
        AmpWorkload(
            f"{dec.describe(params)}, {scale.overhead_decoder_steps} steps",
            lambda: decoder(dec, device),
            NextTokenLoss(),
            split(ids, nxt, dec.batch, device),
        ),
    ]
    loops = {"hand": hand_amp, "nbtrainer": nbtrainer_fit}
    warm_device(device)
    names = [f"{loop} {precision}" for precision in HALF for loop in loops]
    rows = []
    for w in workloads:
        steps = len(w.data)

        def run(name: str, w: AmpWorkload = w, steps: int = steps) -> float:
            loop, precision = name.split()
            return loops[loop](w, precision, device) / steps

        per_step = interleaved(run, names, scale.overhead_rounds)
        for precision in HALF:
            hand, nbt = per_step[f"hand {precision}"], per_step[f"nbtrainer {precision}"]
            ratios = [n / h for n, h in zip(nbt, hand, strict=True)]  # per round: drift hits both alike
            rows.append(
                [
                    w.name,
                    precision,
                    f"{statistics.median(hand) * 1e3:.2f}",
                    f"{statistics.median(nbt) * 1e3:.2f}",
                    f"**{statistics.median(ratios):.3f}x** ({min(ratios):.3f}-{max(ratios):.3f})",
                    f"{1 / statistics.median(hand):.1f}",
                    f"{1 / statistics.median(nbt):.1f}",
                ]
            )
    return (
        f"{machine_line(device).removeprefix('# ')}.\n"
        f"Adam (lr 1e-4), batches already on the device; each round runs every variant for one epoch in rotated "
        f"order (one warm-up round first), rounds: {scale.overhead_rounds}; medians, ratio range over the rounds in "
        f"brackets. Trainer(..., precision=P, progress=False).fit (its per-fit setup included) against torch's AMP "
        f"recipe; under fp16 both sync once per step (GradScaler's inf check).\n\n"
        + table(
            [
                "workload",
                "precision",
                "hand ms/step",
                "nbtrainer ms/step",
                "nbtrainer / hand",
                "hand steps/s",
                "nbtrainer steps/s",
            ],
            rows,
        )
    )


# -- step 3: host syncs per step ---------------------------------------------------------------------------------------
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy")


@contextlib.contextmanager
def counting_syncs(device: torch.device) -> Iterator[list[int]]:
    """Yields a one-element list that holds the count once the block is done. CUDA: the synchronizing operations
    that ``set_sync_debug_mode("warn")`` reports. CPU: the tensor reads that would sync on a GPU."""
    count = [0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # every occurrence, not the first per call site
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield count
            finally:
                torch.cuda.set_sync_debug_mode("default")
        count[0] = sum("synchroniz" in str(w.message) for w in caught)
        return
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(self, *args, **kwargs)

        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(original))
    try:
        yield count
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# name -> (Trainer options, syncs per optimizer step by design). fp16's one is GradScaler's inf check inside
# scaler.step, sync point 3 of nbtrainer/_loop/_fit_loop.py's budget (torch's own AMP recipe has it too).
SYNC_CONFIGS: dict[str, tuple[dict[str, Any], int]] = {
    "fp32": ({}, 0),
    "bf16-mixed": ({"precision": "bf16-mixed"}, 0),
    "fp16-mixed": ({"precision": "fp16-mixed"}, 1),
    "bf16-mixed, accumulation 2, clipping 1.0": (
        {"precision": "bf16-mixed", "grad_accum_steps": 2, "max_grad_norm": 1.0},
        0,
    ),
}


def measure_syncs(scale: Scale, device: torch.device) -> str:
    from nbtrainer import Trainer

    def fit(steps: int, options: dict[str, Any]) -> int:
        x, y = image_data(steps, scale.sync_batch)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=scale.sync_batch)
        torch.manual_seed(0)
        model = small_cnn()
        # refresh_interval: the running values are read per time window, which a slower long fit would see more
        # of; timing_every=0: the step-time sampler's reads are its own, documented cost
        trainer = Trainer(
            model,
            nn.CrossEntropyLoss(),
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
            device=device,
            progress=False,
            refresh_interval=3600.0,
            timing_every=0,
            **options,
        )
        with counting_syncs(device) as count:
            trainer.fit(loader, epochs=1)
        return count[0]

    short, long = scale.sync_steps
    rows, missed = [], []
    for name, (options, by_design) in SYNC_CONFIGS.items():
        fit(short, options)  # lazy initialisation (kernels, cuBLAS handles, autocast caches) out of the count
        n_short, n_long = fit(short, options), fit(long, options)
        steps = (long - short) // options.get("grad_accum_steps", 1)  # extra optimizer steps
        per_step = (n_long - n_short) / (long - short)
        # one stray sync in either fit is noise; a sync per micro-batch or per window adds one per extra one
        met = n_long - n_short <= by_design * steps + 1
        if not met:
            missed.append(name)
        expected = "0" if not by_design else f"{by_design} per optimizer step (GradScaler)"
        rows.append([name, str(n_short), str(n_long), f"**{per_step:.3f}**", expected, "met" if met else "**MISSED**"])
    what = (
        'synchronizing CUDA operations reported by torch.cuda.set_sync_debug_mode("warn")'
        if device.type == "cuda"
        else f"tensor reads that would sync on a GPU ({', '.join(HOST_READS)}): a CPU has no device to wait for"
    )
    verdict = f"**Missed by: {', '.join(missed)}.**" if missed else "Every configuration is at its by-design count."
    return (
        f"Counted: {what}. Small CNN, a DataLoader over a TensorDataset (batch {scale.sync_batch}), SGD with momentum, "
        f"refresh_interval=3600, timing_every=0; one uncounted fit first. Syncs per step = (long - short) / "
        f"{long - short} extra micro-batches; target 0 but for fp16's documented one.\n\n"
        + table(["configuration", f"{short}-step fit", f"{long}-step fit", "syncs/step", "by design", "verdict"], rows)
        + f"\n\n{verdict}"
    )


# -- step 5: the memory planner's prediction against the measured peak -------------------------------------------------
# Asked of plan.predict when the plan proposes fewer rows than the step measures.
EXTRA_SWITCHES: list[dict[str, Any]] = [
    {"precision": "bf16-mixed"},
    {"activation_checkpointing": True},
    {"precision": "bf16-mixed", "activation_checkpointing": True},
    {"optimizer": "adafactor"},
    {"grad_accum_steps": 2},
    {"optimizer_in_backward": True},
    {"chunked_loss": True},
    {"precision": "bf16-mixed", "activation_checkpointing": True, "optimizer": "adafactor"},
]


def llama(size: DecoderSize, device: torch.device) -> nn.Module:
    """transformers' Llama from a config (random init, nothing downloaded): the family the planner is written for.
    (The plain decoder above is no use here: the planner's LoRA simulation trips on nn.MultiheadAttention.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.d_model,
        intermediate_size=8 * size.d_model // 3,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=size.seq,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with device:
        return LlamaForCausalLM(config)


def llama_batches(size: DecoderSize, micro: int, n: int, device: torch.device) -> Batches:
    ids = token_data(replace(size, batch=micro), n, seed=1)[0].to(device)
    return Batches([{"input_ids": b, "labels": b} for b in ids.split(micro)])  # the model shifts the labels itself


def measure_planner(scale: Scale, device: torch.device) -> str:
    import nbtrainer

    if not hasattr(nbtrainer, "plan_memory"):
        raise Skipped("planner not built yet (nbtrainer.plan_memory does not exist)")
    try:
        import transformers  # noqa: F401  (the model the planner is checked on)
    except ImportError:
        raise Skipped("transformers is not installed: the planner is checked on its Llama") from None
    size = scale.planner_llama
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 4 * 2**30
    example = llama_batches(size, size.batch, 1, torch.device("meta")).batches[0]
    start = time.perf_counter()
    plan = nbtrainer.plan_memory(
        llama(size, torch.device("meta")), example, budget_gb=capacity / 2**30, device=str(device)
    )
    planning = time.perf_counter() - start
    # progress on stderr: a step killed at its budget still shows how far it got (the first GPU run showed nothing)
    print(f"planned {len(plan.rows)} rows in {planning:.1f} s", file=sys.stderr, flush=True)
    rows = plan_rows(plan, scale.planner_rows)
    cuda = device.type == "cuda"
    cells, ratios, reserved_ratios = [], [], []
    context: list[int] = []
    timed: list[tuple[float, float]] = []  # (the row's time_factor, its measured seconds per optimizer step)
    for i, (row, source) in enumerate(rows):
        label = [f"{row_label(row)}{source}", f"{row.micro_batch} x {row.grad_accum_steps}", mib(row.peak_bytes)]
        try:
            measured, reserved, step_s = measured_peak(size, row, device, context, trace=i)
        except Exception as exc:  # one row's failure is that row's result; the others still measure
            cells.append([*label, f"failed: {first_line(exc)}", "-", "-", "-", "-", "-", "-"])
            print(" | ".join(cells[-1]), file=sys.stderr, flush=True)
            continue
        ratios.append(row.peak_bytes / measured)
        predicted_reserved = getattr(row, "reserved_bytes", row.peak_bytes)
        if cuda:
            reserved_ratios.append(predicted_reserved / reserved)
            tail = [mib(predicted_reserved), mib(reserved), f"**{reserved_ratios[-1]:.3f}**"]
        else:  # no caching allocator: the reserved bytes are the peak itself
            tail = [mib(predicted_reserved), "-", "-"]
        factor = float(getattr(row, "time_factor", float("nan")))
        timed.append((factor, step_s))
        cells.append([*label, mib(measured), f"**{ratios[-1]:.2f}**", *tail, f"{factor:.2f}", f"{step_s * 1e3:.1f}"])
        print(" | ".join(cells[-1]), file=sys.stderr, flush=True)
    how = (
        "torch.cuda.max_memory_allocated over the fit, and the allocator's reserved bytes after it (memory_reserved: "
        "nothing is released without an out-of-memory retry, so the most it reserved)"
        if cuda
        else "the peak of live tensors (track_peak); no caching allocator on the CPU"
    )
    spread = (
        f"Predicted / measured peak (allocated): median {statistics.median(ratios):.2f}, "
        f"{min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} rows."
        if ratios
        else "No row measured."
    )
    if reserved_ratios:
        under = sum(r < 1 for r in reserved_ratios)
        over = sum(r > 1.08 for r in reserved_ratios)
        spread += (
            f" Predicted / measured reserved: median {statistics.median(reserved_ratios):.3f}, "
            f"{min(reserved_ratios):.3f}-{max(reserved_ratios):.3f}; target: every row in [1, 1.08]: "
            f"{under} under, {over} more than 8% over."
        )
    if context:
        spread += (
            f" CUDA context (device memory in use minus the allocator's reserved bytes): {mib(max(context))}; "
            f"the planner assumes {mib(getattr(plan, 'context_bytes', 0))}."
        )
    if len(timed) >= 2:
        fastest = min(t for _, t in timed)
        tau = kendall_tau([f for f, _ in timed], [t for _, t in timed])
        spread += (
            f" Step time: Kendall's tau-b between the predicted time_factor and the measured time per optimizer step "
            f"(the fit's steps after the first, synchronized) is **{tau:.2f}** over {len(timed)} rows (target >= 0.7); "
            f"measured / fastest row: " + ", ".join(f"{t / fastest:.2f}" for _, t in timed) + "."
        )
    params = n_params(llama(size, torch.device("meta")))
    return (
        f"plan_memory (budget {capacity / 2**30:.0f} GiB, planned in {planning:.1f} s) on the "
        f"{size.describe(params, 'Llama')} built on the meta device; then each row's switches fitted for 4 optimizer "
        f"steps on a fresh model (AdamW unless the row names an optimizer); measured: {how}. The rows that train the "
        f"model as given come first (the planner's order), then those that change it (LoRA, quantized bases).\n\n"
        + table(
            [
                "row",
                "micro-batch x accumulation",
                "predicted peak",
                "measured allocated",
                "predicted / measured",
                "predicted reserved",
                "measured reserved",
                "reserved: predicted / measured",
                "time_factor",
                "ms / optimizer step",
            ],
            cells,
        )
        + f"\n\n{spread}"
    )


def row_label(row: Any) -> str:
    describe = getattr(row, "describe", None)  # the planner is young: its rows may lose or rename their helpers
    return describe() if callable(describe) else ", ".join(f"{k}={v}" for k, v in row.switches.items()) or "fp32"


def plan_rows(plan: Any, n: int) -> list[tuple[Any, str]]:
    """``n`` rows of the plan (with where each came from), topped up from ``plan.predict`` if it has fewer."""
    rows = sorted(plan.rows, key=lambda r: bool(getattr(r, "changes_training", False)))[:n]
    picked = [(r, "") for r in rows]
    for switches in EXTRA_SWITCHES:
        if len(picked) >= n:
            break
        if any(r.switches == switches for r in rows):
            continue
        try:
            picked.append((plan.predict(**switches), " (plan.predict)"))
        except Exception:  # a switch this target does not have (the plan's `unavailable` says why)
            continue
    return picked


class _StepClock:
    """Seconds from the end of the first optimizer step to the end of the last (duck-typed callback): the first
    step pays the lazy kernel loads and autotuning, which ``time_factor`` does not predict. Synchronizes at those two
    steps only."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.marks = device, []

    def on_optimizer_step(self, **_: Any) -> None:
        sync(self.device)
        self.marks.append(time.perf_counter())

    def per_step(self) -> float:
        return (self.marks[-1] - self.marks[0]) / max(len(self.marks) - 1, 1)


def measured_peak(
    size: DecoderSize, row: Any, device: torch.device, context: list[int], *, trace: int | None = None
) -> tuple[int, int, float]:
    """The peak of 4 optimizer steps under the row's switches, on CUDA the caching allocator's reserved bytes after
    them (the CUDA context measured beside them goes to ``context``), and the seconds per optimizer step after the
    first. A function of its own: what it builds is gone (refcounts) when it returns, so one row's model and
    optimizer state never count in the next row's peak. With ``NBT_GPU_TRACES`` set to a folder, the allocator's
    history of the fit (sizes and actions, no stacks) is saved there as ``row<trace>.pickle``: the planner's
    allocator replay (nbtrainer._plan._allocator) is checked against it offline."""
    from nbtrainer import Trainer
    from nbtrainer._memory._peak import track_peak

    data = llama_batches(size, row.micro_batch, 4 * row.grad_accum_steps, device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # reserved from zero: this row's segments only
        torch.cuda.reset_peak_memory_stats(device)
    traces = os.environ.get("NBT_GPU_TRACES") if device.type == "cuda" and trace is not None else None
    if traces:
        try:  # a private API: its failure costs the trace, never the row
            torch.cuda.memory._record_memory_history(max_entries=100_000, context=None, stacks="python")
        except Exception as exc:
            print(f"no allocator trace: {first_line(exc)}", file=sys.stderr, flush=True)
            traces = None
    model = llama(size, device)
    options = {"optimizer": "adamw", "lr": 1e-4, **row.switches}  # switches hold grad_accum_steps when split
    clock = _StepClock(device)
    trainer = Trainer(model, None, device=device, progress=False, callbacks=[clock], **options)
    if device.type != "cuda":
        with track_peak(model, trainer.optimizer) as peak:
            trainer.fit(data, epochs=1)
        return int(peak.peak_bytes), 0, clock.per_step()
    trainer.fit(data, epochs=1)
    torch.cuda.synchronize(device)
    if traces:
        import pickle

        try:
            Path(traces).mkdir(parents=True, exist_ok=True)
            with open(Path(traces) / f"row{trace}.pickle", "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)
        except Exception as exc:
            print(f"no allocator trace: {first_line(exc)}", file=sys.stderr, flush=True)
        torch.cuda.memory._record_memory_history(enabled=None)
    # segments are released only by empty_cache or an out-of-memory retry: what is reserved now is the most it was
    reserved = int(torch.cuda.memory_reserved(device))
    free, total = torch.cuda.mem_get_info(device)
    context.append(int(total - free) - reserved)
    # the loop resets CUDA's peak at each refresh window; its progress keeps the fit's (nbtrainer._memory._window)
    peak_allocated = int(max(torch.cuda.max_memory_allocated(device), trainer.progress.memory_peak or 0))
    return peak_allocated, reserved, clock.per_step()


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


# -- step 6: compile=True against eager --------------------------------------------------------------------------------
def measure_compile(scale: Scale, device: torch.device) -> str:
    from nbtrainer import Trainer

    size = scale.compile_decoder
    ids, nxt = token_data(size, scale.compile_steps)
    data = split(ids, nxt, size.batch, device)
    # the dry run checks the path, not the speed: fp32, whatever the CPU's bf16 support
    precision = "bf16-mixed" if device.type == "cuda" else "fp32"
    warm_device(device)
    trainers = {}
    for name, compile_ in (("eager", False), ("compile=True", True)):
        model = decoder(size, device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        trainers[name] = Trainer(
            model, NextTokenLoss(), opt, precision=precision, device=device, progress=False, compile=compile_
        )
    first: dict[str, float] = {}

    def epoch(name: str) -> float:
        sync(device)
        start = time.perf_counter()
        trainers[name].fit(data, epochs=1)
        sync(device)
        seconds = time.perf_counter() - start
        first.setdefault(name, seconds)  # interleaved's warm-up call: the first epoch, compilation included
        return seconds / len(data)

    header = (
        f"{size.describe(n_params(trainers['eager'].model))}, {precision}, AdamW; {len(data)} steps per epoch, each "
        "trainer fitted one epoch at a time: the first epoch (compilation included), then interleaved epochs "
        f"(rounds: {scale.compile_rounds}; median)."
    )
    try:
        per_step = interleaved(epoch, list(trainers), scale.compile_rounds)
    except Exception as exc:
        if "eager" not in first or "compile=True" in first:
            raise  # not compilation's failure
        message = f"compile=True failed in its first epoch: {first_line(exc)}"
        if device.type == "cuda":
            raise Failed(message) from exc
        # a CPU without a C compiler cannot build inductor's kernels: said in the section, and the run goes on
        raise Skipped(f"{message} (eager first epoch {first['eager']:.2f} s)") from exc
    eager = statistics.median(per_step["eager"])
    rows = [
        [
            name,
            f"{first[name]:.2f} s",
            f"{statistics.median(times) * 1e3:.2f}",
            f"**{statistics.median(times) / eager:.3f}x**",
        ]
        for name, times in per_step.items()
    ]
    return (
        header
        + "\n\n"
        + table(["variant", "first epoch (warm-up)", "steady ms/step", "steady step / eager"], rows)
        + f"\n\nCompilation costs {first['compile=True'] - first['eager']:.1f} s over eager's first epoch."
    )


# -- step 7: DDP and FSDP2 as a world of one (run under torchrun) ------------------------------------------------------
def measure_dist(scale: Scale, device: torch.device) -> str:
    from torch.distributed.tensor import DTensor

    from nbtrainer import Trainer

    size = scale.dist_decoder
    ids, nxt = token_data(size, scale.dist_steps)
    params = n_params(decoder(size, torch.device("meta")))
    precision = "bf16-mixed" if device.type == "cuda" else "fp32"
    rows, failed = [], []
    for strategy in ("ddp", "fsdp"):
        try:
            loader = torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(ids, nxt), batch_size=size.batch, shuffle=True
            )
            model = decoder(size, torch.device("cpu"))  # the strategy moves it to this rank's device
            trainer = Trainer(
                model,
                NextTokenLoss(),
                torch.optim.AdamW(model.parameters(), lr=1e-3),
                precision=precision,
                device=device,
                strategy=strategy,
                seed=0,
                progress=False,
            )
            history = trainer.fit(loader, epochs=2)
            weights = list(trainer.model.parameters())
            sharded = sum(isinstance(w, DTensor) for w in weights)
            s = trainer.strategy
            rows.append(
                [
                    strategy,
                    type(s).__name__,
                    str(getattr(s, "backend", "-")),
                    f"{s.rank}/{s.world_size}",
                    str(trainer.device),
                    str(trainer.global_step),
                    f"{history.epochs[-1]['loss']:.4f}",
                    f"{history.epochs[-1]['time']:.2f} s",
                    f"{sharded}/{len(weights)}",
                ]
            )
        except Exception as exc:  # the other strategy still runs: one launch checks both
            failed.append(strategy)
            rows.append([strategy, f"failed: {first_line(exc)}", *["-"] * 7])
    report = (
        f"`torchrun --standalone --nproc-per-node 1`, one process fitting the {size.describe(params)} "
        f"({precision}, AdamW, 2 epochs of {len(ids) // size.batch} steps) with strategy='ddp', then 'fsdp' (the same "
        "process group).\n\n"
        + table(
            [
                "strategy=",
                "strategy",
                "backend",
                "rank/world",
                "device",
                "steps",
                "final loss",
                "epoch 2",
                "DTensor params",
            ],
            rows,
        )
    )
    if failed:
        raise Failed(report)
    return report


# -- step 8: the crash soak --------------------------------------------------------------------------------------------
def run_soak(trials: int, report: Path, device: str) -> int:
    """bench/crash_soak.py's ``main`` in this process: SIGKILLed runs on ``device``, resumed, compared bit for bit."""
    sys.path[:0] = [str(BENCH)]
    import crash_soak

    summary_path = report.with_suffix(".json")
    sys.argv = ["crash_soak.py", "--trials", str(trials), "--json", str(summary_path), "--device", device]
    rc = int(crash_soak.main())
    summary = json.loads(summary_path.read_text())["summary"]
    report.write_text(
        f"`bench/crash_soak.py --trials {trials}`: {summary['killed']}/{summary['trials']} killed, "
        f"{summary['resume_ok']}/{summary['trials']} resumed ({summary['resumed_from_checkpoint']} from a checkpoint, "
        f"{summary['restarted_before_first_checkpoint']} restarted before the first one), "
        f"**{summary['bit_identical']}/{summary['trials']} bit-identical** to the uninterrupted run; temp files left: "
        f"{summary['temp_files_at_kill']} at the kills, {summary['temp_files_after_resume']} after the resumes; "
        f"run span {summary['run_span_s']} s, {summary['wall_s']} s in all. Trained on {device}.\n"
    )
    return rc


# -- step 9: the panel against the plain Trainer ----------------------------------------------------------------------
def measure_panel(scale: Scale, device: torch.device) -> str:
    """``TrainerWidget(...).start(); wait()`` with no front end (its training thread, its UI thread pushing to real
    ipywidgets and bqplot objects whose messages go nowhere) against ``Trainer(...).fit``, each a 2-epoch fit of the
    small CNN from the same weights. Compared: the second epoch's time per step (the steady state; the first holds
    the fit's setup and CUDA's lazy initialisation), per round, so drift on the machine hits both alike."""
    try:
        import bqplot
        import ipywidgets
    except ImportError as exc:
        raise Skipped(f"the widget stack is not installed ({exc.name}): scripts/gpu-wheels.sh carries it") from None
    from nbtrainer import Trainer, TrainerWidget

    x, y = image_data(scale.panel_steps, scale.cnn_batch)
    data = split(x, y, scale.cnn_batch, device)
    # the dry run checks the path, not the speed: fp32, whatever the CPU's bf16 support
    precision = "bf16-mixed" if device.type == "cuda" else "fp32"
    ui_pushes: list[int] = []

    def second_epoch_per_step(name: str) -> float:
        started = time.perf_counter()
        gc.collect()
        torch.manual_seed(0)
        model = small_cnn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        options: dict[str, Any] = {"precision": precision, "device": device, "progress": False}
        if name == "Trainer.fit":
            history = Trainer(model, nn.CrossEntropyLoss(), opt, **options).fit(data, epochs=2)
        else:
            panel = TrainerWidget(model, nn.CrossEntropyLoss(), opt, data, epochs=2, **options)
            panel.start()
            history = panel.wait()
            if panel.status != "finished":
                raise Failed(f"the panel's run ended {panel.status!r}, not 'finished'")
            ui_pushes.append(panel.ui_updates)
        # progress on stderr: a step killed at its budget still shows how far it got (the second H200 run showed
        # nothing in 45 s)
        print(f"{name}: 2 epochs in {time.perf_counter() - started:.2f} s", file=sys.stderr, flush=True)
        # the epoch's time is read after its losses were: on CUDA it includes the device's work
        return float(history.epochs[1]["time"]) / len(data)

    warm_device(device)
    names = ["Trainer.fit", "TrainerWidget start + wait"]
    per_step = interleaved(second_epoch_per_step, names, scale.panel_rounds)
    plain, panel = per_step[names[0]], per_step[names[1]]
    ratios = [p / t for p, t in zip(panel, plain, strict=True)]
    ratio = statistics.median(ratios)
    verdict = "met" if ratio <= 1.03 else "**MISSED**"
    rows = [
        [
            "Trainer.fit",
            f"{statistics.median(plain) * 1e3:.3f}",
            f"{1 / statistics.median(plain):.0f}",
            "-",
            "-",
        ],
        [
            "TrainerWidget start + wait",
            f"{statistics.median(panel) * 1e3:.3f}",
            f"{1 / statistics.median(panel):.0f}",
            f"**{ratio:.3f}x** ({min(ratios):.3f}-{max(ratios):.3f})",
            f"{min(ui_pushes)}-{max(ui_pushes)}",
        ],
    ]
    return (
        f"{machine_line(device).removeprefix('# ')}; "
        f"ipywidgets {ipywidgets.__version__}, bqplot {bqplot.__version__}.\n"
        f"Small CNN 1x28x28, batch {scale.cnn_batch}, {len(data)} steps an epoch, {precision}, Adam (lr 1e-4), batches "
        f"already on the device; 2-epoch fits from the same weights, the second epoch's time per step compared; "
        f"rounds: {scale.panel_rounds} (one warm-up round first), medians, the ratio's range over the rounds in "
        f"brackets. The panel has no front end: its threads and widgets run, their messages go nowhere.\n\n"
        + table(["variant", "ms/step (epoch 2)", "steps/s", "panel / Trainer", "UI pushes per fit"], rows)
        + f"\n\nTarget: the panel within 3% of the plain Trainer: {verdict}."
    )


# -- the measuring subcommands -----------------------------------------------------------------------------------------
def environment(device: bool = True) -> dict[str, Any]:
    """Versions and machine; with ``device``, the GPU's name, memory and driver too (that creates a CUDA context)."""
    facts: dict[str, Any] = {
        "cuda": device and torch.cuda.is_available(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
    }
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        facts["transformers"] = "not installed"
    if facts["cuda"]:
        props = torch.cuda.get_device_properties(0)
        facts.update(
            device=props.name, memory_gib=round(props.total_memory / 2**30, 1), devices=torch.cuda.device_count()
        )
        facts["capability"] = f"{props.major}.{props.minor}"
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            facts["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
        except (OSError, subprocess.TimeoutExpired, IndexError):
            facts["driver"] = "unknown (no nvidia-smi)"
    return facts


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


MEASURES: dict[str, Callable[[Scale, torch.device], str]] = {
    "overhead": measure_overhead,
    "syncs": measure_syncs,
    "planner": measure_planner,
    "compile": measure_compile,
    "dist": measure_dist,
    "panel": measure_panel,
}


def measure_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py measure")
    p.add_argument("name", choices=[*MEASURES, "env", "soak"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the dry run's sizes")
    p.add_argument("--report", type=Path, required=True)
    args = p.parse_args(argv)
    scale = TINY if args.tiny else GPU
    if args.name == "env":
        args.report.write_text(json.dumps(environment()))
        return 0
    if args.name == "soak":
        return run_soak(scale.soak_trials, args.report, args.device)
    if args.device == "cpu":
        torch.set_num_threads(1)  # two shared cores: one intra-op thread is the faster and steadier choice
    try:
        report = MEASURES[args.name](scale, torch.device(args.device))
    except Skipped as exc:
        args.report.write_text(f"{exc}\n")
        return SKIP
    except Failed as exc:
        args.report.write_text(f"{exc}\n")
        raise  # its traceback goes to the log, whose tail the section shows
    args.report.write_text(report + "\n")
    return 0


# -- the orchestrator --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    dry_run: bool
    python: str
    report: Path  # where the step's subprocess writes its markdown

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def measure(self, name: str) -> list[str]:
        tiny = ["--tiny"] if self.dry_run else []
        return [
            self.python,
            str(Path(__file__).resolve()),
            "measure",
            name,
            "--device",
            self.device,
            "--report",
            str(self.report),
            *tiny,
        ]


@dataclass(frozen=True)
class Step:
    number: int
    title: str
    budget_s: float  # on the GPU
    dry_budget_s: float  # in the dry run, on two shared CPU cores
    command: Callable[[Context], list[str]]
    # commands that write no report: the log -> what the section keeps (raises ValueError on output it cannot read)
    summarize: Callable[[Context, str], str] | None = None


def gpu_test_files() -> list[str]:
    """The test files that mark tests ``gpu``. Not the whole tree: tests/widgets imports bqplot at module level, which
    the GPU machine lacks (a collection error stops the session before any test runs), and collecting 1,000 tests
    takes half a minute on two cores."""
    return [
        str(p.relative_to(ROOT)) for p in sorted((ROOT / "tests").rglob("test_*.py")) if "mark.gpu" in p.read_text()
    ]


def pytest_command(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rfEs", *gpu_test_files()]


def pytest_summary(ctx: Context, log: str) -> str:
    lines = log.splitlines()
    totals = [ln for ln in lines if re.search(r"\b\d+ (passed|failed|skipped|deselected|errors?)\b.* in [\d.]+s", ln)]
    if not totals:
        raise ValueError("no pytest summary line in the output")
    outcomes = [ln for ln in lines if re.match(r"(FAILED|ERROR|SKIPPED) ", ln)]
    files = f"on the {len(gpu_test_files())} files that mark tests gpu" + (", CUDA hidden" if ctx.dry_run else "")
    return f"`pytest -m gpu` {files}: {totals[-1].strip('= ')}\n" + "".join(f"\n    {ln}" for ln in outcomes)


def strategy_size() -> tuple[str, str]:
    """(the size strategies.py runs, what the section says about it): BERT-base where strategies.py has it, else
    its largest size."""
    sys.path.insert(0, str(BENCH))
    import strategies

    sizes: dict[str, dict[str, int]] = strategies.SIZES
    for name, cfg in sizes.items():
        if (cfg["d_model"], cfg["layers"], cfg["heads"]) == (768, 12, 12) and 128 <= cfg["seq"] <= 512:
            return name, f"`--size {name}`: BERT-base-sized."
    name = max(sizes, key=lambda n: sizes[n]["d_model"] ** 2 * sizes[n]["layers"] * sizes[n]["seq"])
    return name, (
        f"bench/strategies.py has no BERT-base size (hidden 768, 12 layers, 12 heads, sequence 128-512) yet: this is "
        f"its largest, `--size {name}`."
    )


def strategy_names(ctx: Context) -> list[str]:
    if ctx.dry_run:  # no fp16 row: a CPU emulates fp16 at ~10x fp32's time, and "all" runs autocast's path (bf16)
        return ["fp32", "accum4", "checkpointing", "adafactor", "all (bf16+ckpt+accum4+adafactor)"]
    # strategies.py's names; its "all" row is fp16 on CUDA, as in the seed's run
    return ["fp32", "fp16-mixed", "accum4", "checkpointing", "adafactor", "all (fp16+ckpt+accum4+adafactor)"]


def strategies_command(ctx: Context) -> list[str]:
    size = "tiny" if ctx.dry_run else strategy_size()[0]
    scale = TINY if ctx.dry_run else GPU
    return [
        ctx.python,
        str(BENCH / "strategies.py"),
        "--device",
        ctx.device,
        "--size",
        size,
        *scale.strategy_args,
        "--only",
        *strategy_names(ctx),
    ]


# The seed's published figures (BERT fine-tuning, Hugging Face's single-GPU guide; its T4 run).
SEED_REFERENCE = {
    "fp32": "the baseline",
    "fp16-mixed": "time 40% of fp32 (AMP 2.4x faster on a T4)",
    "checkpointing": "peak memory 51% of fp32",
    "all": "peak memory 41% of fp32",
}


def strategies_summary(ctx: Context, log: str) -> str:
    lines = log.splitlines()
    rows = [ln for ln in lines if ln.startswith("|")]
    if len(rows) < 3:
        raise ValueError("no markdown table in strategies.py's output")
    # one column more: the header, the separator, then each row's reference (matched on its name's first word)
    out = [rows[0].rstrip("|") + "| seed reference |", rows[1].rstrip("|") + "|---|"]
    seen = set()
    for ln in rows[2:]:
        name = ln.split("|")[1].strip()
        seen.add(name)
        ref = SEED_REFERENCE.get(name.split(" ")[0], "-")
        out.append(ln.rstrip("|") + f"| {ref} |")
    missing = [n for n in strategy_names(ctx) if n not in seen]
    context = [ln for ln in lines if ln.startswith(("Machine:", "Model:"))]
    # the table's footnote (printed under both of strategies.py's tables: once here) and its own checks
    after = list(dict.fromkeys(ln for ln in lines if ln.startswith(("(ratios to", "Against the published"))))
    size_note = (
        "`--size tiny` (the dry run)." if ctx.dry_run else strategy_size()[1]
    ) + " The seed's figures are a BERT-base fine-tuning run on a T4: compare the ratios, not the times."
    text = "\n".join([size_note, "", *context, "", *out, *(["", *after] if after else [])])
    if missing:
        text += f"\n\nRows asked for but absent (strategies.py's names changed?): {', '.join(missing)}."
    return text


def torchrun_command(ctx: Context) -> list[str]:
    run = [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    return [*run, *ctx.measure("dist")[1:]]


def soak_command(ctx: Context) -> list[str]:
    return ctx.measure("soak")


STEPS = [
    Step(1, "`pytest -m gpu`", 60, 45, pytest_command, pytest_summary),
    # 70 s was 1 s short on the first H200 run: the report was written and the process was killed on its way out
    Step(2, "Overhead against a hand-written AMP loop", 90, 45, lambda c: c.measure("overhead")),
    Step(3, "Host syncs per step (target 0)", 30, 30, lambda c: c.measure("syncs")),
    Step(4, "Strategy table (bench/strategies.py)", 75, 60, strategies_command, strategies_summary),
    # dry run: planning alone took 10-25 s of a tiny Llama on two busy cores; on the H200 the 106M Llama's
    # planning (33 s on this 2-core VM) and 10 fits ran past 70 s
    Step(5, "Memory planner: predicted against measured peak", 150, 90, lambda c: c.measure("planner")),
    # dry run: inductor's C++ build of even a tiny model takes ~40 s on two busy cores with a cold cache
    Step(6, "compile=True against eager", 70, 90, lambda c: c.measure("compile")),
    Step(7, "DDP and FSDP2 as a world of one (torchrun)", 45, 45, torchrun_command),
    # on the H200 each trial took about 30 s (two interpreters, each with its CUDA start): 2 of 5 in 85 s
    Step(8, "SIGKILL-and-resume soak (bench/crash_soak.py)", 150, 90, soak_command),
    # 6 fits of 2 x 400 steps at ~1 ms, plus the panels' final pushes; in the dry run one interpreter's imports of
    # torch, ipywidgets and bqplot are most of it
    Step(9, "The panel (TrainerWidget, no front end) against Trainer.fit", 45, 45, lambda c: c.measure("panel")),
]


@dataclass
class Outcome:
    step: Step
    status: str  # OK, SKIPPED: why, FAILED (...), TIMEOUT (...), NOT RUN: why
    budget_s: float
    body: str = ""
    seconds: float = 0.0
    # user + system time of its processes: on a shared machine the wall time says more about the neighbours
    cpu_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "OK" or self.status.startswith("SKIPPED")


def child_env(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # a killed step's log holds its last lines
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a launcher's variables around this script would make every Trainer a rank of it
    # step 1 is `pytest -m gpu` on its files, whatever options a surrounding pytest run was given (the suite runs the
    # dry run; PYTEST_ADDOPTS="-x" or "-k ..." there would stop or deselect the step's own session)
    env.pop("PYTEST_ADDOPTS", None)
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, whatever the machine has: the dry run must not depend on it
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The step's whole process group: SIGTERM first (torchrun then stops its workers, which live in sessions of
    their own), SIGKILL what is left after a grace period."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def children_cpu() -> float:
    """CPU seconds of the finished child processes (and of the descendants they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_step(step: Step, ctx: Context, budget: float, logs: Path) -> Outcome:
    ctx = replace(ctx, report=logs / f"step{step.number}.md")
    log_path = logs / f"step{step.number}.log"
    start, cpu = time.monotonic(), children_cpu()
    try:
        argv = step.command(ctx)
    except Exception as exc:
        return Outcome(step, "FAILED (could not build its command)", budget, first_line(exc))
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=child_env(ctx.dry_run),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
        try:
            rc: int | None = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            stop(proc)
            rc = None
    timing = {"seconds": time.monotonic() - start, "cpu_s": children_cpu() - cpu}
    text = log_path.read_text(errors="replace")
    report = ctx.report.read_text().strip() if ctx.report.exists() else ""
    tail = "\n".join(text.rstrip().splitlines()[-LOG_TAIL_LINES:])
    if step.summarize is not None:  # on a failure too: pytest's failures are in its summary, not always in the tail
        try:
            report = step.summarize(ctx, text)
        except ValueError as exc:
            if rc == 0:
                return Outcome(step, "FAILED (output not understood)", budget, f"{exc}\n\n{fence(tail)}", **timing)
    if rc == 0:
        return Outcome(step, "OK", budget, report, **timing)
    if rc == SKIP and report:
        reason, _, rest = report.partition("\n")
        return Outcome(step, f"SKIPPED: {reason}", budget, rest.strip(), **timing)
    status = f"TIMEOUT (killed after {budget:.0f} s)" if rc is None else f"FAILED (exit status {rc})"
    body = (report + "\n\n" if report else "") + f"Last lines of its output:\n\n{fence(tail)}"
    return Outcome(step, status, budget, body, **timing)


def fence(text: str) -> str:
    return f"```\n{text}\n```"


def git_line() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],  # untracked files too: a new script is a change to what ran
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "commit unknown"
    if head.returncode != 0:
        return "commit unknown (no git here)"
    return f"commit {head.stdout.strip()}" + (" with uncommitted changes" if dirty.stdout.strip() else "")


def probe(ctx: Context, logs: Path) -> tuple[dict[str, Any] | None, str]:
    """The environment. On the GPU from a subprocess: naming the device creates a CUDA context, which this process
    must not hold; the dry run names no device, so this process answers (one torch import less)."""
    if ctx.dry_run:
        facts = environment(device=False)
    else:
        outcome = run_step(Step(0, "environment", 60, 60, lambda c: c.measure("env")), ctx, 60, logs)
        if outcome.status != "OK":
            return None, f"Environment probe {outcome.status}:\n\n{outcome.body}"
        facts = json.loads(outcome.body)
    versions = (
        f"torch {facts['torch']}, transformers {facts['transformers']}, Python {facts['python']}; "
        f"{facts['cpu']}, {facts['cpus']} CPUs"
    )
    if ctx.dry_run:
        return facts, f"Device: none (dry run on the CPU, CUDA hidden); {versions}."
    return facts, (
        f"Device: {facts['device']} ({facts['memory_gib']} GiB, compute capability {facts['capability']}; "
        f"{facts['devices']} visible), driver {facts['driver']}, CUDA {facts['cuda_build']} (torch's build); "
        f"{versions}."
    )


def section(ctx: Context, facts: dict[str, Any] | None, env_line: str, outcomes: list[Outcome], wall: float) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if ctx.dry_run:
        device = f"dry run on the CPU: {facts['cpu'] if facts else cpu_name()}"
    else:
        device = facts["device"] if facts and "device" in facts else "device unknown"
    counts: dict[str, int] = {}
    for o in outcomes:
        key = o.status.split(":")[0].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    tally = ", ".join(f"{n} {k}" for k, n in counts.items())
    command = "bash scripts/gpu-check.sh" + (" --dry-run" if ctx.dry_run else "")
    not_run = sorted({s.number for s in STEPS} - {o.step.number for o in outcomes})
    parts = [
        f"## GPU check {now} ({device})",
        "",
        f"`{command}` at {git_line()}: {len(outcomes)} steps in {wall:.0f} s, "
        f"{sum(o.cpu_s for o in outcomes):.0f} s CPU ({tally})"
        + (f"; steps {', '.join(map(str, not_run))} not asked for (--only)." if not_run else ".")
        + f"\n{env_line}",
    ]
    for o in outcomes:
        parts += ["", f"### {o.step.number}. {o.step.title} — {o.status}", ""]
        timing = f"{o.seconds:.0f} s of its {o.budget_s:.0f} s budget ({o.cpu_s:.0f} s CPU)."
        parts.append(timing + (f"\n\n{o.body}" if o.body else ""))
    return "\n".join(parts) + "\n"


def parse_only(text: str) -> set[int]:
    try:
        steps = {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"step numbers such as 2,5, not {text!r}") from None
    if not steps or not steps <= {s.number for s in STEPS}:
        raise argparse.ArgumentTypeError(f"the steps are 1-{len(STEPS)}, not {text!r}")
    return steps


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        return measure_main(argv[1:])
    p = argparse.ArgumentParser(
        prog="scripts/gpu-check.sh",
        description=__doc__.split("\n\n")[0],
        epilog="steps:\n" + "\n".join(f"  {s.number}. {s.title.replace('`', '')}" for s in STEPS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true", help="the CPU at tiny sizes, into --out (default: a temp file)")
    p.add_argument("--only", type=parse_only, default=None, help="a subset of the steps, e.g. 2,5")
    p.add_argument("--out", type=Path, default=None, help="where the section is appended (default: bench/RESULTS.md)")
    p.add_argument("--logs", type=Path, default=None, help="each step's output and report (default: a new temp dir)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device here (torch.cuda.is_available() is False), and this check measures one.\n"
            "  `bash scripts/gpu-check.sh --dry-run` runs the same steps on the CPU at tiny sizes.",
            file=sys.stderr,
        )
        return 2
    if args.dry_run:
        if args.out is not None and args.out.resolve() == RESULTS.resolve():
            print("gpu-check: a dry run never writes bench/RESULTS.md; give --out another file.", file=sys.stderr)
            return 2
        if args.out is None:
            fd, name = tempfile.mkstemp(prefix="gpu-check-dry-run-", suffix=".md")
            os.close(fd)
            args.out = Path(name)
    out: Path = args.out or RESULTS

    start = time.time()
    # the wrapper's clock: its wheel install and this interpreter's imports count against the total too
    deadline = float(os.environ.get("GPU_CHECK_STARTED", start)) + TOTAL_BUDGET_S[args.dry_run]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gpu-check-logs-"))  # kept: the whole story of a failed step
    logs.mkdir(parents=True, exist_ok=True)
    print(f"gpu-check: logs in {logs}", file=sys.stderr)
    ctx = Context(dry_run=args.dry_run, python=sys.executable, report=logs)
    facts, env_line = probe(ctx, logs)
    outcomes = []
    for step in STEPS:
        if args.only and step.number not in args.only:
            continue
        budget = step.dry_budget_s if args.dry_run else step.budget_s
        left = deadline - time.time()
        if left < min(budget, 10.0):
            outcomes.append(Outcome(step, "NOT RUN: the run's total budget is spent", budget))
            continue
        print(f"gpu-check: step {step.number}. {step.title} (budget {budget:.0f} s) ...", file=sys.stderr, flush=True)
        outcome = run_step(step, ctx, min(budget, left), logs)
        print(f"gpu-check:   {outcome.status} in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
        outcomes.append(outcome)
    text = section(ctx, facts, env_line, outcomes, time.time() - start)
    existing = out.read_text() if out.exists() else ""
    with open(out, "a", encoding="utf-8") as fh:
        fh.write(("\n" if existing and not existing.endswith("\n") else "") + ("\n" if existing else "") + text)
    print(text)
    print(f"gpu-check: section appended to {out}", file=sys.stderr)
    return 0 if facts is not None and all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
