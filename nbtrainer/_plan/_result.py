"""What ``plan_memory`` returns: :class:`PlanRow` (one combination of switches and its predicted peak) and
:class:`MemoryPlan` (the rows, the best, ``predict``, a text table, a DataFrame and a stacked-bar picture)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrainer._options import LABELS, SWITCH, MemoryOptions
from nbtrainer._report._format import format_bytes

__all__ = [
    "PARTS",
    "PART_COLORS",
    "MemoryPlan",
    "PlanRow",
    "check_batch_size",
    "check_budget_gb",
    "check_criterion",
    "check_share",
]


# The arguments every "will it fit" question takes, checked alike by plan_memory and profile_model(...).fits()


def check_budget_gb(budget_gb: Any, caller: str) -> None:
    """Refuse a budget that is not a positive, finite number of GiB (``nan`` and ``inf`` are not budgets)."""
    number = isinstance(budget_gb, (int, float)) and not isinstance(budget_gb, bool)
    if not number or not math.isfinite(budget_gb) or not budget_gb > 0:
        raise ValueError(f"{caller}(budget_gb={budget_gb!r}): the budget must be a positive number of GiB, e.g. 16.")


def check_criterion(criterion: Any, caller: str) -> None:
    """Refuse a criterion that runs a model of its own (``DistillationLoss``'s teacher): the simulated step would
    run that model's real weights on fake tensors (torch's FakeTensor assertion), and no row counts its weights
    nor its forward pass, so a plan would promise a fit the real step does not have."""
    from torch import nn

    teacher = getattr(criterion, "teacher", None)
    if not isinstance(teacher, nn.Module):
        return
    size = sum(t.numel() * t.element_size() for t in (*teacher.parameters(), *teacher.buffers()))
    raise ValueError(
        f"{caller}: the criterion {type(criterion).__name__} runs a teacher model ({type(teacher).__name__}, "
        f"{format_bytes(size)} of weights) that the memory plan does not count yet. Plan the student alone "
        "(plan_memory(student, batch, budget_gb=...) with the base loss) and add the teacher's weights and one "
        "forward pass of it by hand, then set the switches yourself and drop memory_budget_gb."
    )


def check_share(value: Any, caller: str, name: str) -> None:
    """Refuse a share of the budget kept free outside [0, 1)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 <= value < 1:
        raise ValueError(f"{caller}({name}={value!r}): a share of the budget in [0, 1), e.g. 0.1.")


def check_batch_size(value: Any, caller: str, what: str = "the batch size") -> None:
    """Refuse a batch size that is not an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{caller}(batch_size={value!r}): {what}, an int >= 1.")


#: The parts of a row's peak, in display order (they sum to ``peak_bytes``).
PARTS = ("parameters", "gradients", "optimizer_state", "activations", "logits_loss", "temporaries", "batch")


@dataclass(frozen=True)
class PlanRow:
    """One combination of switches and what it needs.

    Attributes:
        switches: ``Trainer`` keyword arguments (``grad_accum_steps`` when the batch is split).
        micro_batch: samples per forward; ``micro_batch * grad_accum_steps`` is the effective batch.
        grad_accum_steps: micro-batches per optimizer step.
        peak_bytes: the predicted peak of the tensors on the device (``torch.cuda.max_memory_allocated`` is this plus
            the allocator's rounding of each tensor and cuBLAS's workspaces).
        parts: ``peak_bytes`` split into :data:`PARTS`.
        host_bytes: what offloading keeps in host RAM instead.
        time_factor: predicted step time relative to plain fp32 at the whole batch (``nbtrainer._plan._cost``).
        fits: what the device must hold (``needed_bytes``) is within the budget less the margin: on a CUDA target
            the caching allocator's ``reserved_bytes`` plus the CUDA context, elsewhere the peak itself.
        changes_training: the row trains something else than the model as given (a quantized base, adapters).
        reserved_bytes: on a CUDA target, what the caching allocator reserves at the peak
            (``torch.cuda.max_memory_reserved``): the step replayed through its segment and block rules
            (``nbtrainer._plan._reserved``), workspaces included; elsewhere ``peak_bytes``.
        context_bytes: what a CUDA target holds outside the allocator (the CUDA context,
            ``nbtrainer._plan._allocator.CUDA_CONTEXT_BYTES``); 0 elsewhere.
    """

    switches: dict[str, Any]
    micro_batch: int
    grad_accum_steps: int
    peak_bytes: int
    parts: dict[str, int]
    host_bytes: int
    time_factor: float
    changes_training: bool = False
    context_bytes: int = 0
    #: the budget less the margin, which ``fits`` compares with
    usable_bytes: int = field(default=0, repr=False)
    #: the reserved bytes, or a function that replays the step for them (called once, when first asked: a plan
    #: replays the rows it shows and those its search reaches, not all of them)
    _reserved: Any = field(default=None, repr=False, compare=False)

    @property
    def reserved_bytes(self) -> int:
        reserved = self._reserved
        if callable(reserved):
            reserved = max(self.peak_bytes, int(reserved()))  # a block is never smaller than its tensor
            object.__setattr__(self, "_reserved", reserved)
        return self.peak_bytes if reserved is None else int(reserved)

    @property
    def needed_bytes(self) -> int:
        """What ``fits`` compares with the usable budget: ``reserved_bytes + context_bytes``."""
        return self.reserved_bytes + self.context_bytes

    @property
    def fits(self) -> bool:
        if self.peak_bytes + self.context_bytes > self.usable_bytes:  # reserved >= peak: no replay needed
            return False
        return self.needed_bytes <= self.usable_bytes

    @property
    def memory(self) -> MemoryOptions:
        """The row's memory switches."""
        return MemoryOptions.from_kwargs(self.switches)

    def __str__(self) -> str:
        from nbtrainer._report._format import format_bytes

        reserved = f", {format_bytes(self.reserved_bytes)} reserved" if self.reserved_bytes != self.peak_bytes else ""
        context = f" + {format_bytes(self.context_bytes)} CUDA context" if self.context_bytes else ""
        parts = ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in self.parts.items())
        host = f"; {format_bytes(self.host_bytes)} in host RAM" if self.host_bytes else ""
        return (
            f"{self.describe()}: peak {format_bytes(self.peak_bytes)}{reserved}{context}, "
            f"{'fits' if self.fits else 'does not fit'}; step time {self.time_factor:.2f}x fp32's\n  {parts}{host}"
        )

    def _repr_html_(self) -> str:
        import html

        return f"<pre class='nbtrainer-plan-row'>{html.escape(str(self))}</pre>"

    def describe(self) -> str:
        """The switches in a few words, e.g. ``bf16-mixed + checkpointing + adamw8bit, micro-batch 4 x 2``."""
        m = self.memory
        words = [m.precision]
        words += [_checkpointing_words(m.activation_checkpointing)] if m.activation_checkpointing else []
        words += [m.optimizer] if m.optimizer and m.optimizer != "adamw" else []
        words += [LABELS[SWITCH.optimizer_in_backward]] if m.optimizer_in_backward else []
        words += [LABELS[SWITCH.chunked_loss]] if m.chunked_loss else []
        words += [LABELS[SWITCH.offload_activations]] if m.offload_activations else []
        words += [LABELS[SWITCH.offload_optimizer]] if m.offload_optimizer else []
        words += [f"{LABELS[SWITCH.quantize]} {m.quantize}"] if m.quantize else []
        words += [f"{LABELS[SWITCH.lora]} r={m.lora.get('r', 8)}"] if m.lora is not None else []
        text = " + ".join(words)
        if self.grad_accum_steps > 1:
            text += f", micro-batch {self.micro_batch} x {self.grad_accum_steps}"
        return text


@dataclass
class MemoryPlan:
    """The result of :func:`plan_memory`: rows (fastest first), the best that fits, and what was left out and why.

    A row's peak comes from a simulated step, and each is simulated when first needed: ``predict`` simulates the
    row it is asked for, ``best`` the fastest rows until one fits, ``rows`` (and the text, the picture, the
    DataFrame) every row. The answers do not depend on what is asked first.

    Attributes:
        rows: the combinations worth a look: none is both slower and larger than another (plus plain fp32).
        best: the fastest row within ``budget * (1 - margin)`` (rows that change what trains only when asked).
        budget_bytes, margin, device, batch_size: the question asked.
        unavailable: ``{switch: reason}`` for switches not proposed on this target.
        seconds: how long planning took so far (the rows simulated when first read included).

    Example:
        >>> import torch
        >>> from nbtrainer import plan_memory
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        >>> plan = plan_memory(model, (torch.randn(32, 64), torch.randint(0, 10, (32,))), budget_gb=1, device="cpu")
        >>> plan.best.switches, plan.best.fits
        ({'optimizer': 'adamw'}, True)
    """

    budget_bytes: int
    margin: float
    device: str
    batch_size: int
    unavailable: dict[str, str] = field(default_factory=dict)
    _predict: Any = field(default=None, repr=False, compare=False)
    #: the rows, simulated on first use (nbtrainer._plan._search.RowSearch: ``best()``, ``table()``, ``seconds``)
    _search: Any = field(default=None, repr=False, compare=False)
    #: the seconds plan_memory took before any row was simulated
    _started: float = field(default=0.0, repr=False)
    #: what the device holds outside the caching allocator, counted in each row's ``fits`` (the CUDA context)
    context_bytes: int = 0

    @property
    def rows(self) -> list[PlanRow]:
        return list(self._search.table().shown)

    @property
    def best(self) -> PlanRow | None:
        return self._search.best()

    @property
    def _candidates(self) -> list[PlanRow]:
        """The pickable rows whose peak fits, fastest first (a step-down's choices; it checks ``fits`` as it goes)."""
        return list(self._search.table().candidates)

    @property
    def seconds(self) -> float:
        return self._started + float(self._search.seconds)

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
        cuda = self.context_bytes > 0
        if cuda:
            head += f"; a row needs its reserved bytes plus the CUDA context ({format_bytes(self.context_bytes)})"
        lines = [head, f"{'time':>6}  {'peak':>10}  " + (f"{'reserved':>10}  " if cuda else "") + "fits  switches"]
        for row in self.rows:
            mark = "*" if row is self.best else " "
            reserved = f"{format_bytes(row.reserved_bytes):>10}  " if cuda else ""
            lines.append(
                f"{row.time_factor:>5.2f}x  {format_bytes(row.peak_bytes):>10}  {reserved}"
                f"{'yes ' if row.fits else 'no  '}{mark}{row.describe()}"
                + ("  (changes what trains)" if row.changes_training else "")
            )
        if self.best is None:
            lines.append("nothing fits: " + _nothing_fits(self))
        else:
            lines.append(f"best: {self.best.describe()} ({_need(self.best)})")
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
                    "reserved_bytes": row.reserved_bytes,
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


#: The color of each part in the plan's bars (the panel's plan view draws with the same).
PART_COLORS = {
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
        for k, c in PART_COLORS.items()
    )
    body = []
    for row in plan.rows:
        bars = "".join(
            f'<div title="{k}: {format_bytes(v)}" style="position:absolute;left:{px(start):.1f}px;'
            f'width:{px(v):.1f}px;height:14px;background:{PART_COLORS[k]}"></div>'
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


def _checkpointing_words(value: Any) -> str:
    label = LABELS[SWITCH.activation_checkpointing]
    if isinstance(value, float):
        return f"{label} {value:g} of the blocks"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{label} {value} blocks"
    return label


def _need(row: PlanRow) -> str:
    """What a row needs, in words: its peak, or on a CUDA target its reserved bytes and the context."""
    if not row.context_bytes:
        return format_bytes(row.peak_bytes)
    return (
        f"{format_bytes(row.needed_bytes)}: {format_bytes(row.reserved_bytes)} reserved by the caching allocator "
        f"for a {format_bytes(row.peak_bytes)} peak, and the CUDA context"
    )


def _nothing_fits(plan: MemoryPlan, ask: str = "ask for it with allow=('lora',)") -> str:
    same = [r for r in plan.rows if not r.changes_training] or plan.rows
    smallest = min(same, key=lambda r: r.needed_bytes)
    text = (
        f"the smallest row that trains the model as given ({smallest.describe()}) needs "
        f"{_need(smallest)}, more than the usable {format_bytes(plan.usable_bytes)}."
    )
    other = [r for r in plan.rows if r.changes_training and r.fits]
    if other:
        fastest = min(other, key=lambda r: r.time_factor)
        return (
            f"{text} With adapters it fits: {fastest.describe()} ({_need(fastest)}); {ask}. "
            "Else: a smaller batch or shorter sequences, or a device with more memory."
        )
    return (
        f"{text} What would help: a smaller batch or shorter sequences, LoRA on a quantized base "
        "(allow=('lora',)), or a device with more memory."
    )
