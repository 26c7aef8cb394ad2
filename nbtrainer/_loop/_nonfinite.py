"""Non-finite (NaN / inf) training losses: detected without a per-step host sync.

``Trainer(on_nonfinite=...)``:

``"raise"`` (default)
    The loop already reads every micro-batch loss at the throttled refresh (``refresh_interval``), at
    the end of each epoch and before every checkpoint save; a non-finite value there raises
    :class:`NonFiniteLossError` naming the optimizer step(s) and epoch. **Extra syncs: none.** Steps
    taken between the bad loss and its detection (at most ``refresh_interval`` seconds) may have made
    the weights non-finite, but no checkpoint is ever written from them: a save reads the pending
    losses first and raises instead of writing.

``"skip"``
    Each accumulation window keeps a device-side flag (``~isfinite(loss)`` OR-ed over its micro-batches;
    never read per micro-batch). A window whose flag is set does not update anything:

    * fp16-mixed: the flag is folded into the GradScaler's own ``found_inf`` after ``unscale_``, so
      ``scaler.step`` skips the step on the inf check it makes anyway. **Extra syncs: none** (the
      scaler also backs its scale off, as for an overflow).
    * fp32 / bf16-mixed: the flag is read once per *optimizer step* (not per micro-batch) to decide
      whether to call ``optimizer.step()``. On CPU that read is not a device sync at all; on CUDA it
      is **one sync per optimizer step**, the same price fp16's scaler pays. An exactly sync-free
      skip would need a copy of the parameters and optimizer state per step (or a fused optimizer's
      ``found_inf``); we chose the read.

    Under DDP / FSDP the flag is OR-ed over the ranks (one all-reduce MAX per optimizer step, these modes only)
    before the decision: a rank whose own losses were finite holds the NaN gradients the all-reduce gave it, so
    every rank skips, or none.

    Skipped windows count in ``skipped_steps`` (history rows: a run total), are left out of the running and epoch
    loss, the scheduler does not step for them, and each is reported as a ``"nonfinite"`` history
    event with its step.

    With ``training_step=`` each ``step.step(name)`` decides on every loss ``step.backward`` got in the window so
    far: a non-finite one holds back that step and every later one of the window, while an optimizer that stepped
    before it keeps its update (and its scheduler steps). A window in which any step was held back is one skipped
    step, its logged loss is non-finite (so that it is left out and reported as above) and under DDP / FSDP each
    ``step.step`` ORs the flag over the ranks.

``"stop"``
    Like ``"skip"`` (the bad window does not update the weights, same sync cost), then the fit stops
    at the refresh that sees it (under DDP / FSDP: after the skipped step, on every rank alike, as the shared flag
    says; a refresh is wall-clock throttled per rank): status ``"stopped"`` with ``history.stop_reason`` naming
    the step range, also when that refresh is the last epoch's end or ``max_steps`` was reached first.

fp16 overflow handled by the scaler (inf gradients with a finite loss) is not a non-finite *loss*:
it is counted in ``skipped_steps`` and never raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["MODES", "NonFiniteGuard", "NonFiniteLossError"]

MODES = ("raise", "skip", "stop")


class NonFiniteLossError(FloatingPointError):
    """The training loss was NaN or inf; the message names where and what to do."""


def check_mode(mode: Any) -> str:
    if mode not in MODES:
        raise ValueError(
            f"on_nonfinite must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}. "
            "'raise' stops with an error, 'skip' skips the optimizer step of a window with a "
            "NaN/inf loss, 'stop' skips it and ends the fit."
        )
    return mode


class NonFiniteGuard:
    def __init__(self, mode: str = "raise") -> None:
        self.mode = check_mode(mode)
        self.gating = self.mode in ("skip", "stop")
        self._bad: torch.Tensor | None = None  # OR of ~isfinite(loss) over the open window (device)
        self.count = 0  # non-finite micro-batch losses seen in this fit
        self.stop_reason: str | None = None  # "stop" saw one in this fit: why the fit ends (the first sighting)
        self._strategy: Any = None  # DDP / FSDP (gating modes): each window's flag is OR-ed over the ranks
        self._device = torch.device("cpu")
        self.stop_now = False  # "stop" under DDP / FSDP: the window just closed was bad on some rank

    def reset(self) -> None:
        self._bad = None
        self.count = 0
        self.stop_reason = None
        self.stop_now = False

    def bind(self, strategy: Any, device: torch.device) -> None:
        """The placement the steps run under: distributed, a gating mode decides on every rank's flag."""
        self._strategy = strategy if strategy.distributed and self.gating else None
        self._device = device

    # -- the hot loop (gating modes only) ---------------------------------------------------------
    def observe(self, loss: torch.Tensor) -> None:
        """Fold this micro-batch's loss into the window flag: device ops only, no read."""
        bad = ~torch.isfinite(loss.detach())
        self._bad = bad if self._bad is None else self._bad | bad

    def new_window(self) -> None:
        """``training_step=``: forget the flag of the window before (it is kept across the window's steps)."""
        self._bad = None

    def allow_step(self, optimizer: torch.optim.Optimizer, scaler: Any, *, keep: bool = False) -> bool:
        """Whether ``optimizer.step()`` may run for the window that just closed (called after
        ``scaler.unscale_``). With a scaler the flag joins its ``found_inf`` and this returns True:
        ``scaler.step`` then skips on its own inf check. ``keep``: the flag stays for the window's later steps
        (``training_step=`` steps several optimizers, each after its own losses)."""
        bad = self._bad
        if not keep:
            self._bad = None
        strategy = self._strategy
        if strategy is not None:
            # every rank closes this window at the same step: the skip is decided on the flag of all of them, or a
            # rank whose own losses were finite would step with the NaN gradients the all-reduce gave it
            bad = strategy.any_rank_flag(bad, self._device)
            if self.mode == "stop" and bool(bad):  # SYNC on CUDA, as below (the fp16 scaler's path too)
                self.stop_now = True
        if bad is None:
            return True
        if scaler is not None:
            found = scaler._per_optimizer_states[id(optimizer)].get("found_inf_per_device") or {}
            if found:
                for value in found.values():
                    value.add_(bad.to(device=value.device, dtype=value.dtype))
                return True
        return not bool(bad)  # SYNC on CUDA: one per optimizer step, "skip"/"stop" only (see module doc)

    # -- at the throttled read ---------------------------------------------------------------------
    def stop_if_shared(self, step: int, epoch: int, request_stop: Callable[[str], None]) -> None:
        """``"stop"`` under DDP / FSDP, after a skipped optimizer step: when the window was bad on some rank, every
        rank requests the stop here, at this same step and with the same reason (a refresh is not aligned)."""
        if not self.stop_now:
            return
        self.stop_now = False
        if self.stop_reason is None:
            self.stop_reason = f"non-finite loss at optimizer step {step} (epoch {epoch}) on at least one rank"
        request_stop(self.stop_reason)

    def check(
        self,
        losses: list[float],
        points: list[tuple[int, float, float]],
        *,
        open_window: list[tuple[float, int]],
        epoch: int,
        global_step: int,
        history: Any,
        request_stop: Callable[[str], None],
    ) -> None:
        """Called by the loop with the host values of one flush: every micro-batch loss, the per-step points,
        the ``(loss, batch size)`` of the window still open, where the run is (``epoch`` 1-based, the steps
        done), the History that records skipped steps and the stop request of ``"stop"``."""
        if math.isfinite(sum(losses)):  # C-speed common case: no inf/nan among them
            return
        bad = [v for v in losses if not math.isfinite(v)]
        if not bad:  # finite values whose sum overflowed
            return
        self.count += len(bad)
        closed = [step for step, loss, _ in points if not math.isfinite(loss)]
        open_bad = any(not math.isfinite(v) for v, _ in open_window)
        steps = closed + ([global_step + 1] if open_bad or not closed else [])  # + the window still open
        first, last = min(steps), max(steps)
        where = f"step {first} (epoch {epoch})" + (f", and at later steps up to {last}" if last > first else "")
        kinds = sorted({"nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") for v in bad})
        what = f"{len(bad)} micro-batch loss{'es' if len(bad) > 1 else ''} {'/'.join(kinds)}"
        if self.mode == "raise":
            raise NonFiniteLossError(
                f"The training loss was non-finite first at optimizer {where}: {what}. Usual causes: a learning "
                "rate too high, log(0) or a division by zero in the loss, NaN/inf in the input data, fp16 "
                "without loss scaling. Fix the cause (lower the lr, set max_grad_norm, check the data), or "
                "pass Trainer(on_nonfinite='skip') to skip such steps or 'stop' to end the fit cleanly. "
                "Weights updated after the bad step may be non-finite; no checkpoint was written from them."
            )
        action = "skipped" if self.mode == "skip" else "skipped; stopping"
        for step in closed:  # an open window is reported when it closes (at a later read)
            history.add_event(step=step, epoch=epoch, kind="nonfinite", old=None, new=f"loss non-finite: step {action}")
        if self.mode == "stop" and self._strategy is None:  # distributed: the shared flag stops (allow_step)
            if self.stop_reason is None:
                self.stop_reason = f"non-finite loss at optimizer {where}: {what}"
            request_stop(self.stop_reason)
