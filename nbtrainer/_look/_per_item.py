"""Each item's loss: what the run's criterion gives for that item alone, for a whole batch at once.

* ``loss_per_item=fn(outputs, targets)`` given: its values (one per item).
* A torch loss with ``reduction`` (``CrossEntropyLoss``, ``MSELoss``, ``BCEWithLogitsLoss``...): a copy with
  ``reduction="none"``, each item's elements then reduced as the original reduction would reduce that item alone:
  ``"mean"`` by their count (``CrossEntropyLoss`` / ``NLLLoss``: by the class weights of its targets, ignored targets
  left out, as torch does), ``"sum"`` and ``"batchmean"`` by their sum.
* No criterion (a Hugging Face model returns ``.loss``): cross-entropy of the logits per item; a language model's
  tokens (logits ``(B, T, V)``, labels ``(B, T)``, -100 ignored, shifted by one for a causal LM, as the model does)
  give each sequence's mean token loss; a regression head (one label) its squared error; float multi-labels
  binary cross-entropy per label, averaged.
* Anything else (a plain function as criterion, a custom ``compute_loss``): a clear error naming
  ``loss_per_item=fn(outputs, targets)``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from nbtrainer._loop._metrics import metric_input

__all__ = ["NoPerItemLoss", "is_causal_lm", "per_item_loss"]

Tensor = torch.Tensor
PerItem = Callable[[Any, Any], Tensor]

_FIX = (
    "Pass interpret(..., loss_per_item=fn(outputs, targets)) returning one loss per item, e.g. "
    "loss_per_item=lambda out, y: torch.nn.functional.cross_entropy(out, y, reduction='none')."
)


class NoPerItemLoss(ValueError):
    """The run's loss cannot be split per item without help."""


def _rows(values: Tensor, batch: int, how: str) -> Tensor:
    flat = values.reshape(batch, -1).float()
    return flat.sum(1) if how == "sum" else flat.mean(1)


def _class_weighted(criterion: Any) -> PerItem:
    """CrossEntropyLoss / NLLLoss, ``reduction="mean"``: each item's summed losses over its targets' weight."""
    unreduced = copy.copy(criterion)
    unreduced.reduction = "none"
    weight, ignore = getattr(criterion, "weight", None), getattr(criterion, "ignore_index", -100)

    def fn(outputs: Any, targets: Any) -> Tensor:
        values = unreduced(outputs, targets)
        b = values.shape[0]
        if not isinstance(targets, Tensor) or targets.is_floating_point():  # class probabilities: a plain mean
            return _rows(values, b, "mean")
        keep = targets != ignore
        if values.ndim == 1 and weight is None:  # one target per item: its loss, nan where it is ignored (as alone)
            return torch.where(keep, values.float(), torch.nan)
        denom = weight[targets.clamp(min=0)] * keep if weight is not None else keep
        return values.reshape(b, -1).float().sum(1) / denom.reshape(b, -1).float().sum(1)

    return fn


def _reducing(criterion: Any) -> PerItem:
    how = "mean" if criterion.reduction == "mean" else "sum"  # "sum" and KLDivLoss's "batchmean" of one item: a sum
    unreduced = copy.copy(criterion)
    unreduced.reduction = "none"

    def fn(outputs: Any, targets: Any) -> Tensor:
        values = unreduced(outputs, targets)
        return _rows(values, values.shape[0], how)

    return fn


def is_causal_lm(model: Any) -> bool:
    """A decoder-only language model shifts its labels by one inside (Hugging Face's convention)."""
    config = getattr(model, "config", None)
    can_generate = getattr(model, "can_generate", None)
    generates = bool(can_generate()) if callable(can_generate) else False
    return generates and not getattr(config, "is_encoder_decoder", False)


def _model_loss(model: Any) -> PerItem:
    """The loss a Hugging Face model computes from ``labels``, per item (see the module docstring)."""
    causal = is_causal_lm(model)
    config = getattr(model, "config", None)

    def fn(outputs: Any, targets: Any) -> Tensor:
        logits = metric_input(outputs)
        if not isinstance(logits, Tensor) or not isinstance(targets, Tensor):
            raise NoPerItemLoss(
                "interpret: the model computes its own loss and its outputs have no logits tensor to split it per "
                f"item. {_FIX}"
            )
        logits = logits.float()
        if logits.ndim == 3 and targets.ndim == 2 and not targets.is_floating_point():  # tokens
            if causal:
                logits, targets = logits[:, :-1], targets[:, 1:]
            tokens = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none", ignore_index=-100)
            counted = (targets != -100).sum(1)
            return tokens.sum(1) / counted.clamp(min=1)
        if logits.ndim == 2 and targets.ndim == 1 and not targets.is_floating_point():
            return F.cross_entropy(logits, targets, reduction="none")
        if targets.is_floating_point() and logits.numel() == targets.numel():
            regression = getattr(config, "problem_type", None) == "regression" or logits.shape[-1] == 1
            if regression:
                return _rows((logits.reshape(targets.shape) - targets.float()) ** 2, targets.shape[0], "mean")
            per_label = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
            return _rows(per_label, targets.shape[0], "mean")
        raise NoPerItemLoss(
            f"interpret: cannot tell the model's own loss per item from logits of shape {tuple(logits.shape)} and "
            f"targets of shape {tuple(targets.shape)}. {_FIX}"
        )

    return fn


def per_item_loss(criterion: Any, model: Any, loss_per_item: PerItem | None, *, custom: bool = False) -> PerItem:
    """The function ``(outputs, targets) -> one loss per item`` for this run (see the module docstring).

    Example:
        >>> fn = per_item_loss(torch.nn.CrossEntropyLoss(), None, None)
        >>> out, y = torch.randn(3, 4), torch.tensor([0, 2, 1])
        >>> bool(torch.allclose(fn(out, y)[1], torch.nn.CrossEntropyLoss()(out[1:2], y[1:2])))
        True
    """
    if loss_per_item is not None:
        if not callable(loss_per_item):
            raise TypeError(f"loss_per_item must be a function fn(outputs, targets) -> losses, got {loss_per_item!r}.")
        return loss_per_item
    if custom:
        raise NoPerItemLoss(f"interpret: this trainer's loss comes from compute_loss=, one per batch. {_FIX}")
    if criterion is None:
        return _model_loss(model)
    reduction = getattr(criterion, "reduction", None)
    if isinstance(criterion, torch.nn.Module) and reduction in ("mean", "sum", "batchmean"):
        if isinstance(criterion, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)) and reduction == "mean":
            return _class_weighted(criterion)
        return _reducing(criterion)
    raise NoPerItemLoss(
        f"interpret: the criterion {getattr(criterion, '__name__', type(criterion).__name__)} gives one loss per "
        f"batch and has no reduction='none'. {_FIX}"
    )
