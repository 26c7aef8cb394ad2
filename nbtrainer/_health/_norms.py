"""Gradient norms, weight norms and update-to-weight ratios per block, on the device, at sampled steps only.

The blocks are the model's top-level children, with a repeated stack split into its items (a ``ModuleList``, or a
``Sequential`` of two or more blocks of one class: a transformer's ``encoder.layer.0``, ``encoder.layer.1``...);
parameters that sit directly on a module that was split form a block named by that module.

Cost, at a sampled step only (``Health(every_n_steps=...)``): one ``torch._foreach_norm`` over the gradients and the
weights together, a copy of the trainable weights (kept by Health as its snapshot, else freed after the step), one
more ``_foreach_norm`` over their change, and one matrix product for the total and every block of all three
(about a dozen operations whatever the model's size); the results stay on the device, as one small vector per
sample, until the refresh reads them with one ``tolist()``. The optimizer's step pre/post hooks are registered for
the sampled step alone, so the other steps pay nothing.

The gradient values are those of the step's gradients after unscaling (fp16) and the rescale of a ragged
accumulation window, *before* clipping: the total is the norm ``clip_grad_norm_`` returns (kept by the loop's
``TrainStep.grad_norm``), each block's is its clipped norm divided by torch's clip coefficient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["NormProbe", "find_blocks"]


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


def _norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each tensor's 2-norm, as one float32 vector on the first tensor's device."""
    norms: Sequence[torch.Tensor]
    try:
        norms = torch._foreach_norm(list(tensors))
    except (RuntimeError, NotImplementedError):  # a kind foreach does not take (sparse, some subclasses)
        norms = [torch.linalg.vector_norm(t) for t in tensors]
    try:
        return torch.stack(list(norms)).float()  # one device (the usual case): no per-tensor copy
    except RuntimeError:  # parameters on several devices
        device = tensors[0].device
        return torch.stack([n.to(device=device, dtype=torch.float32) for n in norms])


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
        pending: ``(step, vector)`` measured and not yet read; the vector on the device is ``[total, block...]``
            of the gradients, then of the weights, then (when the update was measured) of the update ratios.
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
        self._index = index
        self._reduce_on: dict[torch.device, torch.Tensor] = {}
        self.pending: list[tuple[int, torch.Tensor]] = []
        self.before: list[torch.Tensor] | None = None
        self._norms: list[torch.Tensor] | None = None  # the gradients' then the weights' norms, per parameter
        self._clip: tuple[torch.Tensor | None, float | None] = (None, None)

    def _reduce(self, device: torch.device) -> torch.Tensor:
        """``[n_params, 1 + blocks]``: a column of ones (the total) and each block's 0/1 membership, so the sums
        of squares of the total and of every block are one matrix product (no index_add_ or scatter, which have
        no deterministic CUDA kernel; Trainer(deterministic=True) would refuse them)."""
        matrix = self._reduce_on.get(device)
        if matrix is None:
            n = len(self.params)
            matrix = torch.zeros(n, len(self.names) + 1)
            matrix[:, 0] = 1.0
            matrix[torch.arange(n), torch.tensor(self._index) + 1] = 1.0
            matrix = self._reduce_on[device] = matrix.to(device)
        return matrix

    # -- the sampled step: before the optimizer's step, then after it ----------------------------------------
    def before_step(self, pre_clip_total: torch.Tensor | None, max_norm: float | None, ratio: bool) -> None:
        """The gradients' norms (unclipped, see the module docstring) and the weights', before the update, in one
        ``_foreach_norm`` (the optimizer may change a gradient in place); with ``ratio`` also a copy of the weights
        (:attr:`before`), for the update after it. Nothing is reduced per block yet: :meth:`after_step` does it
        once for all."""
        with torch.no_grad():
            params = self.params
            grads = [p.grad for p in params]
            present = [g for g in grads if g is not None]
            if not present:
                self._norms = None
                return
            detached = [p.detach() for p in params]
            norms = list(torch._foreach_norm(present + detached))
            if len(present) != len(params):  # a block unused this step: its gradient counts as zero
                found = iter(norms[: len(present)])
                zero = norms[0].new_zeros(())
                norms = [next(found) if g is not None else zero for g in grads] + norms[len(present) :]
            self._norms = norms
            self._clip = (pre_clip_total, max_norm)
            self.before = list(torch._foreach_mul(detached, 1.0)) if ratio else None

    def after_step(self, step: int) -> None:
        """The update of the sampled step, and every per-block value of the sample in one reduction, queued for
        the refresh (see :attr:`pending`)."""
        norms, before = self._norms, self.before
        self._norms = self.before = None
        if norms is None:
            return
        n = len(self.params)
        with torch.no_grad():
            if before is not None:
                norms = norms + list(torch._foreach_norm(torch._foreach_sub([p.detach() for p in self.params], before)))
            device = norms[0].device
            try:
                flat = torch.stack(norms)
            except RuntimeError:  # parameters on several devices
                flat = torch.stack([t.to(device) for t in norms])
            rows = (flat.float().reshape(-1, n).square() @ self._reduce(device)).sqrt()  # [total, block...] each
            grads, weights = rows[0], rows[1]
            pre_clip, max_norm = self._clip
            if pre_clip is not None and max_norm is not None:
                total = pre_clip.detach().to(grads.device, torch.float32)
                coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)  # torch's own clip coefficient
                grads = torch.cat([total.reshape(1), grads[1:] / coef])
            parts = [grads, weights]
            if before is not None:
                parts.append(rows[2] / weights.clamp_min(1e-30))
            self.pending.append((step, torch.cat(parts)))

    def unpack(self, values: list[float]) -> tuple[list[float], list[float] | None, list[float]]:
        """One pending vector read to the host: ``(grads, update ratios or None, weights)``."""
        n = len(self.names) + 1
        grads, weights = values[:n], values[n : 2 * n]
        return grads, (values[2 * n : 3 * n] if len(values) > 2 * n else None), weights

    def read(self) -> list[tuple[int, list[float], list[float] | None, list[float]]]:
        """The pending samples on the host: one ``tolist()`` for all of them (the refresh's read)."""
        pending, self.pending = self.pending, []
        if not pending:
            return []
        flat = torch.cat([v.reshape(-1).to(pending[0][1].device) for _, v in pending]).tolist()
        out: list[tuple[int, list[float], list[float] | None, list[float]]] = []
        at = 0
        for step, vector in pending:
            values = flat[at : at + vector.numel()]
            at += vector.numel()
            grads, ratios, weights = self.unpack(values)
            out.append((step, grads, ratios, weights))
        return out

    def forget(self) -> None:
        self.pending, self._norms, self.before = [], None, None


def hook_step(optimizer: Any, probe: NormProbe, before: Any, after: Any) -> list[Any]:
    """Register ``before(optimizer)`` / ``after(optimizer)`` as the optimizer's step pre / post hooks (removed by
    the caller after the one step they are for); several named optimizers: on the first of them that steps."""
    children = getattr(optimizer, "optimizers", None)
    target = optimizer if not children else next(iter(children.values()))
    if children:  # each child steps in turn: measure before the first, after the last
        last = list(children.values())[-1]
        return [
            target.register_step_pre_hook(lambda opt, args, kwargs: before(opt)),
            last.register_step_post_hook(lambda opt, args, kwargs: after(opt)),
        ]
    return [
        target.register_step_pre_hook(lambda opt, args, kwargs: before(opt)),
        target.register_step_post_hook(lambda opt, args, kwargs: after(opt)),
    ]
