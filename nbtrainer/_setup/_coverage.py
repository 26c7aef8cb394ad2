"""Trainable parameters that no optimizer holds: they get gradients and never change.

The newcomer's case: a head replaced after the optimizer was built (``model.fc = nn.Linear(...)`` after
``AdamW(model.parameters())``). The run trains and reports a loss; the new head's weights stay at their random
init. Checked once the Trainer has set the model up (freezing applied), before the first step.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["check_optimizer_covers", "untrained_parameters"]


def untrained_parameters(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> list[str]:
    """The names of ``model``'s parameters with ``requires_grad`` that none of ``optimizers`` holds.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> model[1] = nn.Linear(4, 3)  # the head replaced after the optimizer was built
        >>> untrained_parameters(model, [opt])
        ['1.weight', '1.bias']
    """
    held = {id(p) for opt in optimizers for group in opt.param_groups for p in group["params"]}
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in held]


def _listed(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def check_optimizer_covers(
    model: nn.Module, optimizers: Iterable[torch.optim.Optimizer], *, trainable: Any = None
) -> None:
    """Refuse trainable parameters that no optimizer holds, naming them, with the fixes; when the user said which
    parameters train (``trainable=`` / ``freeze=``: ``trainable`` is then their plan, not None) a warning instead.

    Raises:
        ValueError: some trainable parameters are in no optimizer, and neither ``trainable=`` nor ``freeze=`` was
            given.
    """
    missing = untrained_parameters(model, optimizers)
    if not missing:
        return
    what = f"{len(missing)} trainable parameter tensor(s) that no optimizer holds: {_listed(missing)}"
    if trainable is not None:
        warnings.warn(
            f"{what}. trainable= / freeze= keep them trainable, so they get gradients, but the optimizer never steps "
            "them: build the optimizer after setting up the model, or pass it by name (Trainer(model, "
            "criterion, 'adamw') builds it over what trains).",
            UserWarning,
            stacklevel=4,
        )
        return
    raise ValueError(
        f"{what}. They would get gradients and never change (was the optimizer built before these layers were "
        "replaced or added, e.g. a new head?). Build the optimizer after changing the model "
        "(torch.optim.AdamW(model.parameters())), or pass it by name (Trainer(model, criterion, 'adamw') builds "
        "it over what trains), or freeze them (freeze=[...], or requires_grad_(False)). To keep them trainable "
        "outside the optimizer on purpose, say so with trainable=[...] (then this is a warning)."
    )
