"""One row of a plan: the simulated step of a combination (:class:`~nbtrainer._plan._context.Context`) plus the
arithmetic parts, as a :class:`~nbtrainer._plan._result.PlanRow`; on a CUDA target, what the caching allocator
reserves for it (:mod:`nbtrainer._plan._reserved`)."""

from __future__ import annotations

import functools
from typing import Any

from nbtrainer._options import SWITCH, MemoryOptions
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan._arithmetic import RowTensors, row_tensors
from nbtrainer._plan._context import Context
from nbtrainer._plan._cost import time_factor
from nbtrainer._plan._result import PlanRow
from nbtrainer._setup._chunked_loss import DEFAULT_CHUNK

__all__ = ["RowTensors", "plan_row", "row_tensors"]  # the tensors: nbtrainer._plan._arithmetic


def chunk_tokens(chunked_loss: bool | int) -> int:
    """``chunked_loss=``'s tokens per chunk as the Trainer reads it (``True``: the default), 0 when off."""
    if chunked_loss is True:
        return DEFAULT_CHUNK
    return int(chunked_loss) if chunked_loss else 0


def plan_row(
    ctx: Context,
    memory: MemoryOptions,
    micro: int,
    batch_size: int,
    usable: int,
    context_bytes: int = 0,
) -> PlanRow:
    """One combination's predicted peak, parts, reserved bytes, host bytes and time factor.

    ``context_bytes``: what the device holds outside the allocator (the CUDA context); ``fits`` is judged on the
    reserved bytes plus it.
    """
    tensors = row_tensors(ctx.structure, memory)
    param_bytes = sum(tensors.params)
    trained, dequant = tensors.trained, tensors.dequant
    trained_bytes = sum(n * e for n, e, _ in trained)
    kind = memory.optimizer or "adamw"
    state = arith.optimizer_state_bytes(kind, trained)
    temps = arith.step_temporaries(kind, ctx.device.type, trained, in_backward=memory.optimizer_in_backward)
    host = 0
    if memory.offload_optimizer:
        host = state + trained_bytes  # the moments and an fp32 master copy of what trains, on the host
        state, temps = 0, 0
    fsdp = ctx.strategy == "fsdp"
    half = memory.precision in ("bf16-mixed", "fp16-mixed")
    switches = {  # the simulator's parameters (nbtrainer._plan._context.Context.terms)
        # FSDP casts the parameters to the compute dtype (no autocast): simulated so
        "precision": "bf16-params" if fsdp and half else memory.precision,
        "checkpointing": memory.activation_checkpointing,
        # the tokens per chunk (0: off): the chunk's logits and their gradient are what the chunked loss keeps
        "chunked": chunk_tokens(memory.chunked_loss),
        "offload": memory.offload_activations,
        "micro": micro,
        SWITCH.lora: memory.lora,
    }
    sim = ctx.simulate(accumulating=micro < batch_size, **switches)
    grads = trained_bytes
    if fsdp:
        from nbtrainer._plan._distributed import fsdp_parts, rank_parts

        shares = rank_parts(ctx.structure, ctx.units, memory, ctx.world_size, trained)
        state = arith.optimizer_state_bytes(kind, shares["trained"])
        temps = arith.step_temporaries(kind, ctx.device.type, shares["trained"], in_backward=False)
        whole = sum(n * (2 if half else e) for n, e, _ in trained)
        parts = fsdp_parts(
            shares, state=state, temps=temps, sim=sim, batch=sim.batch, accumulating=micro < batch_size,
            unsharded_grads=whole,
        )  # fmt: skip
    elif memory.optimizer_in_backward:
        # each gradient is applied and dropped as soon as it is complete: the simulation's largest total of all but
        # the completed gradients (a gradient in flight included), plus the update's temporary of one parameter
        grads_part = 0
        activations = sim.largest_activations
        temporaries = dequant + temps
    elif micro < batch_size:
        # a later micro-batch of the window: every gradient exists while backward adds the new ones into them
        if sim.peak >= temps:
            grads_part, activations, temporaries = grads, sim.peak, dequant
        else:
            grads_part, activations, temporaries = grads, 0, dequant + temps
    elif sim.peak >= grads + temps:
        # the peak is inside backward: the simulation's gradients so far, the rest its activations
        grads_part = sim.at_peak.get("gradients", 0)
        activations = sim.peak - grads_part
        temporaries = dequant
    else:  # the peak is the optimizer step: activations are gone by then, every gradient and the step's temporaries
        grads_part, activations, temporaries = grads, 0, dequant + temps
    if not fsdp:
        logits = min(sim.logits_loss, activations)
        parts = {
            "parameters": param_bytes,
            # DDP's buckets: a second copy of every trained gradient, kept from the wrap on
            "gradients": grads_part + (trained_bytes if ctx.strategy == "ddp" else 0),
            "optimizer_state": state,
            "activations": activations - logits,
            "logits_loss": logits,
            "temporaries": temporaries,
            "batch": sim.batch,
        }
    peak = sum(parts.values())
    accum = batch_size // micro
    reserved: Any = None  # elsewhere than on CUDA: the peak itself
    if ctx.device.type == "cuda":
        from nbtrainer._plan._reserved import reserved_bytes

        reserved = functools.partial(reserved_bytes, ctx, memory, micro, batch_size, switches)
    out = memory.changed()
    if accum > 1:
        out["grad_accum_steps"] = accum
    return PlanRow(
        switches=out,
        micro_batch=micro,
        grad_accum_steps=accum,
        peak_bytes=peak,
        parts=parts,
        host_bytes=host,
        time_factor=time_factor(ctx.device.type, memory, accum, ctx.blocks),
        changes_training=memory.quantize is not None or memory.lora is not None,
        context_bytes=context_bytes,
        usable_bytes=usable,
        _reserved=reserved,
    )
