"""Out of memory inside ``fit`` / ``evaluate`` / ``predict``: free what the trainer holds, re-raise with advice.

A CUDA out-of-memory error is the most common failure in a notebook, and a raw one keeps its memory: the
traceback (kept by the kernel as ``sys.last_traceback``) holds every frame of the failed step, and with
them the batch, the outputs and the autograd graph with its activations. So, on ``torch.OutOfMemoryError``:

1. the finished frames of the traceback are cleared (the batch, outputs, activations go; the line
   numbers stay), the loop's pending device values are dropped, gradients are set to ``None`` (the
   optimizer state stays, so the run can continue or resume), ``gc.collect()`` and the CUDA cache is
   emptied;
2. the same exception (same type, same traceback) is re-raised with advice built from this run's own
   settings appended to its message: micro-batch size and ``grad_accum_steps``, precision, activation
   checkpointing, memory numbers, and ``profile_model(...).fits()`` when a profile of the model is known,
   asked with the memory switches this run uses (quantize, LoRA, optimizer, offloading, checkpointing), so its
   estimate is of this run and not of the plain model.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import traceback
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._memory._window import host_capacity
from nbtrainer._optimizer_kinds import OPTIMIZERS, counted_kind, optimizer_kind
from nbtrainer._options import MemoryOptions
from nbtrainer._report._format import format_bytes, format_number

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["advice", "handle", "on_oom", "remember_profile"]

log = logging.getLogger(__name__)

MARK = "nbtrainer: out of memory"

# The latest profile_model() result per model (weakly held), so the advice can quote its fits() numbers; with it,
# whether the model was already quantized / LoRA-wrapped when profiled (then those switches are in the measurement).
_PROFILES: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, bool]] = weakref.WeakKeyDictionary()

F = TypeVar("F", bound=Callable[..., Any])


def remember_profile(model: torch.nn.Module, profile: Any) -> None:
    """Called by ``profile_model``: an out-of-memory error of a later fit of ``model`` quotes it."""
    transformed = any(type(m).__module__.split(".")[0] in ("bitsandbytes", "peft") for m in model.modules())
    try:
        _PROFILES[model] = (profile, transformed)
    except TypeError:  # not weak-referenceable: nothing remembered
        pass


def _batch_size(trainer: LoopHost, loader: Any) -> int | None:
    loop = trainer.run_state.loop
    if loader is None and loop is not None:
        loader = loop.train_loader
    size = getattr(loader, "batch_size", None)
    if isinstance(size, int) and size > 0:
        return size
    return loop.last_batch_size() if loop is not None else None  # a loader without batch_size: the last batch


def _mixed_precision_hint(trainer: LoopHost) -> str | None:
    if trainer.precision != "fp32":
        return None
    try:
        from nbtrainer._setup._precision import precision_support

        support = precision_support(trainer.device)
    except Exception:  # the check itself may need memory we do not have
        log.debug(
            "precision support could not be checked (it may need memory there is none of): no hint", exc_info=True
        )
        return None
    for name in ("bf16-mixed", "fp16-mixed"):
        if support.get(name, (False, ""))[0]:
            return (
                f"precision={name!r}: activations in 16 bits, about half their memory "
                f"(this run is fp32; {trainer.device} runs {name})."
            )
    return None


def _device_memory(device: torch.device, fit_peak: int | None) -> tuple[int, int] | None:
    """``(peak allocated, total)`` bytes on a CUDA device, else None. The panel's memory probe resets
    ``max_memory_allocated`` every refresh window, so the fit's peak so far (``Progress.memory_peak``)
    counts too."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        peak = max(int(torch.cuda.max_memory_allocated(device)), int(fit_peak or 0))
        return peak, int(torch.cuda.get_device_properties(device).total_memory)
    except Exception:
        log.debug("no CUDA memory figures: the out-of-memory advice goes without them", exc_info=True)
        return None


def _budget_bytes(device: torch.device, memory: tuple[int, int] | None) -> int | None:
    """What the device has: a GPU's memory; for the CPU the RAM, or the cgroup limit when lower (as the
    panel's memory chart counts it)."""
    if memory is not None:
        return memory[1]
    return host_capacity() if device.type == "cpu" else None


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def advice(trainer: LoopHost, where: str, *, loader: Any = None) -> tuple[str, list[str]]:
    """``(where it happened, what to try)`` from the run's own settings."""
    model = trainer.model
    accum = int(trainer.grad_accum_steps)
    bs = _batch_size(trainer, loader)
    memory = _device_memory(trainer.device, trainer.progress.memory_peak)
    facts = [f"{trainer.device} {trainer.precision}"]
    if where == "fit":
        st = trainer.run_state.loop_state
        facts.append(f"epoch {st.epoch + 1}, step {format_number(st.global_step + 1)}")
        facts.append(f"grad_accum_steps={accum}")
    if bs is not None:
        facts.append(f"{'micro-' if where == 'fit' else ''}batch size {bs}")
    if memory is not None:
        facts.append(f"peak {format_bytes(memory[0])} of {format_bytes(memory[1])}")
    tips: list[str] = []
    if where == "fit":
        if bs is not None and bs > 1:
            tips.append(
                f"Halve the micro-batch (batch_size={bs // 2}) and set grad_accum_steps={accum * 2}: the same "
                f"effective batch of {bs * accum} in smaller pieces."
            )
        else:
            tips.append("A smaller micro-batch with a larger grad_accum_steps (same effective batch).")
    elif bs is not None and bs > 1:
        tips.append(f"A smaller batch_size for this loader (now {bs}); {where} needs no gradients to keep.")
    mixed = _mixed_precision_hint(trainer)
    if mixed:
        tips.append(mixed)
    if where == "fit":
        blocks = trainer.checkpointed_blocks
        if not blocks:
            tips.append(
                "activation_checkpointing=True: the repeated blocks recompute their activations in backward "
                "instead of keeping them (much less activation memory, roughly 20-30% slower steps)."
            )
    total = _budget_bytes(trainer.device, memory)
    budget = f"{total / 2**30:.0f}" if total is not None else "<GiB of the device>"
    fit_line = _profile_fit(_known_profile(model), total, bs, trainer) if where == "fit" else None
    if fit_line:
        tips.append(fit_line)
    elif where == "fit":
        tips.append(
            f"nbtrainer.profile_model(model, example_batch).fits(budget_gb={budget}, batch_size={bs or 'B'}) "
            "measures what a step needs and suggests a micro-batch x accumulation split that fits."
        )
    opt_bytes = _state_bytes(trainer.optimizer) if trainer.optimizer is not None else 0
    if where == "fit" and memory is not None and opt_bytes >= 0.2 * memory[0]:  # only when it is a big share
        tips.append(
            f"The optimizer state takes {format_bytes(opt_bytes)}: optimizer='adafactor' or freezing layers "
            "(trainable=[...]) keeps less of it."
        )
    return ", ".join(facts), tips


def _known_profile(model: torch.nn.Module) -> tuple[Any, bool] | None:
    """The profile of the trainer's model, or of the model under its PEFT wrapper (the user profiles the model they
    built, before ``Trainer(lora=...)`` wraps it)."""
    inner = unwrap_model(model)
    found = _PROFILES.get(inner)
    base = getattr(inner, "get_base_model", None)  # peft.PeftModel
    if found is None and callable(base):
        found = _PROFILES.get(base())
    return found


def _memory_switches(trainer: LoopHost, *, transformed: bool, profiled_optimizer: str | None) -> MemoryOptions:
    """The memory switches ``trainer`` trains with (its one group), as ``ModelProfile.fits`` can take them: the
    precision is the profile's measured one, not a switch of its; checkpointing as the model has it now;
    ``transformed``: the profile measured the model already quantized / with adapters, so ``quantize`` / ``lora`` are
    in its numbers already; the optimizer is named only when it is not the class the profile stepped (else its
    measured state counts); the chunked loss and the attention kernel are not ``fits()``'s to model."""
    memory = trainer.options.memory
    kind = optimizer_kind(trainer.optimizer)
    profiled = optimizer_kind(profiled_optimizer)
    same = kind == profiled or _state(kind) == _state(profiled) == "moments"  # Adam and AdamW keep the same state
    known = _state(kind) is not None and counted_kind(trainer.optimizer) == kind
    fits = dataclasses.replace(
        memory,
        precision="fp32",
        activation_checkpointing=bool(trainer.checkpointed_blocks),
        optimizer=kind if known and not same else None,
        chunked_loss=False,
        attention="auto",
    )
    return dataclasses.replace(fits, quantize=None, lora=None) if transformed else fits


def _state(kind: str | None) -> str | None:
    found = OPTIMIZERS.get(kind or "")
    return found.state if found is not None else None


def _profile_fit(known: tuple[Any, bool] | None, total: int | None, bs: int | None, trainer: LoopHost) -> str | None:
    if known is None or total is None or bs is None or not getattr(known[0], "memory", None):
        return None
    profile, transformed = known
    measured = profile.memory.get(str(trainer.device), {}).get(trainer.precision, {})
    try:
        switches = _memory_switches(trainer, transformed=transformed, profiled_optimizer=measured.get("optimizer"))
        device, precision = str(trainer.device), trainer.precision
        result = profile.fits(total / 2**30, bs, device=device, precision=precision, **switches.changed())
    except Exception:  # measured on another device / precision, or without checkpointing: no numbers to quote
        log.debug(
            "the remembered profile cannot answer for this device, precision or switches: no numbers quoted",
            exc_info=True,
        )
        return None
    return f"profile_model(...).fits(budget_gb={total / 2**30:.0f}, batch_size={bs}): {result.suggestion}"


def release(trainer: LoopHost, exc: BaseException) -> None:
    """Drop what the failed step holds: the traceback's finished frames (batch, outputs, activations), the
    loop's pending device values and the gradients; the optimizer state stays. Then free the cache."""
    traceback.clear_frames(exc.__traceback__)
    loop = trainer.run_state.loop
    if loop is not None:
        loop.release_pending()
    if trainer.optimizer is not None:  # evaluate / predict need none
        trainer.optimizer.zero_grad(set_to_none=True)
    unwrap_model(trainer.model).zero_grad(set_to_none=True)
    gc.collect()
    if trainer.device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def handle(trainer: LoopHost, exc: BaseException, where: str, *, loader: Any = None) -> None:
    """Release the memory, then append the advice to ``exc``'s message (once; the caller re-raises it)."""
    if not isinstance(exc, torch.OutOfMemoryError):
        return
    message = str(exc.args[0]) if exc.args else ""
    if MARK in message:  # already handled further down (evaluate inside fit)
        release(trainer, exc)
        return
    facts, tips = advice(trainer, where, loader=loader)  # before release: it reads the pending batch sizes
    release(trainer, exc)
    lines = [message.rstrip(), "", f"{MARK} in {where} ({facts}). What to try, most effective first:"]
    lines += [f"  {i}. {tip}" for i, tip in enumerate(tips, 1)]
    lines.append(
        "The trainer released the batch, outputs and gradients and emptied the cache; the optimizer state is "
        "kept, so the trainer can fit again. Other large tensors in the notebook still count: `del` them."
    )
    exc.args = ("\n".join(lines), *exc.args[1:])


def on_oom(where: str) -> Callable[[F], F]:
    """Decorate ``Trainer.evaluate`` / ``predict`` (first argument: the loader) with :func:`handle`."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(self: Any, loader: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return fn(self, loader, *args, **kwargs)
            except torch.OutOfMemoryError as exc:
                handle(self, exc, where, loader=loader)
                raise

        return run  # type: ignore[return-value]

    return wrap
