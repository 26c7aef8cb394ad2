"""Building a Trainer: its keywords, parsed into option groups, checked in order, and the parts made from them.

``Trainer.__init__`` is three steps: :meth:`~nbtrainer._options.TrainerOptions.parse` (the keywords into groups; an
unknown keyword is a ``TypeError`` naming the closest), :func:`assemble` (this module: every check first, then the
parts, and the model changed last, so a Trainer that fails a check leaves the user's model as it was), and binding a
criterion that needs the finished Trainer. :class:`Assembled` is what the Trainer keeps.

The order of the checks is the order a user meets the mistakes in: the arguments themselves, the placement (before
anything touches a CUDA device under DDP), manual optimization, the memory budget, the model setup and its memory
switches, the optimizer and its schedule, the data path, then the combinations (the step in backward, a closure
optimizer, chunked loss).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import BatchSpec
from nbtrainer._data._prefetch import check_data_options
from nbtrainer._dist._launch_monitor import launched_channels
from nbtrainer._events._launched import RankMonitor
from nbtrainer._events._progress import progress_callback
from nbtrainer._events._stream import CallbackList
from nbtrainer._know._option import check_option
from nbtrainer._loop._closure import check_closure
from nbtrainer._loop._in_backward import check_in_backward
from nbtrainer._loop._manual import check_manual
from nbtrainer._loop._metrics import MetricSet
from nbtrainer._loop._nonfinite import NonFiniteGuard
from nbtrainer._loop._run_state import RunState
from nbtrainer._options import SWITCH, TrainerOptions, TrainerParts
from nbtrainer._runs._recorder import RunRecorder
from nbtrainer._setup._chunked_loss import check_chunked_loss
from nbtrainer._setup._model_setup import ModelSetup
from nbtrainer._setup._optimizers import check_optimizers, check_schedulers
from nbtrainer._setup._precision import make_scaler, resolve_device
from nbtrainer._trainer import _validate
from nbtrainer._trainer._memory_budget import check_budget

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._trainer._memory_budget import BudgetPlan

__all__ = ["Assembled", "assemble", "bind_criterion"]


@dataclasses.dataclass
class Assembled:
    """What :func:`assemble` made for one Trainer (``Trainer.__init__`` keeps each as its attribute of that name)."""

    options: TrainerOptions  # checked: precision resolved, the device resolved, switches normalized
    strategy: Any
    model: torch.nn.Module
    criterion: Any
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    scaler: torch.amp.GradScaler | None
    batch_spec: BatchSpec
    callbacks: CallbackList
    setup: ModelSetup
    run: RunState
    val_metrics: MetricSet
    chunked_loss: Any
    nonfinite: NonFiniteGuard
    budget: BudgetPlan | None
    recorder: RunRecorder
    metric_spec: dict[str, Any]


def assemble(model: Any, criterion: Any, optimizer: Any, options: TrainerOptions, parts: TrainerParts) -> Assembled:
    """Check everything a Trainer is given, in the order of the module docstring, then build its parts."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
    memory, step, run = options.memory, options.step, options.run
    requested, scheduler = _named_optimizers(model, optimizer, parts.scheduler)
    _validate.check_args(
        criterion=criterion,
        optimizer=requested,
        scheduler=scheduler,
        metrics=parts.metrics,
        callbacks=parts.callbacks,
        device=options.setup.device,
        seed=run.seed,
        refresh_interval=run.refresh_interval,
        on_nonfinite=step.on_nonfinite,
    )
    callbacks = list(parts.callbacks)  # read more than once (checks, then the CallbackList)
    if criterion is not None and not callable(criterion):
        swapped = hasattr(criterion, "param_groups") and callable(requested)  # Trainer(model, optimizer, loss)
        raise TypeError(
            f"criterion must be callable (e.g. nn.CrossEntropyLoss()), got {type(criterion).__name__}."
            + (
                " The arguments are Trainer(model, criterion, optimizer): swap the second and third, or pass them "
                "by name (criterion=..., optimizer=...)."
                if swapped
                else ""
            )
        )
    # Where the model runs: one device, or DDP under torchrun (nbtrainer._dist._ddp). First, so that under DDP
    # nothing touches a CUDA device before this rank's device is set.
    from nbtrainer._dist._fsdp import make_strategy  # DDP / FSDP machinery only once a Trainer is built

    strategy = make_strategy(parts.strategy, options.setup.device, run.seed)
    device = resolve_device(strategy.device)
    options = options.replace("setup", device=device)
    batch = options.batch
    check_manual(
        batch.training_step,
        batch.validation_step,
        criterion=criterion,
        compute_loss=batch.compute_loss,
        optimizer=requested,
        metrics=parts.metrics,
        strategy=strategy,
        options={
            SWITCH.optimizer_in_backward: memory.optimizer_in_backward,
            SWITCH.chunked_loss: memory.chunked_loss,
            "memory_budget_gb": options.budget and options.budget.budget_gb,
        },
    )
    budget = check_budget(
        options.budget, model=model, criterion=criterion, memory=memory, setup=options.setup, strategy=strategy
    )
    # The model setup: checked, and a named optimizer built, now; applied last.
    setup = ModelSetup(model, requested, setup=options.setup, memory=memory)
    memory = setup.savers.memory  # the switches as checked
    optimizer = _validate.check_optimization(
        model,
        setup.optimizer,
        scheduler,
        scheduler_interval=step.scheduler_interval,
        val_every_n_epochs=run.val_every_n_epochs,
        grad_accum_steps=step.grad_accum_steps,
        max_grad_norm=step.max_grad_norm,
        predict_step=batch.predict_step,
    )
    check_data_options(options.data.fast_fetch, options.data.data_on_device)
    options = options.replace("run", check_data=check_option(run.check_data))
    if memory.optimizer_in_backward:
        check_in_backward(
            optimizer=optimizer if optimizer is not None else requested,
            grad_accum_steps=step.grad_accum_steps,
            max_grad_norm=step.max_grad_norm,
            precision=memory.precision,
            distributed=bool(strategy.distributed),
            offload_optimizer=memory.offload_optimizer,
            callbacks=callbacks,
        )
    check_closure(
        optimizer,
        grad_accum_steps=step.grad_accum_steps,
        precision=memory.precision,
        optimizer_in_backward=memory.optimizer_in_backward,
        on_nonfinite=step.on_nonfinite,
        memory_budget=options.budget is not None,
    )
    options = dataclasses.replace(options, memory=memory).replace(
        "run", refresh_interval=float(run.refresh_interval), timing_every=int(run.timing_every)
    )
    options = options.replace(
        "data",
        data_on_device=float(options.data.data_on_device),
        non_blocking=options.data.non_blocking and device.type == "cuda",
    )
    metric_spec = dict((parts.metrics or {}).items())  # a MetricCollection: its members by key
    run_state = RunState(MetricSet(metric_spec, device))
    chunked = check_chunked_loss(
        memory.chunked_loss,
        model=model,
        criterion=criterion,
        compute_loss=batch.compute_loss,
        metrics=metric_spec,
        distributed=bool(strategy.distributed),
    )
    if run.progress is not False and run.progress is not None:
        callbacks.append(progress_callback(run.progress))
    # last: it opens (and checks) the store now, before any step, and callback indices (checkpoint keys) keep
    recorder = RunRecorder(run.run_store)
    # after it: nbtrainer.launch(view=...)'s progress/stop channel (launched ranks only; no state, no index)
    launched = [RankMonitor(channel) for channel in launched_channels()]
    callback_list = CallbackList([run_state.recorder, *callbacks, recorder, *launched])
    # freeze, quantize, lora (its adapters' init from seed=), channels_last, checkpointing, compile: the model changes
    model = setup.apply(seed=run.seed, activation_checkpointing=memory.activation_checkpointing)
    if setup.optimizer is not optimizer:  # named, built once quantize= / lora= changed the model
        optimizer = setup.optimizer
    if strategy.shards_parameters:  # FSDP: shard the model now, rebind the optimizer to the sharded parameters
        strategy.attach(model, optimizer, memory.precision, by_name=setup.optimizer_name is not None)
    return Assembled(
        options=options,
        strategy=strategy,
        model=model,
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=make_scaler(memory.precision, device),
        batch_spec=BatchSpec(
            num_inputs=batch.num_inputs, target_keys=batch.target_keys, pass_targets_to_model=criterion is None
        ),
        callbacks=callback_list,
        setup=setup,
        run=run_state,
        val_metrics=run_state.train_metrics.clone(device),
        chunked_loss=chunked,
        nonfinite=NonFiniteGuard(step.on_nonfinite),
        budget=budget,
        recorder=recorder,
        metric_spec=metric_spec,
    )


def _named_optimizers(model: torch.nn.Module, optimizer: Any, scheduler: Any) -> tuple[Any, Any]:
    """``optimizer={"name": opt, ...}`` (stepped as one, or by name in ``training_step``) and its schedulers by name;
    ``"auto"`` is AdamW (or the kind ``memory_budget_gb``'s plan picks at the first fit)."""
    if isinstance(optimizer, str) and optimizer.strip().lower() == "auto":
        optimizer = "adamw"
    if isinstance(optimizer, Mapping):
        optimizer = check_optimizers(model, optimizer)
        if isinstance(scheduler, Mapping):
            scheduler = check_schedulers(scheduler, optimizer)
    elif isinstance(scheduler, Mapping):
        raise TypeError("scheduler={...} names schedulers of named optimizers: pass optimizer={'name': opt, ...}.")
    return optimizer, scheduler


def bind_criterion(trainer: LoopHost, metric_spec: dict[str, Any]) -> None:
    """A criterion that needs the trainer (``DistillationLoss``: its teacher sees the model's inputs, on this device)
    binds itself once the model is final, and may bring metrics (its loss parts); the user's win a name clash."""
    bind = getattr(trainer.criterion, "bind_trainer", None)
    if not callable(bind):
        return
    extra = {k: v for k, v in bind(trainer).items() if k not in metric_spec}
    if extra:
        metric_spec.update(extra)
        run = trainer.run_state
        run.train_metrics = MetricSet(metric_spec, trainer.device)
        trainer.batch_steps.val_metrics = run.train_metrics.clone(trainer.device)
