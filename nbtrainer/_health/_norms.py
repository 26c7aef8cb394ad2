"""Gradient norms, weight norms and update-to-weight ratios per block, on the device, at sampled steps only.

The blocks are the model's top-level children, with a repeated stack split into its items (a ``ModuleList``, or a
``Sequential`` of two or more blocks of one class: a transformer's ``encoder.layer.0``, ``encoder.layer.1``...);
parameters that sit directly on a module that was split form a block named by that module.

Cost, at a sampled step only (``Health(every_n_steps=...)``): one ``torch._foreach_norm`` over the gradients and the
weights together, a copy of the trainable weights (kept by Health as its snapshot; else, after the step, the
weights are subtracted from it in place: a sample holds one copy of the weights, not two), and one more
``_foreach_norm`` over their change: four operations whatever the model's size (on a small model each
operation's dispatch is what costs, not its arithmetic). The per-parameter norms stay on the device until the
refresh reads them, stacked with everything else Health measured, in one ``tolist()``; the sums of squares per
block, the totals and the ratios are then host arithmetic on those few numbers. Health calls :meth:`before_step`
and :meth:`after_step` from its scheduled step events (``nbtrainer._events._stream``): the other steps pay nothing.

The gradient values are those of the step's gradients after unscaling (fp16) and the rescale of a ragged
accumulation window, *before* clipping: the total is the norm ``clip_grad_norm_`` returns (kept by the loop's
``TrainStep.grad_norm``), each block's is its clipped norm divided by torch's clip coefficient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["NormProbe", "Sample", "find_blocks", "stack_to_host"]


def _repeated(module: torch.nn.Module) -> bool:
    """A stack of blocks: a ModuleList, or a Sequential of two or more non-leaf modules of one class."""
    if isinstance(module, torch.nn.ModuleList):
        return len(module) > 0
    if isinstance(module, torch.nn.Sequential):
        items = [m for m in module.children() if any(True for _ in m.children())]
        return len(items) >= 2 and len({type(m) for m in items}) == 1
    return False


def _holds_stack(module: torch.nn.Module) -> bool:
    return any(_repeated(m) for m in module.modules())


def find_blocks(model: torch.nn.Module) -> list[tuple[str, list[torch.nn.Parameter]]]:
    """``[(qualified name, its parameters)]`` for the blocks of ``model`` (see the module docstring).

    Example:
        >>> enc = torch.nn.Module()
        >>> enc.layer = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(2, 2)) for _ in range(2)])
        >>> model = torch.nn.Sequential()
        >>> model.add_module("encoder", enc); model.add_module("head", torch.nn.Linear(2, 1))
        >>> [name for name, _ in find_blocks(model)]
        ['encoder.layer.0', 'encoder.layer.1', 'head']
    """
    out: list[tuple[str, list[torch.nn.Parameter]]] = []

    def split(prefix: str, module: torch.nn.Module) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if _repeated(child):
                for item_name, item in child.named_children():
                    out.append((f"{full}.{item_name}", list(item.parameters())))
            elif _holds_stack(child):
                split(f"{full}.", child)
            else:
                out.append((full, list(child.parameters())))
        own = list(module.parameters(recurse=False))
        if own:
            out.append((prefix.rstrip(".") or "(model)", own))

    if _repeated(model) or not any(True for _ in model.children()):
        out.extend((name, list(m.parameters())) for name, m in model.named_children())
        own = list(model.parameters(recurse=False))
        if own:
            out.append(("(model)", own))
    else:
        split("", model)
    return [(name, params) for name, params in out if params]


def _norms(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's 2-norm, as float32 0-d tensors (one ``_foreach_norm``: one dispatch for all of them)."""
    try:
        return list(torch._foreach_norm(list(tensors), 2, dtype=torch.float32))
    except (RuntimeError, NotImplementedError, TypeError):  # a kind foreach does not take (sparse, some subclasses)
        return [torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]


@dataclass
class Sample:
    """One sampled step, as measured on the device: the per-parameter norms of the gradients (``None`` where a
    parameter had none), of the weights and of the update (``None`` when not measured), and the clipping."""

    step: int
    grads: list[torch.Tensor | None]
    weights: list[torch.Tensor]
    change: list[torch.Tensor] | None
    pre_clip: torch.Tensor | None = None
    max_norm: float | None = None

    def tensors(self) -> list[torch.Tensor]:
        """What the refresh reads of it, in order (see :meth:`NormProbe.reduce`)."""
        out = [g for g in self.grads if g is not None] + self.weights + (self.change or [])
        if self.pre_clip is not None:
            out.append(self.pre_clip.detach().float().reshape(()))
        return out


class NormProbe:
    """The blocks of one fit and their norms at the sampled steps.

    Args:
        model: the (unwrapped) model.
        params: what the optimizer steps (other parameters are left out).

    Attributes:
        names: the block names, in order (``"total"`` is not one of them: it is each vector's first value).
        params: the stepped parameters, in block order.
        before: the copy of the trainable weights taken before the sampled step (None between samples): the
            update is measured against it, and Health keeps it as its snapshot of the weights (``_snapshot``).
        pending: the :class:`Sample` s measured and not yet read.
    """

    def __init__(self, model: torch.nn.Module, params: list[torch.Tensor]) -> None:
        trainable = {id(p) for p in params}
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        index: list[int] = []
        seen: set[int] = set()
        for name, block in find_blocks(model):
            mine = [p for p in block if id(p) in trainable and id(p) not in seen]
            if not mine:
                continue
            seen.update(id(p) for p in mine)
            index.extend([len(self.names)] * len(mine))
            self.names.append(name)
            self.params.extend(mine)
        rest = [p for p in params if id(p) not in seen]  # stepped but not in the model (a criterion's own)
        if rest:
            index.extend([len(self.names)] * len(rest))
            self.names.append("(other)")
            self.params.extend(rest)
        self._index = index  # each parameter's block
        self.pending: list[Sample] = []
        self.before: list[torch.Tensor] | None = None
        self.kept_before = False  # a snapshot took :attr:`before` as its weights (Health sets it at the sample)
        self._current: Sample | None = None

    # -- the sampled step: before the optimizer's step, then after it ----------------------------------------
    def before_step(self, pre_clip_total: torch.Tensor | None, max_norm: float | None, ratio: bool) -> None:
        """The gradients' norms (unclipped, see the module docstring) and the weights', before the update, in one
        ``_foreach_norm`` (the optimizer may change a gradient in place); with ``ratio`` also a copy of the weights
        (:attr:`before`), for the update after it."""
        with torch.no_grad():
            params = self.params
            grads = [p.grad for p in params]
            present = [g for g in grads if g is not None]
            if not present:
                self._current = None
                return
            detached = [p.detach() for p in params]
            norms = _norms(present + detached)
            found = iter(norms[: len(present)])
            per_param = [next(found) if g is not None else None for g in grads]
            self._current = Sample(0, per_param, norms[len(present) :], None, pre_clip_total, max_norm)
            self.before = list(torch._foreach_mul(detached, 1.0)) if ratio else None
            self.kept_before = False

    def after_step(self, step: int) -> None:
        """The update of the sampled step; the sample is queued for the refresh (:attr:`pending`)."""
        sample, before = self._current, self.before
        self._current = self.before = None
        if sample is None:
            return
        with torch.no_grad():
            if before is not None:
                after = [p.detach() for p in self.params]
                if self.kept_before:  # a snapshot holds the copy as its weights: the change is a new tensor
                    sample.change = _norms(torch._foreach_sub(after, before))
                else:  # the copy becomes the change (its sign aside): no second copy of the weights at a sample
                    torch._foreach_sub_(before, after)
                    sample.change = _norms(before)
        sample.step = step
        self.pending.append(sample)

    def reduce(self, sample: Sample, values: list[float]) -> tuple[list[float], list[float] | None, list[float]]:
        """``(grads, update ratios or None, weights)`` as ``[total, block...]`` from a sample's values read to the
        host (in :meth:`Sample.tensors` order): sums of squares per block, on the host."""
        blocks = len(self.names)
        n = len(self.params)
        at = sum(g is not None for g in sample.grads)
        read = iter(values[:at])
        grad_sq = [(next(read) if g is not None else 0.0) ** 2 for g in sample.grads]
        weight_sq = [v * v for v in values[at : at + n]]
        at += n
        change_sq = None
        if sample.change is not None:
            change_sq = [v * v for v in values[at : at + n]]
            at += n

        def per_block(squares: list[float]) -> list[float]:
            sums = [0.0] * blocks
            for i, sq in zip(self._index, squares, strict=True):
                sums[i] += sq
            return [math.sqrt(sum(squares)), *(math.sqrt(v) for v in sums)]

        grads, weights = per_block(grad_sq), per_block(weight_sq)
        if sample.pre_clip is not None and sample.max_norm is not None:
            total = values[at]
            coef = min(sample.max_norm / (total + 1e-6), 1.0)  # torch's own clip coefficient
            grads = [total, *(g / coef for g in grads[1:])]
        ratios = None
        if change_sq is not None:
            change = per_block(change_sq)
            ratios = [c / max(w, 1e-30) for c, w in zip(change, weights, strict=True)]
        return grads, ratios, weights

    def read(self) -> list[tuple[int, list[float], list[float] | None, list[float]]]:
        """The pending samples on the host: one ``tolist()`` for all of them (the refresh's read)."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        tensors = [t for sample in pending for t in sample.tensors()]
        flat = stack_to_host(tensors)
        out = []
        at = 0
        for sample in pending:
            k = len(sample.tensors())
            out.append((sample.step, *self.reduce(sample, flat[at : at + k])))
            at += k
        return out

    def forget(self) -> None:
        self.pending, self._current, self.before = [], None, None


def stack_to_host(tensors: list[torch.Tensor]) -> list[float]:
    """Float 0-d tensors (on one device or several) as host floats, in one read: the refresh's sync."""
    if not tensors:
        return []
    try:
        return torch.stack(tensors).tolist()  # SYNC: the refresh's one read of Health's measurements
    except RuntimeError:  # several devices
        device = tensors[0].device
        return torch.stack([t.to(device) for t in tensors]).tolist()
