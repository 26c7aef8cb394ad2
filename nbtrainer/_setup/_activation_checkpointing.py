"""Activation checkpointing: find repeated blocks and wrap their forward, reversibly.

Checkpointing trades compute for memory: a wrapped block keeps only its inputs during the forward pass
and recomputes its internals during backward. We wrap with
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (the non-reentrant variant supports
keyword arguments, ``torch.autograd.grad`` and inputs that don't require grad).

The only change made to a wrapped block is an instance attribute ``forward``; ``handle.remove()``
deletes it again (or puts back an instance ``forward`` that was there before), so the model is left
exactly as it was. The wrapper is a small picklable object holding the original bound method, so
``copy.deepcopy`` of a wrapped model gives a copy whose blocks call *their own* forward.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CheckpointHandle",
    "apply_activation_checkpointing",
    "find_checkpointable_blocks",
    "strip_activation_checkpointing",
]

_MISSING = object()


def find_checkpointable_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks of ``model``: the usual unit of activation checkpointing.

    Looks at every ``nn.ModuleList`` / ``nn.Sequential`` (the model itself included) whose children
    are at least two modules of one identical type, and picks the one holding the most parameters
    (ties: the most children, then the first found).

    Args:
        model: Any module.

    Returns:
        ``[(qualified_name, block), ...]`` in order; empty when the model has no such container.

    Example:
        >>> blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3))
        >>> [name for name, _ in find_checkpointable_blocks(nn.ModuleDict({"layers": blocks}))]
        ['layers.0', 'layers.1', 'layers.2']
    """
    best: list[tuple[str, nn.Module]] = []
    best_key = (-1, -1)
    for name, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.named_children())
        if len(children) < 2 or len({type(child) for _, child in children}) != 1:
            continue
        key = (sum(p.numel() for p in container.parameters()), len(children))
        if key > best_key:
            prefix = f"{name}." if name else ""
            best, best_key = [(prefix + child_name, child) for child_name, child in children], key
    return best


class _CheckpointedForward:
    """Instance-level ``forward`` that runs the original forward under non-reentrant checkpointing."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # nothing is saved for backward: checkpointing would only cost
            return self.inner(*args, **kwargs)
        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


class CheckpointHandle:
    """What :func:`apply_activation_checkpointing` returns; ``remove()`` undoes it (also a context manager).

    Attributes:
        names: Qualified names of the wrapped blocks, in model order.
    """

    def __init__(self, wrapped: list[tuple[str, nn.Module, Any]]) -> None:
        self._wrapped = wrapped
        self.names: list[str] = [name for name, _, _ in wrapped]

    @property
    def active(self) -> bool:
        """True until :meth:`remove` has run."""
        return bool(self._wrapped)

    def remove(self) -> None:
        """Restore every wrapped block's ``forward`` exactly as it was. Idempotent."""
        for _, module, previous in reversed(self._wrapped):
            if previous is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous
        self._wrapped = []

    def __enter__(self) -> CheckpointHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        state = "active" if self.active else "removed"
        return f"CheckpointHandle({len(self.names)} blocks, {state})"


def _select(model: nn.Module, blocks: bool | Sequence[type[nn.Module] | str]) -> list[tuple[str, nn.Module]]:
    if blocks is True:
        return find_checkpointable_blocks(model)
    if blocks is False or isinstance(blocks, (str, type)) or not isinstance(blocks, Iterable):
        raise TypeError("blocks must be True or a list of module types and/or qualified module names")
    types = tuple(b for b in blocks if isinstance(b, type))
    names = [b for b in blocks if isinstance(b, str)]
    if len(types) + len(names) != len(blocks):
        raise TypeError("blocks must be True or a list of module types and/or qualified module names")
    chosen: dict[str, nn.Module] = {name: model.get_submodule(name) for name in names}
    if types:
        for name, module in model.named_modules():
            if name and isinstance(module, types):
                chosen.setdefault(name, module)
    # Keep outermost only: checkpointing inside a checkpointed block recomputes twice for nothing.
    ordered = [(n, m) for n, m in model.named_modules() if n in chosen]
    return [(n, m) for n, m in ordered if not any(n.startswith(o + ".") for o, _ in ordered if o != n)]


def apply_activation_checkpointing(
    model: nn.Module, blocks: bool | Sequence[type[nn.Module] | str] = True
) -> CheckpointHandle:
    """Wrap blocks of ``model`` with non-reentrant activation checkpointing, reversibly.

    Args:
        model: The model (changed in place until ``handle.remove()``).
        blocks: ``True`` for :func:`find_checkpointable_blocks`, or a list of module types (every
            outermost submodule of those types) and/or qualified submodule names.

    Returns:
        A :class:`CheckpointHandle`; ``handle.remove()`` restores the model exactly.

    Raises:
        ValueError: Nothing to wrap (no repeated blocks, or the types/names matched nothing).

    Example:
        >>> model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(4)])
        >>> with apply_activation_checkpointing(model) as handle:
        ...     model(torch.randn(2, 8, requires_grad=True)).sum().backward()
        >>> handle.names, "forward" in model[0].__dict__
        (['0', '1', '2', '3'], False)
    """
    selected = _select(model, blocks)
    if not selected:
        raise ValueError(
            "No blocks to checkpoint: the model has no nn.ModuleList/nn.Sequential of >= 2 identical "
            "modules. Pass blocks=[SomeBlockType] or blocks=['name.of.block', ...]."
        )
    wrapped: list[tuple[str, nn.Module, Any]] = []
    for name, module in selected:
        previous = module.__dict__.get("forward", _MISSING)
        if isinstance(previous, _CheckpointedForward):
            continue  # already checkpointed by another handle
        module.__dict__["forward"] = _CheckpointedForward(module.forward)
        wrapped.append((name, module, previous))
    return CheckpointHandle(wrapped)


def strip_activation_checkpointing(model: nn.Module) -> list[str]:
    """Remove our checkpointing wrappers from ``model`` (e.g. from a deep copy, whose handle is gone).

    Returns:
        Names of the blocks that were wrapped.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> _ = apply_activation_checkpointing(model)
        >>> strip_activation_checkpointing(model), "forward" in model[0].__dict__
        (['0', '1'], False)
    """
    names = []
    for name, module in model.named_modules():
        wrapper = module.__dict__.get("forward")
        while isinstance(wrapper, _CheckpointedForward):
            inner = wrapper.inner
            class_forward = getattr(type(module).forward, "__func__", type(module).forward)
            bound_default = (
                getattr(inner, "__self__", None) is module and getattr(inner, "__func__", None) is class_forward
            )
            if bound_default:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = inner
            names.append(name)
            wrapper = module.__dict__.get("forward")
    return names
