"""Several named optimizers as one: ``Trainer(model, criterion, optimizer={"body": opt_a, "head": opt_b})``.

:class:`Optimizers` steps, zeroes, saves and loads its optimizers together and shows their parameter groups as one
list (the same group dicts: an LR change reaches the optimizer that owns the group), so clipping, the fp16
``GradScaler`` (one scale for all, unscaled per optimizer), the non-finite gate, accumulation and checkpoints apply
to all of them as to one optimizer. :class:`Schedulers` does the same for their schedulers
(``scheduler={"head": sched}``). A manual ``training_step`` steps them one by one by name
(``nbtrainer._loop._manual``). :func:`check_optimizers` refuses overlapping parameter sets and warns, naming them,
about trainable parameters no optimizer holds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["Optimizers", "Schedulers", "check_optimizers", "check_schedulers"]


class Optimizers(torch.optim.Optimizer):
    """Named optimizers stepped as one (see the module docstring). A ``torch.optim.Optimizer`` to the code that
    takes one (the GradScaler, clipping, checkpoints); it holds no parameter group of its own.

    Example:
        >>> body, head = nn.Linear(4, 4), nn.Linear(4, 2)
        >>> both = Optimizers({"body": torch.optim.SGD(body.parameters(), lr=0.1),
        ...                    "head": torch.optim.AdamW(head.parameters(), lr=1e-3)})
        >>> both.names, [g["lr"] for g in both.param_groups]
        (['body', 'head'], [0.1, 0.001])
    """

    def __init__(self, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        # torch's Optimizer.__init__ would build groups of its own from parameters: the children own them
        self.optimizers = dict(optimizers)
        self.defaults = {}

    @property
    def names(self) -> list[str]:
        return list(self.optimizers)

    def __getitem__(self, name: str) -> torch.optim.Optimizer:
        return self.optimizers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.optimizers)

    def items(self) -> Any:
        return self.optimizers.items()

    def named_groups(self) -> list[tuple[str, dict[str, Any]]]:
        """Each parameter group with the name of its optimizer, in :attr:`param_groups` order."""
        return [(name, g) for name, opt in self.optimizers.items() for g in opt.param_groups]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for opt in self.optimizers.values() for g in opt.param_groups]

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        raise AttributeError("Optimizers' parameter groups are its optimizers': change those.")

    @property  # type: ignore[override]
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for opt in self.optimizers.values():
            merged.update(opt.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:
        raise AttributeError("Optimizers' state is its optimizers': change those.")

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("Optimizers.step() takes no closure: step closure optimizers alone.")
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = state["optimizers"]
        for name, opt in self.optimizers.items():
            opt.load_state_dict(saved[name])

    def register_step_post_hook(self, hook: Callable[..., Any]) -> Any:
        """The hook on each optimizer (it runs once per optimizer that stepped)."""
        return _Handles([opt.register_step_post_hook(hook) for opt in self.optimizers.values()])

    def __repr__(self) -> str:
        return "Optimizers(" + ", ".join(f"{n}={type(o).__name__}" for n, o in self.optimizers.items()) + ")"


class Schedulers:
    """The schedulers of some of the named optimizers, stepped, saved and loaded as one."""

    def __init__(self, schedulers: Mapping[str, Any], optimizers: Optimizers) -> None:
        self.schedulers = dict(schedulers)
        self.optimizer = optimizers

    def step(self, *args: Any) -> None:
        for sched in self.schedulers.values():
            sched.step(*args)

    def get_last_lr(self) -> list[float]:
        return [lr for s in self.schedulers.values() for lr in s.get_last_lr()]

    def state_dict(self) -> dict[str, Any]:
        return {"schedulers": {name: s.state_dict() for name, s in self.schedulers.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, sched in self.schedulers.items():
            sched.load_state_dict(state["schedulers"][name])

    def __repr__(self) -> str:
        return "Schedulers(" + ", ".join(f"{n}={type(s).__name__}" for n, s in self.schedulers.items()) + ")"


class _Handles:
    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def check_optimizers(model: nn.Module, optimizers: Mapping[Any, Any]) -> Optimizers:
    """``optimizer={"name": opt, ...}`` checked: names, torch optimizers, no parameter in two of them; trainable
    parameters that none holds are named in a warning. Returns the :class:`Optimizers`."""
    if not optimizers:
        raise ValueError("optimizer={} names no optimizer: give {'name': torch.optim.AdamW(...), ...}.")
    owner: dict[int, str] = {}
    for name, opt in optimizers.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"optimizer= dict keys are the optimizers' names (non-empty strings), got {name!r}.")
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer={{{name!r}: ...}} is a {type(opt).__name__}; each value must be a torch.optim.Optimizer "
                "built over its part of the model, e.g. torch.optim.AdamW(model.head.parameters())."
            )
        for group in opt.param_groups:
            for p in group["params"]:
                other = owner.get(id(p))
                if other is not None and other != name:
                    names = {id(q): n for n, q in model.named_parameters()}
                    raise ValueError(
                        f"The optimizers {other!r} and {name!r} both hold the parameter {names.get(id(p), '?')!r}: "
                        "each parameter may have one optimizer. Build them over disjoint parts of the model."
                    )
                owner[id(p)] = name
    loose = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in owner]
    if loose:
        warnings.warn(
            f"{len(loose)} trainable parameter(s) have no optimizer and will not train: {loose[:8]}"
            + (" ..." if len(loose) > 8 else "")
            + ". Add them to one of the optimizers, or freeze them (freeze=[...]).",
            UserWarning,
            stacklevel=4,
        )
    return Optimizers(optimizers)


def check_schedulers(schedulers: Mapping[Any, Any], optimizers: Optimizers) -> Schedulers:
    """``scheduler={"name": sched}``: each name one of the optimizers', each scheduler bound to that optimizer."""
    for name, sched in schedulers.items():
        if name not in optimizers.optimizers:
            raise ValueError(f"scheduler={{{name!r}: ...}} names no optimizer; the optimizers are {optimizers.names}.")
        if getattr(sched, "optimizer", None) is not optimizers[name]:
            raise ValueError(
                f"The scheduler {name!r} is bound to another optimizer: build it from optimizer[{name!r}]."
            )
    return Schedulers(schedulers, optimizers)
