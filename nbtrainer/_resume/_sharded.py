"""Sharded checkpoint directories (``ModelCheckpoint(..., sharded=True)`` under FSDP2).

Each rank writes its own shards with ``torch.distributed.checkpoint`` into ``<name>.partial``; rank 0 adds
``trainer.ckpt`` (everything but the weights: loop, RNG of every rank, history, callbacks) and renames the directory
into place (an older one of the same name is moved aside first and removed after). Nothing is gathered: for models
whose full state does not fit in one host's memory. It resumes on the same number of processes (the per-rank data
order and RNG are part of it). The full-state format (gathered to rank 0) is ``nbtrainer._resume._full_state``.
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._atomic import CheckpointError
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._resume._checkpoint_io import load_checkpoint, save_checkpoint_file
from nbtrainer._resume._full_state import saved_part, to_indexed

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["TRAINER_FILE", "load_sharded", "save_sharded"]

TRAINER_FILE = "trainer.ckpt"  # the non-weight part of a sharded checkpoint


def save_sharded(trainer: LoopHost, path: str, state: dict[str, Any]) -> str:
    """Write ``path`` as a sharded checkpoint directory; every rank calls it. ``state`` is the trainer's state
    without weights (loop, every rank's RNG in ``ranks``, history, callbacks): rank 0 writes it beside the shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    strategy = trainer.strategy
    state = {**state, "sharded": {"world_size": strategy.world_size}}
    assert trainer.optimizer is not None  # save_checkpoint refused a trainer without one
    model_sd, named = get_state_dict(unwrap_model(trainer.model), trainer.optimizer)
    partial = f"{path}.partial"
    if strategy.is_global_zero:
        shutil.rmtree(partial, ignore_errors=True)  # a save that was killed half-way
        os.makedirs(partial)
    strategy.barrier()
    dcp.save({"model": model_sd, "optimizer": named}, checkpoint_id=partial)
    if strategy.is_global_zero:
        save_checkpoint_file(os.path.join(partial, TRAINER_FILE), state)
        _swap_into_place(partial, path)
    strategy.barrier()
    return path


def _swap_into_place(partial: str, path: str) -> None:
    # A directory cannot be os.replace'd over a non-empty one: move the old one aside, then rename.
    old = None
    if os.path.lexists(path):
        old = f"{path}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(partial, path)
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def load_sharded(trainer: LoopHost, path: str) -> dict[str, Any]:
    """A sharded checkpoint directory as a checkpoint dict whose model and optimizer hold this rank's shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    meta_path = os.path.join(path, TRAINER_FILE)
    if not os.path.exists(meta_path):
        raise CheckpointError(
            f"{path!r} is a directory without {TRAINER_FILE}: not a sharded nbtrainer checkpoint (or its save was "
            "interrupted). Resume from a checkpoint written by ModelCheckpoint(..., sharded=True)."
        )
    ckpt = load_checkpoint(meta_path, map_location="cpu")
    strategy = trainer.strategy
    saved = int(ckpt.get("sharded", {}).get("world_size", 0))
    if saved != strategy.world_size:
        raise CheckpointError(
            f"{path!r} is a sharded checkpoint written by {saved} process(es), and this run has "
            f"{strategy.world_size}: its shards and per-rank data order belong to {saved} ranks. Resume it with "
            f"{saved} processes (torchrun --nproc-per-node {saved}), or save full checkpoints (ModelCheckpoint "
            "without sharded=True), which load on any number of processes."
        )
    if trainer.optimizer is None:
        raise CheckpointError(f"{path!r} holds optimizer shards: resume it with a trainer that has an optimizer.")
    own_model, own_optim = get_state_dict(unwrap_model(trainer.model), trainer.optimizer)
    # Loaded into copies: the trainer's own tensors change only after every check of load_trainer_state passed.
    model_sd: dict[str, Any] = {k: _copy(v) for k, v in own_model.items()}
    own: dict[str, Any] = dict(own_optim)
    named: dict[str, Any] = {
        "state": {n: {k: _copy(v) for k, v in s.items()} for n, s in own["state"].items()},
        "param_groups": [dict(g) for g in own["param_groups"]],
    }
    dcp.load({"model": model_sd, "optimizer": named}, checkpoint_id=path)
    ckpt["model"] = saved_part(trainer, model_sd)
    ckpt["optimizer"] = to_indexed(named, trainer)
    return ckpt
