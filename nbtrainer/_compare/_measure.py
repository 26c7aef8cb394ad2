"""Measuring one strategy's run: optimizer-step times, training memory off CUDA, final loss, why it failed."""

from __future__ import annotations

import copy
import math
import platform
import time
from typing import Any

import torch

from nbtrainer._data._batch import batch_size_of, move_to_device
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._profile import measure_training_memory, optimizer_factory
from nbtrainer._setup._activation_checkpointing import strip_activation_checkpointing
from nbtrainer._setup._model_setup import has_own_checkpointing

__all__ = ["StepTimer", "accuracy", "environment", "failure_reason", "final_loss", "measure_cpu_memory"]


class StepTimer:
    """Callback: wall time and samples of every optimizer step (CUDA: synchronized at each step)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.times: list[float] = []
        self.samples: list[int] = []
        self._mark = 0.0
        self._samples = 0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self._mark, self._samples = self._now(), trainer._state.samples

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        now = self._now()
        samples = trainer._state.samples
        self.times.append(now - self._mark)
        self.samples.append(samples - self._samples)
        self._mark, self._samples = now, samples


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).float().mean()


def measure_cpu_memory(trainer: Any, batch: Any, ckpt: Any) -> tuple[int, dict[str, Any]]:
    """Measured training-memory bytes of one step of ``trainer``'s setup on ``batch`` (a private copy)."""
    base = unwrap_model(trainer.model)
    work = copy.deepcopy(base).to(trainer.device)
    own = bool(ckpt) and has_own_checkpointing(base)
    note = ""
    if ckpt is True and not own:
        strip_activation_checkpointing(work)  # measure_training_memory checkpoints the same blocks itself
    elif ckpt:
        note = "checkpointing applied; recompute peak of backward not included"
    batch = move_to_device(batch, trainer.device)
    args, kwargs, targets = trainer.batch_spec.split(batch)
    if args and kwargs:
        raise ValueError("memory measurement needs positional or keyword inputs, not both")
    inputs = kwargs if kwargs else (args if len(args) != 1 else args[0])
    bs = batch_size_of(targets, batch)
    with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
        mem = measure_training_memory(
            work,
            inputs,
            device=trainer.device,
            precision=trainer.precision,
            batch_size=bs,
            make_optimizer=optimizer_factory(base, trainer.optimizer),
            criterion=trainer.criterion,
            targets=targets,
            checkpointing=ckpt is True and not own,
        )
    del work
    use_ckpt = ckpt is True and not own and mem["total_checkpointed"] is not None
    total = mem["total_checkpointed"] if use_ckpt else mem["total"]
    detail = {k: mem[k] for k in ("parameters", "buffers", "gradients", "optimizer_state", "inputs")}
    # checkpointed: what the blocks keep + the largest block's activations re-materialised in backward
    detail["activations"] = (
        mem["activations_checkpointed"] + (mem["recompute_peak"] or 0) if use_ckpt else mem["activations"]
    )
    if note:
        detail["note"] = note
    return int(total), detail


def failure_reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        text = "out of memory: " + text
    return text if len(text) <= 300 else text[:297] + "..."


def final_loss(history: Any) -> float | None:
    losses = [v for v in history.steps.get("loss", []) if v is not None]
    if losses:
        tail = losses[-max(1, math.ceil(len(losses) / 10)) :]
        return float(sum(tail) / len(tail))
    if history.epochs:
        return history.epochs[-1].get("loss")
    return None


def environment(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": name, "torch": torch.__version__, "python": platform.python_version()}
