"""One row of a plan: the simulated step of a combination (cached, extrapolated in depth and batch) plus the
arithmetic parts, as a :class:`~nbtrainer._plan._result.PlanRow`."""

from __future__ import annotations

import collections
import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import iter_tensors
from nbtrainer._options import MemoryOptions
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan._cost import time_factor
from nbtrainer._plan._result import PlanRow
from nbtrainer._plan._simulate import SimulatedStep, empty_batch, simulate_step

__all__ = ["Context", "micro_batches", "plan_row", "repeated_stack"]

_DEPTHS = (2, 3)  # a deep stack of repeated blocks is simulated at these depths and extrapolated


def micro_batches(batch_size: int) -> list[int]:
    """The whole batch, then halvings that divide it exactly, down to 1 (at most 8 sizes)."""
    sizes, m = [batch_size], batch_size
    while m > 1 and len(sizes) < 8:
        m //= 2
        while m > 1 and batch_size % m:
            m -= 1
        if m not in sizes:
            sizes.append(m)
    return sizes


def repeated_stack(model: nn.Module) -> tuple[str, int] | None:
    """``(qualified name of the ModuleList of repeated blocks, its length)`` when the model has one to extrapolate."""
    from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks

    blocks = find_checkpointable_blocks(model)
    if len(blocks) <= _DEPTHS[1] + 2:  # a shallow stack costs no more to simulate whole than at two depths
        return None
    parents = {name.rsplit(".", 1)[0] if "." in name else "" for name, _ in blocks}
    if len(parents) != 1:
        return None
    parent = parents.pop()
    container = model.get_submodule(parent) if parent else model
    if not isinstance(container, nn.ModuleList) or len(container) != len(blocks):
        return None
    return parent, len(blocks)


def _shallow_depth(model: nn.Module, stack: str, depth: int) -> nn.Module:
    """A copy of ``model`` sharing its modules, whose block list ``stack`` keeps its first ``depth`` blocks (and a
    Hugging Face config that says so); only the containers on the path to ``stack`` are copied."""

    def shallow(m: nn.Module) -> nn.Module:
        c = copy.copy(m)
        c.__dict__["_modules"] = dict(m._modules)  # setattr on the copy must not reach the original's table
        return c

    root = shallow(model)
    node, path = root, stack.split(".") if stack else []
    for part in path[:-1]:
        child = shallow(node._modules[part])  # type: ignore[arg-type]
        node._modules[part] = child
        node = child
    blocks = model.get_submodule(stack)
    node._modules[path[-1]] = nn.ModuleList(list(blocks.children())[:depth])
    for m in (root, *(root.get_submodule(".".join(path[: i + 1])) for i in range(len(path) - 1))):
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "num_hidden_layers"):
            config = copy.copy(config)
            config.num_hidden_layers = depth
            m.__dict__["config"] = config
    return root


#: Simulated steps kept across plans of the same model structure, batch shapes, target and loss (re-planning with
#: another budget, a Trainer's plan after a notebook's): a few recent ones, keyed by what the simulation reads.
_SHARED: collections.OrderedDict[tuple, dict[tuple, SimulatedStep]] = collections.OrderedDict()
_SHARED_MAX = 4


def shared_cache(model: nn.Module, batch: Any, device: torch.device, criterion: Any) -> dict[tuple, SimulatedStep]:
    """The simulation cache for this model structure, batch signature, target and loss (a new one if unseen).

    The key holds each parameter's and buffer's name, shape, dtype and ``requires_grad``, each module's type and a
    Hugging Face config's text, the batch's structure and shapes, the target and the criterion (by type and text for
    a loss module, by identity for a function): weights never matter to a simulation, everything it reads does.
    """
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters())
    buffers = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers())
    modules = tuple(type(m).__qualname__ for m in model.modules())
    config = getattr(model, "config", None)
    shapes = tuple((tuple(t.shape), str(t.dtype)) for t in iter_tensors(batch))
    loss = (type(criterion).__qualname__, repr(criterion)) if isinstance(criterion, nn.Module) else id(criterion)
    names = tuple(batch.keys()) if isinstance(batch, Mapping) else ()
    key = (params, buffers, modules, repr(config), type(batch).__name__, names, shapes, str(device), loss)
    if key in _SHARED:
        _SHARED.move_to_end(key)
        return _SHARED[key]
    cache: dict[tuple, SimulatedStep] = {}
    _SHARED[key] = cache
    while len(_SHARED) > _SHARED_MAX:
        _SHARED.popitem(last=False)
    return cache


@dataclass
class Context:
    model: nn.Module
    batch: Any
    example_size: int
    device: torch.device
    criterion: Any
    structure: dict[str, Any]
    stack: tuple[str, int] | None
    cache: dict[tuple, SimulatedStep] = field(default_factory=dict)

    @property
    def sim_device(self) -> torch.device:
        """Where the fake tensors say they are: the target, or the CPU when this torch has no CUDA runtime (fake
        CUDA tensors need it for autograd); the CPU's autocast rules then stand in for CUDA's (docs: limits)."""
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return torch.device("cpu")
        return self.device

    def simulate(
        self,
        *,
        precision: str,
        checkpointing: bool,
        chunked: bool,
        offload: bool,
        accumulating: bool,
        micro: int,
        lora: Any,
    ) -> SimulatedStep:
        """The simulated step at ``micro`` samples, from (cached) simulations at 1 and the example's size, and at two
        depths of the repeated stack, extrapolated."""
        # fp16 and bf16 autocast cast the same ops to 2-byte types: one simulation serves both
        half = "bf16-mixed" if precision == "fp16-mixed" else precision
        # the step in backward needs no simulation of its own: the largest total of everything but the gradients
        # already complete is its peak (each is applied and dropped as soon as it is complete)
        # LoRA's settings by value: the cache outlives one plan (shared_cache), and r or the targets change the step
        lora_key = repr(sorted(lora.items())) if lora is not None else None
        key = (half, checkpointing, chunked, offload, accumulating, lora_key)
        if micro == self.example_size:  # the example's own size: no interpolation
            return self._at_size(key, micro, lora)
        sizes = sorted({1, self.example_size})
        at = {m: self._at_size(key, m, lora) for m in sizes}
        if len(sizes) == 1:
            return at[sizes[0]]
        lo, hi = at[sizes[0]], at[sizes[1]]
        t = (micro - sizes[0]) / (sizes[1] - sizes[0])
        return _lerp(lo, hi, t)

    def _at_size(self, key: tuple, micro: int, lora: Any) -> SimulatedStep:
        cached = (*key, micro)
        if cached in self.cache:
            return self.cache[cached]
        if self.stack is None:
            result = self._run(self.model, key, micro, lora)
        else:
            name, depth = self.stack
            a, b = (self._run(_shallow_depth(self.model, name, d), key, micro, lora) for d in _DEPTHS)
            result = _lerp(a, b, depth - _DEPTHS[0])  # each block adds b - a
        self.cache[cached] = result
        return result

    def _run(self, model: nn.Module, key: tuple, micro: int, lora: Any) -> SimulatedStep:
        precision, checkpointing, chunked, offload, accumulating, _ = key
        from nbtrainer._setup._precision import autocast_dtype

        loss_fn = None
        if chunked:
            from nbtrainer._setup._chunked_loss import ChunkedCausalLMLoss

            loss_fn = ChunkedCausalLMLoss(1024 if chunked is True else int(chunked))
        batch = empty_batch(self.batch, torch.device("meta"), (self.example_size, micro))
        prepare = functools.partial(_sim_lora, lora=lora, structure=self.structure) if lora is not None else None
        try:
            return simulate_step(
                model,
                batch,
                device=self.sim_device,
                autocast_dtype=autocast_dtype(precision),
                checkpointing=checkpointing,
                loss_fn=loss_fn,
                criterion=self.criterion,
                offload_activations=offload,
                accumulating=accumulating,
                prepare=prepare,
            )
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            shapes = [tuple(t.shape) for t in iter_tensors(self.batch)]
            raise ValueError(
                f"plan_memory: the example batch does not fit the model ({type(exc).__name__}: {exc}). Batch tensor "
                f"shapes: {shapes}. Pass one batch exactly as the loader yields it (inputs and targets)."
            ) from exc


def _lerp(a: SimulatedStep, b: SimulatedStep, t: float) -> SimulatedStep:
    def f(x: int, y: int) -> int:
        return max(0, round(x + (y - x) * t))

    return SimulatedStep(
        peak=f(a.peak, b.peak),
        at_peak={k: f(a.at_peak.get(k, 0), b.at_peak.get(k, 0)) for k in a.at_peak},
        gradients=f(a.gradients, b.gradients),
        batch=f(a.batch, b.batch),
        largest_activations=f(a.largest_activations, b.largest_activations),
        logits_loss=f(a.logits_loss, b.logits_loss),
    )


class _SimLoRA(nn.Module):
    """PEFT's LoRA forward on a frozen base linear, for the simulation: ``base(x) + B(A(dropout(x))) * scale``."""

    def __init__(self, base: nn.Linear, r: int, dropout: float) -> None:
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False, device="meta")
        self.lora_B = nn.Linear(r, base.out_features, bias=False, device="meta")
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def weight(self) -> torch.Tensor:  # read directly by some modules (nn.MultiheadAttention's out_proj), as in PEFT
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(self.dropout(x.to(self.lora_A.weight.dtype)))) * 2.0


def _sim_lora(model: nn.Module, *, lora: Mapping[str, Any], structure: dict[str, Any]) -> None:
    model.requires_grad_(False)
    for name, _n_in, _n_out, _bias, quantizable in structure["linears"]:
        if not arith.targeted(name, lora.get("target_modules", "all-linear"), quantizable, structure["head"]):
            continue
        try:
            base = model.get_submodule(name)
        except AttributeError:  # a block left out of the shallow copy
            continue
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        owner._modules[leaf] = _SimLoRA(base, int(lora.get("r", 8)), float(lora.get("dropout", 0.0)))  # type: ignore[arg-type]


def plan_row(
    ctx: Context,
    memory: MemoryOptions,
    micro: int,
    batch_size: int,
    usable: int,
) -> PlanRow:
    """One combination's predicted peak, parts, host bytes and time factor."""
    s = ctx.structure
    quantized = 0
    param_bytes = sum(n * e for _, n, e, _, _ in s["params"])
    trained = [(n, e, shape) for _, n, e, trains, shape in s["params"] if trains]
    dequant = 0
    if memory.quantize:
        params = {row[0]: row for row in s["params"]}
        names: set[str] = set()
        for name, n_in, n_out, _, q in s["linears"]:
            w = params.get(f"{name}.weight")
            if not q or w is None:
                continue
            quantized += w[1] * w[2] - arith.quantized_bytes(memory.quantize, n_in, n_out)
            dequant = max(dequant, n_in * n_out * (2 if memory.precision != "fp32" else 4))
            names |= {f"{name}.weight", f"{name}.bias"}
        trained = [(n, e, shape) for name, n, e, trains, shape in s["params"] if trains and name not in names]
    if memory.lora is not None:
        r = int(memory.lora.get("r", 8))
        targets = [
            row
            for row in s["linears"]
            if arith.targeted(row[0], memory.lora.get("target_modules", "all-linear"), row[4], s["head"])
        ]
        trained = [(r * n_in, 4, [r, n_in]) for _, n_in, _, _, _ in targets]
        trained += [(r * n_out, 4, [n_out, r]) for _, _, n_out, _, _ in targets]
        param_bytes += sum(n * e for n, e, _ in trained)
    param_bytes -= quantized
    trained_bytes = sum(n * e for n, e, _ in trained)
    kind = memory.optimizer or "adamw"
    state = arith.optimizer_state_bytes(kind, trained)
    temps = arith.step_temporaries(kind, ctx.device.type, trained, in_backward=memory.optimizer_in_backward)
    host = 0
    if memory.offload_optimizer:
        host = state + trained_bytes  # the moments and an fp32 master copy of what trains, on the host
        state, temps = 0, 0
    sim = ctx.simulate(
        precision=memory.precision,
        checkpointing=bool(memory.activation_checkpointing),
        chunked=bool(memory.chunked_loss),
        offload=memory.offload_activations,
        accumulating=micro < batch_size,
        micro=micro,
        lora=memory.lora,
    )
    grads = trained_bytes
    if memory.optimizer_in_backward:
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
    logits = min(sim.logits_loss, activations)
    parts = {
        "parameters": param_bytes,
        "gradients": grads_part,
        "optimizer_state": state,
        "activations": activations - logits,
        "logits_loss": logits,
        "temporaries": temporaries,
        "batch": sim.batch,
    }
    peak = sum(parts.values())
    accum = batch_size // micro
    switches = memory.changed()
    if accum > 1:
        switches["grad_accum_steps"] = accum
    return PlanRow(
        switches=switches,
        micro_batch=micro,
        grad_accum_steps=accum,
        peak_bytes=peak,
        parts=parts,
        host_bytes=host,
        time_factor=time_factor(ctx.device.type, memory, accum),
        fits=peak <= usable,
        changes_training=memory.quantize is not None or memory.lora is not None,
    )
