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
from typing import Any

import torch
from torch import nn

from nbtrainer._data._inputs import infer_batch_size, to_device
from nbtrainer._memory._breakdown import measure_training_memory, optimizer_factory
from nbtrainer._profile._flops import count_flops
from nbtrainer._profile._latency import measure_latency
from nbtrainer._profile._report import ModelProfile
from nbtrainer._profile._switches import model_structure
from nbtrainer._setup._activation_checkpointing import strip_activation_checkpointing
from nbtrainer._setup._model_setup import param_numel
from nbtrainer._setup._precision import normalize_precision, precision_support, resolve_device

__all__ = ["profile_model"]

STEPS = ("flops", "latency", "memory")


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
        optimizer: What the memory step steps: ``None`` (AdamW); a callable of the parameters, as
            torch's own classes are (``torch.optim.SGD``, ``functools.partial(torch.optim.AdamW, lr=1e-3)``,
            ``lambda params: ...``); or your optimizer instance (only its class and param-group settings
            are used; it is never stepped).
        checkpointing: Also measure memory with activation checkpointing of repeated blocks.
        include: Which of ``"flops"``, ``"latency"``, ``"memory"`` to run.

    Returns:
        A :class:`ModelProfile`. For a model on the meta device (no weights) nothing runs: sizes come from the
        shapes, latency is reported unsupported, and memory is planned by :func:`nbtrainer.plan_memory` for the
        first of ``devices`` that is not ``"meta"`` (it need not be present): ``fits()`` is then the plan's
        ``predict()``. ``devices=("meta",)`` alone plans for a CUDA target, filed under ``"cuda"`` in ``memory``
        and ``latency_ms``; ``profile.notes`` (first in its text and HTML) says so.

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
    if any(p.device.type == "meta" for p in model.parameters()):
        # no weights: nothing is measured; the memory planner answers from the shapes (the same engine as
        # plan_memory and Trainer(memory_budget_gb=...)): fits() is plan_memory(...).predict(...)
        from nbtrainer._profile._planned import planned_profile

        return planned_profile(
            model, example_inputs, devices=devices, precisions=precisions, criterion=criterion, targets=targets,
            batch_size=batch_size,
        )  # fmt: skip
    if any(torch.device(d).type == "meta" for d in devices):
        raise ValueError(
            "profile_model(devices=('meta',)): the meta device runs no kernel, so nothing can be measured there. "
            "Profile on 'cpu' / 'cuda'; for a model built on the meta device, profile_model plans instead of "
            "measuring, on the device you name (devices=('cuda',)), as nbtrainer.plan_memory does."
        )
    precisions = [normalize_precision(p) for p in precisions]
    batch_size = batch_size or infer_batch_size(example_inputs)
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    params = list(model.parameters())
    prof = ModelProfile(
        model_name=type(model).__name__,
        batch_size=batch_size,
        params=sum(param_numel(p) for p in params),
        trainable_params=sum(param_numel(p) for p in params if p.requires_grad),
        size_mb=0.0,
        size=_size(model),
        seconds=seconds,
        structure=model_structure(model),
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
    from nbtrainer._loop._oom import remember_profile

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
