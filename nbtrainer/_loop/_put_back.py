"""What training steps write on a model, copied before a measuring tool trains, and put back after it.

``profile_training`` and ``lr_find`` really train (their steps change the weights) and must leave the model as they
found it. A copy of ``model.state_dict()`` loaded back with ``load_state_dict`` cannot do that for every model: a
bitsandbytes-quantized base (QLoRA) saves keys its layers do not load back (``weight.absmax``, ``quant_map``...), so
the load raised after the steps had run. What a step can write is known without the state dict: the parameters
that train (their values and gradients) and the buffers (BatchNorm's running statistics...). The frozen base has
no gradient and is never stepped, so it is neither copied nor loaded; the rest is put back in place, tensor by
tensor, so the optimizer's references stay the model's parameters. Each module's training flag is put back too (a
frozen BatchNorm in eval stays so; a model in eval mode stays in eval mode).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ModelPutBack"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's own shard, which shares its storage; any other tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _copy(t: torch.Tensor) -> torch.Tensor:
    return _local(t).detach().to("cpu", copy=True)


class ModelPutBack:
    """A CPU copy of what training can change on ``model``; :meth:`restore` writes it back.

    Args:
        model: the module that trains (wrappers such as DDP or ``torch.compile`` included: their modules are its).
        optimizer: its optimizer, whose parameters are copied even when frozen (``None``: none).

    Example:
        >>> layer = torch.nn.Linear(2, 1).eval()
        >>> kept = ModelPutBack(layer, None)
        >>> with torch.no_grad():
        ...     _ = layer.weight.add_(1.0)
        >>> _ = layer.train(); kept.restore()
        >>> layer.training, kept.params[0][1].equal(layer.weight.detach())
        (False, True)
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any) -> None:
        held = {id(p) for g in optimizer.param_groups for p in g["params"]} if optimizer is not None else set()
        self.flags = [(m, m.training) for m in model.modules()]
        self.params: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = [
            (p, _copy(p), None if p.grad is None else p.grad.detach().to("cpu", copy=True))
            for p in model.parameters()
            if p.requires_grad or id(p) in held
        ]
        # by owner and name: a module may assign a new buffer tensor rather than write into the old one
        self.buffers = [
            (m, name, _copy(b), b.device) for m in model.modules() for name, b in m._buffers.items() if b is not None
        ]

    def restore(self) -> None:
        with torch.no_grad():
            for p, value, grad in self.params:
                _local(p).copy_(value)
                p.grad = None if grad is None else grad.to(p.device)
            for module, name, value, device in self.buffers:
                now = module._buffers.get(name)
                if now is not None and now.shape == value.shape and now.dtype == value.dtype:
                    _local(now).copy_(value)
                else:
                    module._buffers[name] = value.to(device)
        for module, training in self.flags:
            module.training = training
