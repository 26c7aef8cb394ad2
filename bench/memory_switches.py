"""Memory switches (#22) on a random-init Llama decoder built from a config: what each one saves and what it costs.

Measured in one process on the same model, data and seed:

* QLoRA nf4 (r=8, all linear layers): the quantized layers' weight bytes vs fp32, the whole model's parameter
  bytes (packed weights, scales, code books, fp32 embeddings / norms / head, adapters) vs fp32, the optimizer
  state vs full AdamW's, and the loss over the run;
* ``adamw8bit`` (bitsandbytes): optimizer state vs AdamW's, and the weights' relative distance to AdamW's after
  the same steps;
* ``offload_activations``: gradients of one batch compared bit for bit with the plain run;
* activation checkpointing, ``optimizer_in_backward`` and both: the measured peak of live tensor memory over one
  more optimizer step through the trainer (``track_peak``) vs fp32;
* every variant's time per step next to the fp32 baseline's (median of the timed steps).

Usage: ``OMP_NUM_THREADS=1 python bench/memory_switches.py [--hidden 512 --layers 8 --vocab 8000 --seq 256
--batch 4 --steps 20 --intermediate 1376]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _rounds import machine_line

from nbtrainer import Trainer
from nbtrainer._memory._peak import track_peak
from nbtrainer._setup._quantize import quantized_weight_bytes

LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": "all-linear"}


def llama(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(  # type: ignore[call-arg]  # attn_implementation goes to PretrainedConfig
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.seq,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config)


def batches(args: argparse.Namespace, n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, args.vocab, (n * args.batch, 1), generator=g)
    ids = (start + torch.arange(args.seq)) % args.vocab  # a learnable pattern: count up from a random start
    return [
        {"input_ids": ids[i : i + args.batch], "labels": ids[i : i + args.batch]}
        for i in range(0, len(ids), args.batch)
    ]


class StepTimes:
    """Wall time of each optimizer step (a callback; the loss read is the trainer's own, throttled)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer: Trainer, **_: object) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer: Trainer, **_: object) -> None:
        self.times.append(time.perf_counter() - self._t)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if torch.is_tensor(value) and value.ndim > 0:
                total += value.numel() * value.element_size()
    return total


def model_bytes(model: torch.nn.Module) -> int:
    return sum(v.numel() * v.element_size() for v in model.state_dict().values() if torch.is_tensor(v))


def run(args: argparse.Namespace, name: str, options: dict, data: list, steps: int) -> dict:
    timer = StepTimes()
    trainer = Trainer(llama(args), None, progress=False, seed=0, callbacks=[timer], **options)
    assert trainer.optimizer is not None
    history = trainer.fit(data, epochs=-(-steps // len(data)), max_steps=steps)
    step_losses = list(history.steps["loss"])
    timed = timer.times[2:] if len(timer.times) > 4 else timer.times
    out = {
        "name": name,
        "trainer": trainer,
        "step_s": statistics.median(timed),
        "loss_first": step_losses[0],
        "loss_last": statistics.mean(step_losses[-5:]),
        "optimizer_bytes": state_bytes(trainer.optimizer),
        "model_bytes": model_bytes(trainer.model),
    }
    batch = data[0]
    # one more optimizer step through the trainer (its step: in backward with optimizer_in_backward=True)
    with track_peak(trainer.model, trainer.optimizer, inputs=batch) as peak:
        trainer.fit([batch], epochs=1)
    out["peak"] = peak.peak_bytes
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag, default in (("hidden", 512), ("layers", 8), ("vocab", 8000), ("seq", 256), ("batch", 4), ("steps", 20)):
        parser.add_argument(f"--{flag}", type=int, default=default)
    parser.add_argument("--qlora-steps", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run beside fp32 (default: all)")
    # Llama's MLP width for hidden 512 (8/3 x hidden, rounded): the reference model (128 MiB in fp32)
    parser.add_argument("--intermediate", type=int, default=1376)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))
    print(machine_line(torch.device("cpu")))
    print(
        f"# Llama decoder: hidden {args.hidden}, MLP {args.intermediate}, {args.layers} layers, vocab {args.vocab}, "
        f"seq {args.seq}, "
        f"batch {args.batch}; {args.steps} steps (QLoRA {args.qlora_steps}); lr 1e-3"
    )
    data = batches(args, 8)
    variants = {
        "fp32 adamw": {"optimizer": "adamw", "lr": 1e-3},
        "adamw8bit": {"optimizer": "adamw8bit", "lr": 1e-3},
        "offload_activations": {"optimizer": "adamw", "lr": 1e-3, "offload_activations": True},
        "activation_checkpointing": {"optimizer": "adamw", "lr": 1e-3, "activation_checkpointing": True},
        "optimizer_in_backward": {"optimizer": "adamw", "lr": 1e-3, "optimizer_in_backward": True},
        "checkpointing + in_backward": {
            "optimizer": "adamw",
            "lr": 1e-3,
            "activation_checkpointing": True,
            "optimizer_in_backward": True,
        },
        "checkpointing + chunked loss": {
            "optimizer": "adamw",
            "lr": 1e-3,
            "activation_checkpointing": True,
            "chunked_loss": 256,
        },
        "ckpt + in_backward + chunked": {
            "optimizer": "adamw",
            "lr": 1e-3,
            "activation_checkpointing": True,
            "optimizer_in_backward": True,
            "chunked_loss": 256,
        },
        "qlora nf4": {"optimizer": "adamw", "lr": 1e-3, "quantize": "nf4", "lora": LORA},
    }
    if args.only:  # the baseline always, for the ratios
        variants = {k: v for k, v in variants.items() if k == "fp32 adamw" or k in args.only}
    results = {}
    for name, options in variants.items():
        steps = args.qlora_steps if name.startswith("qlora") else args.steps
        results[name] = run(args, name, options, data, steps)
        r = results[name]
        print(f"  {name:26s} {r['step_s'] * 1e3:8.0f} ms/step  peak {r['peak'] / 2**20:7.1f} MiB", flush=True)
    base = results["fp32 adamw"]
    print()
    print(f"{'variant':26s} {'time/step':>10s} {'vs fp32':>8s} {'peak MiB':>9s} {'vs fp32':>8s}  saving")
    if args.only:  # the ratios of what ran; the full summary needs every variant
        for name, r in results.items():
            print(
                f"{name:26s} {r['step_s'] * 1e3:8.0f}ms {r['step_s'] / base['step_s']:7.2f}x "
                f"{r['peak'] / 2**20:9.1f} {r['peak'] / base['peak']:7.2f}x"
            )
        return
    q, eight = results["qlora nf4"], results["adamw8bit"]
    stored, full = quantized_weight_bytes(q["trainer"].model)
    savings = {
        "fp32 adamw": "baseline",
        "adamw8bit": f"optimizer state {eight['optimizer_bytes'] / base['optimizer_bytes']:.2f}x AdamW's",
        "offload_activations": "saved activations in CPU memory (no effect on a CPU device)",
        "activation_checkpointing": f"peak {results['activation_checkpointing']['peak'] / base['peak']:.2f}x",
        "optimizer_in_backward": "gradients freed as each parameter is updated (same weights as AdamW)",
        "checkpointing + in_backward": "saved activations and gradients",
        "checkpointing + chunked loss": "saved activations and the loss head's logits",
        "ckpt + in_backward + chunked": "saved activations, gradients and the full logits",
        "qlora nf4": (
            f"quantized weights {stored / full:.3f}x fp32, parameters {q['model_bytes'] / base['model_bytes']:.2f}x, "
            f"optimizer state {q['optimizer_bytes'] / base['optimizer_bytes']:.4f}x"
        ),
    }
    for name, r in results.items():
        print(
            f"{name:26s} {r['step_s'] * 1e3:8.0f}ms {r['step_s'] / base['step_s']:7.2f}x {r['peak'] / 2**20:9.1f} "
            f"{r['peak'] / base['peak']:7.2f}x  {savings[name]}"
        )
    print()
    print(
        f"QLoRA: parameters {q['model_bytes'] / 2**20:.1f} MiB vs fp32 {base['model_bytes'] / 2**20:.1f} MiB; "
        f"loss {q['loss_first']:.3f} -> {q['loss_last']:.3f} over {args.qlora_steps} steps"
    )
    a, b = base["trainer"].model.state_dict(), results["adamw8bit"]["trainer"].model.state_dict()
    num = sum((a[k].float() - b[k].float()).norm() ** 2 for k in a) ** 0.5
    den = sum(a[k].float().norm() ** 2 for k in a) ** 0.5
    print(f"adamw8bit after {args.steps} steps: weights within {float(num / den):.2e} relative of AdamW's")
    # gradients of one batch, with and without offloaded activations, bit for bit
    grads = []
    for offload in (False, True):
        trainer = Trainer(llama(args), None, "adamw", offload_activations=offload, progress=False)
        trainer.model(**data[0]).loss.backward()
        grads.append([p.grad for p in trainer.model.parameters()])
    same = all(torch.equal(x, y) for x, y in zip(*grads, strict=True))
    print(f"offload_activations: gradients bit-identical to the plain run: {same}")


if __name__ == "__main__":
    main()
