"""What a plan simulates, and how a row's simulated step is put together from the simulations (:class:`Context`).

A simulation (:func:`nbtrainer._plan._simulate.simulate_step`) runs one step of the model on fake tensors at one
micro-batch size. Rows need many sizes and, for a decoder of 32 identical blocks, a depth no simulation should pay
for. So a row's step is a weighted sum of a few *leaves*, each a simulation at an exact size and depth with its
allocation trace (:mod:`nbtrainer._plan._timeline`):

* **depth**: a deep stack of repeated blocks (a decoder's layers in one ``nn.ModuleList``) is simulated with 3
  blocks and its trace put together at the model's depth, the middle block repeated
  (:func:`nbtrainer._plan._timeline.synthesize`: exact for identical blocks); blocks that do not repeat exactly are
  simulated at 2 and 3 and extrapolated (each block adds what the third adds: weights ``3 - N`` and ``N - 2``);
* **some blocks checkpointed** (``activation_checkpointing=0.5`` or ``k``): the stack fully checkpointed, plus, per
  block left plain, the difference between a plain block and a checkpointed one (four leaves);
* **micro-batch size**: sizes 1, 2 and the example's are simulated; another size takes the trace at 2 and at the
  example's size event by event (each tensor's size is affine in the batch: exact) when both hold the same
  operations, else the two leaves weighted by where the size falls between them; size 1 is simulated on its own
  (a batch of one takes other operations: views instead of copies);
* **a later micro-batch of an accumulation window**: the plain step's trace with each gradient released as soon
  as it is complete (:func:`nbtrainer._plan._timeline.accumulating`), no simulation of its own.

The same weights apply to every number read from the leaves: the peak and its parts here, the caching allocator's
reserved bytes replayed from each leaf's trace (:mod:`nbtrainer._plan._reserved`).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import iter_tensors
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan import _timeline as _trace
from nbtrainer._plan._simulate import SimulatedStep, empty_batch, simulate_step

__all__ = ["Context", "Leaf", "micro_batches", "repeated_stack", "shared_cache"]

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


@dataclass(frozen=True)
class Leaf:
    """One simulation at an exact size and depth, its trace at the row's micro-batch size (interpolated, or the
    accumulating variant) and what that trace's peak is. ``depth``: the stack's depth simulated (None: the whole
    model); ``micro``: the samples of its batch."""

    step: SimulatedStep
    depth: int | None
    micro: int


#: A weighted sum of leaves: what a row's step is made of (see the module docstring).
Terms = list[tuple[Leaf, float]]


@dataclass
class Context:
    model: nn.Module
    batch: Any
    example_size: int
    device: torch.device
    criterion: Any
    structure: dict[str, Any]
    stack: tuple[str, int] | None
    cache: dict[tuple, Any] = field(default_factory=dict)
    #: None (one device), "ddp" or "fsdp", over ``world_size`` ranks; FSDP's units' parameter names, the root's last
    strategy: str | None = None
    world_size: int = 1
    units: list[list[str]] = field(default_factory=list)

    @property
    def sim_device(self) -> torch.device:
        """Where the fake tensors say they are: the target, or the CPU when this torch has no CUDA runtime (fake
        CUDA tensors need it for autograd); the CPU's autocast rules then stand in for CUDA's (docs: limits)."""
        if self.device.type == "cuda" and not torch.cuda.is_available():
            return torch.device("cpu")
        return self.device

    @property
    def blocks(self) -> int:
        """How many repeated blocks checkpointing picks among (0: none)."""
        if ("blocks",) not in self.cache:
            from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks

            self.cache[("blocks",)] = len(find_checkpointable_blocks(self.model))
        return int(self.cache[("blocks",)])

    def terms(
        self,
        *,
        precision: str,
        checkpointing: Any,
        chunked: int,
        offload: bool,
        accumulating: bool,
        micro: int,
        lora: Any,
    ) -> Terms:
        """The leaves a row's step is made of, and their weights (see the module docstring)."""
        # fp16 and bf16 autocast cast the same ops to 2-byte types: one simulation serves both
        half = "bf16-mixed" if precision == "fp16-mixed" else precision
        # LoRA's settings by value: the cache outlives one plan (shared_cache), and r or the targets change the step
        lora_key = repr(sorted(lora.items())) if lora is not None else None
        if self.stack is None:
            key = (half, checkpointing if checkpointing else False, chunked, offload, lora_key)
            return self._sized(key, micro, accumulating, None, None, lora)
        from nbtrainer._setup._activation_checkpointing import checkpoint_count, is_selective

        n = self.stack[1]
        plain = (half, False, chunked, offload, lora_key)
        full = (half, True, chunked, offload, lora_key)
        if not checkpointing:
            return self._stacked(plain, micro, accumulating, lora, n)
        terms = list(self._stacked(full, micro, accumulating, lora, n))  # a new list: the cached one stays
        left_plain = n - checkpoint_count(checkpointing, n) if is_selective(checkpointing) else 0
        if left_plain:  # per block left plain: a plain block's increment instead of a checkpointed one's
            for key, sign in ((plain, 1), (full, -1)):
                terms += [(leaf, sign * left_plain * w) for leaf, w in self._stacked(key, micro, accumulating, lora, n)]
                terms += [
                    (leaf, -sign * left_plain * w) for leaf, w in self._stacked(key, micro, accumulating, lora, n - 1)
                ]
        return terms

    def simulate(self, **switches: Any) -> SimulatedStep:
        """The simulated step of a row (its :meth:`terms` summed; no trace)."""
        cache_key = ("sum", *sorted((k, repr(v)) for k, v in switches.items()))
        if cache_key not in self.cache:
            self.cache[cache_key] = weighted(self.terms(**switches))
        return self.cache[cache_key]

    def _stacked(self, key: tuple, micro: int, accumulating: bool, lora: Any, depth: int) -> Terms:
        """The step with ``depth`` blocks: put together from the simulation at 3 (exact), or, for blocks that do not
        repeat exactly, extrapolated from the simulations at 2 and 3 (each block adds what the third adds)."""
        try:
            return self._sized(key, micro, accumulating, _DEPTHS[1], depth, lora)
        except _NotRepeated:
            pass
        lo, hi = _DEPTHS
        t = depth - lo
        return [(leaf, w * (1 - t)) for leaf, w in self._sized(key, micro, accumulating, lo, None, lora)] + [
            (leaf, w * t) for leaf, w in self._sized(key, micro, accumulating, hi, None, lora)
        ]

    def _sized(
        self, key: tuple, micro: int, accumulating: bool, depth: int | None, target: int | None, lora: Any
    ) -> Terms:
        """The step at ``micro`` samples, simulated at ``depth`` blocks (None: the whole model) and put together at
        ``target`` blocks (None: as simulated): one leaf, or two weighted by where ``micro`` falls."""
        cache_key = ("leaf", *key, micro, accumulating, depth, target)
        cached = self.cache.get(cache_key)
        if isinstance(cached, _NotRepeated):
            raise cached
        if cached is not None:
            return list(cached)
        example = self.example_size
        terms: Terms
        try:
            if micro in (1, example):
                raw = self._raw(key, micro, depth, lora)
                terms = [(self._leaf(raw, None, accumulating, depth, target, micro), 1.0)]
            else:  # between 2 and the example's size
                lo, hi = self._raw(key, 2, depth, lora), self._raw(key, example, depth, lora)
                assert lo.trace is not None and hi.trace is not None
                trace = _trace.at_micro(lo.trace, hi.trace, 2, example, micro)
                t = (micro - 2) / (example - 2)
                if trace is not None:
                    terms = [(self._leaf(_lerp(lo, hi, t), trace, accumulating, depth, target, micro), 1.0)]
                else:
                    terms = [
                        (self._leaf(lo, None, accumulating, depth, target, 2), 1 - t),
                        (self._leaf(hi, None, accumulating, depth, target, example), t),
                    ]
        except _NotRepeated as exc:
            self.cache[cache_key] = exc
            raise
        self.cache[cache_key] = terms
        return list(terms)

    @staticmethod
    def _leaf(
        step: SimulatedStep,
        trace: _trace.Trace | None,
        accumulating: bool,
        depth: int | None,
        target: int | None,
        micro: int,
    ) -> Leaf:
        trace = trace if trace is not None else step.trace
        assert trace is not None
        gradients = step.gradients
        if target is not None and target != depth:
            synthesized = _trace.synthesize(trace, target)
            if synthesized is None:
                raise _NotRepeated
            trace = synthesized
            gradients = _trace.stats(trace).gradients_end
        if accumulating:
            trace = _trace.accumulating(trace)
        if trace is not step.trace:  # the peak and its parts from the trace at this size / depth / micro-batch
            step = _retraced(step, trace, gradients=gradients)
        return Leaf(step, target if target is not None else depth, micro)

    def _raw(self, key: tuple, micro: int, depth: int | None, lora: Any) -> SimulatedStep:
        """One simulation: the model (at ``depth`` blocks of its stack) at exactly ``micro`` samples."""
        cached = ("raw", *key, micro, depth)
        if cached in self.cache:
            return self.cache[cached]
        precision, checkpointing, chunked, offload, lora_key = key
        if not offload and self.device.type == "cuda":
            # a CUDA plan has offloading rows too: their simulation gives this one (its trace with each saved
            # storage kept on the device until its last use: exact, checked in tests/plan/test_timeline.py)
            off = self._raw((precision, checkpointing, chunked, True, lora_key), micro, depth, lora)
            assert off.trace is not None
            result = _retraced(off, _trace.kept_on_device(off.trace))
            self.cache[cached] = result
            return result
        model = self.model if depth is None else _shallow_depth(self.model, self.stack[0], depth)  # type: ignore[index]
        result = self._run(model, key, micro, lora, blocks=self.stack[0] if depth is not None else None)  # type: ignore[index]
        self.cache[cached] = result
        return result

    def _run(self, model: nn.Module, key: tuple, micro: int, lora: Any, blocks: str | None = None) -> SimulatedStep:
        precision, checkpointing, chunked, offload, _ = key
        from nbtrainer._setup._precision import autocast_dtype

        loss_fn = None
        if chunked:
            from nbtrainer._setup._chunked_loss import ChunkedCausalLMLoss

            loss_fn = ChunkedCausalLMLoss(int(chunked))  # tokens per chunk (nbtrainer._plan._steps.chunk_tokens)
        batch = empty_batch(self.batch, torch.device("meta"), (self.example_size, micro))
        prepare = functools.partial(_sim_lora, lora=lora, structure=self.structure) if lora is not None else None
        if precision == "bf16-params":  # FSDP's mixed precision: the parameters in bf16, autocast off
            prepare = functools.partial(_in_bf16, then=prepare)
        try:
            return simulate_step(
                model,
                batch,
                device=self.sim_device,
                autocast_dtype=autocast_dtype(precision) if precision != "bf16-params" else None,
                checkpointing=checkpointing,
                loss_fn=loss_fn,
                criterion=self.criterion,
                offload_activations=offload,
                prepare=prepare,
                blocks=blocks,
            )
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            shapes = [tuple(t.shape) for t in iter_tensors(self.batch)]
            raise ValueError(
                f"plan_memory: the example batch does not fit the model ({type(exc).__name__}: {exc}). Batch tensor "
                f"shapes: {shapes}. Pass one batch exactly as the loader yields it (inputs and targets)."
            ) from exc


class _NotRepeated(Exception):
    """The stack's blocks do not repeat exactly in a trace: it cannot be put together at another depth."""


def _retraced(step: SimulatedStep, trace: _trace.Trace, **changes: Any) -> SimulatedStep:
    """``step`` with its peak, the parts at the peak and the largest activations read from ``trace`` (the same step
    at another size, depth, accumulation or placement of its saved storages)."""
    st = _trace.stats(trace)
    return dataclasses.replace(
        step,
        peak=st.peak,
        at_peak={"activations": st.peak - st.gradients_at_peak, "gradients": st.gradients_at_peak},
        largest_activations=st.largest_activations,
        trace=trace,
        **changes,
    )


def _lerp(a: SimulatedStep, b: SimulatedStep, t: float) -> SimulatedStep:
    return weighted([(Leaf(a, None, 0), 1 - t), (Leaf(b, None, 0), t)])


def weighted(terms: Terms) -> SimulatedStep:
    """The weighted sum of the leaves' numbers (each kept >= 0), as one step without a trace."""

    def f(values: list[int]) -> int:
        return max(0, round(sum(v * w for v, (_, w) in zip(values, terms, strict=True))))

    steps = [leaf.step for leaf, _ in terms]
    if len(steps) == 1 and terms[0][1] == 1.0:
        return dataclasses.replace(steps[0], trace=None)
    keys = list(steps[0].at_peak)
    return SimulatedStep(
        peak=f([s.peak for s in steps]),
        at_peak={k: f([s.at_peak.get(k, 0) for s in steps]) for k in keys},
        gradients=f([s.gradients for s in steps]),
        batch=f([s.batch for s in steps]),
        largest_activations=f([s.largest_activations for s in steps]),
        logits_loss=f([s.logits_loss for s in steps]),
    )


def _in_bf16(model: nn.Module, *, then: Any) -> None:
    if then is not None:
        then(model)
    model.to(torch.bfloat16)


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
    from nbtrainer._setup._lora import inside_modules

    model.requires_grad_(False)
    saved, kept = arith.lora_saved(structure, lora), arith.lora_kept(lora)
    for name, p in model.named_parameters():
        if inside_modules(name, saved) or name in kept:  # a task head / modules_to_save / trainable= trains in full
            p.requires_grad_(True)
    for name, _n_in, _n_out, _bias, quantizable in structure["linears"]:
        if inside_modules(name, saved):
            continue
        if not arith.targeted(name, lora.get("target_modules", "all-linear"), quantizable, structure["head"]):
            continue
        try:
            base = model.get_submodule(name)
        except AttributeError:  # a block left out of the shallow copy
            continue
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        owner._modules[leaf] = _SimLoRA(base, int(lora.get("r", 8)), float(lora.get("dropout", 0.0)))  # type: ignore[arg-type]
