"""Strategy comparison on a small transformer encoder (issue 7): fp32 vs fp16-mixed vs bf16-mixed vs
activation checkpointing vs gradient accumulation vs all of them, with ``nbtrainer.compare_strategies``.

The model is defined here in torch (token + position embeddings, a ``nn.ModuleList`` of pre-norm
``nn.TransformerEncoderLayer`` blocks, mean pooling, a linear head), randomly initialised; the data are
synthetic tokens of two classes (class 0 draws from the lower 90% of the vocabulary, class 1 from the upper
90%: learnable in an epoch, so final loss and accuracy mean something). Every strategy starts from the same
weights and sees the same batches; accumulation splits each batch into micro-batches (same samples per
optimizer step as fp32).

    python bench/strategies.py                       # CUDA if available (the "gpu" size), else CPU ("cpu" size)
    python bench/strategies.py --size cpu --steps 30 --repeats 2
    python bench/strategies.py --write-results       # also replace this device's table in bench/RESULTS.md

Expectations from published results (BERT fine-tuning, Hugging Face's single-GPU guide), on a GPU:
mixed precision well under 60% of the fp32 step time; checkpointing at or under ~55% of the peak memory.
Peak memory is measured: on CUDA ``torch.cuda.max_memory_allocated`` over the fit; on a CPU the peak of live
tensor storage over one steady-state optimizer step (``nbtrainer._memory._peak.track_peak``), not a sum of
parts; the table splits it into parameters, gradients, optimizer state and activations. On a CPU autocast is
usually slower than fp32 (fp16 is emulated where the CPU has no fp16 kernels: its row says so). Step times
carry their spread (±) and the table names the rows whose spread makes their ratios unreliable; the machine's
load average during the run is written next to the figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import platform
import re
import sys
import time
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbtrainer import compare_strategies

SIZES = {
    # ~25M parameters, 256 tokens: a BERT-small-like fine-tuning step
    "gpu": {"vocab": 8000, "d_model": 512, "heads": 8, "layers": 8, "seq": 256, "batch": 32, "samples": 32 * 60},
    # BERT-base-sized (hidden 768, 12 layers, 12 heads, ~110M parameters with a 30k vocabulary), 256 tokens: the
    # seed's strategy table was a BERT-base fine-tune (scripts/gpu-check.sh runs this one)
    "bert-base": {
        "vocab": 30522,
        "d_model": 768,
        "heads": 12,
        "layers": 12,
        "seq": 256,
        "batch": 16,
        "samples": 16 * 30,
    },
    # small enough for two shared CPU cores
    "cpu": {"vocab": 128, "d_model": 128, "heads": 4, "layers": 4, "seq": 64, "batch": 16, "samples": 16 * 40},
    # the GPU command's dry run in the test suite (scripts/gpu-check.sh --dry-run): every strategy's code path, no more
    "tiny": {"vocab": 64, "d_model": 32, "heads": 2, "layers": 2, "seq": 16, "batch": 16, "samples": 16 * 40},
}

STRATEGIES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16-mixed": {"precision": "fp16-mixed"},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "checkpointing": {"activation_checkpointing": True},
    "accum4": {"grad_accum_steps": 4},
    "adafactor": {"optimizer": "adafactor", "lr": 1e-2},
}
# all of them, with the mixed precision that pays on the device (fp16 on CUDA as in the published run;
# CPU autocast to fp16 is emulated and slow, bf16 is native on recent x86)
ALL: dict[str, Any] = {"activation_checkpointing": True, "grad_accum_steps": 4, "optimizer": "adafactor", "lr": 1e-2}


class Encoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq: int, classes: int = 2, **_: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(seq, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model,
                heads,
                dim_feedforward=4 * d_model,
                dropout=0.1,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


def make_data(cfg: dict, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # class 0 draws its tokens from the lower 90% of the vocabulary, class 1 from the upper 90%
    labels = torch.randint(0, 2, (cfg["samples"],), generator=g)
    span = int(cfg["vocab"] * 0.9)
    ids = torch.randint(0, span, (cfg["samples"], cfg["seq"]), generator=g) + labels[:, None] * (cfg["vocab"] - span)
    n_val = max(cfg["batch"] * 4, cfg["samples"] // 8)
    train = torch.utils.data.TensorDataset(ids[n_val:], labels[n_val:])
    val = torch.utils.data.TensorDataset(ids[:n_val], labels[:n_val])
    return (
        torch.utils.data.DataLoader(
            train, batch_size=cfg["batch"], shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed)
        ),
        torch.utils.data.DataLoader(val, batch_size=cfg["batch"] * 2),
    )


def environment(device: torch.device) -> str:
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as fh:
                cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        where = f"{cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} intra-op thread(s), no GPU"
    return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


def write_results(path: str, kind: str, block: str) -> None:
    """Replace this device kind's subsection (### CPU / ### CUDA) of '## Strategy comparison (issue 7)'."""
    title = "## Strategy comparison (issue 7)"
    text = pathlib.Path(path).read_text(encoding="utf-8") if os.path.exists(path) else "# Benchmark results\n"
    m = re.search(rf"^{re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    section = m.group(1) if m else ""
    subs = dict(re.findall(r"^### (CPU|CUDA)\n(.*?)(?=^### |\Z)", section, flags=re.S | re.M))
    intro = re.split(r"^### ", section, maxsplit=1, flags=re.M)[0].strip() or (
        "`python bench/strategies.py` (nbtrainer.compare_strategies on a small transformer encoder defined in "
        "torch, random init, synthetic tokens). Every strategy starts from the same weights and sees the same "
        "batches; accum4 splits each batch into 4 micro-batches. Step time: median after warm-up; ratios to fp32."
    )
    subs[kind] = block.strip() + "\n"
    if "CUDA" not in subs:
        subs["CUDA"] = (
            "Pending: no GPU in the session that wrote this section; run `python bench/strategies.py "
            "--write-results` on a CUDA machine.\n"
        )
    body = f"{title}\n\n{intro}\n\n" + "\n".join(f"### {k}\n\n{subs[k].strip()}\n" for k in ("CUDA", "CPU")) + "\n"
    if m:
        text = text[: m.start()] + body + text[m.end() :]
    else:
        text = text.rstrip("\n") + "\n\n" + body
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--size", choices=sorted(SIZES), default=None, help="default: gpu on CUDA, cpu otherwise")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per strategy (default: one epoch)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1, help="round-robin repeats (timings on a busy machine)")
    ap.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    ap.add_argument("--only", nargs="*", default=None, help="a subset of the strategies")
    ap.add_argument("--write-results", action="store_true", help="update bench/RESULTS.md (this device's table)")
    args = ap.parse_args()

    from nbtrainer._setup._precision import resolve_device

    device = resolve_device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = args.size or ("gpu" if device.type == "cuda" else "cpu")
    cfg = SIZES[size]
    train, val = make_data(cfg)
    half = "fp16" if device.type == "cuda" else "bf16"
    plan = {**STRATEGIES, f"all ({half}+ckpt+accum4+adafactor)": {"precision": f"{half}-mixed", **ALL}}
    strategies = {k: v for k, v in plan.items() if not args.only or k in args.only}
    params = sum(p.numel() for p in Encoder(**cfg).parameters())
    print(f"{environment(device)}\nmodel: {params / 1e6:.2f}M params, size {size}: {cfg}", flush=True)

    def show(row):
        state = (
            row["reason"]
            if row["status"] != "ok"
            else (f"{row['step_time_s'] * 1e3:.1f} ms/step, loss {row['final_loss']:.3f}")
        )
        print(f"  {row['name']}: {state}", flush=True)

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    start = time.perf_counter()
    table = compare_strategies(
        lambda: Encoder(**cfg),
        functools.partial(torch.optim.AdamW, lr=1e-3),
        nn.CrossEntropyLoss(),
        train,
        val,
        strategies,
        steps=args.steps,
        warmup=args.warmup,
        repeats=args.repeats,
        device=device,
        metric="val_acc",
        on_row=show,
    )
    wall = time.perf_counter() - start
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(table)
    load = (
        ""
        if load_before is None or load_after is None
        else f" Load average {load_before:.1f} before and {load_after:.1f} after the run on {os.cpu_count()} cores"
        + (": the machine was shared with other jobs, so the time ratios are rough." if load_after > 1 else ".")
    )
    steps = table.settings["steps"] or f"1 epoch ({len(train)} steps)"
    block = (
        f"Machine: {environment(device)}.\n"
        f"Model: {params / 1e6:.2f}M-parameter encoder (`--size {size}`: d_model {cfg['d_model']}, "
        f"{cfg['layers']} layers, {cfg['heads']} heads, sequence {cfg['seq']}, batch {cfg['batch']}); "
        f"{steps} per strategy, warm-up {args.warmup}, repeats {args.repeats}; AdamW lr 1e-3 "
        f"(adafactor lr 1e-2); {wall:.0f} s in all.{load}\n\n" + table.to_markdown()
    )
    # computed on every device, so that the dry run on the CPU walks the lookups the CUDA run makes
    checks = published_checks(table)
    if device.type == "cuda" and checks:
        block += "\n\nAgainst the published expectations: " + "; ".join(checks) + "."
    print("\n" + block)
    if args.write_results:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
        write_results(path, "CUDA" if device.type == "cuda" else "CPU", block)
        print(f"wrote {path}")


def published_checks(table: Any) -> list[str]:
    """The seed's published expectations, for the rows this run has (``--only`` may leave any of them out)."""
    have = set(table.names)
    if "fp32" not in have:
        return []
    checks = []
    for name in ("fp16-mixed", "bf16-mixed"):
        if name in have and table[name]["status"] == "ok":
            checks.append(f"{name} step time {table[name]['step_time_ratio']:.0%} of fp32 (expected < 60%)")
    if "checkpointing" in have and table["checkpointing"]["status"] == "ok":
        ratio = table["checkpointing"]["peak_memory_ratio"]
        checks.append(f"checkpointing peak memory {ratio:.0%} of fp32 (expected <= ~55%)")
    return checks


if __name__ == "__main__":
    main()
