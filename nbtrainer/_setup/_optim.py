"""Optimizers: the one convention for optimizers passed as arguments, and moving optimizer state.

Wherever nbtrainer builds an optimizer itself (``compare_strategies`` once per strategy, ``profile_model``
for its memory step, ``%nbtrainer compare``), it takes what a ``torch.optim`` class already is: a callable
of the parameters. ``torch.optim.AdamW``, ``functools.partial(torch.optim.AdamW, lr=1e-3)`` and
``lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)`` all work. A function of the *model*
(``lambda model: AdamW(model.parameters())``, the convention ``compare_strategies`` used before) is
recognised and refused with the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["OptimizerFn", "build_from_params", "check_optimizer_fn", "move_optimizer_state"]

#: ``params -> optimizer``: an optimizer class, a ``functools.partial`` of one, or a function of the parameters.
OptimizerFn = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

# A lone parameter with one of these names takes a model, not its parameters.
_MODEL_NAMES = frozenset({"model", "module", "net", "network"})

_EXAMPLES = (
    "torch.optim.AdamW, functools.partial(torch.optim.AdamW, lr=1e-3) or lambda params: torch.optim.AdamW(params)"
)


def _model_function(argument: str) -> str:
    return (
        f"{argument} is called with the model's parameters (torch's convention, as torch.optim classes are), "
        f"but this one expects the model (it calls .parameters() on its argument). "
        f"Pass {_EXAMPLES} instead of lambda model: torch.optim.AdamW(model.parameters())."
    )


def _lone_parameter(fn: Any) -> str | None:
    """The name of ``fn``'s only required positional parameter, if it has exactly one."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have no signature: nothing to check
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in sig.parameters.values() if p.kind in kinds and p.default is inspect.Parameter.empty]
    return required[0].name if len(required) == 1 else None


def check_optimizer_fn(optimizer: Any, *, argument: str = "optimizer") -> None:
    """Refuse, with the fix, what is not a ``params -> optimizer`` callable.

    Args:
        optimizer: what the caller passed.
        argument: its name in the error message (``"optimizer"``, ``"strategy 'sgd' optimizer"``).

    Example:
        >>> check_optimizer_fn(torch.optim.AdamW)
        >>> check_optimizer_fn(lambda model: torch.optim.AdamW(model.parameters()))
        Traceback (most recent call last):
        ...
        TypeError: optimizer is called with the model's parameters ...
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"{argument} must build a new optimizer for each model, so it is a callable of the parameters, "
            f"not an optimizer instance ({type(optimizer).__name__}). Pass {_EXAMPLES}."
        )
    if not callable(optimizer):
        raise TypeError(f"{argument} must be a callable of the parameters, got {optimizer!r}. Pass {_EXAMPLES}.")
    if _lone_parameter(optimizer) in _MODEL_NAMES:
        raise TypeError(_model_function(argument))


def build_from_params(
    optimizer: OptimizerFn, model: nn.Module, *, argument: str = "optimizer"
) -> torch.optim.Optimizer:
    """``optimizer(params)`` over ``model``'s parameters, with errors that name the fix.

    Args:
        optimizer: an optimizer class or ``params -> optimizer`` callable.
        model: the model whose parameters the optimizer updates.
        argument: the argument's name in error messages.

    Example:
        >>> import functools
        >>> opt = build_from_params(functools.partial(torch.optim.SGD, lr=0.1), nn.Linear(2, 2))
        >>> type(opt).__name__, opt.param_groups[0]["lr"]
        ('SGD', 0.1)
    """
    check_optimizer_fn(optimizer, argument=argument)
    try:
        built = optimizer(list(model.parameters()))
    except AttributeError as exc:
        # a function of the model under another name: "'list' object has no attribute 'parameters'"
        if "attribute 'parameters'" in str(exc) or "attribute 'named_parameters'" in str(exc):
            raise TypeError(_model_function(argument)) from exc
        raise
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError(f"{argument} returned {type(built).__name__}, not a torch.optim.Optimizer. Pass {_EXAMPLES}.")
    return built


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move ``optimizer``'s state tensors to ``device`` (after the model moved there), in place; the state of a
    parameter kept on another kind of device (an offloaded host copy) stays beside that parameter.

    ``step`` counters go to (or stay on) the CPU, as torch keeps them, unless the group is ``capturable`` /
    ``fused``, whose counters go beside their parameters.
    Shared by the Trainer's setup and the LR finder.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> opt = torch.optim.Adam(model.parameters())
        >>> model(torch.randn(3, 2)).sum().backward(); opt.step()
        >>> move_optimizer_state(opt, torch.device("cpu"))
        >>> opt.state[model.weight]["exp_avg"].device.type
        'cpu'
    """
    states = optimizer.state
    for group in optimizer.param_groups:
        # A fused or capturable step reads its counters on the device. A checkpoint loaded before the model
        # moved there (a resume inside fit) left them beside the CPU parameters: "state_steps is on cpu".
        counters_on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            state = states.get(param)
            if not state:
                continue
            # beside its parameter: an offloaded optimizer (FSDP's CPU offload, offload_optimizer=True) keeps
            # parameters, and so their state, on the CPU while the model trains on the device
            target = param.device if param.device.type != device.type else device
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key == "step":
                    if counters_on_device and value.device != target:
                        state[key] = value.to(device=target, dtype=torch.float32)
                    elif not counters_on_device and value.device.type != "cpu":
                        # a checkpoint loaded with map_location=<the GPU> brings the counters there, and
                        # torch's load_state_dict leaves them as loaded: a non-capturable Adam then reads each
                        # one with .item(), a host sync per parameter per step (found by the GPU soak)
                        state[key] = value.to("cpu")
                elif value.device != target:
                    state[key] = value.to(target)
