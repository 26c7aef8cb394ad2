"""LoRA adapters through PEFT: ``Trainer(lora=dict(r=8, alpha=16, dropout=0.05, target_modules="all-linear"))``.

The base is frozen and low-rank adapters train beside the targeted linear layers; over a quantized base
(``quantize=``) this is QLoRA. ``target_modules="all-linear"`` is resolved here, for any ``nn.Module``
(PEFT resolves it only for Hugging Face models): every linear layer but the output head. A target that
matches nothing is refused before anything changes (PEFT would raise from inside ``get_peft_model``, after
the base was quantized).

The task head of a Hugging Face classification or question-answering model (``AutoModelForSequenceClassification``
...) is built fresh over the pretrained body: frozen, it would stay random while the adapters train on top of it. It
trains in full, as PEFT's ``task_type="SEQ_CLS"`` / ``"TOKEN_CLS"`` / ``"QUESTION_ANS"`` have it: its names
(``classifier``, ``score``; ``qa_outputs``) join ``modules_to_save`` (:func:`task_heads`), unless ``trainable=`` says
what trains beside the adapters. On any other model, a frozen output head is warned about.

``trainable=`` beside ``lora=`` means what it says: a layer whose weight it names trains in full and gets no adapter
(it leaves the targets, as a head in ``modules_to_save`` does), so PEFT never wraps it and renames its weight to
``...base_layer.weight`` out from under the pattern; any other parameter it names (a bias of an adapted layer, a
norm) trains beside the adapters. A parameter inside ``modules_to_save`` is refused: PEFT trains a copy of that module.

Checkpoints hold only what trains (:func:`trainable_state`); :func:`merge_lora` gives a plain model:
adapters added into full-precision weights (a quantized base is dequantized first, rather than merging into
4-bit weights and rounding the adapters away). A model that already is a ``PeftModel`` is left as it is.
"""

from __future__ import annotations

import copy
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from nbtrainer._setup._quantize import (
    dequantize_linear,
    is_conv1d,
    is_linear,
    is_quantized_linear,
    output_head_name,
    require_module,
)

__all__ = [
    "LORA_KEYS",
    "apply_lora",
    "check_lora",
    "inside_modules",
    "is_peft_model",
    "merge_lora",
    "task_heads",
    "trainable_state",
]

#: Keys of ``lora=dict(...)`` (short names; the rest of ``peft.LoraConfig`` through a LoraConfig instance).
LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "bias", "modules_to_save")


def is_peft_model(model: nn.Module) -> bool:
    """A ``peft.PeftModel`` (checked without importing peft)."""
    return any(c.__name__ == "PeftModel" and c.__module__.startswith("peft") for c in type(model).__mro__)


#: peft.peft_model's modules_to_save for its SEQ_CLS / TOKEN_CLS (``...Classification``) and QUESTION_ANS task types
_TASK_HEADS = {"Classification": ("classifier", "score"), "QuestionAnswering": ("qa_outputs",)}


def _is_transformers(model: nn.Module) -> bool:
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers") for c in type(model).__mro__)


def task_heads(model: nn.Module) -> list[str]:
    """The task head modules (children) of a Hugging Face ``...ForSequenceClassification`` /
    ``...ForTokenClassification`` / ``...ForQuestionAnswering`` (any ``...Classification``) model, which ``lora=``
    trains in full; ``[]`` for any other model."""
    if not _is_transformers(model):
        return []
    cls = type(model).__name__
    names = next((heads for suffix, heads in _TASK_HEADS.items() if cls.endswith(suffix)), ())
    children = dict(model.named_children())
    return [name for name in names if name in children]


def inside_modules(name: str, modules: Iterable[str]) -> bool:
    """``name`` is one of ``modules`` or lies inside one (PEFT adapts nothing inside a module it saves)."""
    return any(f".{name}.".find(f".{m}.") >= 0 for m in modules)


def _linear_names(model: nn.Module, saved: Iterable[str] = ()) -> list[str]:
    head, saved = output_head_name(model), list(saved)
    return [
        name
        for name, module in model.named_modules()
        if is_linear(module) and name != head and name and not inside_modules(name, saved)
    ]


def _full_layers(keep: Iterable[str]) -> list[str]:
    """The modules whose weight ``trainable=`` names (``keep``: parameter names): trained in full, not adapted."""
    return sorted({name.rpartition(".")[0] for name in keep if name.endswith(".weight")})


def _check_keep_unsaved(keep: Iterable[str], saved: Iterable[str]) -> None:
    saved = list(saved)
    inside = sorted(name for name in keep if inside_modules(name, saved))
    if inside:
        raise ValueError(
            f"trainable= names {inside[:6]}, inside lora modules_to_save={saved}: PEFT trains a copy of a saved "
            "module and leaves these originals out of the forward pass, so they would never change. Give the module "
            "to one of the two: drop it from modules_to_save, or leave it out of trainable= (a saved module trains "
            "in full anyway)."
        )


def _excluding(config: Any, layers: list[str]) -> Any:
    """``config.exclude_modules`` with ``layers`` (full names) added to what the user excluded."""
    given = config.exclude_modules
    if isinstance(given, str):  # a regex PEFT matches in full: either one excludes
        return "|".join([f"(?:{given})", *(re.escape(name) for name in layers)])
    return set(given or ()) | set(layers)


def _save_heads(model: nn.Module, config: Any, keep: set[str]) -> None:
    """The task heads join ``modules_to_save`` (PEFT does it itself for a LoraConfig with a ``task_type``); a plain
    model's output head left frozen with nothing said about it is warned about."""
    if keep or config.task_type is not None:  # trainable= decides what trains beside the adapters
        return
    heads = task_heads(model)
    given = config.modules_to_save is not None
    saved = list(config.modules_to_save or [])
    if heads:
        config.modules_to_save = saved + [h for h in heads if h not in saved]
        return
    head = output_head_name(model)
    if head is None or given or inside_modules(head, saved) or _is_transformers(model):
        return
    warnings.warn(
        f"lora=: the output head {head!r} of {type(model).__name__} stays frozen (adapters go into the other linear "
        f"layers, the base is frozen). If it is newly initialised, train it: trainable=['{head}.*'] or "
        f"lora=dict(..., modules_to_save=[{head!r}]); modules_to_save=[] keeps it frozen without this warning.",
        stacklevel=_outside_stacklevel(),
    )


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of the first frame outside nbtrainer (the user's ``Trainer(...)``, however it got here)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def check_lora(model: nn.Module, lora: Any, keep: Iterable[str] = ()) -> Any:
    """The ``peft.LoraConfig`` for ``lora=`` (a dict of :data:`LORA_KEYS` or a LoraConfig), with
    ``"all-linear"`` resolved to layer names and a Hugging Face task head in ``modules_to_save`` (unless ``keep``,
    the parameters ``trainable=`` names, says what trains); the layers whose weight ``keep`` names are left out of
    the targets (they train in full). Refused with the fix when a target matches nothing, or ``keep`` names a
    parameter inside ``modules_to_save``."""
    if lora is None or lora is False:
        return None
    peft = require_module("peft", "lora=")
    if is_peft_model(model):
        raise ValueError(
            "lora= was given for a model that already is a PeftModel (it has its adapters): pass the PeftModel "
            "without lora= to train its adapters, or pass the base model with lora=."
        )
    if isinstance(lora, Mapping):
        unknown = sorted(set(lora) - set(LORA_KEYS))
        if unknown:
            raise ValueError(
                f"lora= got unknown keys {unknown}: use {list(LORA_KEYS)}, e.g. lora=dict(r=8, alpha=16, "
                "dropout=0.05, target_modules='all-linear'), or pass a peft.LoraConfig for its other options."
            )
        r = lora.get("r", 8)
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ValueError(f"lora r must be an int >= 1 (the adapters' rank), got {r!r}.")
        config = peft.LoraConfig(
            r=r,
            lora_alpha=lora.get("alpha", 2 * r),
            lora_dropout=float(lora.get("dropout", 0.0)),
            target_modules=lora.get("target_modules", "all-linear"),
            bias=lora.get("bias", "none"),
            modules_to_save=lora.get("modules_to_save"),
        )
    elif isinstance(lora, peft.LoraConfig):
        config = copy.deepcopy(lora)
    else:
        raise TypeError(
            f"lora= takes a dict such as dict(r=8, alpha=16, dropout=0.05, target_modules='all-linear') or a "
            f"peft.LoraConfig, got {type(lora).__name__}."
        )
    keep = set(keep)
    _save_heads(model, config, keep)
    _check_keep_unsaved(keep, config.modules_to_save or ())
    full = _full_layers(keep)
    # PEFT would wrap a layer trainable= trains and rename its weight, which then no longer matches and stays frozen
    trained = f" (trainable= trains {full[:6]} in full, without adapters)" if full else ""
    linears = _linear_names(model, config.modules_to_save or ())
    targets = config.target_modules
    shown = lora.get("target_modules") if isinstance(lora, Mapping) else targets  # peft turns a list into a set
    if isinstance(targets, str) and targets.lower() == "all-linear":
        adapted = [name for name in linears if name not in full]
        if not adapted:
            raise ValueError(
                f"lora target_modules='all-linear' matches nothing: {type(model).__name__} has no linear layer "
                f"besides its output head{trained}. Name the modules to adapt, e.g. target_modules=['proj'], or "
                "narrow trainable= so that some layer is left to adapt."
            )
        config.target_modules = set(adapted)
        return config
    from peft.tuners.tuners_utils import check_target_module_exists

    if full:
        config.exclude_modules = _excluding(config, full)
    names = [name for name, _ in model.named_modules() if name]
    if not targets or not any(check_target_module_exists(config, name) for name in names):
        suffixes = sorted({n.rpartition(".")[2] for n in linears if n not in full})
        raise ValueError(
            f"lora target_modules={shown!r} matches no module of {type(model).__name__}{trained}. Its linear "
            f"layers end in {suffixes[:12]}; use those names, or target_modules='all-linear'."
        )
    return config


def _fan_in_fan_out(model: nn.Module, config: Any) -> None:
    """transformers' ``Conv1D`` stores its weight ``(in, out)``: PEFT needs ``fan_in_fan_out=True`` for it and
    ``False`` for ``nn.Linear`` (it corrects either with a warning per layer). Set for the layers as they are when
    the adapters go in (``quantize=`` has turned the quantized ones into linear layers by then)."""
    from peft.tuners.tuners_utils import check_target_module_exists

    targeted = [m for n, m in model.named_modules() if n and check_target_module_exists(config, n)]
    if any(is_conv1d(m) for m in targeted):
        config.fan_in_fan_out = True
    elif targeted and all(is_linear(m) for m in targeted):
        config.fan_in_fan_out = False


def apply_lora(model: nn.Module, config: Any, keep_trainable: Iterable[str] = ()) -> nn.Module:
    """``peft.get_peft_model``: adapters injected into ``model`` (in place), base frozen; the parameters
    named in ``keep_trainable`` (the user's ``trainable=`` choice) train too. Returns the PeftModel.

    Raises:
        ValueError: a parameter ``keep_trainable`` names is no longer in the wrapped model (PEFT replaced it).
    """
    from peft import get_peft_model

    _fan_in_fan_out(model, config)
    named = dict(model.named_parameters())
    with warnings.catch_warnings():
        # PEFT reads transformers' deprecated `is_gradient_checkpointing` while it wraps the model: a FutureWarning a
        # user saw as red text in every LoRA cell, about a call they never made. Only that message is silenced.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        peft_model = get_peft_model(model, config)
    keep = set(keep_trainable)
    # held by identity: PEFT renames the parameters of a layer it wraps (a bias to ...base_layer.bias)
    kept = {name: p for name, p in named.items() if name in keep}
    present = {id(p) for p in peft_model.parameters()}
    lost = sorted(name for name, p in kept.items() if id(p) not in present)
    if lost:
        raise ValueError(
            f"trainable= names {lost[:6]}, which the LoRA model no longer holds (PEFT replaced them while adding "
            "the adapters), so they would not train. Leave them out of trainable=, or out of the lora targets "
            "(target_modules=[...])."
        )
    for p in kept.values():
        p.requires_grad_(True)
    return peft_model


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state entries of the parameters that train (adapters, unfrozen layers) and of the model's buffers: what
    a LoRA checkpoint holds instead of the whole model.

    Buffers change without a gradient: a frozen BatchNorm updates its running mean and variance at every training
    forward, so a resume that took them from the fresh model would normalise with other statistics than the run
    that wrote the checkpoint. They are small; the frozen weights, which do not change, stay out."""
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    names |= {name for name, _ in model.named_buffers()}
    return {k: v for k, v in model.state_dict().items() if k in names}


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)


@torch.no_grad()
def merge_lora(model: Any, dtype: torch.dtype = torch.float32) -> nn.Module:
    """A plain copy of a LoRA model for inference: every adapter added into its layer's weight
    (``W + scaling * B @ A``), quantized layers dequantized to ``dtype``, no PEFT wrapper. The trained
    model is left as it is (training can go on)."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import ModulesToSaveWrapper

    if not is_peft_model(model):
        raise ValueError("merge_lora() needs a model with LoRA adapters: create the Trainer with lora=dict(r=8).")
    base = copy.deepcopy(model.get_base_model())
    for name, module in list(base.named_modules()):
        if isinstance(module, ModulesToSaveWrapper):  # a head trained in full (modules_to_save): its trained copy
            _replace(base, name, module.unload_and_optionally_merge_module(False, False, None))
    for name, module in list(base.named_modules()):
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module
        inner = layer.get_base_layer()
        if not is_linear(inner):
            raise ValueError(f"merge_lora() merges LoRA on linear layers; {name} wraps {type(inner).__name__}.")
        dense = dequantize_linear(inner, dtype) if is_quantized_linear(inner) else copy.deepcopy(inner)
        dense.weight.requires_grad_(False)
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                dense.weight += layer.get_delta_weight(adapter).to(dense.weight.dtype)
        if dense.bias is not None:
            dense.bias.requires_grad_(False)
        _replace(base, name, dense)
    for name, module in list(base.named_modules()):
        if is_quantized_linear(module):
            _replace(base, name, dequantize_linear(module, dtype))
    for flag in ("is_loaded_in_4bit", "is_loaded_in_8bit"):
        if getattr(base, flag, False):
            setattr(base, flag, False)
    return base
