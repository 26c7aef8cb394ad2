"""Checkpoints under FSDP2: the single-process file format by default, a sharded directory on request.

* **full** (default, what ``trainer.save_checkpoint`` / ``ModelCheckpoint`` write): the model and optimizer
  state are gathered to rank 0 on the CPU (``get_state_dict(full_state_dict=True, cpu_offload=True)``,
  one parameter at a time) and written in exactly the format of a single-process run: model keys without
  any wrapper prefix, the optimizer state keyed by parameter index. So a checkpoint moves between one
  process, DDP and FSDP, both ways. Loading gives each rank its shard of the saved full tensors
  (``set_state_dict(full_state_dict=True)``).
* **sharded** (``ModelCheckpoint(..., sharded=True)``): each rank writes its own shards with
  ``torch.distributed.checkpoint`` into ``<name>.partial``, rank 0 adds ``trainer.ckpt`` (everything but
  the weights: loop, RNG of every rank, history, callbacks) and renames the directory into place (an
  older one of the same name is moved aside first and removed after). Nothing is ever gathered: for
  models whose full state does not fit in one host's memory. It resumes on the same number of
  processes (the per-rank data order and RNG are part of it).

The optimizer's own format is indexed by position; torch's distributed state dicts are keyed by
parameter name: :func:`to_indexed` and ``_dist._fsdp.optimizer_state_by_name`` convert through the optimizer's
parameter order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._dist._fsdp import optimizer_param_names, optimizer_state_by_name
from nbtrainer._dist._placement import unwrap_model

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = [
    "full_model_state",
    "gather_full",
    "load_model_state",
    "load_weights",
    "model_state",
    "saved_part",
    "shards_parameters",
    "to_indexed",
]


def shards_parameters(strategy: Any) -> bool:
    """Whether ``strategy`` keeps each parameter in shards across ranks (FSDP2): its checkpoints are gathered
    (a collective every rank joins) and loaded shard by shard, never through ``module.state_dict()``."""
    return bool(strategy.shards_parameters)


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def _optimizer(trainer: LoopHost) -> torch.optim.Optimizer:
    if trainer.optimizer is None:
        raise ValueError("A checkpoint holds the optimizer's state, and this Trainer has none (optimizer=None).")
    return trainer.optimizer


def _names(trainer: LoopHost) -> list[str]:
    return optimizer_param_names(unwrap_model(trainer.model), _optimizer(trainer))


def to_indexed(named: dict[str, Any], trainer: LoopHost) -> dict[str, Any]:
    names = _names(trainer)
    index = {n: i for i, n in enumerate(names)}
    state = {i: named["state"][n] for i, n in enumerate(names) if n in named["state"]}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]
    return {"state": state, "param_groups": groups}


def _is_sharded(values: Any) -> bool:
    from torch.distributed.tensor import DTensor

    if isinstance(values, DTensor):
        return True
    if isinstance(values, dict):
        return any(_is_sharded(v) for v in values.values())
    return False


def gather_full(trainer: LoopHost) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, optimizer state) in the single-process format on rank 0, empty dicts elsewhere."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, named = get_state_dict(
        unwrap_model(trainer.model), _optimizer(trainer), options=_options(full_state_dict=True, cpu_offload=True)
    )
    if not trainer.strategy.is_global_zero:
        return {}, {}
    return saved_part(trainer, model_sd), to_indexed(named, trainer)


def saved_part(trainer: LoopHost, model_sd: dict[str, Any]) -> dict[str, Any]:
    """LoRA: the single-process format holds what trains (the adapters), not the frozen base."""
    savers = trainer.model_setup.savers
    if savers is None:
        return dict(model_sd)
    keep = set(savers.model_state(unwrap_model(trainer.model)))
    return {k: v for k, v in model_sd.items() if k in keep}


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every rank gets the full model state on the CPU (collective: call it on every rank)."""
    from torch.distributed.tensor import DTensor

    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        for k, v in unwrap_model(model).state_dict().items()
    }


def model_state(trainer: LoopHost) -> dict[str, torch.Tensor]:
    """``Trainer.model_state_dict``: the model's weights (under FSDP gathered in full, on the CPU, by every rank)."""
    if trainer.strategy.shards_parameters:
        return full_model_state(trainer.model)
    return unwrap_model(trainer.model).state_dict()


def load_model_state(trainer: LoopHost, state: dict[str, torch.Tensor]) -> None:
    """``Trainer.load_model_state_dict``: under FSDP each rank keeps its shard of ``state``."""
    if trainer.strategy.shards_parameters:
        load_weights(trainer, state, None)
    else:
        unwrap_model(trainer.model).load_state_dict(state)


def load_weights(trainer: LoopHost, model_state: dict[str, Any] | None, optim_state: dict[str, Any] | None) -> None:
    """Full tensors (a single-process / DDP / FSDP full checkpoint, the same on every rank) or this rank's
    shards (a sharded checkpoint): each rank keeps its shard. A collective."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    root = unwrap_model(trainer.model)
    if model_state is not None:
        # LoRA checkpoints hold the adapters only (their keys were checked against the model's before)
        partial = set(model_state) != set(root.state_dict())
        options = _options(full_state_dict=not _is_sharded(model_state), strict=not partial)
        set_model_state_dict(root, model_state, options=options)
    if optim_state is not None and trainer.optimizer is not None:
        named = optimizer_state_by_name(optim_state, _names(trainer))
        options = _options(full_state_dict=not _is_sharded(optim_state.get("state", {})))
        set_optimizer_state_dict(root, trainer.optimizer, named, options=options)
