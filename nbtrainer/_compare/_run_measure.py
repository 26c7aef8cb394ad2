"""Measuring one strategy's run: optimizer-step times, training memory off CUDA, final loss, why it failed."""

from __future__ import annotations

import itertools
import math
import platform
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._memory._peak import PeakTracker, track_peak

if TYPE_CHECKING:
    from nbtrainer._trainer._trainer import Trainer

__all__ = [
    "StepTimer",
    "accuracy",
    "environment",
    "failure_reason",
    "final_loss",
    "measure_step_peak",
    "stored_batches",
]


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

    def on_epoch_start(self, trainer: Trainer, epoch: int) -> None:
        self._mark, self._samples = self._now(), trainer.run_state.loop_state.samples

    def on_optimizer_step(self, trainer: Trainer, step: int, skipped: bool) -> None:
        now = self._now()
        samples = trainer.run_state.loop_state.samples
        self.times.append(now - self._mark)
        self.samples.append(samples - self._samples)
        self._mark, self._samples = now, samples


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).float().mean()


class _Batches:
    """A few stored batches as a loader (``len()``, iterated again for each epoch)."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)


class _SecondStep:
    """Callback: once the first optimizer step has made the optimizer's state, a new peak; frozen after the
    second step, so the peak is that of one steady-state step (forward, backward, optimizer step)."""

    def __init__(self, tracker: PeakTracker) -> None:
        self.tracker = tracker
        self.steps = 0

    def on_optimizer_step(self, trainer: Trainer, step: int, skipped: bool) -> None:
        self.steps += 1
        if self.steps == 1:
            self.tracker.watch(model=trainer.model, optimizer=trainer.optimizer)
            self.tracker.reset()
        elif self.steps == 2:
            self.tracker.freeze()


def measure_step_peak(
    make_trainer: Callable[[list[Any]], Any], loader: Any
) -> tuple[int, dict[str, int], dict[str, int]]:
    """The measured peak of live tensor memory over the second optimizer step of a private trainer.

    ``make_trainer(callbacks)`` builds a Trainer like the strategy's (on a copy of the model); it trains two
    steps on ``loader`` under :func:`nbtrainer._memory._peak.track_peak`. Returns ``(peak bytes, split at
    the peak by category, what stays allocated after the step by category)``.
    """
    with track_peak() as tracker:
        counter = _SecondStep(tracker)
        trainer = make_trainer([counter])
        trainer.fit(loader, None, epochs=2, max_steps=2)
    if counter.steps < 2:
        raise RuntimeError(f"only {counter.steps} optimizer step(s) ran: the peak needs two")
    del trainer
    return tracker.peak_bytes, dict(tracker.breakdown), dict(tracker.resident)


def stored_batches(loader: Any, n: int) -> _Batches:
    """The first ``n`` batches of ``loader`` (fewer when it is shorter), kept as a loader."""
    return _Batches(list(itertools.islice(iter(loader), n)))


def failure_reason(exc: BaseException) -> str:
    """The whole message on one line: our errors end with the fix, so nothing is cut."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        text = "out of memory: " + text
    return text


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


def emulated_note(device: torch.device, precision: str) -> str:
    """Why a half precision is slow on this CPU ("" when it runs natively or off the CPU)."""
    if device.type != "cpu" or precision not in ("fp16-mixed", "bf16-mixed", "fp16-true", "bf16-true"):
        return ""
    half = precision.split("-")[0]
    probe = {"fp16": "_is_mkldnn_fp16_supported", "bf16": "_is_mkldnn_bf16_supported"}[half]
    try:
        native = bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):
        native = False
    if native:
        return ""
    return f"{half} on this CPU is emulated (no native {half} matrix kernels): slower than fp32, compare its memory"
