"""Thread-safe control of a running fit: stop, pause/resume, lr and accumulation changes, saves; and the LR
arithmetic a change of the reference LR makes (:func:`reference_lr`, :func:`rescale_lr`).

Requests come from any thread (a widget's button, a magic, a signal handler) and are applied by the
training thread at the next optimizer-step boundary. The hot loop only reads ``dirty`` (a plain
attribute) per step; the lock is taken when something was requested.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["Control", "is_plateau", "lr_parts", "reference_lr", "rescale_lr", "step_epoch_scheduler"]


class Control:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self.dirty = False  # read without the lock in the hot loop: a stale read only delays by one step
        self.stop_requested = False
        self.stop_reason: str | None = None
        self._pending: dict[str, Any] = {}
        self._calls: list[tuple[Callable[[], Any], Future]] = []

    # -- requests (any thread) ---------------------------------------------------------------
    def request_stop(self, reason: str = "requested") -> None:
        with self._lock:
            if not self.stop_requested:
                self.stop_requested = True
                self.stop_reason = reason
            self.dirty = True
        self._resume.set()  # a paused run must wake up to stop

    def pause(self) -> None:
        with self._lock:
            self._resume.clear()
            self._pending["pause"] = True
            self.dirty = True

    def resume(self) -> None:
        with self._lock:
            self._pending["pause"] = False
            self.dirty = True
        self._resume.set()

    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    def set(self, key: str, value: Any) -> None:
        with self._lock:
            self._pending[key] = value
            self.dirty = True

    def peek(self, key: str) -> Any:
        """The value requested for ``key`` and not applied yet (None: none)."""
        with self._lock:
            return self._pending.get(key)

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Run ``fn`` on the training thread at the next step boundary; returns a Future."""
        fut: Future = Future()
        with self._lock:
            self._calls.append((fn, fut))
            self.dirty = True
        return fut

    # -- the training thread -------------------------------------------------------------------
    def take(self) -> tuple[dict[str, Any], list[tuple[Callable[[], Any], Future]]]:
        with self._lock:
            pending, calls = self._pending, self._calls
            self._pending, self._calls = {}, []
            self.dirty = self.stop_requested
        return pending, calls

    def wait_while_paused(self, poll: float = 0.1) -> None:
        while not self._resume.wait(poll):
            if self.stop_requested or self._calls:
                return

    def reset(self) -> None:
        with self._lock:
            self.stop_requested = False
            self.stop_reason = None
            self._pending.clear()
            for _, fut in self._calls:
                fut.cancel()
            self._calls.clear()
            self.dirty = False
        self._resume.set()


# -- LR arithmetic: what a set_lr request does to the optimizer and its schedule -------------------------------
def reference_lr(optimizer: Any) -> float:
    """The reference learning rate: OneCycle's ``max_lr``, else the base (initial) LR of group 0."""
    group = optimizer.param_groups[0]
    return float(group.get("max_lr", group.get("initial_lr", group["lr"])))


def rescale_lr(optimizer: Any, scheduler: Any, factor: float) -> None:
    """Multiply the LR schedule by ``factor``: current LRs and every scheduler reference value
    (``initial_lr``, OneCycle's ``max_lr``/``min_lr``, ``base_lrs``), so the schedule continues scaled."""
    for group in optimizer.param_groups:
        for key in ("lr", "initial_lr", "max_lr", "min_lr"):
            if key in group and isinstance(group[key], (int, float)):
                group[key] = group[key] * factor
    if scheduler is not None:
        if hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
        if hasattr(scheduler, "min_lrs"):
            scheduler.min_lrs = [lr * factor for lr in scheduler.min_lrs]
        if getattr(scheduler, "_last_lr", None) is not None:  # torch's own field: get_last_lr() reads it
            scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def lr_parts(optimizer: Any, scheduler: Any, name: str | None = None) -> list[tuple[Any, Any]]:
    """``(optimizer, its scheduler)`` pairs an LR change applies to: the one optimizer, or of several named ones
    (``nbtrainer._setup._optimizers.Optimizers``) the one called ``name`` (None: each)."""
    children = getattr(optimizer, "optimizers", None)
    if children is None:
        if name is not None:
            raise ValueError(f"optimizer={name!r} names one of several optimizers; this trainer has one.")
        return [(optimizer, scheduler)]
    if name is not None and name not in children:
        raise ValueError(f"optimizer={name!r}: no optimizer of that name; the optimizers are {list(children)}.")
    schedulers = getattr(scheduler, "schedulers", {}) or {}
    return [(opt, schedulers.get(n)) for n, opt in children.items() if name is None or n == name]


def is_plateau(scheduler: Any) -> bool:
    """``ReduceLROnPlateau`` steps per epoch on a logged value, whatever the scheduler interval."""
    import torch

    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def step_epoch_scheduler(scheduler: Any, monitor: str | None, logs: dict[str, Any]) -> None:
    """Step an epoch scheduler at the end of an epoch: ``ReduceLROnPlateau`` on ``monitor`` (default
    ``val_loss`` when logged, else ``loss``), any other one plainly."""
    if is_plateau(scheduler):
        key = monitor or ("val_loss" if "val_loss" in logs else "loss")
        if key not in logs:
            raise KeyError(
                f"ReduceLROnPlateau monitors {key!r}, which is not logged; set scheduler_monitor= to one of "
                f"{sorted(logs)}."
            )
        scheduler.step(logs[key])
    else:
        scheduler.step()
