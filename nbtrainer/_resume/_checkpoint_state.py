"""Checkpoint state of a Trainer: assembling it, loading it back (with clear mismatch errors), resume."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._history import append_steps
from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._resume._checkpoint_io import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint
from nbtrainer._resume._full_state import gather_full, load_weights, shards_parameters
from nbtrainer._setup._seed import capture_rng

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["load_trainer_state", "rank_state", "restore", "save_trainer_checkpoint", "trainer_state_dict"]

VERSION = 1


def _optimizer(trainer: LoopHost) -> torch.optim.Optimizer:
    """The trainer's optimizer (saving and resuming refuse a trainer without one before they get here)."""
    if trainer.optimizer is None:
        raise ValueError("A checkpoint holds the optimizer's state, and this Trainer has none (optimizer=None).")
    return trainer.optimizer


def _callback_key(index: int, cb: Any) -> str:
    return f"{type(cb).__name__}:{index}"


def _stateful(trainer: LoopHost) -> list[tuple[str, Any]]:
    return [
        (_callback_key(i, cb), cb)
        for i, cb in enumerate(trainer.callbacks.callbacks)
        if callable(getattr(cb, "state_dict", None)) and callable(getattr(cb, "load_state_dict", None))
    ]


def _savers(trainer: LoopHost) -> Any:
    """The trainer's quantize / LoRA setup (``_setup._memory_savers``), which decides what of the model is saved."""
    return trainer.model_setup.savers


def _model_state(trainer: LoopHost) -> dict[str, Any]:
    model, savers = unwrap_model(trainer.model), _savers(trainer)
    return savers.model_state(model) if savers is not None else model.state_dict()


def trainer_state_dict(trainer: LoopHost, *, weights: bool = True) -> dict[str, Any]:
    """``weights=False``: without the model and optimizer state (empty dicts), e.g. a rank's own part."""
    run = trainer.run_state
    loop = run.loop
    if loop is not None:
        # Running sums must be on the host and complete. This also checks the pending losses: with
        # on_nonfinite="raise" a NaN/inf raises here, so no checkpoint is written from poisoned weights.
        loop.flush()
    st = run.loop_state
    loop_state = st.state_dict()
    history = trainer.history.state_dict()
    if loop is not None:
        # Per-step points read by the flush reach the History at the next refresh: put them in the saved
        # copy now, or a resumed run's step series would have a hole.
        points, group_lrs = loop.pending_points()
        append_steps(history["steps"], points, st.epoch + 1, group_lrs)
        if not st.epoch_complete:
            loop_state["epoch_time"] = loop.epoch_elapsed()
    model_state: dict[str, Any] = {}
    optim_state: dict[str, Any] = {}
    if weights:
        # FSDP gathers the full state to rank 0 (a collective: every rank gets here), else the module's own.
        if shards_parameters(trainer.strategy):
            model_state, optim_state = gather_full(trainer)
        else:
            # LoRA / a quantized base: what trains (not the frozen base, unless save_base=True)
            model_state, optim_state = _model_state(trainer), _optimizer(trainer).state_dict()
    return {
        "format": CHECKPOINT_FORMAT,
        "version": VERSION,
        "torch_version": str(torch.__version__),
        "model": model_state,
        "optimizer": optim_state,
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
        "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
        "loop": loop_state,
        "config": {
            "precision": trainer.precision,
            "grad_accum_steps": trainer.grad_accum_steps,
            "optimizer": type(trainer.optimizer).__name__,
            "scheduler": type(trainer.scheduler).__name__ if trainer.scheduler is not None else None,
            "elapsed": run.elapsed(),
            # the (last) fit's planned epochs, also once it has ended: `nbtrainer checkpoint` tells a finished run
            # from one to finish (a fit ended by max_steps is "finished" in its History, its epochs not all done)
            "epochs": loop.epochs if loop is not None else st.fit_epochs,
            "max_steps": loop.max_steps if loop is not None else st.fit_max_steps,
            **(_savers(trainer).checkpoint_config() if _savers(trainer) is not None else {}),
        },
        "metrics": run.train_metrics.state_dict(),
        "rng": capture_rng(),
        "history": history,
        "callbacks": {key: cb.state_dict() for key, cb in _stateful(trainer)},
    }


def save_trainer_checkpoint(trainer: LoopHost, path: str, *, sharded: bool = False) -> str:
    """``Trainer.save_checkpoint`` on the training thread: the full state in one file (under DDP with every rank's
    own part; under FSDP gathered with a collective), or with ``sharded=True`` (FSDP2) each rank's shards."""
    strategy = trainer.strategy
    if sharded:
        if not shards_parameters(strategy):
            raise ValueError(
                "save_checkpoint(sharded=True) needs strategy='fsdp' (a sharded checkpoint is each rank's "
                "shards); without it, save_checkpoint(path) writes the full state."
            )
        from nbtrainer._resume._sharded import save_sharded

        state = trainer_state_dict(trainer, weights=False)
        state["ranks"] = strategy.all_gather_object(rank_state(trainer))
        return save_sharded(trainer, path, state)
    # DDP: each rank's own RNG, loop sums and metric states go into rank 0's file (exact resume).
    ranks = strategy.all_gather_object(rank_state(trainer)) if strategy.distributed else None
    # FSDP gathers the full weights with a collective: every rank builds the state, rank 0 writes it.
    if strategy.is_global_zero or strategy.shards_parameters:
        from nbtrainer._resume._checkpoint_io import save_checkpoint_file

        state = trainer.state_dict()  # a subclass may add to it
        if ranks is not None:
            state["ranks"] = ranks
        if strategy.is_global_zero:
            save_checkpoint_file(path, state)
    strategy.barrier()
    return path


def _check_model(trainer: LoopHost, state: dict[str, torch.Tensor]) -> None:
    own = _model_state(trainer)
    missing = [k for k in own if k not in state]
    savers = _savers(trainer)
    if missing and savers is not None and savers.partial_checkpoints:
        # LoRA / quantize= checkpoints hold the buffers since 2026-11-30; an older one lacks them, and the adapters
        # in it still fit: the model's own buffers (a BatchNorm's running statistics) stay, and the user is told
        buffers = {name for name, _ in unwrap_model(trainer.model).named_buffers()}
        if all(k in buffers for k in missing):
            warnings.warn(
                f"The checkpoint holds no buffers ({missing[:4]}{' ...' if len(missing) > 4 else ''}): it was "
                "written before LoRA / quantize= checkpoints kept them. Its adapters are loaded; the buffers stay "
                "this model's own (a BatchNorm's running statistics are then not those of the run that wrote it). "
                "A checkpoint written now keeps them.",
                stacklevel=4,
            )
            missing = []
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in own
        if k in state and hasattr(state[k], "shape") and state[k].shape != own[k].shape
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing in checkpoint: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected in checkpoint: {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if shapes:
            parts.append("shape mismatch: " + "; ".join(shapes[:8]))
        raise CheckpointError(
            "The checkpoint's model does not match this model (different architecture?). "
            + " | ".join(parts)
            + ". Resume with the model that wrote the checkpoint."
        )


def _check_optimizer(trainer: LoopHost, state: dict[str, Any], saved_class: str | None) -> None:
    opt: Any = _optimizer(trainer)
    children = getattr(opt, "optimizers", None)
    if children is not None:  # several named optimizers: each checked against its own saved state
        saved = state.get("optimizers", {}) if isinstance(state, dict) else {}
        if saved_class != type(opt).__name__ or set(saved) != set(children):
            raise CheckpointError(
                f"The checkpoint holds the optimizers {sorted(saved) or saved_class}, this trainer "
                f"{sorted(children)}. Build the same named optimizers to resume."
            )
        for name, child in children.items():
            _check_one_optimizer(child, saved[name], type(child).__name__)
        return
    _check_one_optimizer(opt, state, saved_class)


def _check_one_optimizer(opt: Any, state: dict[str, Any], saved_class: str | None) -> None:
    own_class = type(opt).__name__
    if saved_class is not None and saved_class != own_class:
        raise CheckpointError(
            f"The checkpoint was written by {saved_class}, this optimizer is {own_class}. Use the "
            f"same optimizer (torch.optim.{saved_class}, same param groups) to resume, or load only "
            "the weights with trainer.load_model_state_dict(ckpt['model'])."
        )
    groups = opt.state_dict()["param_groups"]
    saved = state.get("param_groups", [])
    if len(groups) != len(saved) or any(
        len(a["params"]) != len(b["params"]) for a, b in zip(groups, saved, strict=True)
    ):
        raise CheckpointError(
            f"The checkpoint's optimizer has {len(saved)} param groups of sizes "
            f"{[len(g['params']) for g in saved]}, this one {len(groups)} of sizes "
            f"{[len(g['params']) for g in groups]}. "
            "Build the optimizer exactly as for the run that wrote the checkpoint."
        )
    saved_keys = {k for s in state.get("state", {}).values() for k in s}
    own_default = {k for g in groups for k in g if k != "params"}
    saved_default = {k for g in saved for k in g if k != "params"}
    if saved_class is None and (saved_keys or len(own_default ^ saved_default) > 2) and own_default != saved_default:
        raise CheckpointError(
            f"The checkpoint was written by a different optimizer (hyper-parameters {sorted(saved_default)} vs "
            f"this optimizer's {sorted(own_default)}). Use the same optimizer class to resume."
        )
    # Same class and group sizes, but the parameters in another order (e.g. groups built differently):
    # the per-parameter state would land on the wrong tensors.
    saved_state = state.get("state", {})
    for gi, (group, sgroup) in enumerate(zip(opt.param_groups, saved, strict=True)):
        for j, (param, index) in enumerate(zip(group["params"], sgroup["params"], strict=True)):
            for key, value in saved_state.get(index, {}).items():
                if (
                    isinstance(value, torch.Tensor)
                    and value.ndim > 0
                    and value.shape != param.shape
                    and key not in _KBIT_BOOKKEEPING
                ):
                    raise CheckpointError(
                        f"The checkpoint's optimizer state {key!r} for parameter {j} of group {gi} has shape "
                        f"{tuple(value.shape)}, this parameter {tuple(param.shape)}: the optimizer's parameters are "
                        "not in the order of the run that wrote the checkpoint. Build the optimizer the same way."
                    )


# bitsandbytes' 8-bit optimizer state beside its param-shaped moments (state1/state2): code books and block scales.
_KBIT_BOOKKEEPING = frozenset(
    {"qmap1", "qmap2", "absmax1", "absmax2", "max1", "max2", "new_max1", "new_max2", "unorm_vec"}
)


def _check_compatible(trainer: LoopHost, ckpt: dict[str, Any], load_scheduler: bool = True) -> None:
    """Everything that can refuse a checkpoint, checked before anything is loaded (no half-loaded trainer)."""
    for key in ("model", "optimizer", "loop", "history", "rng"):
        if key not in ckpt:
            raise CheckpointError(
                f"The checkpoint has no {key!r} entry (written by another tool, or damaged). "
                "Resume from a checkpoint written by ModelCheckpoint or trainer.save_checkpoint()."
            )
    config = ckpt.get("config", {})
    refused = _savers(trainer).check_checkpoint(config) if _savers(trainer) is not None else None
    if refused:  # e.g. adapters trained over an nf4 base, resumed over a full-precision one
        raise CheckpointError(refused)
    _check_model(trainer, ckpt["model"])
    _check_optimizer(trainer, ckpt["optimizer"], config.get("optimizer"))
    if not load_scheduler:  # fit_more with a fresh schedule: the saved one is not used
        pass
    elif (trainer.scheduler is None) != (ckpt.get("scheduler") is None):
        raise CheckpointError(
            "The checkpoint was written "
            + ("with" if ckpt.get("scheduler") is not None else "without")
            + " an LR scheduler and this trainer has "
            + ("none" if trainer.scheduler is None else "one")
            + ". Configure the scheduler as in the original run."
        )
    saved_sched = config.get("scheduler")
    if (
        load_scheduler
        and trainer.scheduler is not None
        and saved_sched is not None
        and saved_sched != type(trainer.scheduler).__name__
    ):
        raise CheckpointError(
            f"The checkpoint was written with the scheduler {saved_sched}, this trainer has "
            f"{type(trainer.scheduler).__name__}. Configure the scheduler as in the original run."
        )
    _check_metrics(trainer, ckpt.get("metrics") or {})
    saved_precision = config.get("precision")
    if saved_precision is not None and saved_precision != trainer.precision:
        raise CheckpointError(
            f"The checkpoint was written with precision={saved_precision!r}, this trainer has "
            f"precision={trainer.precision!r}: the run would not continue as it was (GradScaler "
            f"state, numerics). Create the Trainer with precision={saved_precision!r}, or load "
            "only the weights with trainer.load_model_state_dict(ckpt['model'])."
        )


def _check_metrics(trainer: LoopHost, saved: dict[str, Any]) -> None:
    """The running sums and torchmetrics states of a checkpoint only fit the same metrics."""
    metrics = trainer.run_state.train_metrics
    own_sums = sorted(n for n, _ in metrics.callables)
    own_tm = sorted(n for n, m in metrics.torchmetrics if hasattr(m, "metric_state"))
    saved_sums, saved_tm = sorted(saved.get("sums", {})), sorted(saved.get("torchmetrics", {}))
    if trainer.batch_steps.training_step_fn is not None:  # its values (it has no metrics=) come back when it returns
        saved_sums = own_sums
    if saved_sums != own_sums or saved_tm != own_tm:
        raise CheckpointError(
            f"The checkpoint's run had the metrics {saved_sums + saved_tm}, this trainer has {own_sums + own_tm}: "
            "its running sums would not fit. Create the Trainer with the same metrics= as the run that wrote the "
            "checkpoint, or load only the weights with trainer.load_model_state_dict(ckpt['model'])."
        )


# What differs between DDP ranks: saved for every rank (``ckpt["ranks"]``), the rest comes from rank 0.
_PER_RANK = ("loop", "metrics", "rng")


def rank_state(trainer: LoopHost) -> dict[str, Any]:
    """This rank's own part of a checkpoint: RNG, loop sums (samples, loss) and metric states."""
    full = trainer_state_dict(trainer, weights=False)
    return {key: full[key] for key in _PER_RANK}


def _this_rank(trainer: LoopHost, ckpt: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint as this rank should load it: its own RNG/sums when the world size matches."""
    world, rank = trainer.strategy.world_size, trainer.strategy.rank
    ranks = ckpt.get("ranks") or []
    if len(ranks) == world and world > 1:
        return {**ckpt, **{k: v for k, v in ranks[rank].items() if k in _PER_RANK}}
    saved = len(ranks) or 1
    loop = ckpt.get("loop", {})
    if saved != world and loop.get("batch", 0) and not loop.get("epoch_complete", False):
        import warnings

        warnings.warn(
            f"This checkpoint was written mid-epoch by {saved} process(es) and is resumed by {world}: the "
            "rest of that epoch sees a different data order than the original run (epoch-end checkpoints "
            "resume exactly across world sizes).",
            stacklevel=4,
        )
    return ckpt


def load_trainer_state(
    trainer: LoopHost,
    ckpt: dict[str, Any],
    *,
    load_scheduler: bool = True,
    before_load: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Load a checkpoint into ``trainer`` after every check passed (``before_load(ckpt)`` is the last one:
    it can refuse the checkpoint, e.g. a saved OneCycleLR too short for the fit, with nothing loaded yet).
    ``load_scheduler=False`` leaves the saved scheduler out (``fit_more`` with a fresh schedule)."""
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError("Not an nbtrainer checkpoint (no format marker).")
    ckpt = _this_rank(trainer, ckpt)
    _check_compatible(trainer, ckpt, load_scheduler)
    if before_load is not None:
        before_load(ckpt)
    if shards_parameters(trainer.strategy):  # FSDP: each rank keeps its shard of the saved tensors
        load_weights(trainer, ckpt["model"], ckpt["optimizer"])
    elif _savers(trainer) is not None:  # only what trains, or a quantized base in bitsandbytes' format
        _savers(trainer).load_model_state(unwrap_model(trainer.model), ckpt["model"])
        _optimizer(trainer).load_state_dict(ckpt["optimizer"])
    else:
        unwrap_model(trainer.model).load_state_dict(ckpt["model"])
        _optimizer(trainer).load_state_dict(ckpt["optimizer"])
    if load_scheduler and trainer.scheduler is not None and ckpt.get("scheduler") is not None:
        trainer.scheduler.load_state_dict(ckpt["scheduler"])
    if trainer.scaler is not None and ckpt.get("scaler"):
        trainer.scaler.load_state_dict(ckpt["scaler"])
    config = ckpt.get("config", {})
    accum = int(config.get("grad_accum_steps", trainer.grad_accum_steps))
    trainer.options = trainer.options.replace("step", grad_accum_steps=accum)
    # the run's position, metric sums, seconds and History; RNG is restored by the loop after it has replayed
    # the epoch's data order up to the saved batch
    trainer.run_state.restore(
        loop=ckpt["loop"],
        metrics=ckpt.get("metrics", {}),
        elapsed=float(config.get("elapsed", 0.0)),
        history=ckpt["history"],
        rng=ckpt["rng"],
        device=trainer.device,
    )
    saved_cbs = ckpt.get("callbacks", {})
    for key, cb in _stateful(trainer):
        if key in saved_cbs:
            cb.load_state_dict(saved_cbs[key])


def restore(
    trainer: LoopHost,
    resume_from: str,
    *,
    load_scheduler: bool = True,
    before_load: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Load ``resume_from`` (a path or ``"last"``) into ``trainer``; ``before_load(ckpt)`` may refuse the
    checkpoint before anything of it is loaded (``_continue.resume_fit`` checks the saved schedule there)."""
    path = os.fspath(resume_from)
    if path == "last":
        found = ModelCheckpoint.find(trainer.callbacks.callbacks)
        dirs = [found.dirpath] if found is not None else []
        if not dirs:
            raise CheckpointError(
                "resume_from='last' needs a ModelCheckpoint callback (its dirpath holds last.ckpt); "
                "pass a checkpoint path instead."
            )
        path = os.path.join(dirs[0], "last.ckpt")
        if not os.path.exists(path):
            raise CheckpointError(
                f"resume_from='last': no {path!r} yet. Train with ModelCheckpoint(save_last=True) "
                "first, or pass a checkpoint path."
            )
    if os.path.isdir(path):  # ModelCheckpoint(sharded=True): only a strategy that shards can read it
        if not shards_parameters(trainer.strategy):
            raise CheckpointError(
                f"{path!r} is a sharded checkpoint directory (ModelCheckpoint(..., sharded=True)); resume it with "
                "strategy='fsdp' on the number of processes that wrote it, or resume from a full checkpoint file."
            )
        from nbtrainer._resume._sharded import load_sharded

        ckpt = load_sharded(trainer, path)
    else:
        # FSDP: the full tensors stay on the CPU until each rank has taken its shard
        ckpt = load_checkpoint(path, map_location="cpu" if shards_parameters(trainer.strategy) else trainer.device)
    load_trainer_state(trainer, ckpt, load_scheduler=load_scheduler, before_load=before_load)
