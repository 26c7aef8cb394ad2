"""What :func:`~nbtrainer.profile_model` measured (:class:`ModelProfile`) and how it is shown: a long
pandas table, HTML (the notebook view) and text (the ``repr``). Numbers go through :mod:`nbtrainer._report._format`.
"""

from __future__ import annotations

import copy
import html
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from nbtrainer._options import MemoryOptions
from nbtrainer._profile._fit import FitResult, plan_fit, planned_fit
from nbtrainer._profile._switches import normalize_switches
from nbtrainer._report._format import format_bytes, format_count, format_duration
from nbtrainer._setup._precision import normalize_precision, resolve_device

__all__ = ["ModelProfile", "rows", "to_frame", "to_html", "to_text"]

_MEMORY_ROWS = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "total",
    "activations_checkpointed",
    "recompute_peak",
    "total_checkpointed",
    "cuda_peak",
    "cuda_peak_checkpointed",
)
_LATENCY_ROWS = ("median", "p90", "mean", "min", "throughput")


@dataclass
class ModelProfile:
    """What :func:`~nbtrainer.profile_model` measured. Plain data; ``to_dict()`` is JSON-serialisable.

    ``ModelProfile.MEMORY_ROWS`` names the entries of a ``memory`` breakdown, in the order reports show them.

    Attributes:
        model_name: ``type(model).__name__``.
        batch_size: Samples in the example inputs.
        params: All parameters (tied parameters once).
        trainable_params: Parameters with ``requires_grad``.
        size_mb: Parameters + buffers in memory, MiB (2**20 bytes).
        size: ``{"parameters_bytes", "buffers_bytes", "by_dtype": {dtype: bytes}, "serialized_bytes"}``
            (``serialized_bytes``: ``torch.save(state_dict)``).
        macs: Forward MACs per sample, ptflops (aten backend); ``None`` when not counted.
        flops: Forward FLOPs per sample, ``FlopCounterMode``; ``None`` when not counted.
        compute: Every count with its counter, per batch and per sample, forward and forward+backward.
        latency_ms: ``{device: {precision: {"median", "p90", "mean", "min", "max", "std", "n_iters",
            "batch_size", "throughput"}}}`` in ms (throughput in samples/s), or ``{"supported": False,
            "reason": ...}`` where the device can't run that precision.
        memory: ``{device: {precision: breakdown}}``, bytes; see
            :func:`nbtrainer._memory._breakdown.measure_training_memory`.
        environment: torch / ptflops versions and device names.
        seconds: Wall time per profiling step.
        structure: The layer table :meth:`fits` needs for the memory switches: ``{"head", "params": [[name,
            numel, element_size, trainable, shape]], "linears": [[name, in, out, has_bias, quantizable]]}``.
        notes: What the reader must know to read the numbers (a meta model's profile is planned, not measured,
            and for which device); shown first in the text and the HTML.
    """

    MEMORY_ROWS: ClassVar[tuple[str, ...]] = _MEMORY_ROWS

    model_name: str
    batch_size: int
    params: int
    trainable_params: int
    size_mb: float
    size: dict[str, Any]
    macs: float | None = None
    flops: float | None = None
    compute: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    memory: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    structure: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def fits(
        self,
        budget_gb: float,
        batch_size: int | None = None,
        *,
        device: str | None = None,
        precision: str | None = None,
        checkpointing: bool = False,
        headroom: float = 0.0,
        quantize: str | None = None,
        lora: Any = None,
        optimizer: str | None = None,
        offload_activations: bool = False,
        offload_optimizer: bool = False,
        optimizer_in_backward: bool = False,
        activation_checkpointing: bool | None = None,
    ) -> FitResult:
        """Does one training step fit in ``budget_gb`` GiB? If not, suggest micro-batch x accumulation.

        A measured profile (a model with weights) answers from its measured step, with the switches' effect computed
        from the layer shapes by the planner's arithmetic (``nbtrainer._plan._arithmetic``). A planned profile (a
        model on the meta device) answers with the planner's row: ``plan_memory(...).predict(**switches)``.

        The memory switches take the Trainer's option names and values; their effect on the measured parts is
        computed from the layer shapes (the ``FitResult`` says which switch saved what, in ``savings`` and its
        ``suggestion``). Offloading moves bytes to host RAM (``host_bytes``): the budget is the training
        device's memory, as on a GPU (on a CPU both are the same RAM, and the Trainer refuses
        ``offload_optimizer``).

        Args:
            budget_gb: Memory budget in GiB (2**30 bytes, as GPU memory is reported): a positive, finite number.
            batch_size: Batch size to check, an int >= 1 (default: the profiled one).
            device: Which measured device (default: the first measured).
            precision: Which measured precision (default: the first measured on that device).
            activation_checkpointing: Assume activation checkpointing of the model's repeated blocks (the Trainer's
                name; ``checkpointing=`` is its former one here and still works).
            headroom: Fraction of the budget to keep free (CUDA context, fragmentation), in [0, 1).
            quantize: ``"nf4"``, ``"nf4-dq"``, ``"fp4"`` or ``"int8"``: every ``nn.Linear`` but the output head
                frozen in 4 bits (0.5 byte per weight plus a scale per block of 64) or 8 bits.
            lora: ``dict(r=8, target_modules="all-linear")`` or a ``peft.LoraConfig``: base frozen, adapters of
                ``r * (in + out)`` parameters per targeted layer train (their gradients and optimizer state only).
            optimizer: ``"adamw"``, ``"adam"``, ``"adafactor"``, ``"adamw8bit"``, ``"paged_adamw8bit"`` (2 bytes
                of state per trained value) or ``"adamw4bit"`` (1 byte); None: the optimizer profiled.
            offload_activations: Saved activations wait in host RAM.
            offload_optimizer: The optimizer state lives in host RAM.
            optimizer_in_backward: Each gradient is freed once its parameter is updated (about the largest one
                is kept).

        Returns:
            A :class:`~nbtrainer._profile._fit.FitResult` (truthy when it fits).

        Raises:
            ValueError: a budget, batch size or headroom out of range (checked as ``plan_memory`` checks them).

        Example:
            >>> import torch
            >>> from nbtrainer import profile_model
            >>> prof = profile_model(torch.nn.Linear(64, 64), torch.randn(8, 64), include=("memory",))
            >>> prof.fits(budget_gb=1, batch_size=64).fits
            True
            >>> prof.fits(budget_gb=1, batch_size=64, optimizer="adamw8bit").breakdown["optimizer_state"]
            10880
        """
        plan = getattr(self, "_plan", None)
        ckpt = checkpointing if activation_checkpointing is None else activation_checkpointing

        def switches(precision: str) -> MemoryOptions:  # the Trainer's keywords, checked into one MemoryOptions
            return normalize_switches(
                precision=precision,
                activation_checkpointing=ckpt,
                quantize=quantize,
                lora=lora,
                optimizer=optimizer,
                offload_activations=offload_activations,
                offload_optimizer=offload_optimizer,
                optimizer_in_backward=optimizer_in_backward,
            )

        if plan is not None:  # a meta model's profile: the planner's row, not a measured step (_profile/_planned)
            memory = switches(normalize_precision(precision or "fp32"))
            size = self.batch_size if batch_size is None else batch_size
            return planned_fit(
                plan, budget_gb, batch_size=size, example_size=self.batch_size, switches=memory, headroom=headroom
            )
        measured = {d: {p: m for p, m in per.items() if m.get("supported", True)} for d, per in self.memory.items()}
        measured = {d: per for d, per in measured.items() if per}
        if not measured:
            raise ValueError("No training memory was measured; profile with 'memory' in include=")
        dev = device if device is not None else next(iter(measured))
        dev = dev if dev in measured else str(resolve_device(dev))
        if dev not in measured:
            raise ValueError(f"Memory was not measured on {device!r}; measured: {sorted(measured)}")
        prec = normalize_precision(precision) if precision is not None else next(iter(measured[dev]))
        if prec not in measured[dev]:
            raise ValueError(f"Memory was not measured for {prec!r} on {dev}; measured: {sorted(measured[dev])}")
        return plan_fit(
            measured[dev][prec],
            budget_gb=budget_gb,
            batch_size=self.batch_size if batch_size is None else batch_size,
            switches=switches(prec),
            headroom=headroom,
            structure=self.structure,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain nested data (dicts, lists, numbers, strings): every field above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelProfile:
        """Rebuild a profile from :meth:`to_dict` output (e.g. loaded back from JSON)."""
        return cls(**copy.deepcopy(data))

    def to_pandas(self) -> Any:
        """One long table: columns ``section, device, precision, metric, value, unit, source``; the sections are
        ``model`` (parameters and sizes), ``compute`` (MACs / FLOPs), ``latency`` and ``memory``.

        Example:
            >>> import torch
            >>> from nbtrainer import profile_model
            >>> prof = profile_model(torch.nn.Linear(8, 4), torch.randn(2, 8), include=("flops",))
            >>> list(dict.fromkeys(prof.to_pandas().section))
            ['model', 'compute']
        """
        return to_frame(self)

    def _repr_html_(self) -> str:
        return to_html(self)

    def __repr__(self) -> str:
        return to_text(self)


def rows(prof: ModelProfile) -> list[dict[str, Any]]:
    """Long-format records ``{section, device, precision, metric, value, unit, source}``."""
    out: list[dict[str, Any]] = []

    def add(
        section: str, metric: str, value: Any, unit: str = "", source: str = "", device: str = "", precision: str = ""
    ) -> None:
        out.append(
            {
                "section": section,
                "device": device,
                "precision": precision,
                "metric": metric,
                "value": value,
                "unit": unit,
                "source": source,
            }
        )

    add("model", "params", prof.params, "count")
    add("model", "trainable_params", prof.trainable_params, "count")
    add("model", "size_in_memory", prof.size["parameters_bytes"] + prof.size["buffers_bytes"], "bytes")
    for dtype, nbytes in prof.size["by_dtype"].items():
        add("model", f"size_{dtype}", nbytes, "bytes")
    add("model", "serialized_size", prof.size["serialized_bytes"], "bytes", "torch.save(state_dict)")
    if prof.compute:
        counters = prof.compute["counters"]
        for per in ("per_sample", "per_batch"):
            add("compute", f"forward_macs_{per}", prof.compute["ptflops_macs"]["forward"][per], "MAC", counters["macs"])
            for pass_, counts in prof.compute["flop_counter_flops"].items():
                add("compute", f"{pass_}_flops_{per}", counts[per], "FLOP", counters["flops"])
    for section, data, keys in (("latency", prof.latency_ms, _LATENCY_ROWS), ("memory", prof.memory, _MEMORY_ROWS)):
        for device, by_precision in data.items():
            for precision, entry in by_precision.items():
                if not entry.get("supported", True):
                    add(section, "supported", False, "", entry["reason"], device, precision)
                    continue
                for key in keys:
                    if entry.get(key) is not None:
                        unit = "bytes" if section == "memory" else ("samples/s" if key == "throughput" else "ms")
                        add(section, key, entry[key], unit, _source(section, key, entry), device, precision)
    return out


def _source(section: str, key: str, entry: dict[str, Any]) -> str:
    if section == "latency":
        return f"{entry['n_iters']} iterations"
    if key.startswith(("activations", "recompute", "total")):
        return entry["method"]
    if key == "optimizer_state":
        return f"{entry['optimizer']}.state after one step"
    if key.startswith("cuda_peak"):
        return "torch.cuda.max_memory_allocated"
    return ""


def to_frame(prof: ModelProfile) -> Any:
    """:func:`rows` as a ``pandas.DataFrame``."""
    import pandas as pd

    return pd.DataFrame(rows(prof), columns=["section", "device", "precision", "metric", "value", "unit", "source"])


def _ms(ms: float) -> str:
    """Latencies are stored in ms; shown in the one duration format (µs below 1 ms, so small models keep digits)."""
    return format_duration(ms / 1000)


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header)
    lines = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body
    )
    return f"<table style='border-collapse:collapse;margin:4px 0'><tr>{head}</tr>{lines}</table>"


def _combos(data: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(d, p, e) for d, per in data.items() for p, e in per.items()]


def _optimizer(entry: dict[str, Any]) -> str:
    """The optimizer a memory entry stepped (measured) or assumed (planned: no optimizer object exists)."""
    name = str(entry.get("optimizer") or "AdamW")
    return f"{name}, planned" if entry.get("source") == "planned" else name


def _memory_keys(combos: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The rows of the memory table: the measured breakdown's, then the parts only a plan has (logits and loss,
    temporaries, the batch, the allocator's reserve), in their order."""
    planned = [e for _, _, e in combos if e.get("source") == "planned"]
    extra = [k for e in planned for k, v in e.items() if k not in _MEMORY_ROWS and type(v) in (int, float)]
    keys = [k for k in _MEMORY_ROWS if k != "total"] + [k for k in dict.fromkeys(extra) if k != "reserved"]
    return [*keys, "total", *(["reserved"] if "reserved" in extra else [])]


def to_html(prof: ModelProfile) -> str:
    """The notebook view: model summary, compute, latency and memory tables."""
    parts = [f"<div class='nbtrainer-profile'><b>{html.escape(prof.model_name)}</b> (batch size {prof.batch_size})"]
    parts += [f"<div><i>{html.escape(note)}</i></div>" for note in prof.notes]
    summary = [
        ["parameters", f"{format_count(prof.params)} ({format_count(prof.trainable_params)} trainable)"],
        ["size in memory", format_bytes(prof.size_mb * 2**20)],
        ["serialized", format_bytes(prof.size["serialized_bytes"])],
    ]
    if prof.compute:
        c = prof.compute
        bwd = c["flop_counter_flops"]["forward_backward"]["per_sample"]
        summary += [
            ["MACs / sample (forward)", f"{format_count(prof.macs, 'MACs')}  [{c['counters']['macs']}]"],
            ["FLOPs / sample (forward)", f"{format_count(prof.flops, 'FLOPs')}  [{c['counters']['flops']}]"],
            ["FLOPs / sample (fwd+bwd)", f"{format_count(bwd, 'FLOPs')}  [FlopCounterMode]"],
        ]
    parts.append(_table(["", ""], summary))
    if prof.compute:
        parts.append(f"<div style='font-size:smaller'>{html.escape(prof.compute['convention'])}</div>")
    if prof.latency_ms:
        body = []
        for device, precision, e in _combos(prof.latency_ms):
            if not e.get("supported", True):
                body.append([device, precision, f"not run: {e['reason']}", "", "", "", ""])
                continue
            body.append(
                [
                    device,
                    precision,
                    *(_ms(e[k]) for k in ("median", "p90", "mean", "min")),
                    f"{format_count(e['throughput'])} samples/s",
                ]
            )
        parts.append(
            "<b>Inference latency</b>"
            + _table(["device", "precision", "median", "p90", "mean", "min", "throughput"], body)
        )
    if prof.memory:
        combos = _combos(prof.memory)
        header = ["training step (one optimizer step)"] + [f"{d} {p}" for d, p, _ in combos]
        body = []
        for key in _memory_keys(combos):
            values = [e.get(key) if e.get("supported", True) else None for _, _, e in combos]
            if any(v is not None for v in values):
                body.append([key.replace("_", " ")] + [format_bytes(v) for v in values])
        reasons = [f"{d} {p}: not run: {e['reason']}" for d, p, e in combos if not e.get("supported", True)]
        optimizers = sorted({_optimizer(e) for _, _, e in combos if e.get("supported", True)})
        parts.append(
            f"<b>Training memory</b> (optimizer: {html.escape(', '.join(optimizers) or 'none')})"
            + _table(header, body)
            + "".join(f"<div>{html.escape(r)}</div>" for r in reasons)
        )
    return "".join(parts) + "</div>"


def to_text(prof: ModelProfile) -> str:
    """A short one-screen summary (the ``repr``)."""
    lines = [
        f"ModelProfile({prof.model_name}, batch_size={prof.batch_size}, params={format_count(prof.params)}, "
        f"trainable={format_count(prof.trainable_params)}, size={format_bytes(prof.size_mb * 2**20)}, "
        f"macs/sample={format_count(prof.macs)}, flops/sample={format_count(prof.flops)})"
    ]
    lines += [f"  note: {note}" for note in prof.notes]
    for device, precision, e in _combos(prof.latency_ms):
        if e.get("supported", True):
            lines.append(f"  latency {device} {precision}: median {_ms(e['median'])}, p90 {_ms(e['p90'])}")
        else:
            lines.append(f"  latency {device} {precision}: not run: {e['reason']}")
    for device, precision, e in _combos(prof.memory):
        if e.get("supported", True):
            lines.append(f"  memory {device} {precision}: total {format_bytes(e['total'])} ({_optimizer(e)})")
        else:
            lines.append(f"  memory {device} {precision}: not run: {e['reason']}")
    return "\n".join(lines)
