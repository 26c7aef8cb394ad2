"""QLoRA side by side (#22): nbtrainer's ``Trainer(quantize="nf4-dq", lora=...)`` vs the Hugging Face Trainer with
bitsandbytes and PEFT, on the same model, data and LoRA settings, in one process.

The model is a random-init Llama decoder built from a ``LlamaConfig`` and saved once (fp32) to a temporary folder;
every run loads the same weights from there (nothing is downloaded):

* ``nbtrainer``: ``LlamaForCausalLM.from_pretrained(dir)`` in fp32, then ``Trainer(model, quantize="nf4-dq",
  lora=dict(r=8, alpha=16, dropout=0.0, target_modules="all-linear"), optimizer="adamw", lr=...)``;
* ``hf``: ``from_pretrained(dir, quantization_config=BitsAndBytesConfig(load_in_4bit=True, nf4, double quant,
  compute dtype fp32))``, ``peft.prepare_model_for_kbit_training`` and ``get_peft_model(LoraConfig(r=8,
  lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))``, ``transformers.Trainer`` on the CPU. The
  settings that differ by default are made equal: no gradient clipping (HF clips at 1.0 by default), a constant
  LR (HF decays it linearly), AdamW's weight decay 0.01 (torch's default, which nbtrainer keeps; HF's is 0), fused
  AdamW on both;
* ``hf+ckpt``: the same, with the gradient checkpointing that ``prepare_model_for_kbit_training`` turns on by
  default (the usual QLoRA recipe: less activation memory, a recomputed forward). ``hf`` passes
  ``use_gradient_checkpointing=False``, so it and ``nbtrainer`` keep the same activations: that pair is the fair
  comparison of time per step.

Measured for each: parameter memory (every parameter and buffer as stored, plus the bitsandbytes quant states:
block scales, their second-level scales and code books; one function for all, storages counted once), trainable
parameters, the time of each optimizer step (a callback on each side: step start to step end, forward, backward
and optimizer step, median over the steps after ``--warmup``), and the loss over the run. Each round builds
every variant afresh and runs them in a rotated order, so the load of a shared machine falls on all alike.

Usage: ``python bench/qlora_vs_hf.py [--hidden 512 --layers 8 --vocab 8000 --seq 256 --batch 4 --steps 10
--warmup 2 --rounds 3 --lr 1e-3]`` (threads: torch's default unless OMP_NUM_THREADS is set).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_line

from nbtrainer import Trainer

LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": "all-linear"}
VARIANTS = ["hf", "hf+ckpt"]


def save_model(args: argparse.Namespace, folder: str) -> None:
    from memory_switches import llama  # the same random-init decoder the memory bench trains

    model: Any = llama(args)  # a LlamaForCausalLM (typed as the nn.Module it is)
    model.save_pretrained(folder)


def samples(args: argparse.Namespace, n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` sequences that count up from a random start (learnable), as in bench/memory_switches.py."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, args.vocab, (n, 1), generator=g)
    ids = (start + torch.arange(args.seq)) % args.vocab
    return [{"input_ids": row, "labels": row} for row in ids]


def parameter_bytes(model: torch.nn.Module) -> int:
    """Every parameter and buffer as stored (a 4-bit weight is its packed uint8 storage) plus the quant states
    bitsandbytes keeps beside a 4-bit weight (absmax, code book, and with double quantization their own
    scales and code book); each storage counted once."""
    seen: dict[int, int] = {}

    def add(t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()

    for t in [*model.parameters(), *model.buffers()]:
        add(t)
        state = getattr(t, "quant_state", None)
        while state is not None:
            for value in vars(state).values():
                if isinstance(value, torch.Tensor):
                    add(value)
            state = getattr(state, "state2", None)
    return sum(seen.values())


def halves(losses: list[float]) -> list[float]:
    """The mean loss of the first and of the second half of the steps (what HF logs with logging_steps=N/2)."""
    half = len(losses) // 2
    return [statistics.mean(losses[:half]), statistics.mean(losses[half : 2 * half])]


def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class NbSteps:
    """nbtrainer callback: wall time from a batch's start to its end (forward, backward, optimizer step) and the
    step's loss (kept as the detached tensor the trainer passes; read once the run is over)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.losses: list[torch.Tensor] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer: Any, **_: object) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, loss: torch.Tensor | None = None, **_: object) -> None:
        self.times.append(time.perf_counter() - self._t)
        if loss is not None:
            self.losses.append(loss)


class Ours:
    """nbtrainer's QLoRA run, one optimizer step per :meth:`step` (a ``fit`` of one batch), so that its steps
    can alternate with the Hugging Face Trainer's."""

    def __init__(self, args: argparse.Namespace, folder: str, data: list) -> None:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32)
        self.timer = NbSteps()
        self.trainer = Trainer(
            model,
            None,
            "adamw",
            lr=args.lr,
            quantize="nf4-dq",
            lora=dict(LORA),
            progress=False,
            seed=0,
            callbacks=[self.timer],
        )
        self.batches = [
            {k: torch.stack([s[k] for s in data[i : i + args.batch]]) for k in ("input_ids", "labels")}
            for i in range(0, len(data), args.batch)
        ]
        self.done = 0

    def step(self) -> None:
        batch = self.batches[self.done % len(self.batches)]
        self.trainer.fit([batch], epochs=1, max_steps=1)
        self.done += 1

    def result(self) -> dict[str, Any]:
        return {
            "times": self.timer.times,
            "losses": halves([float(x) for x in self.timer.losses]),
            "param_bytes": parameter_bytes(self.trainer.model),
            "trainable": trainable(self.trainer.model),
        }


def run_pair(args: argparse.Namespace, folder: str, data: list, checkpointing: bool) -> tuple[dict, dict]:
    """The Hugging Face Trainer's run, with one step of a fresh nbtrainer run after each of its steps (outside
    both timed spans): the two alternate step by step, so the machine's load hits both alike."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import (
        BitsAndBytesConfig,
        LlamaForCausalLM,
        TrainerCallback,
        TrainingArguments,
    )
    from transformers import (
        Trainer as HFTrainer,
    )

    ours = Ours(args, folder, data)
    base = LlamaForCausalLM.from_pretrained(
        folder,
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        ),
        device_map="cpu",
        dtype=torch.float32,
    )
    base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=checkpointing)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)  # LORA's values
    model = get_peft_model(base, config)
    times: list[float] = []
    losses: list[float] = []

    class Alternate(TrainerCallback):
        def __init__(self) -> None:
            self.t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t)
            ours.step()

        def on_log(self, *a: Any, logs: dict | None = None, **k: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_steps=max(1, args.steps // 2),  # two means: the first and second half of the run
            dataloader_num_workers=0,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.01,
            max_grad_norm=0.0,
            optim="adamw_torch_fused",
            disable_tqdm=True,
            seed=0,
        )
        HFTrainer(model=model, args=targs, train_dataset=data, callbacks=[Alternate()]).train()
    theirs = {"times": times, "losses": losses, "param_bytes": parameter_bytes(model), "trainable": trainable(model)}
    return ours.result(), theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (
        ("hidden", 512),
        ("layers", 8),
        ("vocab", 8000),
        ("seq", 256),
        ("batch", 4),
        ("steps", 10),
        ("warmup", 2),
        ("rounds", 3),
        ("intermediate", 1376),  # Llama's MLP width for hidden 512: the 128 MiB fp32 reference model
    ):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--only", nargs="*", default=VARIANTS, choices=VARIANTS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    print(machine_line(torch.device("cpu")))
    libs = ", ".join(f"{p} {version(p)}" for p in ("transformers", "peft", "bitsandbytes"))
    print(
        f"# {libs}; Llama decoder: hidden {args.hidden}, MLP {args.intermediate}, {args.layers} layers, vocab "
        f"{args.vocab}, seq {args.seq}, batch {args.batch}; LoRA r=8 alpha=16 all-linear, nf4 double quant, fp32 "
        f"compute; AdamW lr {args.lr}; {args.steps} steps per run ({args.warmup} warm-up), {args.rounds} rounds"
    )
    data = samples(args, args.batch * 8)
    hf_names = [n for n in ("hf", "hf+ckpt") if n in args.only]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in ["nbtrainer", *hf_names]}
    paired: dict[str, list[float]] = {n: [] for n in hf_names}  # ours / theirs, per pair
    with tempfile.TemporaryDirectory() as folder:
        save_model(args, folder)
        for r in range(args.rounds):
            for name in hf_names[r % len(hf_names) :] + hf_names[: r % len(hf_names)]:
                ours, theirs = run_pair(args, folder, data, checkpointing=name == "hf+ckpt")
                results["nbtrainer"].append(ours)
                results[name].append(theirs)
                a, b = (statistics.median(o["times"][args.warmup :]) for o in (ours, theirs))
                paired[name].append(a / b)
                print(
                    f"  round {r + 1} vs {name:8s} nbtrainer {a:6.2f} s/step, {name} {b:6.2f} s/step: {a / b:.2f}x; "
                    f"loss (mean of each half) nbtrainer {ours['losses'][0]:.3f} -> {ours['losses'][1]:.3f}, "
                    f"{name} {theirs['losses'][0]:.3f} -> {theirs['losses'][1]:.3f}",
                    flush=True,
                )
    print()
    print(
        f"{'variant':10s} {'params MiB':>10s} {'trainable':>10s} {'s/step':>7s}  mean loss, 1st half -> 2nd half "
        "(last run)"
    )
    summary = {}
    for name, runs in results.items():
        step = statistics.median(statistics.median(o["times"][args.warmup :]) for o in runs)
        summary[name] = runs[-1] | {"step_s": step}
        s = summary[name]
        print(
            f"{name:10s} {s['param_bytes'] / 2**20:10.2f} {s['trainable']:10d} {step:7.2f}  "
            f"{s['losses'][0]:.3f} -> {s['losses'][1]:.3f}"
        )
    ours_s = summary["nbtrainer"]
    for name in hf_names:
        ratios = paired[name]
        print(
            f"nbtrainer / {name}: parameter memory {ours_s['param_bytes'] / summary[name]['param_bytes']:.3f}x, "
            f"trainable {ours_s['trainable'] / summary[name]['trainable']:.3f}x, time per step "
            f"{statistics.median(ratios):.2f}x (median of {len(ratios)} pairs: {', '.join(f'{x:.2f}' for x in ratios)})"
        )


if __name__ == "__main__":
    main()
