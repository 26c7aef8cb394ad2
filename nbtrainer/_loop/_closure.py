"""Optimizers whose ``step`` takes a closure (``torch.optim.LBFGS``): the Trainer builds it for each batch.

A closure optimizer evaluates the loss and its gradient as many times as it needs inside one ``step(closure)``.
:class:`ClosureStep` makes the closure a hand loop would write (``zero_grad``, forward and loss under the
precision's autocast, ``backward``, clipping) and the loop hands it to the optimizer at the step. The first
evaluation is the batch's: its loss goes to the History (copied into a device tensor, no sync), its outputs to the
metrics, and on the first batch of a run it takes the staged checks. :func:`check_closure` refuses, before any step,
what cannot be combined with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import batch_size_of

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["ClosureStep", "check_closure", "needs_closure"]


def needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` requires a closure (``LBFGS``), from its signature."""
    step = getattr(type(optimizer), "step", None)
    if optimizer is None or step is None:
        return False
    try:
        param = inspect.signature(step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


def check_closure(
    optimizer: Any,
    *,
    grad_accum_steps: int,
    precision: str,
    optimizer_in_backward: bool,
    on_nonfinite: str,
    memory_budget: bool,
) -> None:
    """Raise ``ValueError`` for what a closure optimizer cannot be combined with, naming the fix."""
    if not needs_closure(optimizer):
        return
    name = type(optimizer).__name__
    problems = [
        (optimizer_in_backward, "optimizer_in_backward=True (the step evaluates the loss itself, several times)"),
        (grad_accum_steps != 1, f"grad_accum_steps={grad_accum_steps} (each step re-evaluates one batch)"),
        (precision == "fp16-mixed", "fp16-mixed (GradScaler does not take closures; use bf16-mixed or fp32)"),
        (on_nonfinite != "raise", f"on_nonfinite={on_nonfinite!r} (the step runs before a loss can be checked)"),
        (memory_budget, "memory_budget_gb (its plan may split batches; give the switches yourself)"),
    ]
    for bad, what in problems:
        if bad:
            raise ValueError(
                f"{name} takes a closure in step(); it cannot be combined with {what}. Remove that option."
            )


class ClosureStep:
    """The closure of one batch (see the module docstring); :meth:`prepare` returns the batch's loss holder."""

    def __init__(self, host: LoopHost, params: list[torch.Tensor]) -> None:
        self.host, self.params = host, params

    def prepare(self, batch: Any, first: bool, amp: Any, metrics: Any) -> tuple[torch.Tensor, int, Callable[[], Any]]:
        """``(loss of the first evaluation, filled when the step runs; batch size; the closure)``."""
        t = self.host
        opt, steps, params = t.optimizer, t.batch_steps, self.params
        assert opt is not None  # a fit runs only with an optimizer
        holder = torch.zeros((), device=t.device)
        state = {"calls": 0}

        def closure() -> torch.Tensor:
            opt.zero_grad(set_to_none=True)
            initial = state["calls"] == 0
            state["calls"] += 1
            with torch.enable_grad(), amp:
                if first and initial:
                    loss, outputs, targets = steps.first_compute(batch)
                else:
                    loss, outputs, targets = steps.compute(batch)
            if first and initial:
                steps.check_first_loss(loss, outputs, targets)
            loss.backward()
            max_norm = t.options.step.max_grad_norm
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, max_norm)
            if initial:
                holder.copy_(loss.detach())
                if metrics is not None:
                    with torch.no_grad():
                        metrics.update(outputs, targets)
                    if first:
                        metrics.check_first()
            return loss

        return holder, batch_size_of(None, batch), closure
