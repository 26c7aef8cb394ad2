"""One training step's mechanics, shared by ``fit`` (``FitLoop``) and ``lr_find``.

A micro-batch's loss is divided by the size of its window and back-propagated (through the GradScaler under
fp16), under DDP's ``no_sync`` unless it closes the window. A micro-batch whose item count (the host-side size
the loop reads from shapes) differs from the window's first one is also weighted by its size over the first's,
and a window whose items total other than planned x the first's size is rescaled once at its step, so that a
mean-reduced loss's window gradient is its items' mean: one big batch of them (the last micro-batch of an epoch
is often smaller). Windows of equal micro-batches take no extra operation. The window's optimizer step then runs,
in this order: unscale (fp16), the exact rescale of a ragged window, clipping, ``on_before_optimizer_step``, the
NaN/inf gate (``on_nonfinite="skip"/"stop"``), the step (the scaler's, which may skip), ``zero_grad``, and the
per-step scheduler, never after a skipped step (the optimizer's step post-hook tells, without a device read).
The profiler's ``nbt.optimizer_step`` range wraps it. ``fit`` adds its bookkeeping around it (global step,
per-step points, ``on_optimizer_step``, deferred saves); ``lr_find`` sets the LR itself, so it steps no
scheduler and fires no events.

With ``optimizer_in_backward`` (``_in_backward``) the update happens inside ``backward``, parameter by
parameter; ``step`` then only reads the LR, tells whether anything was updated and steps the scheduler.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import batch_size_of
from nbtrainer._data._split import split_batch
from nbtrainer._loop._host import scheduler_per_step
from nbtrainer._loop._in_backward import StepInBackward

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._nonfinite import NonFiniteGuard

__all__ = ["TrainStep", "split_steps", "used_lr"]

_NULL = contextlib.nullcontext()


class TrainStep:
    """The backward and optimizer-step half of training over ``host`` (see the module docstring).

    Args:
        host: the Trainer: its model, optimizer (one object for the whole fit), scaler, callbacks and scheduler.
        nonfinite: the Trainer's NaN/inf gate.
        profiler: a ``torch.profiler.profile`` or ``None`` (then no ranges are recorded).
        events: fire ``on_before_optimizer_step``.
        schedule: step a per-step scheduler after each optimizer step that was not skipped.
    """

    def __init__(
        self,
        host: LoopHost,
        nonfinite: NonFiniteGuard,
        *,
        profiler: Any = None,
        events: bool = True,
        schedule: bool = True,
    ) -> None:
        optimizer = host.optimizer
        if optimizer is None:
            raise ValueError("A training step needs an optimizer (the Trainer was built with optimizer=None).")
        self.host, self.optimizer, self.nonfinite = host, optimizer, nonfinite
        nonfinite.bind(host.strategy, host.device)
        #: what the optimizer steps, in its order (clipping and a ragged window's rescale go over these)
        self.params: list[torch.Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        # ReduceLROnPlateau or scheduler_interval="epoch": stepped by the loop at the epoch's end, not here
        self.scheduler_per_step = schedule and scheduler_per_step(host)
        self.profiler = profiler
        self.events = events
        self.schedule = schedule
        self._stepped = False
        self._in_backward: StepInBackward | None = None
        #: a closure optimizer's closure for the next step (``nbtrainer._loop._closure``), set by the loop
        self.closure: Any = None
        #: ``training_step=``'s runner (``nbtrainer._loop._manual``): the user steps; the window only closes here
        self.manual: Any = None
        #: the total gradient norm before clipping of the step being taken (a device tensor, never read here), or
        #: None without ``max_grad_norm``: what ``nbtrainer.Health`` reports as the step's norm
        self.grad_norm: torch.Tensor | None = None
        #: each param group's LR as the last step used it, when a per-step scheduler has moved it on since (else
        #: None: the groups still hold it); ``fit`` keeps it in its loop state for the epoch's row
        self.scheduled_from: list[float] | None = None
        # the open window's first micro-batch size, and how many items its others had beyond that size each
        self._nominal = 0
        self._extra = 0

    def attach(self) -> Any:
        """Register the optimizer's step post-hook (a skipped fp16 step never calls it) and, with
        ``optimizer_in_backward``, the per-parameter update hooks; returns a handle that removes them."""
        pull = getattr(self.optimizer, "pull_parameters", None)
        if pull is not None:  # offload_optimizer: its host master copies take weights loaded since it was built
            pull()
        hooks: list[Any] = [self.optimizer.register_step_post_hook(self._on_step)]
        if self.host.options.memory.optimizer_in_backward:
            self._in_backward = StepInBackward(self.optimizer, profiled=self.profiler is not None)
            hooks.append(self._in_backward)
        return _Handles(hooks, self)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True

    def no_sync(self, closes: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP: a micro-step that does not close its window skips the gradient all-reduce (forward AND
        backward must run inside); a no-op on one device."""
        strategy = self.host.strategy
        return strategy.no_sync(self.host.model, not closes) if strategy.distributed else _NULL

    def backward(self, loss: torch.Tensor, window: int, size: int = 0, nth: int = 1) -> None:
        """Back-propagate ``loss`` as one of ``window`` micro-batches (scaled by the GradScaler under fp16):
        ``size`` items, the ``nth`` of its window (see the module docstring; ``size=0``: no weighting)."""
        nominal = self._count(size, nth)
        if nominal is None:
            scaled = loss / window if window != 1 else loss
        else:
            scaled = loss * (size / (nominal * window))
        self.propagate(scaled)

    def weigh(self, size: int, nth: int) -> float:
        """What :meth:`backward` multiplies a loss by for its size (1.0 for the window's usual size), for a caller
        that back-propagates a batch in parts (:func:`split_steps`); counts the items as backward does."""
        nominal = self._count(size, nth)
        return 1.0 if nominal is None else size / nominal

    def _count(self, size: int, nth: int) -> int | None:
        """Count a micro-batch of ``size`` items, the ``nth`` of its window; returns the window's first size when
        this one differs from it (its loss is then weighted), else None."""
        if nth == 1:
            self._nominal, self._extra = size, 0
            return None
        nominal = self._nominal
        if size == nominal or not nominal:
            return None
        self._extra += size - nominal
        return nominal

    def window_rescale(self, window: int, taken: int) -> float:
        """The factor for the gradients of a window planned as ``window`` micro-batches that closed after ``taken``:
        its losses were divided by ``window`` and weighted against its first one's size, so that the step sees its
        items' mean. 1.0 (no operation) for a full window of equal micro-batches."""
        extra = self._extra
        if not extra:  # the count's ratio alone: the same float as planned x size / (taken x size)
            return window / taken if taken != window else 1.0
        nominal = self._nominal
        return window * nominal / (taken * nominal + extra)

    def propagate(self, scaled: torch.Tensor) -> None:
        """Back-propagate a loss already divided for its window (scaled by the GradScaler under fp16)."""
        in_bwd = self._in_backward
        if in_bwd is not None:  # accumulation is refused with it: every micro-batch closes its window
            guard = self.nonfinite
            # "skip"/"stop": the window's flag, read now (the update happens during this backward), same cost
            in_bwd.arm(allowed=guard.allow_step(self.optimizer, None) if guard.gating else True)
            self._stepped = False
            try:
                scaled.backward()
            finally:
                in_bwd.disarm()
            return
        scaler = self.host.scaler
        (scaler.scale(scaled) if scaler is not None else scaled).backward()

    def step(self, rescale: float = 1.0) -> tuple[bool, Any]:
        """The optimizer step of a closed window; ``rescale`` corrects a window that ended early (its
        micro-batches were divided by the planned size). Returns ``(skipped, the LR the step used)``: see
        :func:`used_lr`."""
        host = self.host
        opt, scaler = self.optimizer, host.scaler
        if self.manual is not None:  # training_step stepped each optimizer (and its scheduler) itself
            self.scheduled_from = used = self.manual.handle.used_lrs
            lr = used_lr(opt, used)
            stepped = self.manual.window_closed(first_window=host.run_state.loop_state.global_step == 0)
            if scaler is not None:
                scaler.update()  # one scale for every optimizer of the window
            return not stepped, lr
        if self._in_backward is not None:  # updated during backward; parameters without a gradient keep none
            lr = used_lr(opt)
            opt.zero_grad(set_to_none=True)
            skipped = not self._stepped
            self._schedule(skipped)
            return skipped, lr
        r_opt = torch.profiler.record_function("nbt.optimizer_step") if self.profiler is not None else _NULL
        with r_opt:
            wait = getattr(opt, "wait_for_gradients", None)
            if wait is not None:  # offload_optimizer: gradients copied to the host during backward must land
                wait()  # first (its step waits for them anyway: no extra sync)
            closure, self.closure = self.closure, None
            if closure is not None:  # LBFGS: the gradients (clipped) come from the closure, inside the step
                self._before_step(opt)
                lr = used_lr(opt)
                self._stepped = False
                opt.step(closure)
                opt.zero_grad(set_to_none=True)
                return self._after_step(lr)
            if scaler is not None:
                scaler.unscale_(opt)
            if rescale != 1.0:
                grads = [p.grad for p in self.params if p.grad is not None]
                if grads:
                    torch._foreach_mul_(grads, rescale)
            max_norm = host.options.step.max_grad_norm
            if max_norm is not None:
                # Never read the returned norm here: that would be a sync per step (Health reads it at the refresh).
                self.grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            else:
                self.grad_norm = None
            self._before_step(opt)
            lr = used_lr(opt)
            self._stepped = False
            # on_nonfinite="skip"/"stop": a window with a non-finite loss does not update (see _nonfinite)
            guard = self.nonfinite
            allowed = guard.allow_step(opt, scaler) if guard.gating else True
            if scaler is not None:
                scaler.step(opt)  # fp16: the scaler's inf check syncs here (documented sync point 3)
                scaler.update()
            elif allowed:
                opt.step()
            opt.zero_grad(set_to_none=True)
        return self._after_step(lr)

    def _before_step(self, opt: Any) -> None:
        """``on_before_optimizer_step``: to every-step callbacks, and to scheduled ones at their step (_events)."""
        cb = self.host.callbacks
        if self.events:
            step = self.host.run_state.loop_state.global_step + 1
            if cb.has("on_before_optimizer_step") or step >= cb.next_due:
                cb.call_before_step(step, trainer=self.host, optimizer=opt)

    def _after_step(self, lr: Any) -> tuple[bool, Any]:
        skipped = not self._stepped
        self._schedule(skipped)
        return skipped, lr

    def _schedule(self, skipped: bool) -> None:
        """Step a per-step scheduler after a step that was not skipped, keeping the LRs that step used."""
        scheduler = self.host.scheduler
        if not skipped and self.scheduler_per_step and scheduler is not None:
            self.scheduled_from = [g["lr"] for g in self.optimizer.param_groups]
            scheduler.step()
        else:
            self.scheduled_from = None


def used_lr(optimizer: Any, used: list[Any] | None = None) -> Any:
    """The LR a step used, as the loop keeps it until the throttled read: group 0's, or with several param groups a list
    of every group's (``used``: the manual step's record of them). Read as they are: an LR held in a tensor becomes a
    float at the read, with the losses, never at the step."""
    groups = optimizer.param_groups
    if len(groups) == 1:
        return used[0] if used is not None else groups[0]["lr"]
    return list(used) if used is not None else [group["lr"] for group in groups]


class _Handles:
    """Removes the hooks of :meth:`TrainStep.attach` (and forgets the per-parameter ones)."""

    def __init__(self, hooks: list[Any], step: TrainStep) -> None:
        self._hooks, self._step = hooks, step

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._step._in_backward = None


def split_steps(
    host: LoopHost,
    step: TrainStep,
    batch: Any,
    window: int,
    closes: bool,
    first: bool,
    amp: Any,
    metrics: Any,
    nth: int = 1,
) -> tuple[torch.Tensor, int]:
    """One loader batch, the ``nth`` of its window, as ``host.micro_split`` forward / backward passes
    (``memory_budget_gb``'s plan): each part's loss is divided by the parts' count too and, when the rows do not
    split evenly, weighted by its rows over the parts' mean, so the window's gradient is the whole batch's for a
    mean loss. Returns the batch's mean loss (detached, on the device) and its size."""
    t = host
    parts = split_batch(batch, t.micro_split)
    rows = [batch_size_of(None, part) for part in parts]
    total = sum(rows)
    weight = step.weigh(batch_size_of(None, batch), nth)
    divisor = window * len(parts)
    even = weight == 1.0 and total == rows[0] * len(parts)
    guard = step.nonfinite
    steps = t.batch_steps
    losses: list[torch.Tensor] = []
    size = 0
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        with step.no_sync(closes and last):  # DDP: one all-reduce, on the window's last backward
            with amp:
                if first and i == 0:
                    loss, outputs, targets = steps.first_compute(part)
                    steps.check_first_loss(loss, outputs, targets)
                else:
                    loss, outputs, targets = steps.compute(part)
            if guard.gating:
                guard.observe(loss)
            if metrics is not None:
                with torch.no_grad():
                    metrics.update(outputs, targets)
                if first and i == 0:
                    metrics.check_first()
            if even:
                step.propagate(loss / divisor if divisor != 1 else loss)
            else:
                step.propagate(loss * (weight * rows[i] * len(parts) / (total * divisor)))
        losses.append(loss.detach())
        size += targets.shape[0] if type(targets) is torch.Tensor and targets.ndim else batch_size_of(targets, part)
        del loss, outputs, targets
    return torch.stack(losses).mean(), size
