"""torchao's ``CPUOffloadOptimizer`` made to behave like a ``torch.optim.Optimizer`` for ``offload_optimizer=True``.

torchao keeps one CPU optimizer per large parameter (over a pinned host copy of it) and one on-device optimizer
for the small ones, copies each gradient to the host during backward (a post-accumulate-grad hook on its own
stream) and steps on the CPU. What it does not have, and the rest of nbtrainer and of torch relies on:

* **step hooks**: it does not call ``Optimizer.__init__``, so ``register_step_post_hook`` (how the loop tells a
  step that fp16's GradScaler skipped) and the memory tracker's pre/post hooks had nowhere to go;
* ``defaults`` (LR schedulers read it, e.g. OneCycleLR's momentum cycling) and ``state`` (memory accounting,
  moving state beside its parameter);
* ``param_groups`` that stay live after ``load_state_dict`` (which replaces an optimizer's group dicts);
* **a standard state dict**: its own is ``{"offloaded": [...], "on-device": ...}``; checkpoints and their
  checks expect ``{"state", "param_groups"}``. Here the inner optimizers' dicts are laid end to end as one
  (their groups in order, parameter indices renumbered) and split back on load, so a checkpoint is an ordinary
  optimizer state dict that ``torch.load(weights_only=True)`` reads;
* **master copies that follow the model**: torchao copies each parameter to the host once, at construction;
  :meth:`pull_parameters` copies them again (on every load of a state dict and at the start of each fit), so
  weights loaded into the model afterwards are what the CPU step updates;
* **gradients final before the step**: the host copies land asynchronously; :meth:`wait_for_gradients` waits for
  them, so the loop's unscale, the exact rescale of a ragged accumulation window and clipping act on the
  gradients the CPU step will read (they are the optimizer's parameters' ``.grad``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from nbtrainer._setup._quantize import require_module

__all__ = ["offload_optimizer_class"]

_CLASS: list[type] = []


def offload_optimizer_class() -> type:
    """The adapter class over torchao's ``CPUOffloadOptimizer`` (made once, when torchao is first needed)."""
    if _CLASS:
        return _CLASS[0]
    base: Any = require_module("torchao.optim", "offload_optimizer=True").CPUOffloadOptimizer

    class OffloadOptimizer(base):
        """``CPUOffloadOptimizer`` with step hooks, ``defaults``, a ``state`` view and a standard state dict."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # what Optimizer.__init__ would have made: torch's own register_step_*_hook fill these dicts
            self._optimizer_step_pre_hooks: OrderedDict[int, Any] = OrderedDict()
            self._optimizer_step_post_hooks: OrderedDict[int, Any] = OrderedDict()
            first = next(iter(self._inner()), None)
            self.defaults = dict(first.defaults) if first is not None else {}

        def _inner(self) -> list[torch.optim.Optimizer]:
            # the order of torchao's param_groups: the on-device (small) parameters' groups first
            return [*([self.d_opt] if self.d_opt is not None else []), *self.optim_dict.values()]

        @property
        def param_groups(self) -> list[dict[str, Any]]:
            """The inner optimizers' live groups, in torchao's order. torchao's own property starts from the list
            of group dicts the on-device optimizer was built with, and ``load_state_dict`` replaces an
            optimizer's group dicts: after a resume, LR changes (a scheduler, ``set_lr``) went to the stale
            dicts and the small parameters kept the loaded LR (seen on an H200: resumed != uninterrupted)."""
            return [group for opt in self._inner() for group in opt.param_groups]

        @property
        def state(self) -> dict[torch.Tensor, dict[str, Any]]:
            """Every inner optimizer's state by parameter (host copies for the offloaded ones)."""
            merged: dict[torch.Tensor, dict[str, Any]] = {}
            for opt in self._inner():
                merged.update(opt.state)
            return merged

        def pull_parameters(self) -> None:
            """Copy the model's parameters into the host master copies the CPU step updates. torchao takes
            them once, at construction: weights loaded into the model later (a resume, ``load_state_dict``)
            would otherwise be overwritten by the stale copies at the next step."""
            with torch.no_grad():
                for p_device, p_host in self.param_d2h_map.items():
                    p_host.copy_(p_device.detach())

        def wait_for_gradients(self) -> None:
            """Block until every gradient copied to the host in this backward has landed."""
            for event in self.queue.values():
                event.synchronize()

        def step(self, closure: Any = None) -> Any:
            for hook in list(self._optimizer_step_pre_hooks.values()):
                hook(self, (), {})
            out = super().step(closure)
            for hook in list(self._optimizer_step_post_hooks.values()):
                hook(self, (), {})
            return out

        def state_dict(self) -> dict[str, Any]:
            state: dict[int, Any] = {}
            groups: list[dict[str, Any]] = []
            offset = 0
            for opt in self._inner():
                sd = opt.state_dict()
                for key, value in sd["state"].items():
                    state[offset + int(key)] = value
                for group in sd["param_groups"]:
                    groups.append({**group, "params": [offset + int(i) for i in group["params"]]})
                offset += sum(len(g["params"]) for g in sd["param_groups"])
            return {"state": state, "param_groups": groups}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            groups, state = list(state_dict["param_groups"]), state_dict["state"]
            inner = self._inner()
            want = sum(len(opt.param_groups) for opt in inner)
            if len(groups) != want:
                raise ValueError(
                    f"This offloaded optimizer has {want} param groups (one per large parameter, then the small "
                    f"ones), the state dict {len(groups)}: it was saved by another optimizer or model."
                )
            offset = 0
            for opt in inner:
                own, groups = groups[: len(opt.param_groups)], groups[len(opt.param_groups) :]
                count = sum(len(g["params"]) for g in own)
                opt.load_state_dict(
                    {
                        "state": {int(k) - offset: v for k, v in state.items() if offset <= int(k) < offset + count},
                        "param_groups": [{**g, "params": [int(i) - offset for i in g["params"]]} for g in own],
                    }
                )
                offset += count
            self.pull_parameters()  # a resume loads the model's weights first, then this state

    _CLASS.append(OffloadOptimizer)
    return OffloadOptimizer
