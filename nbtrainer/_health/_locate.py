"""Diagnostic forwards, never on the training path: where a non-finite value first appears, and dead ReLU units.

Both run one batch the loop already had (a reference, not a copy) through the model with hooks on every module, at
a step boundary, under ``no_grad``, the trainer's autocast and a forked RNG, and put the model's buffers back
afterwards (a BatchNorm's running statistics must not learn from a diagnostic pass, least of all a NaN one). Each
hook reads its module's output on the host: that costs one device sync per module, which is why these run only
when a problem was seen (the non-finite finder) or once an epoch on one batch (dead units).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Finding", "check_batch", "dead_units", "locate_nonfinite", "nonfinite_kind"]

from nbtrainer._data._predict_collect import module_mode
from nbtrainer._health._units import RELU_TYPES

log = logging.getLogger(__name__)


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The floating-point tensors in a module's output or inputs (tuples, lists, dicts, ModelOutput, dataclasses)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def _bad(value: Any) -> str | None:
    """``"NaN"``, ``"inf"`` or None for the tensors of ``value`` (a host read per tensor: diagnostic only)."""
    for t in _tensors(value):
        t = t.detach()
        if not bool(torch.isfinite(t).all()):
            return "NaN" if bool(torch.isnan(t).any()) else "inf"
    return None


nonfinite_kind = _bad  # for the data check of a fit that on_nonfinite="raise" ended (_readings)


@dataclass
class Finding:
    """Where the diagnostic forward first met a non-finite value.

    ``where`` is ``"output"`` (the module's output, its inputs and weights finite: this module made it),
    ``"weights"`` (the module's own parameters are non-finite: an earlier update carried it there), ``"input"``
    (a module got it as input from code of ``parent`` outside any submodule, or from the batch when ``parent`` is
    None), ``"loss"`` (the model's outputs are finite, the loss is not), ``"none"`` (the re-run was finite) or
    ``"error"`` (the re-run raised: ``detail``).
    """

    where: str
    module: str | None = None
    type: str | None = None
    value: str | None = None  # "NaN" or "inf"
    parent: str | None = None
    detail: str = ""

    def describe(self) -> str:
        m = f"{self.module} ({self.type})" if self.module is not None else ""
        if self.where == "output":
            return f"{self.value} first appears in the output of {m}"
        if self.where == "weights":
            return f"the weights of {m} are already {self.value}: an earlier update put it there"
        if self.where == "input":
            src = f"the forward of {self.parent} (outside its submodules)" if self.parent else "the batch itself"
            return f"{self.value} first appears in the input of {m}: it comes from {src}"
        if self.where == "loss":
            return f"the model's outputs are finite; the loss turns {self.value} (the criterion, or the targets)"
        if self.where == "error":
            return f"the batch could not be run again ({self.detail})"
        return "the batch gives finite values when run again (randomness such as dropout, or a transient)"


@contextlib.contextmanager
def _diagnostic(model: torch.nn.Module, train: bool) -> Iterator[None]:
    """No gradients, a forked RNG, the model's mode and buffers as they were afterwards."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    tensors = [*model.parameters(), *model.buffers()]
    devices = sorted({t.device.index or 0 for t in tensors if t.device.type == "cuda"})
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad(), module_mode(model, train):
            yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


def locate_nonfinite(
    model: torch.nn.Module, compute: Callable[[Any], tuple[Any, Any, Any]], batch: Any, autocast: Any
) -> Finding:
    """Run ``compute(batch)`` (the trainer's ``(loss, outputs, targets)``) with hooks on every module of ``model``
    and say where a non-finite value first appears (:class:`Finding`)."""
    found: list[Finding] = []
    stack: list[str] = []
    names = {m: n for n, m in model.named_modules()}

    def pre(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        name = names.get(module, "?")
        if not found:
            value = _bad((args, kwargs))
            if value is not None:
                found.append(
                    Finding("input", name or "(model)", type(module).__name__, value, stack[-1] if stack else None)
                )
        stack.append(name or "(model)")

    def post(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if stack:
            stack.pop()
        if found:
            return
        value = _bad(output)
        if value is not None:
            name = names.get(module, "?") or "(model)"
            own = _bad(list(module.parameters(recurse=False)))
            found.append(Finding("weights" if own else "output", name, type(module).__name__, own or value))

    handles = []
    for module in names:
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        with _diagnostic(model, train=True), autocast:
            loss, _outputs, _targets = compute(batch)
            if not found:
                value = _bad(loss)
                if value is not None:
                    found.append(Finding("loss", value=value))
    except Exception as exc:  # a diagnostic must never end the run
        log.debug("locating the non-finite value failed (a diagnostic never ends the run): reported", exc_info=True)
        return Finding("error", detail=f"{type(exc).__name__}: {exc}"[:200])
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else Finding("none")


def dead_units(
    model: torch.nn.Module, compute: Callable[[Any], tuple[Any, Any, Any]], batch: Any, autocast: Any
) -> dict[str, tuple[int, int]]:
    """``{module: (dead units, units)}`` over one batch, for the ReLU-family modules of ``model`` (eval mode): a
    unit (a feature of the last dimension; a channel for 4-D and 5-D outputs) is dead when it is zero for every
    sample. One host read for all of them. Health's fallback for a compiled model (``_units`` hooks the training
    forward otherwise)."""
    return check_batch(model, compute, batch, autocast)[0]


def check_batch(
    model: torch.nn.Module, compute: Callable[[Any], tuple[Any, Any, Any]], batch: Any, autocast: Any
) -> tuple[dict[str, tuple[int, int]], float]:
    """One diagnostic forward of ``batch`` with the weights as they are now: ``({module: (dead, units)}, loss)``,
    one host read for both. What Health looks at when it reports a problem, to tell whether the weights are
    damaged (units that died, a loss above the chance level)."""
    alive: dict[str, torch.Tensor] = {}

    def post(module: torch.nn.Module, args: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor) or output.ndim < 2:
            return
        dim = 1 if output.ndim >= 4 else output.ndim - 1
        on = output.detach().amax(dim=[d for d in range(output.ndim) if d != dim]) > 0
        name = names[module]
        alive[name] = on if name not in alive or alive[name].shape != on.shape else alive[name] | on

    names = {m: n for n, m in model.named_modules() if isinstance(m, RELU_TYPES) and n}
    handles = [m.register_forward_hook(post) for m in names]
    try:
        with _diagnostic(model, train=False), autocast:
            loss = compute(batch)[0]
    finally:
        for h in handles:
            h.remove()
    order = list(alive)
    parts = [torch.stack([(~alive[n]).sum(), torch.tensor(alive[n].numel(), device=alive[n].device)]) for n in order]
    fallback = loss.device if isinstance(loss, torch.Tensor) else torch.device("cpu")
    device = parts[0].device if parts else fallback
    loss_part = (
        loss.detach().float().reshape(1).to(device)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1
        else torch.tensor([math.nan], device=device)
    )
    values = torch.cat([*(p.float() for p in parts), loss_part]).tolist()  # the one host read
    dead = {name: (int(values[2 * i]), int(values[2 * i + 1])) for i, name in enumerate(order)}
    return dead, values[-1]
