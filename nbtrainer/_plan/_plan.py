"""``plan_memory``: each combination of the memory switches, its predicted peak and step time, the fastest that fits.

The peak of one training step (steady state: the optimizer's state exists) is, on the target device,

    parameters + optimizer state + batch + max(simulated step, gradients + optimizer-step temporaries)

where the *simulated step* (:mod:`nbtrainer._plan._simulate`) is the peak of what forward, loss and backward
allocate (activations, temporaries, the loss head's logits and their gradient, the gradients as backward creates
them), run on fake tensors for each precision / checkpointing / chunked-loss / offload combination, and the rest is
arithmetic (:mod:`nbtrainer._plan._arithmetic`). Repeated blocks (a decoder's layers) are simulated at two depths and
extrapolated to the model's (both parts grow by the same amount per block), and each micro-batch at sizes 1 and the
largest (activations grow linearly with the batch), so an 8B decoder plans in seconds.
"""

from __future__ import annotations

import functools
import html
import importlib.util
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import iter_tensors
from nbtrainer._options import MemoryOptions
from nbtrainer._plan import _arithmetic as arith
from nbtrainer._plan._cost import time_factor
from nbtrainer._plan._simulate import SimulatedStep, simulate_step
from nbtrainer._report._format import format_bytes

__all__ = ["MemoryPlan", "PlanRow", "plan_memory"]

GiB = 2**30
#: The parts of a row's peak, in display order (they sum to ``peak_bytes``).
PARTS = ("parameters", "gradients", "optimizer_state", "activations", "logits_loss", "temporaries", "batch")
_KINDS = ("adamw", "adamw8bit", "paged_adamw8bit", "adamw4bit", "adafactor")
_LIBRARY = {"adamw8bit": "bitsandbytes", "paged_adamw8bit": "bitsandbytes", "adamw4bit": "torchao"}
_DEFAULT_LORA = {"r": 16, "target_modules": "all-linear"}


@dataclass(frozen=True)
class PlanRow:
    """One combination of switches and what it needs.

    Attributes:
        switches: ``Trainer`` keyword arguments (``grad_accum_steps`` when the batch is split).
        micro_batch: samples per forward; ``micro_batch * grad_accum_steps`` is the effective batch.
        grad_accum_steps: micro-batches per optimizer step.
        peak_bytes: the predicted peak on the device.
        parts: ``peak_bytes`` split into :data:`PARTS`.
        host_bytes: what offloading keeps in host RAM instead.
        time_factor: predicted step time relative to plain fp32 at the whole batch (``nbtrainer._plan._cost``).
        fits: ``peak_bytes`` is within the budget less the margin.
        changes_training: the row trains something else than the model as given (a quantized base, adapters).
    """

    switches: dict[str, Any]
    micro_batch: int
    grad_accum_steps: int
    peak_bytes: int
    parts: dict[str, int]
    host_bytes: int
    time_factor: float
    fits: bool
    changes_training: bool = False

    @property
    def memory(self) -> MemoryOptions:
        """The row's memory switches."""
        return MemoryOptions.from_kwargs(self.switches)

    def describe(self) -> str:
        """The switches in a few words, e.g. ``bf16-mixed + checkpointing + adamw8bit, micro-batch 4 x 2``."""
        m = self.memory
        words = [m.precision]
        words += ["checkpointing"] if m.activation_checkpointing else []
        words += [m.optimizer] if m.optimizer and m.optimizer != "adamw" else []
        words += ["in-backward"] if m.optimizer_in_backward else []
        words += ["chunked loss"] if m.chunked_loss else []
        words += ["offload activations"] if m.offload_activations else []
        words += ["offload optimizer"] if m.offload_optimizer else []
        words += [f"quantize {m.quantize}"] if m.quantize else []
        words += [f"LoRA r={m.lora.get('r', 8)}"] if m.lora is not None else []
        text = " + ".join(words)
        if self.grad_accum_steps > 1:
            text += f", micro-batch {self.micro_batch} x {self.grad_accum_steps}"
        return text


@dataclass
class MemoryPlan:
    """The result of :func:`plan_memory`: rows (fastest first), the best that fits, and what was left out and why.

    Attributes:
        rows: the combinations worth a look: none is both slower and larger than another (plus plain fp32).
        best: the fastest row within ``budget * (1 - margin)`` (rows that change what trains only when asked).
        budget_bytes, margin, device, batch_size: the question asked.
        unavailable: ``{switch: reason}`` for switches not proposed on this target.
        seconds: how long planning took.

    Example:
        >>> import torch
        >>> from nbtrainer import plan_memory
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        >>> plan = plan_memory(model, (torch.randn(32, 64), torch.randint(0, 10, (32,))), budget_gb=1, device="cpu")
        >>> plan.best.switches, plan.best.fits
        ({}, True)
    """

    rows: list[PlanRow]
    best: PlanRow | None
    budget_bytes: int
    margin: float
    device: str
    batch_size: int
    unavailable: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    _predict: Any = field(default=None, repr=False, compare=False)

    def predict(self, **switches: Any) -> PlanRow:
        """The row for any one combination: ``Trainer`` keyword arguments (``precision=``, ``optimizer=``,
        ``grad_accum_steps=`` ...), or ``micro_batch=``.

        Example:
            >>> # plan.predict(precision="bf16-mixed", activation_checkpointing=True, optimizer="adamw8bit")
        """
        return self._predict(switches)

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * (1 - self.margin))

    def __str__(self) -> str:
        head = (
            f"memory plan for {self.device}, batch {self.batch_size}: budget {format_bytes(self.budget_bytes)} "
            f"(usable {format_bytes(self.usable_bytes)} after a {self.margin:.0%} margin)"
        )
        lines = [head, f"{'time':>6}  {'peak':>10}  fits  switches"]
        for row in self.rows:
            mark = "*" if row is self.best else " "
            lines.append(
                f"{row.time_factor:>5.2f}x  {format_bytes(row.peak_bytes):>10}  {'yes ' if row.fits else 'no  '}"
                f"{mark}{row.describe()}" + ("  (changes what trains)" if row.changes_training else "")
            )
        if self.best is None:
            lines.append("nothing fits: " + _nothing_fits(self))
        else:
            lines.append(f"best: {self.best.describe()} ({format_bytes(self.best.peak_bytes)})")
        if self.unavailable:
            lines.append("not proposed: " + "; ".join(f"{k}: {v}" for k, v in self.unavailable.items()))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame (one column per part, in bytes)."""
        import pandas as pd

        return pd.DataFrame(
            [
                {
                    "switches": row.describe(),
                    "micro_batch": row.micro_batch,
                    "grad_accum_steps": row.grad_accum_steps,
                    "peak_bytes": row.peak_bytes,
                    "time_factor": row.time_factor,
                    "fits": row.fits,
                    "host_bytes": row.host_bytes,
                    **row.parts,
                }
                for row in self.rows
            ]
        )

    def _repr_html_(self) -> str:
        return _to_html(self)


_COLORS = {
    "parameters": "#4c78a8",
    "gradients": "#f58518",
    "optimizer_state": "#e45756",
    "activations": "#72b7b2",
    "logits_loss": "#54a24b",
    "temporaries": "#b279a2",
    "batch": "#9d755d",
}


def _to_html(plan: MemoryPlan) -> str:
    """Each row as a stacked bar of its parts against the budget line (seed 003's strategy table as a picture)."""
    top = max([plan.budget_bytes, *(r.peak_bytes for r in plan.rows)]) * 1.05
    width = 420

    def px(n: int) -> float:
        return width * n / top

    legend = " ".join(
        f'<span style="display:inline-block;width:10px;height:10px;background:{c}"></span> {html.escape(k)}'
        for k, c in _COLORS.items()
    )
    body = []
    for row in plan.rows:
        bars = "".join(
            f'<div title="{k}: {format_bytes(v)}" style="position:absolute;left:{px(start):.1f}px;'
            f'width:{px(v):.1f}px;height:14px;background:{_COLORS[k]}"></div>'
            for k, v, start in _stacked(row.parts)
        )
        line = (
            f'<div class="nbt-plan-budget" style="position:absolute;left:{px(plan.usable_bytes):.1f}px;width:2px;'
            'height:18px;top:-2px;background:#000"></div>'
        )
        cls = "nbt-plan-row nbt-plan-best" if row is plan.best else "nbt-plan-row"
        body.append(
            f'<tr class="{cls}"><td>{html.escape(row.describe())}</td><td>{row.time_factor:.2f}x</td>'
            f"<td>{format_bytes(row.peak_bytes)}</td><td>{'yes' if row.fits else 'no'}</td>"
            f'<td><div style="position:relative;width:{width}px;height:14px">{bars}{line}</div></td></tr>'
        )
    best = html.escape(plan.best.describe()) if plan.best else html.escape("nothing fits: " + _nothing_fits(plan))
    return (
        f'<div class="nbt-plan"><b>Memory plan</b> for {html.escape(plan.device)}, batch {plan.batch_size}, budget '
        f"{format_bytes(plan.budget_bytes)} (the line: {format_bytes(plan.usable_bytes)} after the margin). "
        f"Best: <b>{best}</b><br>{legend}<table><tr><th>switches</th><th>time</th><th>peak</th><th>fits</th>"
        f"<th>parts</th></tr>{''.join(body)}</table></div>"
    )


def _stacked(parts: Mapping[str, int]) -> Iterable[tuple[str, int, int]]:
    start = 0
    for k in PARTS:
        v = int(parts.get(k, 0))
        if v > 0:
            yield k, v, start
            start += v


def _nothing_fits(plan: MemoryPlan) -> str:
    smallest = min(plan.rows, key=lambda r: r.peak_bytes)
    return (
        f"the smallest row ({smallest.describe()}) needs {format_bytes(smallest.peak_bytes)}, more than the usable "
        f"{format_bytes(plan.usable_bytes)}. What would help: a smaller batch or shorter sequences, LoRA on a "
        "quantized base (allow=('lora',)), or a device with more memory."
    )


# -- the search -------------------------------------------------------------------------------------------------------


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


def _resize(obj: Any, old: int, new: int) -> Any:
    """The batch with every tensor whose first dimension is ``old`` given ``new`` rows, on the meta device."""
    if isinstance(obj, torch.Tensor):
        shape = (new, *obj.shape[1:]) if obj.dim() > 0 and obj.shape[0] == old else tuple(obj.shape)
        return torch.empty(shape, dtype=obj.dtype, device="meta")
    if isinstance(obj, Mapping):
        return {k: _resize(v, old, new) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
        return type(obj)(_resize(v, old, new) for v in obj)
    if isinstance(obj, tuple):
        return type(obj)(*(_resize(v, old, new) for v in obj))
    return obj


def _micro_batches(batch_size: int) -> list[int]:
    """The whole batch, then halvings that divide it exactly, down to 1 (at most 8 sizes)."""
    sizes, m = [batch_size], batch_size
    while m > 1 and len(sizes) < 8:
        m //= 2
        while m > 1 and batch_size % m:
            m -= 1
        if m not in sizes:
            sizes.append(m)
    return sizes


def _repeated_stack(model: nn.Module) -> tuple[str, int] | None:
    """``(qualified name of the ModuleList of repeated blocks, its length)`` when the model has one to extrapolate."""
    from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks

    blocks = find_checkpointable_blocks(model)
    if len(blocks) < 4:
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
    import copy

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
    node._modules[path[-1]] = nn.ModuleList(list(blocks)[:depth])
    for m in (root, *(root.get_submodule(".".join(path[: i + 1])) for i in range(len(path) - 1))):
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "num_hidden_layers"):
            config = copy.copy(config)
            config.num_hidden_layers = depth
            m.__dict__["config"] = config
    return root


@dataclass
class _Context:
    model: nn.Module
    batch: Any
    example_size: int
    device: torch.device
    criterion: Any
    structure: dict[str, Any]
    stack: tuple[str, int] | None
    causal_lm: bool
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
        in_backward: bool,
        accumulating: bool,
        micro: int,
        lora: Any,
    ) -> SimulatedStep:
        """The simulated step at ``micro`` samples, from (cached) simulations at 1 and the example's size, and at two
        depths of the repeated stack, extrapolated."""
        # fp16 and bf16 autocast cast the same ops to 2-byte types: one simulation serves both
        half = "bf16-mixed" if precision == "fp16-mixed" else precision
        key = (half, checkpointing, chunked, offload, in_backward, accumulating, lora is not None)
        sizes = sorted({1, self.example_size})
        at = {m: self._at_size(key, m, lora) for m in sizes}
        if len(sizes) == 1:
            return at[sizes[0]]
        lo, hi = at[sizes[0]], at[sizes[1]]
        t = (micro - sizes[0]) / (sizes[1] - sizes[0])
        return _lerp(lo, hi, t)

    def _at_size(self, key: tuple, micro: int, lora: Any) -> SimulatedStep:
        if (*key, micro) in self.cache:
            return self.cache[(*key, micro)]
        if self.stack is None:
            result = self._run(self.model, key, micro, lora)
        else:
            name, depth = self.stack
            a, b = (self._run(_shallow_depth(self.model, name, d), key, micro, lora) for d in (2, 3))
            result = _lerp(a, b, depth - 2)  # per block: b - a
        self.cache[(*key, micro)] = result
        return result

    def _run(self, model: nn.Module, key: tuple, micro: int, lora: Any) -> SimulatedStep:
        precision, checkpointing, chunked, offload, in_backward, accumulating, _ = key
        from nbtrainer._setup._precision import autocast_dtype

        loss_fn = None
        if chunked:
            from nbtrainer._setup._chunked_loss import ChunkedCausalLMLoss

            loss_fn = ChunkedCausalLMLoss(1024 if chunked is True else int(chunked))
        batch = _resize(self.batch, self.example_size, micro)
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
                free_gradients=in_backward,
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


def _row(
    ctx: _Context,
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
        in_backward=memory.optimizer_in_backward,
        accumulating=micro < batch_size,
        micro=micro,
        lora=memory.lora,
    )
    grads = trained_bytes
    if memory.optimizer_in_backward:
        # each gradient is applied and dropped as soon as it is complete (the simulation does the same): its peak,
        # plus the update's temporary of one parameter
        grads_part = sim.at_peak.get("gradients", 0)
        activations = sim.peak - grads_part
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


def _pareto(rows: list[PlanRow]) -> list[PlanRow]:
    """The rows no other row beats on both time and peak (ties: the fewer switches), fastest first."""
    ordered = sorted(rows, key=lambda r: (r.time_factor, r.peak_bytes, len(r.switches)))
    front: list[PlanRow] = []
    smallest = math.inf
    for row in ordered:
        if row.peak_bytes < smallest:
            front.append(row)
            smallest = row.peak_bytes
    return front


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

    Returns:
        A :class:`MemoryPlan`.

    Raises:
        ValueError: a budget that is not positive, an unknown target, a batch that does not fit the model, a model
            with no trainable parameters.
    """
    start = time.perf_counter()
    if isinstance(budget_gb, bool) or not isinstance(budget_gb, (int, float)) or not budget_gb > 0:
        raise ValueError(f"plan_memory(budget_gb={budget_gb!r}): the budget must be a positive number of GiB.")
    if not isinstance(margin, (int, float)) or not 0 <= margin < 1:
        raise ValueError(f"plan_memory(margin={margin!r}): a share of the budget in [0, 1), e.g. 0.1.")
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_memory: model must be a torch.nn.Module, got {type(model).__name__}.")
    target = _resolve_target(device)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "plan_memory: the model has no trainable parameters (all requires_grad=False). Unfreeze the layers to "
            "train, or plan LoRA adapters with allow=('lora',)."
        )
    example = _batch_size_of(batch)
    batch_size = example if batch_size is None else batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"plan_memory(batch_size={batch_size!r}): the effective batch, an int >= 1.")
    allowed = set(allow or ())
    unknown = allowed - {"lora"}
    if unknown:
        raise ValueError(f"plan_memory(allow={sorted(unknown)}): the switches to allow are ('lora',).")
    if lora is not None:
        allowed.add("lora")
    usable = int(budget_gb * GiB * (1 - margin))

    from nbtrainer._setup._chunked_loss import check_chunked_loss

    try:  # the Trainer's own test: a Hugging Face *ForCausalLM whose logits come straight from the head
        check_chunked_loss(True, model=model, criterion=criterion, compute_loss=None, metrics=None, distributed=False)
        causal = isinstance(batch, Mapping) and "labels" in batch
    except (ValueError, TypeError):
        causal = False
    ctx = _Context(
        model=model,
        batch=batch,
        example_size=example,
        device=target,
        criterion=criterion,
        structure=arith.model_structure(model),
        stack=_repeated_stack(model),
        causal_lm=causal,
    )
    unavailable: dict[str, str] = {}
    precisions = ["fp32", "bf16-mixed"]
    if target.type == "cuda":
        precisions.append("fp16-mixed")
    else:
        unavailable["fp16-mixed"] = "emulated on most CPUs: slower than fp32"
    kinds = [k for k in _KINDS if optimizer is None or k == optimizer]
    if optimizer is not None and not kinds:
        kinds = [optimizer]
    for k in list(kinds):
        lib = _LIBRARY.get(k)
        if lib is not None and importlib.util.find_spec(lib) is None:
            kinds.remove(k)
            unavailable[k] = f"needs {lib}: pip install 'nbtrainer[quant]'"
        elif k == "paged_adamw8bit" and target.type != "cuda":
            kinds.remove(k)
            unavailable[k] = "paging needs CUDA"
    offloads = [False, True] if target.type == "cuda" else [False]
    if target.type != "cuda":
        unavailable["offload_activations / offload_optimizer"] = "need a CUDA device (host RAM is the device here)"
    chunked_opts = [False, True] if causal else [False]
    if not causal:
        unavailable["chunked_loss"] = "for Hugging Face causal LMs only"
    structures: list[tuple[str | None, Any]] = [(None, None)]
    lora_settings = dict(lora) if lora is not None else dict(_DEFAULT_LORA)
    quantizable = any(row[4] for row in ctx.structure["linears"])
    if quantizable:
        structures.append((None, lora_settings))
        if importlib.util.find_spec("bitsandbytes") is not None:
            structures.append(("nf4", lora_settings))
        else:
            unavailable["quantize"] = "needs bitsandbytes: pip install 'nbtrainer[quant]'"
    from nbtrainer._setup._activation_checkpointing import find_checkpointable_blocks
    from nbtrainer._setup._model_setup import has_own_checkpointing

    checkpointing = [False]
    if has_own_checkpointing(model) or find_checkpointable_blocks(model):
        checkpointing.append(True)
    else:
        unavailable["activation_checkpointing"] = "the model has no repeated blocks to checkpoint"
    rows: list[PlanRow] = []
    micros = _micro_batches(batch_size) if example >= 1 else [batch_size]
    for precision in precisions:
        for quantize, lora_cfg in structures:
            if quantize is not None and precision == "fp32" and target.type == "cuda":
                continue  # a 4-bit base computes in half precision on CUDA
            for ckpt in checkpointing:
                for chunked in chunked_opts:
                    for off_act in offloads:
                        for kind in kinds:
                            for in_bwd in (False, True):
                                for off_opt in offloads:
                                    for micro in micros:
                                        accum = batch_size // micro
                                        if in_bwd and (precision == "fp16-mixed" or accum > 1 or off_opt):
                                            continue
                                        if off_opt and kind in arith.KBIT:
                                            continue
                                        if in_bwd and kind == "paged_adamw8bit":
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
                                        rows.append(_row(ctx, memory, micro, batch_size, usable))
    baseline = next(r for r in rows if r.memory == MemoryOptions(optimizer="adamw") and r.grad_accum_steps == 1)
    pickable = [r for r in rows if r.fits and (not r.changes_training or "lora" in allowed)]
    best = min(pickable, key=lambda r: (r.time_factor, r.peak_bytes, len(r.switches)), default=None)
    # the plain rows' front, then the front of the rows that train something else (listed, picked only when asked)
    shown = _pareto([r for r in rows if not r.changes_training]) + _pareto([r for r in rows if r.changes_training])
    for extra in (baseline, best):
        if extra is not None and extra not in shown:
            shown.append(extra)
    shown.sort(key=lambda r: (r.time_factor, r.peak_bytes))

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
        if switches.get("lora") is True:
            switches["lora"] = dict(lora_settings)
        return _row(ctx, MemoryOptions(**switches), micro, batch_size, usable)

    return MemoryPlan(
        rows=shown,
        best=best,
        budget_bytes=int(budget_gb * GiB),
        margin=float(margin),
        device=str(target),
        batch_size=batch_size,
        unavailable=unavailable,
        seconds=time.perf_counter() - start,
        _predict=predict,
    )
