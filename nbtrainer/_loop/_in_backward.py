"""``Trainer(optimizer_in_backward=True)``: each parameter is updated as soon as its gradient is complete.

Backward produces gradients layer by layer, from the loss back to the input. Normally every gradient is kept
until ``optimizer.step()`` runs after the whole backward, so at the end of backward a full copy of the
trainable parameters exists as gradients. Here a hook on each parameter (``register_post_accumulate_grad_hook``)
runs the optimizer's update for that one parameter the moment its gradient is accumulated, then frees the
gradient: at most a few gradients are alive at any time, which saves about the trainable parameters' size in
memory (what PyTorch's "optimizer step in backward" recipe and torchtune's ``optimizer_in_bwd`` do).

One optimizer object stays the Trainer's optimizer: the hook calls its ``step()`` with the parameter's group
narrowed to that parameter, so schedulers, ``set_lr`` / the panel's LR control, param groups, the optimizer's
state in checkpoints and exact resume work as before. The update is the same arithmetic as a whole step for
per-parameter optimizers (AdamW, SGD, Adafactor, the 8-bit and 4-bit ones): a plain step and a step in
backward give bit-identical weights on a CPU.

What needs every gradient at once cannot work, and is refused before the first step with the reason and the
fix: ``max_grad_norm`` (the global norm), fp16's GradScaler (its inf check spans all gradients, and it may skip
the step after backward), accumulation (gradients must survive between micro-batches: nothing to save), DDP /
FSDP (they reduce gradients after backward), ``offload_optimizer`` (its own per-parameter hooks),
``on_before_optimizer_step`` callbacks (there is no moment when the gradients exist together), optimizers that
need a closure or see all parameters together (LBFGS), and paged optimizers (they synchronize the device at
every ``step()``: once per parameter here). A gradient that arrives in two parts within one backward (reentrant
activation checkpointing) stops the fit before a second update; nbtrainer's own checkpointing is non-reentrant.
``on_nonfinite="skip"/"stop"`` works: the loss is known before
its backward, so a non-finite window's gradients are dropped without an update.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["StepInBackward", "check_in_backward"]

_FIX = "Remove optimizer_in_backward=True, or {fix}."


def check_in_backward(
    *,
    optimizer: Any,
    grad_accum_steps: int,
    max_grad_norm: float | None,
    precision: str,
    distributed: bool,
    offload_optimizer: bool = False,
    callbacks: Iterable[Any] = (),
) -> None:
    """Raise ``ValueError`` naming what ``optimizer_in_backward=True`` cannot be combined with, and the fix."""

    def refuse(problem: str, fix: str) -> None:
        raise ValueError(f"optimizer_in_backward=True: {problem}. {_FIX.format(fix=fix)}")

    if optimizer is None:
        refuse("there is no optimizer to step in backward", "pass an optimizer (e.g. 'adamw')")
    if max_grad_norm is not None:
        refuse(
            f"max_grad_norm={max_grad_norm} clips by the norm of all gradients together, but each gradient is "
            "freed as soon as its parameter is updated",
            "drop max_grad_norm",
        )
    if precision == "fp16-mixed":
        refuse(
            "fp16-mixed's GradScaler checks every gradient for inf before it lets a step happen (and may skip it)",
            "use bf16-mixed, which needs no scaler",
        )
    if grad_accum_steps != 1:
        refuse(
            f"grad_accum_steps={grad_accum_steps} keeps the gradients between micro-batches, so there is nothing "
            "to free",
            "use grad_accum_steps=1 with a larger batch, or accumulation without it",
        )
    if distributed:
        refuse(
            "DDP and FSDP reduce the gradients across ranks after backward, and a parameter updated before that "
            "would diverge between ranks",
            "train on one process",
        )
    if offload_optimizer:
        refuse("offload_optimizer has its own per-parameter hooks over the same gradients", "use one of the two")
    if isinstance(optimizer, torch.optim.LBFGS):
        refuse("LBFGS re-evaluates the loss through a closure over all parameters", "use AdamW or SGD")
    name = optimizer.strip() if isinstance(optimizer, str) else type(optimizer).__name__  # by name, or an instance
    if name.lower().startswith("paged") or getattr(optimizer, "is_paged", False):
        shown = repr(name) if isinstance(optimizer, str) else name
        refuse(
            f"{shown} synchronizes the device at every step(), which would be once per parameter",
            "use optimizer='adamw8bit'",
        )
    for cb in callbacks:
        # a callback that does without the event where it never fires says so (Health: it measures nothing then)
        needs = getattr(cb, "needs_before_optimizer_step", True)
        if callable(getattr(cb, "on_before_optimizer_step", None)) and needs:
            refuse(
                f"the callback {type(cb).__name__} has on_before_optimizer_step, which reads the gradients "
                "together; here they never exist together and the event does not fire",
                "move its work to on_optimizer_step, or remove the callback",
            )


class StepInBackward:
    """The per-parameter hooks of one fit (or LR sweep) over ``optimizer``; :meth:`remove` takes them off.

    Between :meth:`arm` and the end of that backward, each trainable parameter is updated once its gradient is
    complete (or, with ``allowed=False``, its gradient is only dropped); outside, gradients accumulate as usual.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, profiled: bool = False) -> None:
        self.optimizer = optimizer
        # profile_training: each update is an nbt.optimizer_step range inside nbt.backward, where it runs
        self._range = functools.partial(torch.profiler.record_function, "nbt.optimizer_step") if profiled else None
        self._armed = False
        self._allowed = True
        self._done: set[int] = set()  # parameters handled in this backward
        self._handles: list[Any] = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(functools.partial(self._hook, group)))

    def arm(self, *, allowed: bool = True) -> None:
        """The next backward steps each parameter (``allowed``) or drops its gradient (a non-finite window)."""
        self._armed, self._allowed = True, allowed
        self._done = set()

    def disarm(self) -> None:
        self._armed = False

    def _hook(self, group: dict[str, Any], param: torch.Tensor) -> None:
        if not self._armed:
            return
        if id(param) in self._done:
            # A second accumulation in one backward (reentrant checkpointing runs a backward of its own per
            # segment): the first part was applied as if it were the whole gradient. Stop before a second update.
            raise RuntimeError(
                f"optimizer_in_backward=True: a parameter of shape {tuple(param.shape)} received its gradient in "
                "two parts in one backward (reentrant activation checkpointing, torch.utils.checkpoint(..., "
                "use_reentrant=True), does that), so it would be updated twice. Use use_reentrant=False (nbtrainer's "
                "activation_checkpointing=True does), or remove optimizer_in_backward=True."
            )
        self._done.add(id(param))
        if self._allowed:
            # The optimizer steps every parameter of a group that has a gradient; narrowing the group's list to
            # this one parameter makes step() O(1) here instead of a scan of the whole model per parameter.
            params = group["params"]
            group["params"] = [param]
            try:
                if self._range is None:
                    self.optimizer.step()
                else:
                    with self._range():
                        self.optimizer.step()
            finally:
                group["params"] = params
        param.grad = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._armed = False
