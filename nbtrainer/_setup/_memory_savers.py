"""The switches for training what does not fit, checked together and applied in order.

``quantize=`` (``_quantize``), ``lora=`` (``_lora``), the k-bit optimizers (``_kbit_optim``),
``offload_activations=`` / ``offload_optimizer=`` (``_offload``) and ``attention=`` (``_attention``) are
validated in :class:`MemorySavers`' constructor, before the model changes and before the first step.
:meth:`MemorySavers.transform` then quantizes and adds adapters, in that order (PEFT wraps the quantized
layers with its quantization-aware LoRA layers), and the optimizer is built afterwards over what trains:
an optimizer built before would hold the replaced parameters. ``ModelSetup`` owns one of these.

Checkpoints of a quantized or LoRA model hold what trains (adapters, unfrozen layers), the buffers (running
statistics change without gradients), the optimizer and the loop state; the frozen base comes from the model the
resumed Trainer is given (``save_base=True`` stores it too, in its quantized form). The configuration goes into the
checkpoint so that a checkpoint trained on an nf4 base is not resumed over a full-precision one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from nbtrainer._options import SWITCH, MemoryOptions, lora_settings
from nbtrainer._setup import _attention, _kbit_optim, _lora, _offload, _quantize
from nbtrainer._setup._precision import autocast_dtype, require_precision, resolve_device
from nbtrainer._setup._seed import rng_untouched

__all__ = ["MemorySavers", "memory_saver_support"]


class MemorySavers:
    """``quantize`` / ``lora`` / ``save_base`` / k-bit optimizers / offloading / ``attention`` of one Trainer.

    Args:
        model: the user's model (not changed here).
        optimizer: the Trainer's ``optimizer=`` (a name, an instance or None).
        memory: the Trainer's memory switches as given (checked here; :attr:`memory` is the checked copy).
        device, save_base: the Trainer's.
        plan: ``{parameter name: trainable}`` after ``trainable=`` / ``freeze=``.
        keep: the parameters ``trainable=`` names: their layers stay in full precision and train beside adapters.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        memory: MemoryOptions,
        *,
        device: Any,
        save_base: bool = False,
        plan: dict[str, bool],
        keep: set[str],
    ) -> None:
        self.device = resolve_device(device)
        precision = require_precision(memory.precision, self.device)
        memory.check_flags()
        if not isinstance(save_base, bool):
            raise TypeError(f"save_base= takes True or False, got {save_base!r}.")
        self.keep = set(keep)
        self.lora_config = _lora.check_lora(model, memory.lora, self.keep)
        # a task head lora= trains in full (_lora.task_heads) stays in full precision, as trainable= layers do
        heads = _lora.task_heads(model) if self.lora_config is not None and not self.keep else []
        full = self.keep | {f"{h}.{n}" for h in heads for n, _ in model.get_submodule(h).named_parameters()}
        quantize, self.quant_targets = _quantize.check_quantize(
            model, memory.quantize, device=self.device, precision=precision, keep=full
        )
        self.save_base = save_base
        if save_base and self.lora_config is None and quantize is None:
            raise ValueError(
                "save_base=True is for lora= / quantize=: it keeps the frozen base in checkpoints, which without "
                "them hold the whole model anyway. Remove save_base, or add lora=dict(r=8)."
            )
        changes_params = quantize is not None or self.lora_config is not None
        if changes_params and optimizer is not None and not isinstance(optimizer, str):
            raise ValueError(
                "quantize= / lora= replace the model's layers, so an optimizer built beforehand would update "
                "parameters that are no longer trained. Give it by name (optimizer='adamw' or 'adamw8bit', lr=...) "
                "and, for a scheduler, set trainer.scheduler = ...(trainer.optimizer) after creating the Trainer."
            )
        name = optimizer.strip().lower() if isinstance(optimizer, str) else None
        if name is not None and name in _kbit_optim.KBIT_OPTIMIZERS:
            library = _kbit_optim.KBIT_OPTIMIZERS[name].library
            _quantize.require_module("torchao.optim" if library == "torchao" else library, f"optimizer={name!r}")
        if name is not None and self.lora_config is None and quantize is not None:
            quantized = {f"{m}.{p}" for m in self.quant_targets for p in ("weight", "bias")}
            if not {n for n, trains in plan.items() if trains} - quantized:
                raise ValueError(
                    f"quantize={quantize!r} freezes the quantized layers and nothing else trains: add adapters "
                    "(lora=dict(r=8), i.e. QLoRA), or keep some layers trainable (trainable=['head.*'])."
                )
        if memory.offload_optimizer:
            _offload.check_offload_optimizer(self.device, optimizer)
        dtype = autocast_dtype(precision) or torch.float32
        attention = _attention.check_attention(memory.attention, self.device, dtype, model)
        #: The switches as checked: the precision resolved, ``quantize`` / ``attention`` normalized, ``lora`` as plain
        #: settings. Those that set up the model (all but precision and checkpointing) hold for its whole life.
        self.memory = dataclasses.replace(
            memory,
            precision=precision,
            quantize=quantize,
            lora=lora_settings(memory.lora, self.lora_config, self.keep),
            attention=attention,
        )
        #: The optimizer waits for transform(): quantize / lora / offload_optimizer decide its parameters.
        self.deferred = changes_params or memory.offload_optimizer
        self.peft_model: nn.Module | None = None
        self._hooks: list[Any] = []

    # -- applying -----------------------------------------------------------------------------
    def transform(self, model: nn.Module, *, seed: int | None = None) -> nn.Module:
        """Quantize, then add adapters (in place where possible); returns the module to train.

        With ``seed`` (the Trainer's), the adapters' random init comes from that seed and leaves the caller's RNG
        where it was: two Trainers built with one seed start from the same adapters, whatever ran before them.
        Without it, the init draws from torch's global RNG, as PEFT does.
        """
        if self.memory.quantize is not None:
            dtype = _quantize.compute_dtype(self.memory.precision)
            _quantize.quantize_model(model, self.quant_targets, self.memory.quantize, dtype=dtype, device=self.device)
        if self.lora_config is not None:
            with contextlib.ExitStack() as stack:
                if seed is not None:
                    stack.enter_context(rng_untouched(self.device))
                    torch.manual_seed(seed)
                self.peft_model = _lora.apply_lora(model, self.lora_config, self.keep)
            return self.peft_model
        return model

    def build_optimizer(
        self, model: nn.Module, name: str, lr: float | None, build: Callable[..., torch.optim.Optimizer]
    ) -> torch.optim.Optimizer:
        """The named optimizer over what trains after :meth:`transform` (``build``: ``build_optimizer``)."""
        params = [p for p in model.parameters() if p.requires_grad]
        if self.memory.offload_optimizer:
            return _offload.build_offload_optimizer(name, params, lr)
        return build(name, params, lr, device=self.device)

    def attach_hooks(self, model: nn.Module) -> None:
        """The forward hooks of ``attention=`` and ``offload_activations=`` on the module that trains."""
        if self.memory.attention != "auto":
            self._hooks.append(_attention.AttentionKernel(model, self.memory.attention))
        if self.memory.offload_activations:
            self._hooks.append(_offload.ActivationOffload(model, pin_memory=self.device.type == "cuda"))

    def merge_lora(self, model: nn.Module) -> nn.Module:
        """A plain model with the adapters merged (see :func:`nbtrainer._setup._lora.merge_lora`)."""
        peft_model = self.peft_model if self.peft_model is not None else model
        return _lora.merge_lora(peft_model, _quantize.compute_dtype(self.memory.precision))

    def describe(self) -> dict[str, Any]:
        lora = self.lora_config
        out: dict[str, Any] = {
            SWITCH.quantize: self.memory.quantize,
            "quantized_layers": len(self.quant_targets),
            SWITCH.lora: lora and {"r": lora.r, "alpha": lora.lora_alpha},
            SWITCH.offload_activations: self.memory.offload_activations,
            SWITCH.offload_optimizer: self.memory.offload_optimizer,
            "attention": self.memory.attention,
        }
        return out

    # -- checkpoints ----------------------------------------------------------------------------
    @property
    def partial_checkpoints(self) -> bool:
        """Checkpoints hold only what trains (the frozen base comes from the model given on resume)."""
        return (self.lora_config is not None or self.memory.quantize is not None) and not self.save_base

    def checkpoint_config(self) -> dict[str, Any]:
        # the keys a checkpoint has always carried: the switches' names
        lora = self.lora_config is not None
        return {SWITCH.quantize: self.memory.quantize, SWITCH.lora: lora, "save_base": self.save_base}

    def model_state(self, model: nn.Module) -> dict[str, Any]:
        return _lora.trainable_state(model) if self.partial_checkpoints else model.state_dict()

    def load_model_state(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Load what :meth:`model_state` saved (quantized base layers through bitsandbytes' own format)."""
        if self.partial_checkpoints:
            model.load_state_dict(state, strict=False)  # the keys were checked against model_state() first
            return
        rest = dict(state)
        for name, module in model.named_modules():
            if not _quantize.is_quantized_linear(module):  # told without importing bitsandbytes
                continue
            lib = _quantize.bnb("loading a quantized checkpoint")
            if not isinstance(module, lib.nn.Linear4bit):
                continue
            prefix = f"{name}.weight" if name else "weight"
            stats = {k[len(prefix) + 1 :]: rest.pop(k) for k in list(rest) if k.startswith(prefix + ".")}
            data = rest.pop(prefix)
            module.weight = lib.nn.Params4bit.from_prequantized(
                data, stats, requires_grad=False, device=module.weight.device, module=module
            )
        model.load_state_dict(rest, strict=False)

    def check_checkpoint(self, config: dict[str, Any]) -> str | None:
        """Why a checkpoint written with ``config`` cannot be resumed here (None when it can)."""
        saved_q, saved_lora = config.get(SWITCH.quantize), bool(config.get(SWITCH.lora, False))
        if saved_q != self.memory.quantize:
            return (
                f"The checkpoint was trained with quantize={saved_q!r}, this trainer has "
                f"quantize={self.memory.quantize!r}: "
                f"its adapters were fitted to that base. Create the Trainer with quantize={saved_q!r}."
            )
        if saved_lora != (self.lora_config is not None):
            return (
                "The checkpoint was written "
                + ("with LoRA adapters" if saved_lora else "without lora=")
                + " and this trainer has "
                + ("lora=" if self.lora_config is not None else "none")
                + ". Create the Trainer with the lora= of the run that wrote it."
            )
        return None


def memory_saver_support(
    device: Any = "auto", precision: str = "fp32", *, probe: bool = True
) -> dict[str, tuple[bool, str]]:
    """Which memory switches run on ``device`` in ``precision``: ``{switch: (ok, reason)}``.

    Keys: ``"quantize:nf4"`` (and ``nf4-dq``, ``fp4``, ``int8``), ``"lora"``, ``"optimizer:adamw8bit"`` (and
    ``paged_adamw8bit``, ``adamw4bit``), ``"offload_activations"``, ``"offload_optimizer"``,
    ``"optimizer_in_backward"``, ``"attention:flash"``
    (and ``auto``, ``efficient``, ``cudnn``, ``math``). The reason is empty when it runs and says why not (and
    what to install or use instead) when not: what a panel shows on a disabled option. Quantized layers and
    attention backends are checked by running a tiny one here (cached), like :func:`precision_support`.

    ``probe=False`` skips the quantized layers' check, and with it bitsandbytes' import (about 0.6 s of CPU in a
    fresh process): a quantized format then counts as running wherever bitsandbytes is installed. The panel's
    memory savers group asks for this when it is built and probes when it is first opened.

    Example:
        >>> memory_saver_support("cpu")["offload_optimizer"]
        (False, 'nothing to offload to on cpu: the optimizer state is in CPU RAM already (needs CUDA)')
    """
    import importlib.util

    dev = resolve_device(device)
    precision = require_precision(precision, dev)

    def missing(module: str) -> str:
        return "" if importlib.util.find_spec(module) else f"needs {module}: {_quantize.INSTALL_QUANT}"

    rows: dict[str, tuple[bool, str]] = {}
    for method in _quantize.QUANTIZE:
        why = missing("bitsandbytes")
        if probe and not why:
            why = _quantize._probe(str(dev), method, _quantize.compute_dtype(precision))
        rows[f"{SWITCH.quantize}:{method}"] = (not why, why)
    why = missing("peft")
    rows[SWITCH.lora] = (not why, why)
    for name, kind in _kbit_optim.KBIT_OPTIMIZERS.items():
        why = missing(kind.library)
        rows[f"{SWITCH.optimizer}:{name}"] = (not why, why)
    rows[SWITCH.offload_activations] = (True, "")
    why = (
        f"nothing to offload to on {dev}: the optimizer state is in CPU RAM already (needs CUDA)"
        if dev.type != "cuda"
        else missing("torchao")
    )
    rows[SWITCH.offload_optimizer] = (not why, why)
    why = (
        "fp16-mixed's GradScaler checks every gradient before a step: use bf16-mixed or fp32"
        if precision == "fp16-mixed"
        else ""
    )
    rows[SWITCH.optimizer_in_backward] = (not why, why)
    dtype = autocast_dtype(precision) or torch.float32
    for name, (ok, reason) in _attention.attention_support(dev, dtype).items():
        rows[f"{SWITCH.attention}:{name}"] = (ok, reason)
    return rows
