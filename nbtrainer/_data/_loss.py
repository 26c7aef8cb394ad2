"""How a batch becomes ``(loss, outputs, targets)``: the batch protocol's side of ``fit`` and ``evaluate``.

Three ways, first match wins: a ``compute_loss=fn(model, batch)`` function; a subclass's own ``compute_loss(batch)``
method (its batch type may be one only it can read); else the protocol (``BatchSpec.split``, the model, then the
criterion or the model's ``.loss``). In evaluation, a batch without targets gives outputs and no loss. The loop's
inlined ``model(x)`` / ``criterion(out, y)`` path for ``(x, y)`` batches is the same computation, taken only when
:func:`plain_pairs` says nothing overrides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbtrainer._data._batch import BatchSpec, loss_from_outputs

__all__ = ["batch_loss", "plain_pairs"]


def batch_loss(
    model: Any,
    batch: Any,
    *,
    spec: BatchSpec,
    criterion: Callable[..., Any] | None,
    custom: Callable[[Any, Any], Any] | None = None,
    override: Callable[[Any], Any] | None = None,
    training: bool = True,
    need_outputs: bool = False,
) -> tuple[Any, Any, Any]:
    """``(loss, outputs, targets)`` of ``batch`` (see the module docstring).

    Args:
        custom: ``compute_loss=fn(model, batch)``, returning a loss or ``(loss, outputs, targets)``.
        override: a subclass's ``compute_loss(batch)`` (bound), or ``None``.
        training: ``False`` in evaluation, where a batch without targets gives ``(None, outputs, None)``.
        need_outputs: metrics are computed, so a ``custom`` returning a loss alone is refused with the fix.
    """
    if custom is not None:
        result = custom(model, batch)
        if isinstance(result, tuple) and len(result) == 3:
            return result
        if isinstance(result, tuple):  # (loss, outputs) is the usual slip: the targets are needed too
            kinds = ", ".join(type(r).__name__ for r in result)
            raise ValueError(
                f"compute_loss returned a tuple of {len(result)} ({kinds}): return the loss alone, or "
                "(loss, outputs, targets) for metrics and the panel's views."
            )
        if need_outputs:
            raise ValueError(
                "compute_loss returned only a loss, but metrics need outputs and targets: return "
                "(loss, outputs, targets) from compute_loss."
            )
        return result, None, None
    if override is not None:
        return override(batch)
    args, kwargs, targets = spec.split(batch)
    outputs = model(*args, **kwargs)
    if not training and criterion is not None and targets is None:
        return None, outputs, None
    return loss_from_outputs(criterion, outputs, targets, batch=batch, spec=spec), outputs, targets


def plain_pairs(*, spec: BatchSpec, criterion: Any, custom: Any, override: Any) -> bool:
    """True when ``(x, y)`` batches may take the loop's inlined ``criterion(model(x), y)`` (the same computation
    as :func:`batch_loss`): no custom loss, no override, a criterion, and no ``num_inputs`` to honour."""
    return custom is None and override is None and criterion is not None and spec.num_inputs is None
