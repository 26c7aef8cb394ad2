"""``plan_memory``: each combination of the memory switches, its predicted peak and step time, the fastest that fits.

The peak of one training step (steady state: the optimizer's state exists) is, on the target device,

    parameters + optimizer state + batch + max(simulated step, gradients + optimizer-step temporaries)

where the *simulated step* (:mod:`nbtrainer._plan._simulate`) is the peak of what forward, loss and backward
allocate (activations, temporaries, the loss head's logits and their gradient, the gradients as backward creates
them), run on fake tensors for each precision / checkpointing / chunked-loss / offload combination, and the rest is
arithmetic (:mod:`nbtrainer._plan._arithmetic`). A deep stack of repeated blocks (a decoder's layers) is simulated
with 3 blocks and its allocation trace put together at the model's depth; micro-batch sizes and the later
micro-batches of an accumulation window come from the traces too (:mod:`nbtrainer._plan._context`), so an 8B
decoder plans in seconds. On a CUDA target each row's steps are replayed through the caching allocator's rules
(:mod:`nbtrainer._plan._reserved`): ``fits`` is judged on the reserved bytes plus the CUDA context.
"""

from __future__ import annotations

import importlib.util
import itertools
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from nbtrainer._cancel import cancel_event
from nbtrainer._data._batch import iter_tensors
from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._options import SWITCH, MemoryOptions
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan._context import Context, micro_batches, repeated_stack, shared_cache
from nbtrainer._plan._result import (
    MemoryPlan,
    PlanRow,
    check_batch_size,
    check_budget_gb,
    check_criterion,
    check_share,
)
from nbtrainer._plan._search import RowSearch
from nbtrainer._plan._steps import plan_row

__all__ = ["MemoryPlan", "PlanRow", "plan_memory"]

GiB = 2**30
_DEFAULT_LORA = {"r": 16, "target_modules": "all-linear"}


# -- the search -------------------------------------------------------------------------------------------------------
def _paged(kind: str) -> bool:
    return kind in OPTIMIZERS and OPTIMIZERS[kind].paged


def _resolve_target(device: Any) -> torch.device:
    if device is None or device == "auto":
        from nbtrainer._setup._precision import resolve_device

        return resolve_device("auto")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"plan_memory(device={device!r}): not a device ({exc}). Use 'cuda', 'cuda:0' or 'cpu'."
        ) from None
    if target.type not in ("cpu", "cuda"):
        raise ValueError(
            f"plan_memory(device={device!r}): the planner knows the memory rules of 'cuda' and 'cpu' targets only."
        )
    return target


def _batch_size_of(batch: Any) -> int:
    for t in iter_tensors(batch):
        if t.dim() > 0:
            return int(t.shape[0])
    raise ValueError("plan_memory: the example batch has no tensor with a batch dimension.")


#: The shares of the repeated blocks a plan checkpoints besides all of them (selective checkpointing: the fastest
#: plan that fits may keep some blocks' activations).
SHARES = (0.25, 0.5, 0.75)


def _shares(blocks: int, kept: Any) -> list[Any]:
    """The selective checkpointing values to plan for ``blocks`` repeated blocks: each of :data:`SHARES` that picks
    a different number of blocks, more than none and fewer than all (for a few blocks, the share nearest to what it
    picks: 0.5 of 2 blocks, not 0.25), and the value the user set (``kept``)."""
    from nbtrainer._setup._activation_checkpointing import checkpoint_count, is_selective

    by_count: dict[int, float] = {}
    for share in SHARES:
        k = checkpoint_count(share, blocks) if blocks else 0
        if 0 < k < blocks and abs(share - k / blocks) < abs(by_count.get(k, 2.0) - k / blocks):
            by_count[k] = share
    values: list[Any] = [by_count[k] for k in sorted(by_count)]
    if is_selective(kept) and kept not in values:
        values.append(kept)
    return values


def plan_memory(
    model: nn.Module,
    batch: Any,
    *,
    budget_gb: float,
    device: Any = "auto",
    batch_size: int | None = None,
    margin: float = 0.1,
    allow: Iterable[str] | None = None,
    criterion: Any = None,
    lora: Mapping[str, Any] | None = None,
    optimizer: str | None = None,
    keep: Mapping[str, Any] | None = None,
    world_size: int = 1,
    strategy: str | None = None,
    cancel: threading.Event | None = None,
) -> MemoryPlan:
    """Which memory switches make a training step of ``model`` on ``batch`` fit ``budget_gb``, and which is fastest.

    Args:
        model: the model; it may live on the meta device (nothing of its size is allocated).
        batch: one example batch as the loader yields it (meta tensors allowed).
        budget_gb: the device memory to plan for, in GiB.
        device: the target (``"cuda"``, ``"cuda:0"``, ``"cpu"``; need not be present). ``"auto"``: this machine's.
        batch_size: the effective batch you want (default: the example's); the plan may reach it with a smaller
            micro-batch and ``grad_accum_steps``.
        margin: the share of the budget kept free (allocator fragmentation, the CUDA context).
        allow: switches that change what trains which ``best`` may pick: ``("lora",)`` (a quantized base with LoRA).
        criterion: the loss (default: the model's ``.loss``, else cross-entropy / MSE from the targets).
        lora: LoRA's settings for the rows that add adapters (implies ``allow=("lora",)``); default r=16, all-linear.
        optimizer: only this optimizer kind (an optimizer you build yourself); default: the planner chooses.
        keep: switches held at these values (``{"precision": "bf16-mixed"}``): only the rows that have them
            (``Trainer(memory_budget_gb=...)`` keeps the switches its user set). ``quantize`` / ``lora`` kept: the
            rows train that quantized base with those adapters (QLoRA under a budget).
        world_size, strategy: plan one rank of ``world_size`` under ``"ddp"`` (each rank holds the whole model,
            and DDP's gradient buckets) or ``"fsdp"`` (FSDP2: parameters, gradients and optimizer state sharded,
            one unit gathered at a time); the batch is one rank's (``nbtrainer._plan._distributed``).
        cancel: an event another thread may set to end the search: the plan simulates its rows when first asked
            (``rows``, ``best``), one at a time, and once the event is set a row not yet simulated raises
            ``concurrent.futures.CancelledError`` (the panel's Plan button plans in a helper thread, ended so when
            the panel closes or the interpreter exits).

    Returns:
        A :class:`MemoryPlan`.

    Raises:
        ValueError: a budget that is not positive, an unknown target, a batch that does not fit the model, a model
            with no trainable parameters, ``world_size`` < 1, ``strategy="fsdp"`` on one rank, a criterion that runs
            a teacher model (``DistillationLoss``: not planned yet).
        TypeError: ``cancel`` that is not a ``threading.Event`` (anything with ``is_set()``).
        concurrent.futures.CancelledError: ``cancel`` was set before the first row was simulated (and later, from
            ``rows`` or ``best`` if it was set before they were).
    """
    start = time.perf_counter()
    from nbtrainer._plan._distributed import check_strategy, fsdp_units

    check_strategy(world_size, strategy)
    cancel_event(cancel, caller="plan_memory")
    check_budget_gb(budget_gb, "plan_memory")
    check_share(margin, "plan_memory", "margin")
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_memory: model must be a torch.nn.Module, got {type(model).__name__}.")
    check_criterion(criterion, "plan_memory")
    target = _resolve_target(device)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "plan_memory: the model has no trainable parameters (all requires_grad=False). Unfreeze the layers to "
            "train, or plan LoRA adapters with allow=('lora',)."
        )
    example = _batch_size_of(batch)
    batch_size = example if batch_size is None else batch_size
    check_batch_size(batch_size, "plan_memory", "the effective batch")
    allowed = set(allow or ())
    unknown = allowed - {SWITCH.lora}
    if unknown:
        raise ValueError(f"plan_memory(allow={sorted(unknown)}): the switches to allow are {(SWITCH.lora,)}.")
    if lora is not None:
        allowed.add(SWITCH.lora)
    keep = dict(keep or {})
    unknown_keep = sorted(set(keep) - set(MemoryOptions.names()))
    if unknown_keep:
        raise TypeError(f"plan_memory(keep=...): {unknown_keep} are not switches; use {list(MemoryOptions.names())}.")
    held = MemoryOptions(**{**MemoryOptions(activation_checkpointing=None).__dict__, **keep})  # None: not held
    budget_bytes = int(budget_gb * GiB)
    usable = int(budget_bytes * (1 - margin))  # as MemoryPlan.usable_bytes: one rounding for fits and best
    from nbtrainer._plan._allocator import CUDA_CONTEXT_BYTES

    context = CUDA_CONTEXT_BYTES if target.type == "cuda" else 0  # held outside the allocator, counted in fits

    from nbtrainer._setup._chunked_loss import check_chunked_loss

    try:  # the Trainer's own test: a Hugging Face *ForCausalLM whose logits come straight from the head
        check_chunked_loss(True, model=model, criterion=criterion, compute_loss=None, metrics=None, distributed=False)
        causal = isinstance(batch, Mapping) and "labels" in batch
    except (ValueError, TypeError):
        causal = False
    ctx = Context(
        model=model,
        batch=batch,
        example_size=example,
        device=target,
        criterion=criterion,
        structure=arith.model_structure(model),
        stack=repeated_stack(model),
        strategy=strategy,
        world_size=world_size,
        units=fsdp_units(model) if strategy == "fsdp" else [],
    )
    # simulated steps kept across plans, keyed by where they run (Context.sim_device), not the target
    ctx.cache = shared_cache(model, batch, ctx.sim_device, criterion)
    unavailable: dict[str, str] = {}
    # what the Trainer refuses on this model and target: predict() does too, with the reason and the fix
    refused: dict[str, tuple[str, str]] = {}
    precisions = ["fp32", "bf16-mixed"]
    if target.type == "cuda":
        precisions.append("fp16-mixed")
    else:
        unavailable["fp16-mixed"] = "emulated on most CPUs: slower than fp32"
    kinds = [k for k, kind in OPTIMIZERS.items() if kind.planned and (optimizer is None or k == optimizer)]
    if optimizer is not None and not kinds:
        kinds = [optimizer]
    for k in list(kinds):
        lib = OPTIMIZERS[k].library if k in OPTIMIZERS else "torch"
        if lib != "torch" and importlib.util.find_spec(lib) is None:
            kinds.remove(k)
            unavailable[k] = f"needs {lib}: pip install 'nbtrainer[quant]'"
            refused[k] = (unavailable[k], "install it, or choose another optimizer")
        elif k in OPTIMIZERS and OPTIMIZERS[k].paged and target.type != "cuda":
            kinds.remove(k)
            unavailable[k] = "paging needs CUDA"
    offloads = [False, True] if target.type == "cuda" else [False]
    if target.type != "cuda":
        why = "need a CUDA device (host RAM is the device here)"
        unavailable[f"{SWITCH.offload_activations} / {SWITCH.offload_optimizer}"] = why
        refused[SWITCH.offload_optimizer] = (
            why,
            f"remove {SWITCH.offload_optimizer}, or plan for a GPU: plan_memory(..., device='cuda')",
        )
    chunked_opts = [False, True] if causal else [False]
    if not causal:
        unavailable[SWITCH.chunked_loss] = "for Hugging Face causal LMs only"
        refused[SWITCH.chunked_loss] = (
            unavailable[SWITCH.chunked_loss],
            f"remove {SWITCH.chunked_loss}, or plan a *ForCausalLM with a dict batch holding 'labels'",
        )
    structures: list[tuple[str | None, Any]] = [(None, None)]
    lora_settings = dict(lora) if lora is not None else dict(_DEFAULT_LORA)
    quantizable = any(row[4] for row in ctx.structure["linears"])
    if held.quantize is not None or held.lora is not None:  # QLoRA / LoRA as the user set them
        structures = [(held.quantize, held.lora)]
        allowed.add(SWITCH.lora)
    elif quantizable:
        structures.append((None, lora_settings))
        if importlib.util.find_spec("bitsandbytes") is not None:
            structures.append(("nf4", lora_settings))
        else:
            unavailable[SWITCH.quantize] = "needs bitsandbytes: pip install 'nbtrainer[quant]'"
            refused[SWITCH.quantize] = (unavailable[SWITCH.quantize], f"install it, or remove {SWITCH.quantize}")
    from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks, has_own_checkpointing

    checkpointing: list[Any] = [False]
    blocks = len(find_checkpointable_blocks(model))
    if has_own_checkpointing(model) or blocks:
        checkpointing += [*_shares(blocks, held.activation_checkpointing), True]
    else:
        unavailable[SWITCH.activation_checkpointing] = "the model has no repeated blocks to checkpoint"
        refused[SWITCH.activation_checkpointing] = (
            unavailable[SWITCH.activation_checkpointing],
            f"remove {SWITCH.activation_checkpointing}",
        )
    # the combinations; each row's step is simulated when the plan first needs it (nbtrainer._plan._search)
    specs: list[tuple[MemoryOptions, int]] = []
    micros = micro_batches(batch_size) if example >= 1 else [batch_size]
    combos = itertools.product(precisions, structures, checkpointing, chunked_opts, offloads, kinds, (False, True))
    for precision, (quantize, lora_cfg), ckpt, chunked, off_act, kind, in_bwd in combos:
        if quantize is not None and precision == "fp32" and target.type == "cuda":
            continue  # a 4-bit base computes in half precision on CUDA
        for off_opt, micro in itertools.product(offloads, micros):
            # the combinations the Trainer refuses up front are not rows
            if in_bwd and (precision == "fp16-mixed" or batch_size // micro > 1 or off_opt or _paged(kind)):
                continue
            if off_opt and kind in arith.KBIT:
                continue
            # what the Trainer refuses under DDP / FSDP: the step in backward, the chunked loss; FSDP: a quantized
            # base (bitsandbytes' packed weights are not shardable) and offloading the optimizer
            if strategy is not None and (in_bwd or chunked):
                continue
            if strategy == "fsdp" and (quantize is not None or off_opt):
                continue
            memory = MemoryOptions(
                precision=precision,
                activation_checkpointing=ckpt,
                optimizer=kind,
                optimizer_in_backward=in_bwd,
                chunked_loss=chunked,
                quantize=quantize,
                lora=lora_cfg,
                offload_activations=off_act,
                offload_optimizer=off_opt,
            )
            if any(getattr(memory, k) != v for k, v in keep.items()):
                continue
            specs.append((memory, micro))
    if not specs:
        raise ValueError(
            f"plan_memory(keep={keep}): no combination has these switches on this model and target "
            f"({'; '.join(f'{k}: {v}' for k, v in unavailable.items()) or 'check their values'})."
        )
    plain = MemoryOptions(**{**MemoryOptions(optimizer=kinds[0] if optimizer else "adamw").__dict__, **keep})
    # best: the fastest that fits; among equally fast rows the one with fewest switches (nothing switched on that is
    # not needed). Rows that change what trains are listed, and picked only when asked. On a CUDA target a row's
    # reserved bytes are replayed when first asked, so only the rows the search reaches (and those shown) are.
    search = RowSearch(
        ctx,
        specs,
        batch_size=batch_size,
        usable=usable,
        context_bytes=context,
        pickable=lambda m: (m.quantize is None and m.lora is None) or SWITCH.lora in allowed,
        plain=plain,
        cancel=cancel,
    )
    search.row(0)  # one step now: a batch that does not fit the model is refused here, not at the first question

    def predict(switches: Mapping[str, Any]) -> PlanRow:
        switches = dict(switches)
        accum = int(switches.pop("grad_accum_steps", 1))
        micro = int(switches.pop("micro_batch", max(batch_size // max(accum, 1), 1)))
        if "optimizer" not in switches:
            switches["optimizer"] = optimizer or "adamw"
        names = set(MemoryOptions.names())
        unknown_keys = sorted(set(switches) - names)
        if unknown_keys:
            raise TypeError(f"predict() got {unknown_keys}: use the Trainer's switches {sorted(names)}.")
        from nbtrainer._setup._precision import normalize_precision

        switches["precision"] = normalize_precision(switches.get("precision", "fp32"))
        if target.type != "cuda":  # the Trainer allows it there and nothing moves: saved tensors are in RAM already
            switches[SWITCH.offload_activations] = False
        for name, value in switches.items():
            key = value if name == SWITCH.optimizer and isinstance(value, str) else name
            if key in refused and value not in (None, False, 0):
                why, fix = refused[key]
                raise ValueError(
                    f"predict({name}={value!r}): not on this plan, {why} (plan.unavailable; the Trainer refuses it "
                    f"too). {fix[0].upper()}{fix[1:]}."
                )
        if switches.get(SWITCH.lora) is True:
            switches[SWITCH.lora] = dict(lora_settings)
        return plan_row(ctx, MemoryOptions(**switches), micro, batch_size, usable, context)

    return MemoryPlan(
        budget_bytes=budget_bytes,
        margin=float(margin),
        device=str(target),
        batch_size=batch_size,
        unavailable=unavailable,
        _predict=predict,
        _search=search,
        _started=time.perf_counter() - start,
        context_bytes=context,
    )
