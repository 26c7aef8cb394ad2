"""``profile_model``: what you are about to train, how fast it runs and whether it fits.

Everything that runs the model runs on deep copies (one per device), with the global RNG forked, so
the caller's model, optimizer and random streams are left exactly as they were: device, train/eval
mode of every submodule, ``requires_grad``, parameter and buffer values (no buffers added), ``.grad``
tensors and hooks. (Two things are global and can't be left untouched: user hooks registered on the
model also run on the copies, and on CUDA the memory step resets the device's peak-memory statistics.)
"""

from __future__ import annotations

import copy
import importlib.metadata
import io
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from nbtrainer._checkpointing import strip_activation_checkpointing
from nbtrainer._precision import normalize_precision, precision_support, resolve_device
from nbtrainer._profile_fit import FitResult, plan_fit
from nbtrainer._profile_flops import count_flops
from nbtrainer._profile_inputs import infer_batch_size, to_device
from nbtrainer._profile_latency import measure_latency
from nbtrainer._profile_memory import measure_training_memory, optimizer_factory

__all__ = ["ModelProfile", "profile_model"]

STEPS = ("flops", "latency", "memory")


@dataclass
class ModelProfile:
    """What :func:`profile_model` measured. Plain data; ``to_dict()`` is JSON-serialisable.

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
            :func:`nbtrainer._profile_memory.measure_training_memory`.
        environment: torch / ptflops versions and device names.
        seconds: Wall time per profiling step.
    """

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

    def fits(
        self,
        budget_gb: float,
        batch_size: int | None = None,
        *,
        device: str | None = None,
        precision: str | None = None,
        checkpointing: bool = False,
        headroom: float = 0.0,
    ) -> FitResult:
        """Does one training step fit in ``budget_gb`` GiB? If not, suggest micro-batch x accumulation.

        Args:
            budget_gb: Memory budget in GiB (2**30 bytes, as GPU memory is reported).
            batch_size: Batch size to check (default: the profiled one).
            device: Which measured device (default: the first measured).
            precision: Which measured precision (default: the first measured on that device).
            checkpointing: Assume activation checkpointing of the model's repeated blocks.
            headroom: Fraction of the budget to keep free (CUDA context, fragmentation).

        Returns:
            A :class:`~nbtrainer._profile_fit.FitResult` (truthy when it fits).

        Example:
            >>> prof = profile_model(nn.Linear(64, 64), torch.randn(8, 64), include=("memory",))
            >>> prof.fits(budget_gb=1, batch_size=64).fits
            True
        """
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
            batch_size=batch_size or self.batch_size,
            checkpointing=checkpointing,
            headroom=headroom,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain nested data (dicts, lists, numbers, strings): every field above."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelProfile:
        """Rebuild a profile from :meth:`to_dict` output (e.g. loaded back from JSON)."""
        return cls(**copy.deepcopy(data))

    def to_pandas(self) -> Any:
        """One long table: columns ``section, device, precision, metric, value, unit, source``."""
        from nbtrainer._profile_report import to_frame

        return to_frame(self)

    def _repr_html_(self) -> str:
        from nbtrainer._profile_report import to_html

        return to_html(self)

    def __repr__(self) -> str:
        from nbtrainer._profile_report import to_text

        return to_text(self)


def _size(model: nn.Module) -> dict[str, Any]:
    by_dtype: dict[str, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        key = str(tensor.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + tensor.numel() * tensor.element_size()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return {
        "parameters_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "buffers_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
        "by_dtype": by_dtype,
        "serialized_bytes": buf.getbuffer().nbytes,
    }


def _device_check(device: torch.device) -> str:
    if device.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine"
    return ""


def profile_model(
    model: nn.Module,
    example_inputs: Any,
    *,
    devices: Sequence[str | torch.device] = ("cpu",),
    precisions: Sequence[str] = ("fp32",),
    batch_size: int | None = None,
    n_warmup: int = 5,
    n_iters: int | None = None,
    time_budget_s: float = 1.0,
    criterion: Callable[..., torch.Tensor] | None = None,
    targets: Any = None,
    optimizer: Any = None,
    checkpointing: bool = True,
    include: Collection[str] = STEPS,
) -> ModelProfile:
    """Profile ``model`` on ``example_inputs``: size, MACs/FLOPs, latency and training memory.

    Args:
        model: The model; never modified (all runs use deep copies).
        example_inputs: A tensor, a tuple/list of tensors (``model(*inputs)``) or a dict of tensors
            (``model(**inputs)``), with a batch dimension first.
        devices: Devices to measure latency and memory on (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).
        precisions: ``"fp32"``, ``"fp16-mixed"``, ``"bf16-mixed"`` or aliases; each runs under autocast.
            Combinations a device can't run are reported as ``{"supported": False, "reason": ...}``.
        batch_size: Samples in ``example_inputs`` (default: first dimension of the first tensor).
        n_warmup: Untimed iterations before timing.
        n_iters: Timed iterations; ``None`` runs as many as fit in ``time_budget_s`` (10 to 300).
        time_budget_s: Time per device x precision for ``n_iters=None``.
        criterion: Loss for the training step, ``criterion(output, targets)``; default: the sum of the
            means of the floating-point outputs (FLOP counts never include the criterion).
        targets: Targets for ``criterion``.
        optimizer: What the memory step steps: ``None`` (AdamW), an optimizer class or
            ``params -> optimizer`` callable, or your optimizer instance (only its class and
            param-group settings are used; it is never stepped).
        checkpointing: Also measure memory with activation checkpointing of repeated blocks.
        include: Which of ``"flops"``, ``"latency"``, ``"memory"`` to run.

    Returns:
        A :class:`ModelProfile`.

    Example:
        >>> model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        >>> prof = profile_model(model, torch.randn(16, 32), n_iters=20)
        >>> prof.params, prof.macs, prof.flops
        (2762, 2762.0, 5376.0)
        >>> prof.latency_ms["cpu"]["fp32"]["median"] > 0
        True
    """
    unknown = set(include) - set(STEPS)
    if unknown:
        raise ValueError(f"include= takes {STEPS}, got {sorted(unknown)}")
    precisions = [normalize_precision(p) for p in precisions]
    batch_size = batch_size or infer_batch_size(example_inputs)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    params = list(model.parameters())
    prof = ModelProfile(
        model_name=type(model).__name__,
        batch_size=batch_size,
        params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        size_mb=0.0,
        size=_size(model),
        seconds=seconds,
        environment={"torch": torch.__version__, "ptflops": importlib.metadata.version("ptflops"), "devices": {}},
    )
    prof.size_mb = (prof.size["parameters_bytes"] + prof.size["buffers_bytes"]) / 2**20
    seconds["size"] = time.perf_counter() - start
    make_optimizer = optimizer_factory(model, optimizer)
    resolved = [resolve_device(d) for d in devices]
    cuda = [d for d in resolved if d.type == "cuda" and torch.cuda.is_available()]
    with torch.random.fork_rng(devices=cuda):  # dropout etc. must not advance the caller's RNG
        for device in resolved:
            _profile_on(
                prof,
                model,
                device,
                example_inputs,
                targets,
                precisions,
                include=include,
                make_optimizer=make_optimizer,
                criterion=criterion,
                checkpointing=checkpointing,
                n_warmup=n_warmup,
                n_iters=n_iters,
                time_budget_s=time_budget_s,
            )
    seconds["total"] = time.perf_counter() - start
    from nbtrainer._oom import remember_profile

    remember_profile(model, prof)  # an out-of-memory error in a later fit of this model quotes its fits()
    return prof


def _profile_on(
    prof: ModelProfile,
    model: nn.Module,
    device: torch.device,
    example_inputs: Any,
    targets: Any,
    precisions: list[str],
    *,
    include: Collection[str],
    make_optimizer: Any,
    criterion: Any,
    checkpointing: bool,
    n_warmup: int,
    n_iters: int | None,
    time_budget_s: float,
) -> None:
    key = str(device)
    problem = _device_check(device)
    prof.environment["devices"][key] = problem or (
        torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    )
    if problem:  # reported, not silently dropped
        for name, step in (("latency", prof.latency_ms), ("memory", prof.memory)):
            if name in include:
                step[key] = {p: {"supported": False, "reason": problem} for p in precisions}
        return
    support = {p: precision_support(device)[p] for p in precisions}
    seconds = prof.seconds
    start = time.perf_counter()
    work = copy.deepcopy(model).to(device)
    work.zero_grad(set_to_none=True)
    strip_activation_checkpointing(work)  # measure without, then with, checkpointing ourselves
    inputs = to_device(example_inputs, device)
    tgt = to_device(targets, device)
    seconds[f"copy {key}"] = time.perf_counter() - start
    if "flops" in include and not prof.compute:  # device independent: count once
        start = time.perf_counter()
        prof.compute = count_flops(work, inputs, batch_size=prof.batch_size)
        prof.macs = prof.compute["ptflops_macs"]["forward"]["per_sample"]
        prof.flops = prof.compute["flop_counter_flops"]["forward"]["per_sample"]
        prof.compute["device"] = key
        seconds["flops"] = time.perf_counter() - start
    for name, step in (("latency", prof.latency_ms), ("memory", prof.memory)):
        if name not in include:
            continue
        per = step.setdefault(key, {})
        for precision in precisions:
            ok, reason = support[precision]
            if not ok:
                per[precision] = {"supported": False, "reason": reason}
                continue
            start = time.perf_counter()
            if name == "latency":
                per[precision] = measure_latency(
                    work,
                    inputs,
                    device=device,
                    precision=precision,
                    batch_size=prof.batch_size,
                    n_warmup=n_warmup,
                    n_iters=n_iters,
                    time_budget_s=time_budget_s,
                )
            else:
                per[precision] = measure_training_memory(
                    work,
                    inputs,
                    device=device,
                    precision=precision,
                    batch_size=prof.batch_size,
                    make_optimizer=make_optimizer,
                    criterion=criterion,
                    targets=tgt,
                    checkpointing=checkpointing,
                )
            seconds[f"{name} {key} {precision}"] = time.perf_counter() - start
    del work, inputs, tgt
    if device.type == "cuda":
        torch.cuda.empty_cache()
