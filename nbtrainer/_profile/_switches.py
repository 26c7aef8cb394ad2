"""What the memory switches do to a measured training step, by arithmetic: ``fits(quantize=..., lora=...)``.

The Trainer's switches (``quantize=``, ``lora=``, the k-bit optimizers, ``offload_activations=`` and
``offload_optimizer=``) change the parts of one measured step (:mod:`nbtrainer._memory._breakdown`) in ways that
follow from the layer shapes the profile recorded (:func:`model_structure`), so they are computed here rather
than measured once per combination:

* ``quantize``: each quantizable ``nn.Linear`` weight (every one but the output head, as the Trainer picks them)
  becomes 4-bit (0.5 byte per value, plus an fp32 ``absmax`` per block of 64 and a 16-entry code book; with
  double quantization ``"nf4-dq"`` the block scales are 8-bit, with an fp32 scale per 256 of them and a
  256-entry code book) or int8 (1 byte per value plus an fp32 scale per output row). Biases stay in full
  precision. The quantized layers are frozen: their gradients and optimizer state go away.
* ``lora``: the base is frozen; adapters of ``r * (in + out)`` parameters (fp32) train beside every targeted
  linear layer, so gradients and optimizer state are the adapters' only.
* ``optimizer``: AdamW keeps 2 fp32 moments (8 bytes per trained value); ``adamw8bit`` / ``paged_adamw8bit``
  (bitsandbytes) 2 bytes plus an fp32 scale per block of 256 and two shared 256-entry maps, ``adamw4bit``
  (torchao) 1 byte plus an fp32 scale per block of 128; both keep tensors under 4096 values in 32 bits, as
  the libraries do. ``adafactor``: a row and a column statistic per matrix.
* ``optimizer_in_backward``: each gradient is freed as soon as its parameter is updated, so about the largest
  trained parameter's gradient is kept instead of all of them.
* ``offload_activations``: the saved activations wait in host RAM (a checkpointed block's recomputation runs
  in the backward, outside the offloaded forward, and stays on the device). ``offload_optimizer``: the state
  (and the fp32 master copy of what trains) lives in host RAM. What moves is reported as ``host_bytes``.

Activations are kept as measured: LoRA adds only ``r``-wide adapter outputs, and a frozen layer saves no less
than a trained one that feeds an adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._options import QUANTIZE, SWITCH, MemoryOptions
from nbtrainer._plan._arithmetic import KBIT as _KBIT
from nbtrainer._plan._arithmetic import model_structure
from nbtrainer._plan._arithmetic import optimizer_state_bytes as _optimizer_state
from nbtrainer._plan._arithmetic import targeted as _targeted

__all__ = ["QUANTIZE", "Switched", "apply_switches", "model_structure", "normalize_switches"]

_LORA_KEYS = ("r", "alpha", "dropout", "target_modules", "bias", "modules_to_save")


# fits(quantize=...) and fits(optimizer=...) take the Trainer's names (optimizer=None keeps the profiled optimizer:
# its measured state, scaled to what trains)
def normalize_switches(
    *,
    precision: str = "fp32",
    activation_checkpointing: bool = False,
    quantize: Any = None,
    lora: Any = None,
    optimizer: Any = None,
    offload_activations: bool = False,
    offload_optimizer: bool = False,
    optimizer_in_backward: bool = False,
) -> MemoryOptions:
    """``fits()``'s switches as one checked :class:`~nbtrainer.MemoryOptions` (``lora`` as ``{"r", "target_modules"}``);
    bad values refused."""
    if quantize is not None and quantize is not False:
        key = quantize.strip().lower() if isinstance(quantize, str) else None
        if key not in QUANTIZE:
            raise ValueError(f"fits(quantize={quantize!r}): use one of {list(QUANTIZE)} or None (the Trainer's names).")
        quantize = key
    else:
        quantize = None
    if optimizer is not None:
        key = optimizer.strip().lower() if isinstance(optimizer, str) else None
        known = [name for name, kind in OPTIMIZERS.items() if kind.state is not None]
        if key not in known:
            raise ValueError(
                f"fits(optimizer={optimizer!r}): use one of {known} (by name, as Trainer(optimizer=...)), "
                "or None for the optimizer the profile measured."
            )
        optimizer = key
    memory = MemoryOptions(
        precision=precision,
        activation_checkpointing=bool(activation_checkpointing),
        quantize=quantize,
        lora=_normalize_lora(lora),
        optimizer=optimizer,
        offload_activations=offload_activations,
        offload_optimizer=offload_optimizer,
        optimizer_in_backward=optimizer_in_backward,
    )
    memory.check_flags(call="fits")
    if offload_optimizer and optimizer in _KBIT:
        raise ValueError(
            f"fits(offload_optimizer=True, optimizer={optimizer!r}): the Trainer offloads torch's optimizers only; an "
            "8-bit / 4-bit optimizer's state is small already: use one or the other."
        )
    return memory


def _normalize_lora(lora: Any) -> dict[str, Any] | None:
    if lora is None or lora is False:
        return None
    if isinstance(lora, Mapping):
        unknown = sorted(set(lora) - set(_LORA_KEYS))
        if unknown:
            raise ValueError(f"fits(lora=) got unknown keys {unknown}: use {list(_LORA_KEYS)}, e.g. lora=dict(r=8).")
        r, targets = lora.get("r", 8), lora.get("target_modules", "all-linear")
    elif hasattr(lora, "r") and hasattr(lora, "target_modules"):  # a peft.LoraConfig (not imported here)
        r, targets = lora.r, lora.target_modules
    else:
        raise TypeError(f"fits(lora=) takes a dict such as dict(r=8) or a peft.LoraConfig, got {type(lora).__name__}.")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"fits(lora=): r must be an int >= 1 (the adapters' rank), got {r!r}.")
    if targets is not None and not isinstance(targets, str):
        targets = sorted(targets)
    return {"r": r, "target_modules": targets}


@dataclass
class Switched:
    """The fixed parts after the switches, what each switch saved, and what went to host RAM."""

    parts: dict[str, int]
    activation_scale: float = 1.0  # the share of the measured activations left on the device
    savings: dict[str, dict[str, int]] = field(default_factory=dict)
    host: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def apply_switches(memory: dict[str, Any], structure: dict[str, Any] | None, switches: MemoryOptions) -> Switched:
    """The fixed parts (parameters, buffers, gradients, optimizer state) of the measured ``memory`` under
    ``switches``."""
    parts = {key: int(memory[key]) for key in ("parameters", "buffers", "gradients", "optimizer_state")}
    out = Switched(parts=dict(parts), host={"trained": int(memory.get("trainable_parameters", 0))})
    changes_params = switches.quantize is not None or switches.lora is not None
    if (changes_params or switches.optimizer is not None) and structure is None:
        raise ValueError(
            "This profile has no layer table (it was made by an older nbtrainer): run profile_model(...) again to "
            "use fits() with quantize= / lora= / optimizer=."
        )
    if structure is not None:
        _params_and_state(memory, structure, switches, out)
    if switches.offload_optimizer and out.parts["optimizer_state"]:
        state = out.parts["optimizer_state"]
        master = out.host.get("trained", 0)
        out.host["optimizer_state"] = state + master
        out.savings[SWITCH.offload_optimizer] = {"optimizer_state": state}
        out.parts["optimizer_state"] = 0
    out.host.pop("trained", None)
    if switches.optimizer_in_backward and out.parts["gradients"]:
        # each gradient is freed once its parameter is updated: about the largest one exists at a time
        largest = max((n * size for _, n, size, trains, _ in (structure or {}).get("params", []) if trains), default=0)
        kept = min(out.parts["gradients"], largest) if largest else 0
        out.savings[SWITCH.optimizer_in_backward] = {"gradients": out.parts["gradients"] - kept}
        out.parts["gradients"] = kept
    if switches.offload_activations:
        checkpointing = bool(switches.activation_checkpointing)
        recompute = memory.get("recompute_peak") or 0
        kept = memory.get("activations_checkpointed") or 0
        out.activation_scale = recompute / (kept + recompute) if checkpointing and kept + recompute else 0.0
        out.notes.append(
            "the backward brings offloaded activations back one at a time (not counted)"
            + (", a checkpointed block's recomputation stays on the device" if checkpointing else "")
        )
    return out


def _params_and_state(
    memory: dict[str, Any], structure: dict[str, Any], switches: MemoryOptions, out: Switched
) -> None:
    # the parameters and what trains after quantize / lora: the planner's own code (nbtrainer._plan._arithmetic), so a
    # profile's fits() and a plan's rows count them alike
    from nbtrainer._plan._arithmetic import row_tensors

    method, lora = switches.quantize, switches.lora
    head = structure["head"]
    if method is not None and not any(row[4] for row in structure["linears"]):
        raise ValueError(f"fits(quantize={method!r}): the model has no nn.Linear to quantize besides its output head.")
    if lora is not None and not any(
        _targeted(row[0], lora["target_modules"], row[4], head) for row in structure["linears"]
    ):
        raise ValueError(
            f"fits(lora=): target_modules={lora['target_modules']!r} matches no linear layer of the model; use "
            "target_modules='all-linear' or the names of its nn.Linear layers."
        )
    tensors = row_tensors(structure, MemoryOptions(quantize=method, lora=lora))
    adapters = tensors.trained if lora is not None else []
    adapter_bytes = sum(n * e for n, e, _ in adapters)
    if method is not None:
        param_saving = sum(n * e for _, n, e, _, _ in structure["params"]) + adapter_bytes - sum(tensors.params)
        out.parts["parameters"] -= param_saving
        out.savings[f"{SWITCH.quantize}={method!r}"] = {"parameters": param_saving}
    out.parts["parameters"] += adapter_bytes
    after = tensors.trained
    before = [(row[1], row[2], row[4]) for row in structure["params"] if row[3]]
    bytes_before = sum(n * e for n, e, _ in before)
    bytes_after = sum(n * e for n, e, _ in after)
    out.host["trained"] = bytes_after
    grads = max(out.parts["gradients"] - bytes_before + bytes_after, 0)
    name = switches.optimizer
    if name is not None:
        state = _optimizer_state(name, after)
    elif bytes_before:  # the profiled optimizer: its measured state per trained byte
        state = round(memory["optimizer_state"] * bytes_after / bytes_before)
    else:
        state = 0
    what = f"{SWITCH.lora}(r={lora['r']})" if lora is not None else f"{SWITCH.quantize}={method!r}" if method else ""
    if what:
        saved = {"gradients": out.parts["gradients"] - grads}
        if lora is not None:
            saved["parameters"] = -sum(n * e for n, e, _ in adapters)  # adapters cost parameters
        if name is None:
            saved["optimizer_state"] = out.parts["optimizer_state"] - state
        out.savings.setdefault(what, {}).update(saved)
    if name is not None:
        same_set = _optimizer_state("adamw", after)
        out.savings[f"optimizer={name!r}"] = {"optimizer_state": same_set - state}
        if what:  # the frozen base's share of AdamW's state goes to quantize / lora
            out.savings[what]["optimizer_state"] = out.parts["optimizer_state"] - same_set
    out.parts["gradients"], out.parts["optimizer_state"] = grads, state
