"""A Trainer's checkpoints (mixed into :class:`~nbtrainer.Trainer`).

What a checkpoint holds is ``_checkpoint_state``'s (model, optimizer, scheduler, scaler, loop position, RNG
states, history, callback state); writing it atomically is ``_checkpoint_io``'s. The data order a checkpoint
carries is the data's (``nbtrainer._data._order``).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._resume import _checkpoint_state as _state
from nbtrainer._trainer import _validate
from nbtrainer._trainer._base import TrainerBase

__all__ = ["TrainerCheckpoints"]


class TrainerCheckpoints(TrainerBase):
    """Mixin of :class:`~nbtrainer.Trainer` (its state is declared in :class:`TrainerBase`)."""

    def save_checkpoint(self, path: str, *, sharded: bool = False) -> str:
        """Write a full checkpoint atomically (from any thread: applied at the next step boundary).

        ``sharded=True`` (FSDP2 only) writes a directory of each rank's shards instead of gathering the full
        state to rank 0; every rank must call it, and it resumes on the same number of processes."""
        fit_thread = self._run.fit_thread
        if fit_thread is not None and threading.get_ident() != fit_thread:
            return self._live.requests.submit(lambda: self.save_checkpoint(path, sharded=sharded)).result()
        if self.optimizer is None:
            raise _validate.no_optimizer(
                "save_checkpoint", " To save the weights alone: torch.save(trainer.model_state_dict(), path)."
            )
        if sharded:
            if not getattr(self.strategy, "can_shard_checkpoints", False):
                raise ValueError(
                    "save_checkpoint(sharded=True) needs strategy='fsdp' (a sharded checkpoint is each rank's "
                    "shards); without it, save_checkpoint(path) writes the full state."
                )
            from nbtrainer._resume._sharded import save_sharded

            state = _state.trainer_state_dict(self._whole, weights=False)
            state["ranks"] = self.strategy.all_gather_object(_state.rank_state(self._whole))
            return save_sharded(self._whole, path, state)
        # DDP: each rank's own RNG, loop sums and metric states go into rank 0's file (exact resume).
        ranks = self.strategy.all_gather_object(_state.rank_state(self._whole)) if self.strategy.distributed else None
        # FSDP gathers the full weights with a collective: every rank builds the state, rank 0 writes it.
        if self.is_global_zero or getattr(self.strategy, "collective_state", False):
            from nbtrainer._resume._checkpoint_io import save_checkpoint_file

            state = self.state_dict()
            if ranks is not None:
                state["ranks"] = ranks
            if self.is_global_zero:
                save_checkpoint_file(path, state)
        self.strategy.barrier()
        return path

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain data (loads with ``weights_only=True``)."""
        return _state.trainer_state_dict(self._whole)

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        _state.load_trainer_state(self._whole, checkpoint)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights (under FSDP: gathered in full, on the CPU; call it on every rank)."""
        full = getattr(self.strategy, "full_model_state", None)
        return full(self.model) if full is not None else unwrap_model(self.model).state_dict()

    def load_model_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load = getattr(self.strategy, "load_weights", None)  # FSDP: each rank keeps its shard
        if load is not None:
            load(self, state, None)
        else:
            unwrap_model(self.model).load_state_dict(state)
