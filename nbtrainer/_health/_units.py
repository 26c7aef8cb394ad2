"""Dead ReLU units and the model's output width, seen on a sampled step's own training forward.

A unit (a feature of the last dimension; a channel of a 4-D or 5-D output) of a ReLU / ReLU6 module is dead on a
step when it is zero for every sample of the step's micro-batches: it passes no gradient, so the weights that feed
it stop learning. :class:`UnitWatch` hooks the ReLU modules for the forwards of one sampled step only (armed at the
step before, removed at its own ``on_optimizer_step``: the other steps pay nothing), keeps each unit's largest
output on the device (one ``amax`` a module and forward) and counts the dead ones after the step (one reduction a
module); the counts are read at the refresh with the norms (one ``tolist()``).

The first sampled forward also tells the width of the model's output (``classes``), which with a cross-entropy
criterion gives the loss of a model that has learnt nothing: ``ln(classes)`` (``chance_level``).

Hooks added to a compiled model's modules would recompile it: Health then uses :func:`~nbtrainer._health._locate.
dead_units` (a diagnostic forward of one batch) at the end of each epoch instead.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["RELU_TYPES", "UnitWatch", "chance_level", "is_compiled"]

#: the ReLU family whose output is >= 0 and exactly zero where a unit is off
RELU_TYPES: tuple[type[torch.nn.Module], ...] = (torch.nn.ReLU, torch.nn.ReLU6)


def is_compiled(model: torch.nn.Module) -> bool:
    """``model`` is (or wraps) a ``torch.compile`` module (no dynamo imported: it cannot be)."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(dynamo, "OptimizedModule", None) if dynamo is not None else None
    while optimized is not None and isinstance(model, torch.nn.Module):
        if isinstance(model, optimized):
            return True
        inner = getattr(model, "module", None)  # DDP's wrapped module
        if not isinstance(inner, torch.nn.Module):
            return False
        model = inner
    return False


def chance_level(criterion: Any, classes: int | None) -> float | None:
    """The loss of a uniform guess over ``classes`` (``ln C``) when the criterion is a mean-reduced cross-entropy (or
    the model returns its own loss with logits, as Hugging Face models do: ``criterion=None``); else None.

    Example:
        >>> round(chance_level(torch.nn.CrossEntropyLoss(), 10), 4)
        2.3026
        >>> chance_level(torch.nn.CrossEntropyLoss(reduction="sum"), 10) is None
        True
    """
    if classes is None or classes < 2:
        return None
    if criterion is None:
        return math.log(classes)
    # ln C is the loss of one item: a sum over the batch is n times that, with n the batch's (changing) size, so
    # a summed loss that learnt well still sits far above ln C and would be told "not learning, weights damaged"
    if isinstance(criterion, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)) and criterion.reduction == "mean":
        return math.log(classes)
    return None


def _width(output: Any) -> int | None:
    """The class dimension of a model output: a tensor's dim 1, or the last dim of a ``logits`` entry."""
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        logits = output["logits"]
        return int(logits.shape[-1]) if logits.ndim >= 2 else None
    if isinstance(output, torch.Tensor) and output.ndim >= 2 and output.is_floating_point():
        return int(output.shape[1])
    return None


class UnitWatch:
    """The ReLU modules of one model and what the sampled forwards saw of them.

    Attributes:
        names: the ReLU modules, ``"name (Type)"`` order as :meth:`arm` hooks them.
        classes: the width of the model's output (after the first armed forward; None if not a class score).
        pending: ``(step, module names, dead counts on the device, unit counts)`` measured, not yet read.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.modules = [(name, m) for name, m in model.named_modules() if isinstance(m, RELU_TYPES) and name]
        self.types = {name: type(m).__name__ for name, m in self.modules}
        self.classes: int | None = None
        self._want_width = True
        self._alive: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []
        self._attached: Callable[[], bool] = lambda: True
        self.pending: list[tuple[int, list[str], list[torch.Tensor], list[int]]] = []

    def arm(self, attached: Callable[[], bool] = lambda: True) -> None:
        """Hook the next forward(s) (one sampled step's micro-batches). ``attached()`` says whether the owner still
        watches (a callback removed mid-fit): the hooks remove themselves when it does not."""
        self._attached = attached
        if self._handles:
            return
        for name, module in self.modules:
            self._handles.append(module.register_forward_hook(self._seen(name)))
        if self._want_width:
            self._handles.append(self.model.register_forward_hook(self._output))

    def feeder(self, relu: str) -> str | None:
        """The module that feeds ReLU module ``relu``: the last module with a weight matrix registered before it
        (for a model built in the order it runs: a Sequential, or layers assigned as they are used), or None."""
        last = None
        for name, module in self.model.named_modules():
            if name == relu:
                return last
            weight = getattr(module, "weight", None)
            if name and isinstance(weight, torch.Tensor) and weight.ndim >= 2:
                last = name
        return None

    def _seen(self, name: str) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if not self._attached():  # removed mid-fit: torch runs a copy of the hooks, so this is safe here
                self.forget()
                return
            if not isinstance(output, torch.Tensor) or output.ndim < 2:
                return
            dim = 1 if output.ndim >= 4 else output.ndim - 1
            with torch.no_grad():  # a ReLU's output is >= 0: its largest value is 0 exactly where a unit is off
                top = output.detach().amax(dim=[d for d in range(output.ndim) if d != dim])
            prev = self._alive.get(name)
            self._alive[name] = top if prev is None or prev.shape != top.shape else torch.maximum(prev, top)

        return hook

    def _output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.classes = _width(output)
        self._want_width = False

    def disarm(self, step: int) -> None:
        """Remove the hooks; the dead counts of what they saw are queued for the next read (on the device)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        alive, self._alive = self._alive, {}
        if not alive:
            return
        names = list(alive)
        sizes = [int(alive[n].numel()) for n in names]
        with torch.no_grad():  # one small reduction a module; read at the refresh with the norms
            counts = [(alive[n] <= 0).sum(dtype=torch.float32) for n in names]
        self.pending.append((step, names, counts, sizes))

    def forget(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._alive, self.pending = [], {}, []
