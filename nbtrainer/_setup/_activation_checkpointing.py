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

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = [
    "CheckpointHandle",
    "apply_activation_checkpointing",
    "checkpoint_count",
    "enable_activation_checkpointing",
    "find_checkpointable_blocks",
    "has_own_checkpointing",
    "is_selective",
    "selected_blocks",
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


def is_selective(value: Any) -> bool:
    """Whether ``activation_checkpointing=value`` asks for some of the blocks: an int k or a float share."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def checkpoint_count(value: Any, n_blocks: int) -> int:
    """How many of ``n_blocks`` repeated blocks ``activation_checkpointing=value`` checkpoints.

    ``True``: all; an int k: k; a float in (0, 1): that share, rounded half up, at least one.

    Raises:
        ValueError: a share outside (0, 1), k < 1, or k greater than the number of blocks.

    Example:
        >>> checkpoint_count(True, 32), checkpoint_count(8, 32), checkpoint_count(0.25, 32), checkpoint_count(0.1, 4)
        (32, 8, 8, 1)
    """
    if value is True:
        return n_blocks
    if isinstance(value, float):
        if not 0 < value < 1:
            raise ValueError(
                f"activation_checkpointing={value!r}: a share of the blocks is a float in (0, 1) (0.5: every other "
                "block); True checkpoints them all, an int k checkpoints k of them."
            )
        return min(n_blocks, max(1, math.floor(value * n_blocks + 0.5)))
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(
                f"activation_checkpointing={value}: an int is the number of blocks to checkpoint (>= 1); "
                "False turns checkpointing off."
            )
        if value > n_blocks:
            raise ValueError(
                f"activation_checkpointing={value}: the model has {n_blocks} repeated blocks, so at most "
                f"{n_blocks} can be checkpointed (True: all of them)."
            )
        return value
    raise TypeError(f"activation_checkpointing: expected True, an int or a float, got {value!r}.")


def selected_blocks(n_blocks: int, k: int) -> list[int]:
    """Which ``k`` of ``n_blocks`` blocks to checkpoint: evenly spaced, the last block among them (backward meets
    it first, so its recomputation falls where every other block's activations are still held: the peak a plan
    predicts).

    Example:
        >>> selected_blocks(8, 2), selected_blocks(8, 4), selected_blocks(5, 5)
        ([3, 7], [1, 3, 5, 7], [0, 1, 2, 3, 4])
    """
    return [(i + 1) * n_blocks // k - 1 for i in range(k)]


def no_blocks_message(model: nn.Module, value: Any) -> str:
    """The error for ``activation_checkpointing=value`` on a model without a container of repeated blocks: what
    to pass instead, with the model's own module types that could be blocks."""
    kinds = sorted(
        {type(m).__name__ for m in model.modules() if m is not model and any(True for _ in m.parameters())}
        - {"Linear", "Embedding", "LayerNorm", "Conv2d", "BatchNorm2d", "ModuleList", "Sequential", "ModuleDict"}
    )
    hint = f" (its module types: {', '.join(kinds[:8])})" if kinds else ""
    return (
        f"activation_checkpointing={value!r} picks among the model's repeated blocks, and {type(model).__name__} "
        "has none: no nn.ModuleList / nn.Sequential attribute holding >= 2 modules of one type. Hold the blocks "
        "in one (e.g. self.layers = nn.ModuleList([...])), or pass the blocks to checkpoint by type or name: "
        f"activation_checkpointing=[BlockType] or ['name.of.block', ...]{hint}."
    )


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


def _select(model: nn.Module, blocks: Any) -> list[tuple[str, nn.Module]]:
    if blocks is True:
        return find_checkpointable_blocks(model)
    if is_selective(blocks):  # k of the repeated blocks, evenly spaced
        found = find_checkpointable_blocks(model)
        if not found:
            return []
        return [found[i] for i in selected_blocks(len(found), checkpoint_count(blocks, len(found)))]
    if blocks is False or isinstance(blocks, (str, type)) or not isinstance(blocks, Iterable):
        raise TypeError("blocks must be True or a list of module types and/or qualified module names")
    items: list[Any] = list(blocks)
    types: tuple[type[nn.Module], ...] = tuple(b for b in items if isinstance(b, type))
    names = [b for b in items if isinstance(b, str)]
    if len(types) + len(names) != len(items):
        raise TypeError("blocks must be True or a list of module types and/or qualified module names")
    chosen: dict[str, nn.Module] = {}
    classes: set[str] = set()  # a module class's name ("Block", "LlamaDecoderLayer"), meant as the type
    for name in names:
        try:
            chosen[name] = model.get_submodule(name)
        except AttributeError:
            if not any(type(m).__name__ == name for _, m in model.named_modules()):
                kinds = sorted({type(m).__name__ for n, m in model.named_modules() if n})
                paths = [n for n, _ in model.named_children()]
                raise AttributeError(
                    f"{type(model).__name__} has no submodule `{name}` and no module of a class of that name: give "
                    f"qualified names (its children: {paths[:6]}), module classes, or their class names "
                    f"({kinds[:6]})."
                ) from None
            classes.add(name)
    if types or classes:
        for name, module in model.named_modules():
            if name and (isinstance(module, types) or type(module).__name__ in classes):
                chosen.setdefault(name, module)
    # Keep outermost only: checkpointing inside a checkpointed block recomputes twice for nothing.
    ordered = [(n, m) for n, m in model.named_modules() if n in chosen]
    return [(n, m) for n, m in ordered if not any(n.startswith(o + ".") for o, _ in ordered if o != n)]


def apply_activation_checkpointing(
    model: nn.Module, blocks: bool | int | float | Sequence[type[nn.Module] | str] = True
) -> CheckpointHandle:
    """Wrap blocks of ``model`` with non-reentrant activation checkpointing, reversibly.

    Args:
        model: The model (changed in place until ``handle.remove()``).
        blocks: ``True`` for :func:`find_checkpointable_blocks`; an int k or a float share in (0, 1) for that many
            of them, evenly spaced (:func:`selected_blocks`); or a list of module types (every outermost
            submodule of those types) and/or qualified submodule names.

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


# -- the Trainer's switch: a model's own (Hugging Face), else our wrapping ---------------------------------------------


def _own_switch(model: nn.Module, action: str) -> tuple[str, Any] | None:
    """The model's own ``<prefix>_checkpointing_<action>`` method: transformers >= 5 names it
    ``activation_checkpointing_*`` and deprecates ``gradient_checkpointing_*`` (a FutureWarning at each
    call), so the new name is used when the model has it and the old one otherwise."""
    for prefix in ("activation", "gradient"):
        fn = getattr(model, f"{prefix}_checkpointing_{action}", None)
        if callable(fn):
            return prefix, fn
    return None


class _OwnSwitch:
    """Handle for a model's own checkpointing switch (Hugging Face's ``activation_checkpointing_enable()``,
    or ``gradient_checkpointing_enable()`` before transformers 5).

    ``select``: only these of the repeated blocks (``(name, block)``, each with the per-layer flag
    ``gradient_checkpointing`` Hugging Face's layers carry): the switch is turned on for the model, then off on the
    other blocks, so the model's own handling of its cache under checkpointing still applies.
    """

    def __init__(self, model: nn.Module, select: list[tuple[str, nn.Module]] | None = None) -> None:
        self.model = model
        found = _own_switch(model, "enable")
        if found is None:  # pragma: no cover - has_own_checkpointing() was checked first
            raise ValueError(f"{type(model).__name__} has no checkpointing switch of its own.")
        prefix, enable = found
        self.names = [f"{type(model).__name__}.{prefix}_checkpointing_enable()"]
        try:
            enable(**{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}})
        except TypeError:  # older transformers, or a model whose switch takes no arguments
            enable()
        if select is not None:
            chosen = {id(block) for _, block in select}
            for _, block in find_checkpointable_blocks(model):
                setattr(block, "gradient_checkpointing", id(block) in chosen)  # noqa: B010  (a Module attribute)
            self.names = [name for name, _ in select]

    def remove(self) -> None:
        found = _own_switch(self.model, "disable")
        if found is not None:
            found[1]()
        self.names = []


def has_own_checkpointing(model: nn.Module) -> bool:
    """Whether the model brings its own switch (``activation_checkpointing_enable`` or
    ``gradient_checkpointing_enable``) and supports it."""
    return _own_switch(model, "enable") is not None and bool(getattr(model, "supports_gradient_checkpointing", True))


def _check_checkpointing_value(value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if is_selective(value):
        if isinstance(value, float) and not 0 < value < 1:
            checkpoint_count(value, 1)  # raises the message for a share outside (0, 1)
        if isinstance(value, int) and value < 1:
            checkpoint_count(value, 1)
        return
    if (
        isinstance(value, (str, type))
        or not isinstance(value, Sequence)
        or not all(isinstance(v, (str, type)) for v in value)
    ):
        raise TypeError(
            "activation_checkpointing= takes True, False, an int k (k of the repeated blocks), a float in (0, 1) "
            f"(that share of them) or a list of module types and/or qualified module names, got {value!r}."
        )


def _check_blocks_exist(model: nn.Module, value: Any) -> None:
    """Raise now (before anything changes) if checkpointing ``value`` would find nothing to wrap."""
    if not value or (value is True and has_own_checkpointing(model)):
        return
    if is_selective(value):
        found = find_checkpointable_blocks(model)
        if not found:
            raise ValueError(no_blocks_message(model, value))
        checkpoint_count(value, len(found))  # k greater than the number of blocks
        return
    try:
        found = _select(model, True if value is True else list(value))
    except AttributeError as exc:  # a qualified name that is not a submodule
        raise ValueError(f"activation_checkpointing: {exc}") from None
    if not found:
        raise ValueError(
            "activation_checkpointing found no blocks to checkpoint: the model has no nn.ModuleList / "
            "nn.Sequential of >= 2 identical modules, or the given types match none. Pass a list of "
            "module types or qualified names, e.g. activation_checkpointing=[MyBlock]."
        )


def enable_activation_checkpointing(model: nn.Module, value: Any) -> Any:
    """Turn activation checkpointing on; returns a handle with ``names`` and ``remove()`` (None for off).

    ``True``: the model's own switch when it has one, else the children of its largest container of
    identical blocks. An int k / a float share: that many of those blocks, evenly spaced (with the model's own
    switch, turned off on the others, when its blocks carry Hugging Face's per-layer flag). A list: those module
    types / qualified names (always our wrapping).
    """
    _check_checkpointing_value(value)
    if not value:
        return None
    if value is True and has_own_checkpointing(model):
        return _OwnSwitch(model)
    if is_selective(value):
        chosen = _select(model, value)
        if not chosen:
            raise ValueError(no_blocks_message(model, value))
        if has_own_checkpointing(model) and all(hasattr(b, "gradient_checkpointing") for _, b in chosen):
            return _OwnSwitch(model, chosen)
        return apply_activation_checkpointing(model, [name for name, _ in chosen])
    return apply_activation_checkpointing(model, True if value is True else list(value))
