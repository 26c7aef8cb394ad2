"""Healthy states to go back to: copies of the weights and the optimizer state, kept in host memory by Health.

A snapshot is taken at a sampled step, just before its update, while the run looks healthy (no problem reported
since the fit started or since the last fix): the trainable weights (the copy the update ratio is measured against:
on the CPU no second copy is made), the model's buffers (a BatchNorm's running statistics) and each optimizer's
per-parameter state (momentum, Adam's moments and step). On a GPU the copies go to pinned host memory without a
wait (``non_blocking``), so a snapshot adds no host-device sync.

Bounds, so watching never costs the run its memory or its speed:

* **memory**: all kept snapshots together stay within ``Health(snapshot_mb=...)`` (default 256 MiB) and a tenth of
  the memory the system has available at the fit's start. Kept: the fit's first (the weights it started from) and
  the two newest, as many of those three as fit; a model whose state alone does not fit keeps none (the advice then
  uses the last checkpoint, or says to restart);
* **time**: a snapshot is taken only when the time since the last one is at least 200 times what the last one
  took, so copying stays under 0.5% of the run.

A problem has an onset (the step its damage began, as well as Health can tell); the state restored is the newest
snapshot taken at or before it (:meth:`Snapshots.choose`): its weights are those before that step's update.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["SPACING", "Snapshot", "Snapshots", "available_bytes"]

SPACING = 200  # a snapshot at most every SPACING times its own cost


_AVAILABLE: tuple[float, int | None] = (-1e9, None)  # (when it was read, bytes): read at most every 30 s


def available_bytes() -> int | None:
    """The memory the system has available (``MemAvailable``, read at most every 30 s: a fit's start need not pay a
    file read each time), or None where it cannot be read."""
    global _AVAILABLE
    now = time.monotonic()
    if now - _AVAILABLE[0] < 30.0:
        return _AVAILABLE[1]
    _AVAILABLE = (now, _read_available())
    return _AVAILABLE[1]


def _read_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _host(t: torch.Tensor) -> torch.Tensor:
    """A host copy that does not wait for the device (pinned memory on a GPU)."""
    t = t.detach()
    if t.device.type == "cpu":
        return t.clone()
    return t.to("cpu", non_blocking=True)


@dataclass
class _Saved:
    """An optimizer-state tensor's host copy and the device it lives on (Adam keeps ``step`` on the CPU)."""

    tensor: torch.Tensor
    device: torch.device


@dataclass
class Snapshot:
    """The weights before ``step``'s update (aligned with the probe's parameters), the buffers by name, and each
    optimizer's state by parameter index."""

    step: int
    params: list[torch.Tensor]
    buffers: dict[str, torch.Tensor]
    states: list[dict[int, dict[str, Any]]] = field(default_factory=list)
    nbytes: int = 0


def _optimizers(optimizer: Any) -> list[Any]:
    children = getattr(optimizer, "optimizers", None)
    return list(children.values()) if children else [optimizer]


class Snapshots:
    """The snapshots of one fit (see the module docstring).

    Args:
        budget: bytes all kept snapshots may hold together.

    Attributes:
        kept: the snapshots, oldest first (the fit's first, then the newest).
        off: why none are kept (``""`` while they are).
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.kept: list[Snapshot] = []
        self.off = "" if budget > 0 else "Health(snapshot_mb=0)"
        self._cost = 0.0
        self._last = -float("inf")

    def due(self) -> bool:
        """Whether one may be taken now (on, and spaced by its cost)."""
        return not self.off and time.perf_counter() - self._last >= SPACING * self._cost

    def take(
        self, step: int, params: list[torch.Tensor], copies: list[torch.Tensor] | None, model: Any, optimizer: Any
    ) -> bool:
        """Keep the state before ``step``'s update; ``copies``: the weights already copied (on the device). Returns
        whether the snapshot kept ``copies`` themselves (on the CPU), which must then stay as they are."""
        start = time.perf_counter()
        with torch.no_grad():
            if copies is not None and all(c.device.type == "cpu" for c in copies):
                weights = copies
            else:
                weights = [_host(c if copies is not None else p) for c, p in zip(copies or params, params, strict=True)]
            buffers = {name: _host(b) for name, b in model.named_buffers()}
            index = {id(p): i for i, p in enumerate(params)}
            states = []
            for opt in _optimizers(optimizer):
                state: dict[int, dict[str, Any]] = {}
                for p, values in opt.state.items():
                    i = index.get(id(p))
                    if i is not None:
                        state[i] = {
                            k: _Saved(_host(v), v.device) if isinstance(v, torch.Tensor) else v
                            for k, v in values.items()
                        }
                states.append(state)
        tensors = [*weights, *buffers.values()] + [
            v.tensor for state in states for values in state.values() for v in values.values() if isinstance(v, _Saved)
        ]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self._cost = time.perf_counter() - start
        self._last = time.perf_counter()
        if nbytes > self.budget:
            self.kept = []
            self.off = f"one copy of the weights and optimizer state ({nbytes / 2**20:.0f} MiB) exceeds the budget"
            return False
        self.kept.append(Snapshot(step, weights, buffers, states, nbytes))
        fits = max(1, min(3, self.budget // max(nbytes, 1)))
        while len(self.kept) > fits:  # keep the fit's first while three fit, else the newest
            self.kept.pop(1 if fits == 3 else 0)
        return weights is copies

    def choose(self, onset: int) -> Snapshot | None:
        """The newest snapshot taken at or before step ``onset`` (its weights are those before that step)."""
        older = [s for s in self.kept if s.step <= onset]
        return older[-1] if older else None

    def drop_after(self, step: int) -> None:
        """Forget the snapshots newer than ``step`` (they may hold the damage a restore undoes)."""
        self.kept = [s for s in self.kept if s.step <= step]

    @staticmethod
    def restore(snap: Snapshot, params: list[torch.Tensor], model: Any, optimizer: Any) -> None:
        """Put ``snap`` back into the live tensors (at a step boundary, on the training thread)."""
        with torch.no_grad():
            for p, saved in zip(params, snap.params, strict=True):
                p.copy_(saved, non_blocking=True)
            for name, b in model.named_buffers():
                saved_buffer = snap.buffers.get(name)
                if saved_buffer is not None and saved_buffer.shape == b.shape:
                    b.copy_(saved_buffer, non_blocking=True)
            for opt, state in zip(_optimizers(optimizer), snap.states, strict=False):
                for i, p in enumerate(params):
                    if i in state:
                        opt.state[p] = {
                            k: v.tensor.to(v.device, non_blocking=True, copy=True) if isinstance(v, _Saved) else v
                            for k, v in state[i].items()
                        }
                    elif p in opt.state:
                        del opt.state[p]  # it had no state then (Adam before its first step): fresh again

    def clear(self) -> None:
        self.kept = []
