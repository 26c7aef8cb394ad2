"""What the CUDA caching allocator reserves for a row: its steps replayed, allocation by allocation, through the
allocator's rules (:mod:`nbtrainer._plan._allocator`).

For each leaf of the row's step (:class:`~nbtrainer._plan._context.Leaf`: a simulation at one size and depth, with
its allocation trace), the device's life is replayed in the order a Trainer's fit goes:

1. the parameters, tensor by tensor (a quantized weight as its packed values, scales and code book; LoRA's adapters
   after them);
2. an optimizer step window, twice (the second is the steady state; a third reserves nothing new, the test suite
   checks it): for each micro-batch, the batch, cuBLAS's two workspaces (the first matmul of forward and of
   backward, on the first step), a quantized base's dequantized weight, then the trace (the window's first
   micro-batch creates the gradients; later ones add into them); then the optimizer step: its state on the first
   step (for ``optimizer_in_backward``, each parameter's as its gradient completes, which is then dropped), its
   temporaries, and ``zero_grad`` releasing the gradients.

The reserved bytes after that are the leaf's; the row's are the leaves' weighted sum (depth, checkpointed share,
micro-batch size: the weights of :meth:`~nbtrainer._plan._context.Context.terms`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nbtrainer._data._batch import iter_tensors
from nbtrainer._options import MemoryOptions
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan._allocator import CachingAllocator, cublas_workspace_bytes
from nbtrainer._plan._context import Context, Leaf
from nbtrainer._plan._timeline import ALLOC, FREE, GRAD, Trace

__all__ = ["STEPS", "replay", "reserved_bytes"]

STEPS = 2  # optimizer steps replayed: the first builds the optimizer's state, the second is the steady state


def replay(
    *,
    params: list[int],
    batch: list[int],
    first: Trace,
    rest: Trace | None = None,
    micro_batches: int = 1,
    state: Sequence[list[int]] = (),
    shared_state: Sequence[int] = (),
    temporaries: Sequence[int] = (),
    in_backward: bool = False,
    dequant: int = 0,
    workspaces: Sequence[int] = (),
    steps: int = STEPS,
    drop_gradients: bool = False,
    per_step: Sequence[int] = (),
) -> CachingAllocator:
    """Replay a fit's first ``steps`` optimizer steps through the caching allocator (see the module docstring).

    Args:
        params: each parameter's bytes, allocated first and kept.
        batch: each batch tensor's bytes (one micro-batch), allocated before its forward, released after the step.
        first: the window's first micro-batch (creates the gradients); ``rest``: each later one (default: first).
        micro_batches: micro-batches per optimizer step.
        state: per trained tensor (the index a gradient event carries), the optimizer state tensors' bytes;
            ``shared_state``: state shared by all (allocated with the first tensor's).
        temporaries: what the optimizer step allocates while it runs (released at its end).
        in_backward: each parameter is stepped when its gradient completes, and the gradient dropped.
        dequant: a dequantized weight allocated and released at the start of each micro-batch.
        workspaces: kept from the first micro-batch on (cuBLAS's, per thread).
        drop_gradients: each gradient is released as it completes (FSDP reduce-scatters it into a shard).
        per_step: allocated at each micro-batch's start and released at its end (FSDP's gathered parameters).

    Returns:
        The allocator: ``reserved`` and ``peak_allocated`` (``max_memory_reserved`` / ``max_memory_allocated``).
    """
    a = CachingAllocator()
    a.malloc_all(params)
    has_state = False
    for step in range(steps):
        held: dict[int, Any] = {}  # the window's gradients (and whatever else a micro-batch left alive)
        batches = []
        for i in range(micro_batches):
            batches.append(a.malloc_all(batch))
            if step == 0 and i == 0:
                a.malloc_all(workspaces)
            if dequant:
                a.free(a.malloc(dequant))
            gathered = a.malloc_all(per_step)
            live: dict[int, Any] = {}
            trace = first if i == 0 or rest is None else rest
            for op, ident, n in zip(trace.ops, trace.ids, trace.sizes, strict=True):
                if op == ALLOC:
                    live[ident] = a.malloc(n)
                elif op == FREE:
                    block = live.pop(ident, None)
                    if block is not None:
                        a.free(block)
                elif op == GRAD and (in_backward or drop_gradients):  # trained tensor n's gradient is complete
                    if in_backward and not has_state and n < len(state):  # step it
                        a.malloc_all([*state[n], *(shared_state if n == 0 else ())])
                    block = live.pop(ident, None)  # and drop it
                    if block is not None:
                        a.free(block)
            for block in gathered:
                a.free(block)
            held.update({(i, k): v for k, v in live.items()})
        if not in_backward:
            if not has_state:
                a.malloc_all(shared_state)
                for tensors in state:
                    a.malloc_all(tensors)
            for block in a.malloc_all(temporaries):
                a.free(block)
        has_state = True
        for block in held.values():  # zero_grad(set_to_none=True)
            a.free(block)
        for blocks in batches:
            for block in blocks:
                a.free(block)
    return a


def _batch_sizes(ctx: Context, micro: int) -> list[int]:
    sizes = []
    for t in iter_tensors(ctx.batch):
        n = t.numel() * t.element_size()
        if t.dim() > 0 and t.shape[0] == ctx.example_size:
            n = n // ctx.example_size * micro
        sizes.append(n)
    return sizes


def _keep(ctx: Context, depth: int | None) -> Any:
    """The parameter names a shallow copy of ``depth`` blocks holds (None: all)."""
    if depth is None or ctx.stack is None:
        return None
    prefix = f"{ctx.stack[0]}." if ctx.stack[0] else ""

    def keep(name: str) -> bool:
        if not name.startswith(prefix):
            return True
        index = name[len(prefix) :].split(".", 1)[0]
        return not index.isdigit() or int(index) < depth

    return keep


def _workspaces(ctx: Context) -> list[int]:
    capability = None
    if ctx.device.type == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability(ctx.device)
    return [cublas_workspace_bytes(capability)] * 2  # forward's thread and autograd's device thread


def _leaf_reserved(ctx: Context, memory: MemoryOptions, first: Leaf, rest: Leaf | None, windows: int) -> int:
    kind = memory.optimizer or "adamw"
    key = ("replay", id(first), id(rest), windows, kind, memory.offload_optimizer, memory.optimizer_in_backward,
           memory.quantize, memory.precision, repr(memory.lora), ctx.strategy, ctx.world_size)  # fmt: skip
    cached = ctx.cache.get(key)
    if cached is not None:
        return cached
    tensors = arith.row_tensors(ctx.structure, memory, _keep(ctx, first.depth))
    # stepped all at once: every trained tensor of the model at this depth; in backward: the one whose gradient
    # completes, numbered as the simulated model's (a stack put together from 3 blocks repeats the middle one's)
    in_backward = memory.optimizer_in_backward
    trained = [(n, e, list(shape)) for n, e, shape in first.step.trained] if in_backward else tensors.trained
    state, shared = arith.state_tensors(kind, trained) if not memory.offload_optimizer else ([], [])
    temps_bytes = arith.step_temporaries(kind, ctx.device.type, trained, in_backward=in_backward)
    temporaries: list[int] = []
    per_step: list[int]
    if temps_bytes and not memory.offload_optimizer:
        whole = sum(n * e for n, e, _ in trained)
        temporaries = [n * e for n, e, _ in trained] if temps_bytes == whole else [temps_bytes]
    assert first.step.trace is not None
    params, per_step, drop = list(tensors.params), [], False
    if ctx.strategy == "ddp":  # DDP's gradient buckets: 1 MiB first, then up to 25 MiB each, kept
        params = [*params, *_buckets(sum(n * e for n, e, _ in tensors.trained))]
    elif ctx.strategy == "fsdp":
        params, per_step, drop, state, temporaries = _fsdp_replay(ctx, memory, tensors, kind)
        shared = []  # in the last of ``state``
    allocator = replay(
        params=params,
        batch=_batch_sizes(ctx, first.micro),
        first=first.step.trace,
        rest=rest.step.trace if rest is not None else None,
        micro_batches=windows,
        state=state,
        shared_state=shared,
        temporaries=temporaries,
        in_backward=memory.optimizer_in_backward,
        dequant=tensors.dequant,
        workspaces=_workspaces(ctx),
        drop_gradients=drop,
        per_step=per_step,
    )
    ctx.cache[key] = allocator.reserved
    return allocator.reserved


def _buckets(total: int, first: int = 2**20, cap: int = 25 * 2**20) -> list[int]:
    sizes = [min(first, total)] if total else []
    total -= sizes[0] if sizes else 0
    while total > 0:
        sizes.append(min(cap, total))
        total -= sizes[-1]
    return sizes


def _fsdp_replay(
    ctx: Context, memory: MemoryOptions, tensors: Any, kind: str
) -> tuple[list[int], list[int], bool, list[list[int]], list[int]]:
    """FSDP2's rank, for the replay: the shards kept (parameters and gradients), the root's whole parameters and
    the largest unit gathered twice for each micro-batch, gradients dropped as reduce-scattered, the sharded
    state. An approximation of FSDP's own buffers (their order within a step is not followed)."""
    from nbtrainer._plan._distributed import rank_parts, shard_bytes

    ws = ctx.world_size
    shares = rank_parts(ctx.structure, ctx.units, memory, ws, tensors.trained)
    kept = [shard_bytes(n, e, shape, ws) for _, n, e, _, shape in ctx.structure["params"]]
    kept += [shard_bytes(n, e, shape, ws) for n, e, shape in tensors.trained]  # the sharded gradients
    per_step = [shares["root"], shares["units"] // 2, shares["units"] - shares["units"] // 2]
    state, shared = arith.state_tensors(kind, shares["trained"]) if not memory.offload_optimizer else ([], [])
    whole = sum(n * e for n, e, _ in shares["trained"])
    temps = arith.step_temporaries(kind, ctx.device.type, shares["trained"], in_backward=False)
    temporaries = [n * e for n, e, _ in shares["trained"]] if temps and temps == whole else ([temps] if temps else [])
    return kept, [p for p in per_step if p], True, [*state, shared], temporaries


def reserved_bytes(ctx: Context, memory: MemoryOptions, micro: int, batch_size: int, switches: dict[str, Any]) -> int:
    """The row's reserved bytes at its peak (see the module docstring); ``switches``: the row's simulated switches
    (as :meth:`Context.terms` takes them)."""
    windows = batch_size // micro
    first = ctx.terms(accumulating=False, **switches)
    rest = ctx.terms(accumulating=True, **switches) if windows > 1 else None
    total = 0.0
    for i, (leaf, weight) in enumerate(first):
        later = rest[i][0] if rest is not None else None
        total += weight * _leaf_reserved(ctx, memory, leaf, later, windows)
    return max(0, round(total))
