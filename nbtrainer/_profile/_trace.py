"""``profile_training``: a few real training steps under ``torch.profiler``, a Chrome/Perfetto trace
and the ``key_averages()`` table.

The Trainer's loop marks its phases with ``torch.profiler.record_function`` ranges named
``nbt.data``, ``nbt.forward``, ``nbt.backward`` and ``nbt.optimizer_step`` when ``fit(profiler=...)``
is given one, and calls ``profiler.step()`` after each optimizer step; the schedule
(``wait`` / ``warmup`` / ``active`` optimizer steps) therefore counts optimizer steps, those taken inside backward
(``optimizer_in_backward``, one ``nbt.optimizer_step`` range per parameter there) included.
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._arrays import as_loaders
from nbtrainer._loop._put_back import ModelPutBack
from nbtrainer._report._format import format_duration
from nbtrainer._setup._seed import kept_rng

if TYPE_CHECKING:
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["PHASES", "TrainingProfile", "profile_training"]

PHASES = ("nbt.data", "nbt.forward", "nbt.backward", "nbt.optimizer_step")


@dataclass
class TrainingProfile:
    """What :func:`profile_training` recorded.

    Attributes:
        trace_path: The Chrome/Perfetto trace (open in ``chrome://tracing`` or https://ui.perfetto.dev).
        table: ``key_averages().table(...)`` as text.
        rows: The same averages as records (times in µs, memory in bytes); see :meth:`to_pandas`.
        phases: Mean ms per profiled step of each ``nbt.*`` range (CPU wall time of the range).
        steps: Optimizer steps recorded (the ``active`` part of the schedule).
        sort_by: The column the table is sorted by.
    """

    trace_path: str
    table: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    sort_by: str = "self_cpu_time_total"

    def to_pandas(self) -> Any:
        """``key_averages()`` as a ``pandas.DataFrame``, one row per op / range (pandas is optional)."""
        from nbtrainer._optional import import_optional

        pd = import_optional("pandas", "TrainingProfile.to_pandas()", "pip install pandas")
        return pd.DataFrame(self.rows)

    def summary(self) -> str:
        """Where the trace is and the mean time per step of each phase (the first lines of ``str()``)."""
        from nbtrainer._report._format import format_duration

        phases = "  ".join(f"{k.removeprefix('nbt.')}={format_duration(v / 1e3)}" for k, v in self.phases.items())
        return (
            f"Training profile: {self.steps} steps; trace: {self.trace_path} "
            "(open it in https://ui.perfetto.dev or chrome://tracing)\n"
            f"mean per step: {phases}"
        )

    def _repr_html_(self) -> str:
        import html

        phases = ", ".join(f"{k}: {format_duration(v / 1000)}" for k, v in self.phases.items())
        return (
            f"<div><b>Training profile</b> ({self.steps} steps; trace: <code>{html.escape(self.trace_path)}</code>)"
            f"<br>{html.escape(phases)}<pre style='font-size:smaller'>{html.escape(self.table)}</pre></div>"
        )

    def __str__(self) -> str:
        return self.summary() + "\n" + self.table


def _row(event: Any) -> dict[str, Any]:
    return {
        "name": event.key,
        "count": event.count,
        "cpu_time_total_us": float(event.cpu_time_total),
        "self_cpu_time_total_us": float(event.self_cpu_time_total),
        "cpu_time_avg_us": float(event.cpu_time_total) / max(event.count, 1),
        "device_time_total_us": float(getattr(event, "device_time_total", 0) or 0),
        "self_device_time_total_us": float(getattr(event, "self_device_time_total", 0) or 0),
        "cpu_memory_usage": int(getattr(event, "cpu_memory_usage", 0) or 0),
        "device_memory_usage": int(getattr(event, "device_memory_usage", 0) or 0),
    }


def _cpu_copy(obj: Any) -> Any:
    """A detached CPU copy of a state dict (nested dicts/lists of tensors), to restore later."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return copy.deepcopy(obj)


def _snapshot(trainer: Trainer) -> tuple[ModelPutBack, list[tuple[Any, Any]]]:
    """What the profiled steps change, to put back: the model (:class:`ModelPutBack`: what trains and the buffers),
    the optimizer's and the GradScaler's state."""
    states = [(obj, _cpu_copy(obj.state_dict())) for obj in (trainer.optimizer, trainer.scaler) if obj is not None]
    return ModelPutBack(trainer.model, trainer.optimizer), states


@contextmanager
def _untouched(trainer: Trainer) -> Iterator[None]:
    """Profiling steps run without the trainer's LR scheduler (a used-up OneCycleLR would refuse them, and the
    schedule must not move) or its run recorder, and leave its history, loop state, callbacks' state, each module's
    training flag (fit puts the model in train mode) and the RNG states as they were."""
    from nbtrainer._events._stream import CallbackList

    # what a fit replaces on the trainer besides its run (RunState.preserved puts that back): profiling puts each back
    status, progress, callback_list = trainer.status, trainer.progress, trainer.callbacks
    scheduler = trainer.scheduler
    modes = [(m, m.training) for m in trainer.model.modules()]
    callbacks = callback_list.callbacks
    states = [
        (cb, _cpu_copy(cb.state_dict()))
        for cb in callbacks
        if callable(getattr(cb, "state_dict", None)) and callable(getattr(cb, "load_state_dict", None))
    ]
    run_recorder = trainer.run_recorder
    try:
        with kept_rng(), trainer.run_state.preserved():
            trainer.scheduler = None
            if callbacks:
                trainer.callbacks = CallbackList(cb for cb in callbacks if cb is not run_recorder)
            yield
    finally:
        trainer.scheduler = scheduler
        trainer.status, trainer.progress, trainer.callbacks = status, progress, callback_list
        for module, training in modes:
            module.training = training
        for cb, state in states:
            cb.load_state_dict(state)


def profile_training(
    trainer: Trainer,
    train_loader: Any,
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    trace_path: str | os.PathLike[str] | None = None,
    row_limit: int = 20,
    restore: bool = True,
    record_shapes: bool = False,
    profile_memory: bool = False,
) -> TrainingProfile:
    """Profile ``wait + warmup + active`` optimizer steps of ``trainer.fit(train_loader, ...)``.

    Args:
        trainer: An :class:`nbtrainer.Trainer`.
        train_loader: Batches to train on (re-iterated for more epochs if it is short), or arrays (``(x, y)``, a
            dict of arrays) with ``batch_size`` and ``shuffle`` as for ``Trainer.fit``.
        wait: Steps run before the profiler starts.
        warmup: Steps profiled but discarded (the profiler's own start-up cost).
        active: Steps recorded.
        trace_path: Where to write the Chrome/Perfetto JSON trace (parent folders are created). Default:
            ``trace.json`` in a new temporary folder (nothing is written to the working directory unasked).
            The absolute path is ``result.trace_path`` and the first line of ``print(result)``.
        row_limit: Rows in the text table.
        restore: Put the model (what trains and the buffers), optimizer and GradScaler state back afterwards
            (these steps really train). Whatever ``restore`` says, profiling leaves the trainer's ``history``, loop
            position, LR schedule (its steps run without the scheduler, so a used-up OneCycleLR is no obstacle),
            callbacks' state, each module's training flag and the random number generators as they were, and
            records no run. With ``optimizer_in_backward=True`` each parameter's update is an
            ``nbt.optimizer_step`` range inside ``nbt.backward`` (the backward time includes them).
        record_shapes: Record input shapes of ops (bigger trace).
        profile_memory: Record tensor allocations (bigger trace).

    Returns:
        A :class:`TrainingProfile`.

    Raises:
        RuntimeError: The loader ran out before any step was recorded.

    Example:
        >>> # prof = profile_training(trainer, train_loader, trace_path="runs/trace.json")
        >>> # print(prof)  -> "Training profile: 3 steps; trace: /abs/runs/trace.json (open it in ...)" + table
        >>> # prof.phases  -> {"nbt.data": 0.2, "nbt.forward": 3.1, "nbt.backward": 5.9, ...}
    """
    if min(wait, warmup) < 0 or active < 1:
        raise ValueError("wait and warmup must be >= 0 and active >= 1")
    needed = wait + warmup + active
    train_loader, _ = as_loaders(train_loader, batch_size=batch_size, shuffle=shuffle, caller="profile_training")
    try:
        per_epoch = math.ceil(len(train_loader) / max(trainer.grad_accum_steps, 1))
    except TypeError:
        per_epoch = 0
    epochs = max(1, math.ceil(needed / per_epoch)) if per_epoch else needed
    if trace_path is None:
        trace_path = os.path.join(tempfile.mkdtemp(prefix="nbtrainer-trace-"), "trace.json")
    path = os.path.abspath(os.fspath(trace_path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    device = trainer.device
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    result: dict[str, Any] = {}

    def ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(path)
        averages = prof.key_averages()
        result["table"] = averages.table(sort_by=sort_by, row_limit=row_limit)
        result["rows"] = sorted((_row(e) for e in averages), key=lambda r: -r[sort_by + "_us"])

    kept, states = _snapshot(trainer) if restore else (None, [])
    schedule = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    try:
        with (
            _untouched(trainer),
            torch.profiler.profile(
                activities=activities,
                schedule=schedule,
                on_trace_ready=ready,
                record_shapes=record_shapes,
                profile_memory=profile_memory,
            ) as prof,
        ):
            trainer.fit(train_loader, epochs=epochs, max_steps=needed, profiler=prof)
            # A fit without resume_from starts at step 0; the loop calls prof.step() after each optimizer step, also
            # one taken inside backward (optimizer_in_backward, which has no nbt.optimizer_step range of its own
            # after backward), so the steps taken say how many the schedule recorded.
            taken = trainer.global_step
    finally:
        if kept is not None:
            kept.restore()
        for obj, state in states:
            obj.load_state_dict(state)
    steps = max(0, min(active, taken - wait - warmup)) if "table" in result else 0
    if not steps:
        raise RuntimeError(
            f"No training step was recorded: the loader gave {taken} optimizer steps, fewer than wait + warmup + 1 = "
            f"{wait + warmup + 1}. Lower wait/warmup or pass more batches."
        )
    phases = {r["name"]: r["cpu_time_total_us"] / 1000.0 / steps for r in result["rows"] if r["name"] in PHASES}
    return TrainingProfile(
        trace_path=path,
        table=result["table"],
        rows=result["rows"],
        phases={name: phases[name] for name in PHASES if name in phases},
        steps=steps,
        sort_by=sort_by,
    )
