"""Training-memory breakdown of one optimizer step, measured on a private copy of the model.

* parameters, buffers: bytes of unique storages; inputs: each input's own bytes (a batch sliced from a
  larger tensor is its slice, not the storage behind it);
* gradients: the ``.grad`` tensors after one backward;
* optimizer state: every tensor in ``optimizer.state`` after one real ``step()``, by state key, so
  Adam/AdamW (``exp_avg`` + ``exp_avg_sq`` = 2x the trainable parameters, plus a scalar ``step``
  per parameter), SGD with momentum (1x), plain SGD (0) and factored optimizers are all right;
* activations: tensors saved for backward, seen through ``torch.autograd.graph.saved_tensors_hooks``,
  each storage counted once and parameters/buffers/inputs left out (autocast's low-precision copies of
  weights are counted: they are real memory). With activation checkpointing the same hooks see what
  the checkpointed blocks keep (their inputs); ``recompute_peak`` is the largest single block's saved
  activations, re-materialised one block at a time during backward;
* on CUDA also the peak allocated memory of the whole step (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nbtrainer._data._inputs import call_model, iter_tensors, make_loss, slice_batch
from nbtrainer._setup._activation_checkpointing import apply_activation_checkpointing, find_checkpointable_blocks
from nbtrainer._setup._optim import build_from_params
from nbtrainer._setup._precision import autocast, normalize_precision

__all__ = ["measure_training_memory", "optimizer_factory"]

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


def _storage_key(t: torch.Tensor) -> tuple[Any, int]:
    try:
        storage = t.untyped_storage()
        return (t.device, storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # tensor subclasses without a plain storage
        return ("id", id(t)), t.numel() * t.element_size()


def _unique_bytes(tensors: Any) -> int:
    seen: dict[Any, int] = {}
    for t in tensors:
        key, nbytes = _storage_key(t)
        seen[key] = nbytes
    return sum(seen.values())


def _own_bytes(tensors: Any) -> int:
    """Bytes of the tensors themselves, each distinct view once.

    A batch sliced from a dataset held as one tensor shares the dataset's storage: counting storages
    would charge the whole dataset to one step (and to every sample, once scaled to a batch size).
    """
    seen: dict[Any, int] = {}
    for t in tensors:
        key: Any = _storage_key(t)[0]
        if key[0] != "id":  # a subclass without a plain storage is keyed by its identity already
            key = (key, t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        seen[key] = t.numel() * t.element_size()
    return sum(seen.values())


def optimizer_factory(model: nn.Module, optimizer: Any = None) -> OptimizerFactory:
    """How to build, for a copy of ``model``, the optimizer the memory step measures.

    Args:
        model: The user's model (only read: parameter names; an optimizer is built over it once as a check).
        optimizer: ``None`` (AdamW with default settings), a callable of the parameters (an optimizer
            class, ``functools.partial(torch.optim.AdamW, lr=1e-3)``, ``lambda params: ...``), or an
            existing ``torch.optim.Optimizer`` over ``model``'s parameters: same class,
            same param-group settings, mapped by parameter name onto the copy (its state is not
            touched or copied).

    Example:
        >>> make = optimizer_factory(nn.Linear(2, 2), torch.optim.SGD)
        >>> type(make(nn.Linear(2, 2))).__name__
        'SGD'
    """
    if optimizer is None:
        return lambda copy: torch.optim.AdamW(copy.parameters())
    if not isinstance(optimizer, torch.optim.Optimizer):
        # built once and dropped (nothing is stepped): a function of the model fails here, before any measuring
        build_from_params(optimizer, model)
        return lambda copy: build_from_params(optimizer, copy)
    names = {id(p): name for name, p in model.named_parameters()}
    groups = [
        {
            **{k: v for k, v in group.items() if k != "params"},
            "params": [names[id(p)] for p in group["params"] if id(p) in names],
        }
        for group in optimizer.param_groups
    ]
    cls: Any = type(optimizer)  # a subclass: its own __init__ signature
    defaults = dict(optimizer.defaults)

    def make(copy: nn.Module) -> torch.optim.Optimizer:
        new_groups = [{**g, "params": [copy.get_parameter(n) for n in g["params"]]} for g in groups]
        try:
            return cls(new_groups, **defaults)
        except TypeError:
            return cls(new_groups)

    return make


def _saved_tensor_tracker(exclude: set[Any], blocks: list[nn.Module]) -> tuple[Any, dict, dict, list]:
    saved: dict[Any, int] = {}
    per_block: dict[int, dict[Any, int]] = {}
    current: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key(t)
        if key not in exclude:
            saved[key] = nbytes
            if current:
                per_block.setdefault(current[-1], {})[key] = nbytes
        return t

    def enter(index: int) -> Callable[..., None]:
        def hook(*_: Any) -> None:
            current.append(index)

        return hook

    def leave(*_: Any) -> None:  # must return None: a forward hook's return value replaces the output
        current.pop()

    handles = []
    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(enter(i)))
        handles.append(block.register_forward_hook(leave, always_call=True))
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    return hooks, saved, per_block, handles


def _forward_saved(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    device: torch.device,
    precision: str,
    exclude: set[Any],
    blocks: list[nn.Module],
) -> tuple[torch.Tensor, int, int]:
    """Forward + loss under autocast; returns (loss, bytes saved for backward, largest block's share)."""
    hooks, saved, per_block, handles = _saved_tensor_tracker(exclude, blocks)
    try:
        with hooks, autocast(precision, device):
            loss = loss_fn(call_model(model, inputs))
    finally:
        for h in handles:
            h.remove()
    return loss, sum(saved.values()), max((sum(b.values()) for b in per_block.values()), default=0)


def _one_step(
    model: nn.Module,
    inputs: Any,
    loss_fn: Callable[[Any], torch.Tensor],
    *,
    make_optimizer: OptimizerFactory,
    **forward: Any,
) -> dict[str, Any]:
    model.zero_grad(set_to_none=True)
    device = forward["device"]
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    loss, activations, recompute_peak = _forward_saved(model, inputs, loss_fn, **forward)
    loss.backward()
    del loss
    grads = _unique_bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer = make_optimizer(model)
    optimizer.step()
    state_by_key: dict[str, int] = {}
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state_by_key[str(key)] = state_by_key.get(str(key), 0) + _own_bytes([value])
    result = {
        "activations": activations,
        "recompute_peak": recompute_peak,
        "gradients": grads,
        "optimizer": type(optimizer).__name__,
        "optimizer_state": sum(state_by_key.values()),
        "optimizer_state_by_key": state_by_key,
        "cuda_peak_delta": None,
    }
    if cuda:
        torch.cuda.synchronize(device)
        result["cuda_peak_delta"] = torch.cuda.max_memory_allocated(device) - base
    del optimizer
    model.zero_grad(set_to_none=True)
    if cuda:  # the next step's base is read from the allocator: no cycle may hold this step's tensors. A CPU's
        # figures come from the tensors themselves, and a full collection costs ~0.17 s beside torch's objects
        gc.collect()
    return result


def _linear(full: int, half: int | None, batch_size: int) -> dict[str, float]:
    """Split a byte count measured at ``batch_size`` (and at half of it) into fixed + per-sample parts."""
    if half is None:
        return {"fixed": 0.0, "per_sample": full / batch_size}
    per_sample = max((full - half) / (batch_size - batch_size // 2), 0.0)
    return {"fixed": max(full - per_sample * batch_size, 0.0), "per_sample": per_sample}


def measure_training_memory(
    model: nn.Module,
    inputs: Any,
    *,
    device: torch.device,
    precision: str,
    batch_size: int,
    make_optimizer: OptimizerFactory,
    criterion: Callable[..., torch.Tensor] | None = None,
    targets: Any = None,
    checkpointing: bool = True,
) -> dict[str, Any]:
    """Run one forward/backward/optimizer step on ``model`` (a private copy) and break its memory down.

    Activation bytes are also measured with a forward pass at half the batch, to split them into a
    batch-independent part (e.g. autocast's low-precision weight copies) and a per-sample part:
    ``fits()`` extrapolates with that line.

    Args:
        model: A private copy on ``device`` (put in train mode; its parameters are stepped).
        inputs: Example inputs on ``device``.
        device: The device the copy lives on.
        precision: Autocast precision of forward + loss.
        batch_size: Samples in ``inputs``.
        make_optimizer: ``copy -> optimizer`` (see :func:`optimizer_factory`).
        criterion: ``criterion(output, targets)`` (``criterion(output)`` without targets); default: the
            sum of the means of the floating-point outputs.
        targets: Targets on ``device`` for ``criterion``.
        checkpointing: Also measure with activation checkpointing when the model has repeated blocks.

    Returns:
        A dict of byte counts (see the module docstring); ``*_checkpointed`` values are ``None`` when
        there are no blocks to checkpoint, ``cuda_peak*`` values ``None`` off CUDA; ``scaling`` holds
        the ``{"fixed", "per_sample"}`` lines of ``inputs``, ``activations`` and
        ``activations_checkpointed`` (which includes ``recompute_peak``).

    Example:
        >>> mem = measure_training_memory(nn.Linear(10, 10), torch.randn(4, 10), device=torch.device("cpu"),
        ...     precision="fp32", batch_size=4, make_optimizer=lambda m: torch.optim.Adam(m.parameters()))
        >>> mem["optimizer_state_by_key"]["exp_avg"] == mem["trainable_parameters"]
        True
    """
    precision = normalize_precision(precision)
    model.train()
    params, buffers = list(model.parameters()), list(model.buffers())
    input_tensors = list(iter_tensors(inputs))
    exclude = {_storage_key(t)[0] for t in params + buffers + input_tensors + list(iter_tensors(targets))}
    named_blocks = find_checkpointable_blocks(model) if checkpointing else []
    blocks = [m for _, m in named_blocks]
    half = batch_size // 2 if batch_size >= 2 else None
    loss_full = make_loss(criterion, targets)
    loss_half = make_loss(criterion, None if targets is None else slice_batch(targets, batch_size, half or 1))
    fwd: dict[str, Any] = {"device": device, "precision": precision, "exclude": exclude}

    def half_batch(track: list[nn.Module]) -> tuple[int, int] | tuple[None, None]:
        if half is None:
            return None, None
        loss, act, rec = _forward_saved(model, slice_batch(inputs, batch_size, half), loss_half, **fwd, blocks=track)
        del loss  # frees the graph: nothing is backpropagated
        return act, rec

    plain = _one_step(model, inputs, loss_full, make_optimizer=make_optimizer, blocks=blocks, **fwd)
    half_act, half_rec = half_batch(blocks)
    ckpt: dict[str, Any] = {}
    if blocks:
        with apply_activation_checkpointing(model, [name for name, _ in named_blocks]):
            ckpt = _one_step(model, inputs, loss_full, make_optimizer=make_optimizer, blocks=[], **fwd)
            half_ckpt, _ = half_batch([])
    fixed = {
        "parameters": _unique_bytes(params),
        "trainable_parameters": _unique_bytes(p for p in params if p.requires_grad),
        "buffers": _unique_bytes(buffers),
        "gradients": plain["gradients"],
        "optimizer_state": plain["optimizer_state"],
    }
    inputs_bytes = _own_bytes(input_tensors)
    resident = fixed["parameters"] + fixed["buffers"] + inputs_bytes  # already allocated before the step
    total = sum(v for k, v in fixed.items() if k != "trainable_parameters") + inputs_bytes + plain["activations"]
    act_ckpt = ckpt.get("activations")
    recompute = plain["recompute_peak"] if blocks else None
    scaling: dict[str, Any] = {
        "inputs": {"fixed": 0.0, "per_sample": inputs_bytes / batch_size},
        "activations": _linear(plain["activations"], half_act, batch_size),
        "activations_checkpointed": None,
        "method": f"forward at batch {batch_size} and {half}" if half else "proportional to batch size",
    }
    if act_ckpt is not None and recompute is not None:  # both set when there are blocks to checkpoint
        half_point = None if half_ckpt is None or half_rec is None else half_ckpt + half_rec
        scaling["activations_checkpointed"] = _linear(act_ckpt + recompute, half_point, batch_size)
    return {
        "device": str(device),
        "precision": precision,
        "batch_size": batch_size,
        "optimizer": plain["optimizer"],
        **fixed,
        "optimizer_state_by_key": plain["optimizer_state_by_key"],
        "inputs": inputs_bytes,
        "activations": plain["activations"],
        "total": total,
        "checkpoint_blocks": [name for name, _ in named_blocks],
        "activations_checkpointed": act_ckpt,
        "recompute_peak": recompute,
        "total_checkpointed": None if act_ckpt is None else total - plain["activations"] + act_ckpt + recompute,
        "cuda_peak": None if plain["cuda_peak_delta"] is None else plain["cuda_peak_delta"] + resident,
        "cuda_peak_checkpointed": (
            ckpt["cuda_peak_delta"] + resident if ckpt.get("cuda_peak_delta") is not None else None
        ),
        "scaling": scaling,
        "method": "saved_tensors_hooks" + (" + torch.cuda.max_memory_allocated" if device.type == "cuda" else ""),
    }
