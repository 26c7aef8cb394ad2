"""``profile_model`` on a model with no weights (the meta device): a profile from shapes, planned, not measured.

Nothing can run, so nothing is timed or measured: the parameters and their bytes come from the shapes, and the
memory of a training step comes from the memory planner (:func:`nbtrainer.plan_memory`, the same engine a
``Trainer(memory_budget_gb=...)`` uses). The profile keeps the plan, so ``profile.fits(budget_gb, **switches)`` is
``plan_memory(...).predict(**switches)`` judged against that budget (:func:`nbtrainer._profile._fit.planned_fit`): the
same row, the same parts, the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import iter_tensors
from nbtrainer._profile._report import ModelProfile
from nbtrainer._setup._model_setup import param_numel

__all__ = ["planned_profile"]

_NOTHING_RUNS = "the model is on the meta device (no weights): nothing runs, so nothing is timed"


def _example(example_inputs: Any, targets: Any) -> Any:
    """One batch as a loader would give it: the inputs, with the targets after them when given apart."""
    if targets is None:
        return example_inputs
    if isinstance(example_inputs, (tuple, list)):
        return (*example_inputs, targets)
    return (example_inputs, targets)


def planned_profile(
    model: nn.Module,
    example_inputs: Any,
    *,
    devices: Sequence[Any],
    precisions: Sequence[str],
    criterion: Any,
    targets: Any,
    batch_size: int | None,
) -> ModelProfile:
    """A :class:`ModelProfile` of a meta model: sizes from the shapes, memory from :func:`nbtrainer.plan_memory`."""
    from nbtrainer._plan._arithmetic import model_structure
    from nbtrainer._plan._plan import plan_memory
    from nbtrainer._setup._precision import normalize_precision

    asked = [str(d) for d in devices]
    # the meta device runs nothing: asked alone, it means "plan for the usual training device", a CUDA GPU
    device = next((d for d in asked if torch.device(d).type != "meta"), "cuda")
    batch = _example(example_inputs, targets)
    size = next((int(t.shape[0]) for t in iter_tensors(batch) if t.dim() > 0), 1)
    plan = plan_memory(model, batch, budget_gb=1, device=device, criterion=criterion)
    params = list(model.parameters())
    by_dtype: dict[str, int] = {}
    for t in [*params, *model.buffers()]:
        key = str(t.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + t.numel() * t.element_size()
    sizes: dict[str, Any] = {
        "parameters_bytes": sum(p.numel() * p.element_size() for p in params),
        "buffers_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "by_dtype": by_dtype,
        "serialized_bytes": None,
    }
    prof = ModelProfile(
        model_name=type(model).__name__,
        batch_size=batch_size or size,
        params=sum(param_numel(p) for p in params),
        trainable_params=sum(param_numel(p) for p in params if p.requires_grad),
        size_mb=(sizes["parameters_bytes"] + sizes["buffers_bytes"]) / 2**20,
        size=sizes,
        structure=model_structure(model),
        environment={"torch": torch.__version__, "devices": {plan.device: "planned (meta model)"}},
    )
    target = f"planned for {plan.device}, not measured: the model is on the meta device (no weights), so nothing runs"
    if device != asked[0]:
        target += (
            f"; devices={tuple(asked)!r} asked, and the meta device runs nothing, so the plan is for a CUDA "
            f"target: read it as profile.memory[{plan.device!r}], or pass devices=('cpu',) to plan for the CPU"
        )
    prof.notes.append(target)
    prof.latency_ms[plan.device] = {
        normalize_precision(p): {"supported": False, "reason": _NOTHING_RUNS} for p in precisions
    }
    per: dict[str, dict[str, Any]] = {}
    for p in precisions:
        precision = normalize_precision(p)
        try:
            row = plan.predict(precision=precision)
        except (ValueError, TypeError) as exc:
            per[precision] = {"supported": False, "reason": str(exc)}
            continue
        per[precision] = {
            "source": "planned",
            "optimizer": str(row.switches.get("optimizer", "adamw")),
            **row.parts,
            "total": row.peak_bytes,
            "reserved": row.reserved_bytes,
        }
    prof.memory[plan.device] = per
    prof.seconds["plan"] = plan.seconds
    prof._plan = plan  # type: ignore[attr-defined]  # not a field: to_dict() stays plain data
    return prof
