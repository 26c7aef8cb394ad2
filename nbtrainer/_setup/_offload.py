"""CPU offloading: ``offload_activations=True`` and ``offload_optimizer=True``.

* Activations: the tensors autograd saves during the forward go to CPU memory (pinned on CUDA, so the copy
  back during the backward is asynchronous) through ``torch.autograd.graph.save_on_cpu``. The forward is
  wrapped by a pre-hook / hook pair on the top module, so it covers whatever the model computes (a Hugging
  Face model's loss too) and nothing in the training loop changes. Gradients are bit-identical to the run
  without it: the same kernels run on the same values, only where saved tensors wait differs. On a CPU
  device it changes nothing (they are already there), and is allowed so one configuration runs anywhere.
* Optimizer state: on CUDA, torchao's ``CPUOffloadOptimizer`` keeps the parameters' fp32 master copies and
  the optimizer state in CPU RAM and runs the step there (gradients are copied to the CPU as they are
  produced). On a CPU device there is nothing to offload to, and it is refused rather than ignored. The
  adapter in ``_offload_optimizer`` gives it what torch optimizers have (step hooks, a standard state dict).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._setup._quantize import require_module

__all__ = ["ActivationOffload", "build_offload_optimizer", "check_offload_optimizer"]

# Named optimizers CPUOffloadOptimizer can run on the CPU (torch's own; the k-bit ones keep their state on the
# GPU and are small already).
_OFFLOADABLE = {name: kind.cls for name, kind in OPTIMIZERS.items() if kind.offloadable}


class ActivationOffload:
    """Hooks that run a module's forward under ``save_on_cpu``; :meth:`remove` takes them off."""

    def __init__(self, model: nn.Module, *, pin_memory: bool) -> None:
        self.pin_memory = pin_memory
        self._stack: list[Any] = []
        self._handles = [
            model.register_forward_pre_hook(self._enter),
            model.register_forward_hook(self._exit, always_call=True),
        ]

    def _enter(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():  # evaluation saves nothing: no copies
            ctx = torch.autograd.graph.save_on_cpu(pin_memory=self.pin_memory)
            ctx.__enter__()
            self._stack.append(ctx)
        else:
            self._stack.append(None)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            ctx = self._stack.pop()
            if ctx is not None:
                ctx.__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def check_offload_optimizer(device: torch.device, optimizer: Any) -> None:
    """Refuse ``offload_optimizer=True`` where it cannot work, with the reason and the fix."""
    if device.type != "cuda":
        raise ValueError(
            f"offload_optimizer=True on {device}: nothing to offload to (the optimizer state already lives in "
            "CPU RAM). Remove offload_optimizer, or train on a CUDA device."
        )
    if not isinstance(optimizer, str) or optimizer.strip().lower() not in _OFFLOADABLE:
        raise ValueError(
            f"offload_optimizer=True builds the optimizer itself, on the CPU: give it by name, one of "
            f"{sorted(_OFFLOADABLE)} (optimizer='adamw', lr=...), not {optimizer!r}. An 8-bit optimizer's state "
            "is small already: use one or the other."
        )
    require_module("torchao.optim", "offload_optimizer=True")


def build_offload_optimizer(name: str, params: Iterable[torch.Tensor], lr: float | None) -> torch.optim.Optimizer:
    """torchao's ``CPUOffloadOptimizer`` over ``params`` with the torch optimizer ``name``."""
    from nbtrainer._setup._offload_optimizer import offload_optimizer_class

    cls = getattr(torch.optim, _OFFLOADABLE[name.strip().lower()])
    kwargs: dict[str, Any] = {} if lr is None else {"lr": float(lr)}
    optimizer: torch.optim.Optimizer = offload_optimizer_class()(list(params), cls, offload_gradients=False, **kwargs)
    return optimizer
