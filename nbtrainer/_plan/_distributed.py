"""A plan for one rank of DDP or FSDP2 (``plan_memory(..., world_size=N, strategy="ddp" | "fsdp")``).

**DDP** (``nbtrainer.DDP``, ``DistributedDataParallel``): every rank holds the whole model, its gradients and the
optimizer's state, and runs its own micro-batch (the example batch is one rank's). DDP adds its gradient buckets:
with ``gradient_as_bucket_view=False`` (torch's default, and ``nbtrainer.DDP``'s) a second copy of every trained
gradient, allocated when the model is wrapped and kept.

**FSDP2** (``nbtrainer.FSDP``, ``fully_shard`` on each unit and the root, ``reshard_after_forward=True``): each
parameter is split on its first dimension (padded to a multiple of the ranks), so a rank holds ``1/N`` of the
parameters, of their gradients (reduce-scattered as backward goes) and of the optimizer's state. For the step:

* the root's own parameters (those no unit holds: a final norm, a head tied to the embedding) are gathered whole
  at the first forward and kept until backward ends (FSDP2 does not reshard the root after forward);
* a unit's parameters are gathered whole (in the compute dtype: ``bf16-mixed`` gathers bf16) for its forward and
  again for its backward; while one is in use the next is gathered (FSDP2 prefetches one unit in backward; the
  all-gather's output buffer is copied out into the parameters, so a unit is briefly there twice in forward too);
  in backward the unit's gradients exist whole, in the compute dtype and in the fp32 of the reduction, before the
  reduce-scatter leaves a rank its share; under accumulation they stay whole until the window's last micro-batch,
  whose reduce-scatter fills the shards while they are held;
* the activations are a single device's at the rank's batch, with the parameters cast to the compute dtype rather
  than autocast (FSDP's ``MixedPrecisionPolicy`` turns autocast off): simulated that way, and with every gradient
  dropped as it completes (it is reduce-scattered), as for the optimizer step in backward.

The units are the Trainer's (:func:`nbtrainer._dist._fsdp.shard_units`: the repeated blocks and any module holding at
least 10% of the parameters).
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from nbtrainer._options import MemoryOptions

__all__ = ["STRATEGIES", "check_strategy", "fsdp_units", "rank_parts", "shard_bytes"]

STRATEGIES = ("ddp", "fsdp")


def check_strategy(world_size: Any, strategy: Any) -> None:
    """``plan_memory``'s ``world_size`` / ``strategy``, refused before anything runs when they cannot be planned."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"plan_memory(world_size={world_size!r}): the number of ranks, an int >= 1.")
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"plan_memory(strategy={strategy!r}): plan one device (None), 'ddp' or 'fsdp'.")
    if strategy == "fsdp" and world_size == 1:
        raise ValueError(
            "plan_memory(strategy='fsdp', world_size=1): one rank shards nothing, and FSDP then only adds its "
            "all-gathers. Give the number of ranks (world_size=8), or plan one device with strategy=None."
        )
    if strategy is None and world_size > 1:
        raise ValueError(
            f"plan_memory(world_size={world_size}): say how the ranks share the model, strategy='ddp' (each holds it "
            "whole) or strategy='fsdp' (each holds 1/N of it)."
        )


def shard_bytes(numel: int, elem: int, shape: list[int], world_size: int) -> int:
    """One rank's share of a tensor split on its first dimension, padded to a multiple of ``world_size``."""
    if not shape or world_size == 1:
        return numel * elem
    rest = numel // shape[0] if shape[0] else 0
    return math.ceil(shape[0] / world_size) * rest * elem


def fsdp_units(model: nn.Module) -> list[list[str]]:
    """The parameter names of each unit the Trainer shards (the root's own last)."""
    from nbtrainer._dist._fsdp import shard_units

    names = {id(p): n for n, p in model.named_parameters()}
    units = [[names[id(p)] for p in unit.parameters() if id(p) in names] for unit in shard_units(model, None)]
    held = {n for unit in units for n in unit}
    return [u for u in units if u] + [[n for n in names.values() if n not in held]]


def rank_parts(
    structure: dict[str, Any],
    units: list[list[str]],
    memory: MemoryOptions,
    world_size: int,
    trained: list[tuple[int, int, list[int]]],
) -> dict[str, Any]:
    """What FSDP2 holds on one rank besides the activations: ``params``, ``grads``, ``trained`` (the sharded trained
    tensors, for the optimizer's state), ``root`` (the root's parameters, whole) and ``units`` (the most a unit
    adds while it is gathered, forward or backward)."""
    shapes = {name: (n, e, shape) for name, n, e, _, shape in structure["params"]}
    params = sum(shard_bytes(n, e, shape, world_size) for n, e, shape in shapes.values())
    adapters = [(n, e, shape) for n, e, shape in trained if memory.lora is not None]
    params += sum(shard_bytes(n, e, shape, world_size) for n, e, shape in adapters)
    grads = sum(shard_bytes(n, e, shape, world_size) for n, e, shape in trained)

    def compute(e: int) -> int:
        return 2 if memory.precision in ("bf16-mixed", "fp16-mixed") else e

    def whole(names: list[str]) -> int:
        return sum(shapes[n][0] * compute(shapes[n][1]) for n in names if n in shapes)

    trains = {name for name, _, _, t, _ in structure["params"] if t} if memory.lora is None else set()

    def grads_whole(names: list[str]) -> int:  # in the compute dtype, and in fp32 for the reduce-scatter
        return sum(shapes[n][0] * (compute(shapes[n][1]) + 4) for n in names if n in trains)

    blocks = units[:-1]
    forward = 2 * max((whole(u) for u in blocks), default=0)
    backward = max((2 * whole(u) + grads_whole(u) for u in blocks), default=0)
    sharded = [(math.ceil(s[0] / world_size) * (n // s[0]) if s and s[0] else n, e, s) for n, e, s in trained]
    return {
        "params": params,
        "grads": grads,
        "root": whole(units[-1]),
        "units": max(forward, backward),
        "trained": sharded,
    }


def fsdp_parts(
    r: dict[str, Any],
    *,
    state: int,
    temps: int,
    sim: Any,
    batch: int,
    accumulating: bool,
    unsharded_grads: int,
) -> dict[str, int]:
    """One FSDP2 rank's peak in parts (see the module docstring): ``r`` from :func:`rank_parts`; ``sim``: the
    simulated step with the parameters in the compute dtype; ``accumulating``: a micro-batch of a window whose
    gradients stay whole until its last one (``set_requires_gradient_sync(False)``), ``unsharded_grads`` bytes."""
    # a window's gradients stay whole until its last micro-batch, whose reduce-scatter fills the shards while the
    # whole gradients of the units still to reduce are held: both at once
    grads = unsharded_grads + r["grads"] if accumulating else r["grads"]
    inside = sim.largest_activations + r["root"] + r["units"]  # backward: gradients dropped as reduce-scattered
    logits = min(sim.logits_loss, sim.largest_activations)
    if inside >= temps:
        activations, temporaries = sim.largest_activations - logits, r["units"]
    else:  # the optimizer step
        activations, temporaries, logits = 0, temps, 0
    return {
        "parameters": r["params"] + (r["root"] if inside >= temps else 0),
        "gradients": grads,
        "optimizer_state": state,
        "activations": activations,
        "logits_loss": logits,
        "temporaries": temporaries,
        "batch": batch,
    }
