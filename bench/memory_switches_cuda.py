"""Memory switches (#22) on a CUDA device: peak allocated memory and time per step of each switch.

A random-init Llama decoder built on the GPU from a config (nothing downloaded), the same data and seed for
every variant. Each variant trains ``--warmup`` steps (optimizer state allocated, kernels chosen), then the peak
is reset and ``--steps`` more are timed (``torch.cuda.synchronize`` around them): ``peak`` is
``torch.cuda.max_memory_allocated`` over those steps (with the fit's own per-refresh peaks), ``time / step``
their mean. Ratios are against the fp32 AdamW row of the same run.

Usage: ``python bench/memory_switches_cuda.py [--hidden 1024 --layers 16 --vocab 32000 --seq 512 --batch 8]``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_line
from memory_switches import batches, llama  # the same decoder and data as the CPU bench

from nbtrainer import Trainer

LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"}

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32 adamw": {},
    "bf16-mixed": {"precision": "bf16-mixed"},
    "activation_checkpointing": {"activation_checkpointing": True},
    "optimizer_in_backward": {"optimizer_in_backward": True},
    "checkpointing + in_backward": {"activation_checkpointing": True, "optimizer_in_backward": True},
    "adamw8bit": {"optimizer": "adamw8bit"},
    "paged_adamw8bit": {"optimizer": "paged_adamw8bit"},
    "offload_optimizer": {"offload_optimizer": True},
    "offload_activations": {"offload_activations": True},
    "attention=flash (bf16)": {"precision": "bf16-mixed", "attention": "flash"},
    "qlora nf4 (bf16)": {"precision": "bf16-mixed", "quantize": "nf4", "lora": LORA},
    "qlora nf4 + checkpointing": {
        "precision": "bf16-mixed",
        "quantize": "nf4",
        "lora": LORA,
        "activation_checkpointing": True,
    },
    "all (bf16, ckpt, in_bwd, adamw8bit)": {
        "precision": "bf16-mixed",
        "activation_checkpointing": True,
        "optimizer_in_backward": True,
        "optimizer": "adamw8bit",
    },
}


def run(args: argparse.Namespace, options: dict[str, Any], data: list) -> dict[str, Any]:
    options = {"optimizer": "adamw", **options}
    gc.collect()  # nothing of the previous variant may count in this one's peak
    if args.device == "cuda":
        torch.cuda.empty_cache()
    model = llama(args)
    cuda = args.device == "cuda"
    trainer = Trainer(
        model, None, options.pop("optimizer"), lr=1e-4, device=args.device, progress=False, seed=0, **options
    )
    trainer.fit(data, epochs=1, max_steps=args.warmup)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    history = trainer.fit(data, epochs=args.steps, max_steps=args.steps)
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / args.steps
    # the fit resets the CUDA peak at each refresh (the panel's memory chart); progress keeps the fit's peak
    peak = max(torch.cuda.max_memory_allocated(), trainer.progress.memory_peak or 0) if cuda else 0
    out = {"step_s": seconds, "peak": peak, "loss": history.steps["loss"][-1]}
    del trainer, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("hidden", 1024), ("layers", 16), ("vocab", 32000), ("seq", 512), ("batch", 8)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cuda (the measurement); cpu only smoke-tests the script")
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(machine_line(torch.device(args.device)))
    n_params = sum(p.numel() for p in llama(args).parameters())
    print(
        f"# Llama decoder: hidden {args.hidden}, MLP {args.intermediate}, {args.layers} layers, vocab {args.vocab}, "
        f"seq {args.seq}, batch {args.batch}: {n_params / 1e6:.0f} M parameters; {args.warmup} warm-up + "
        f"{args.steps} timed steps, lr 1e-4"
    )
    data = batches(args, 4)
    results: dict[str, dict[str, Any]] = {}
    for name, options in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        try:
            results[name] = run(args, dict(options), data)
        except Exception as exc:  # a variant this device cannot run: say why, go on
            traceback.print_exc(limit=3)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        r = results[name]
        line = r.get("error") or f"{r['step_s'] * 1e3:8.1f} ms/step  peak {r['peak'] / 2**20:9.1f} MiB"
        print(f"  {name:38s} {line}", flush=True)
    base = results.get("fp32 adamw", {})
    print()
    print("| variant | time / step | vs fp32 | peak allocated | vs fp32 | loss after |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | |")
            continue
        rt = f"{r['step_s'] / base['step_s']:.2f}x" if "step_s" in base else ""
        rp = f"{r['peak'] / base['peak']:.2f}x" if base.get("peak") else ""
        print(f"| {name} | {r['step_s'] * 1e3:.1f} ms | {rt} | {r['peak'] / 2**20:,.0f} MiB | {rp} | {r['loss']:.3f} |")


if __name__ == "__main__":
    main()
