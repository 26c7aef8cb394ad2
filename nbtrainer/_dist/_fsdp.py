"""Fully sharded data parallel (FSDP2, ``torch.distributed.fsdp.fully_shard``): the same Trainer when the
model, its gradients and its optimizer state no longer fit on one device.

:class:`FSDP` is a :class:`~nbtrainer.DDP` (same process group, sampler, reductions, rank-0-only output);
what differs, and where:

* **sharding** (:meth:`FSDP.attach`, called once by the Trainer's constructor): rank 0's weights are
  broadcast (every rank starts from the same model, as under DDP), then ``fully_shard`` is applied to each
  unit (``wrap=`` types, else the repeated blocks of an ``nn.ModuleList`` / ``nn.Sequential``, else the
  children holding a large share of the parameters) and to the root last, over a 1-D device mesh. Each
  parameter becomes a ``DTensor`` ``Shard(0)``: a rank holds ``1/N`` of it, of its gradient and of its
  optimizer state. The optimizer the user built is rebound to the sharded parameters in place (same
  groups, same order), so ``trainer.optimizer`` and the user's reference stay one object.
* **precision**: ``bf16-mixed`` / ``fp16-mixed`` become a ``MixedPrecisionPolicy`` (parameters gathered
  and computed in the low dtype, gradients reduced in fp32, the root's outputs in fp32 for the loss);
  autocast is then off (``casts_params``): autocasting fp32 sharded parameters would all-gather them in
  fp32. The precision check of the Trainer still runs first.
* **accumulation** (:meth:`FSDP.no_sync`): ``set_requires_gradient_sync(False)`` on non-final micro-steps
  (gradients accumulate unsharded, no reduce-scatter), ``True`` on the step that closes the window.
* **evaluation data**: every forward is a collective (parameters are all-gathered), so every rank must
  run the same number of batches: a validation shard is cut into the same number of batches on every rank.
* **checkpoints**: ``nbtrainer._resume`` (``_full_state``: the full state gathered to rank 0 in the
  single-process format; ``_sharded``: a ``torch.distributed.checkpoint`` directory). It knows an FSDP
  placement by ``Strategy.shards_parameters``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from nbtrainer._atomic import CheckpointError
from nbtrainer._dist._ddp import _LOADER_ARGS, DDP, ShardSampler, resolve_strategy
from nbtrainer._dist._placement import SingleDevice, Strategy, unwrap_model

__all__ = ["FSDP", "optimizer_param_names", "optimizer_state_by_name", "shard_units"]

_NULL = contextlib.nullcontext()
_LARGE_SHARE = 0.1  # a child holding at least this share of the parameters is a sharding unit of its own
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential)  # where repeated blocks live
_PACKED = ("Params4bit", "Int8Params")  # bitsandbytes' quantized parameter classes


def _numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _blocks(root: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of the largest ModuleList / Sequential of >= 2 children of one type (a transformer's
    layers), if they hold at least half of the parameters."""
    best: list[torch.nn.Module] = []
    best_size = 0
    for module in root.modules():
        if not isinstance(module, _CONTAINERS) or len(module) < 2:
            continue
        children = list(module.children())
        if len({type(c) for c in children}) != 1 or not any(True for _ in children[0].parameters()):
            continue
        size = sum(_numel(c) for c in children)
        if size > best_size:
            best, best_size = children, size
    return best if best_size * 2 >= _numel(root) else []


def _tied_elsewhere(root: torch.nn.Module, module: torch.nn.Module) -> bool:
    """Whether a parameter of ``module`` is also held by a module outside it (tied embeddings): such a
    module cannot be a unit of its own (a parameter is sharded once), it stays with the root."""
    own = {id(p) for p in module.parameters()}
    inside = {id(m) for m in module.modules()}
    outside = (m for m in root.modules() if id(m) not in inside)
    return any(id(p) in own for m in outside for p in m.parameters(recurse=False))


def shard_units(root: torch.nn.Module, wrap: Sequence[type] | None) -> list[torch.nn.Module]:
    """The modules ``fully_shard`` is applied to before the root (in post-order: inner units first).

    ``wrap``: every module of these types. ``None``: the repeated blocks (:func:`_blocks`) plus, outside
    them, any module holding at least 10% of the parameters (embeddings, a large head); without repeated
    blocks, the direct children of that size. Modules with parameters tied to others stay with the root,
    and so do ``ModuleList`` / ``ModuleDict`` (they have no forward to gather around). An empty list
    means the root alone.
    """
    if wrap is not None:
        types = tuple(wrap)
        return [m for m in root.modules() if isinstance(m, types) and m is not root]
    total = _numel(root) or 1
    blocks = _blocks(root)
    units = list(blocks)
    inside = {id(m) for b in blocks for m in b.modules()}
    scope = root.modules() if blocks else root.children()
    for module in scope:
        if module is root or id(module) in inside or isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            continue
        below = {id(m) for m in module.modules()}
        if any(id(b) in below for b in blocks) or _numel(module) < _LARGE_SHARE * total:
            continue
        if not _tied_elsewhere(root, module):
            units.append(module)
            inside |= below
    order = {id(m): i for i, m in enumerate(root.modules())}
    return sorted(units, key=lambda m: -order[id(m)])  # innermost / last first: a parent after its children


class _EvenBatches(Sampler[list[int]]):
    """``indices`` cut into exactly ``count`` non-empty batches (sizes differ by at most one)."""

    def __init__(self, indices: list[int], count: int) -> None:
        self.indices, self.count = indices, count

    def __iter__(self) -> Iterator[list[int]]:
        n, k = len(self.indices), self.count
        start = 0
        for i in range(k):
            size = n // k + (1 if i < n % k else 0)
            yield self.indices[start : start + size]
            start += size

    def __len__(self) -> int:
        return self.count


class FSDP(DDP):
    """Fully sharded data parallel (FSDP2): parameters, gradients and optimizer state split across ranks.

    ``Trainer(..., strategy="fsdp")`` or an instance for options; launch as for DDP (``torchrun``,
    :func:`nbtrainer.launch`; outside a launcher a world of one). The same script runs with
    ``strategy="ddp"``; see ``docs/distributed.md`` for the memory per rank of each choice.

    Args:
        reshard_after_forward: free the gathered parameters of each unit after its forward (and gather
            them again in backward): less memory, one more all-gather per unit and step.
        offload: keep the sharded parameters, gradients and optimizer state in CPU memory
            (``CPUOffloadPolicy``; the optimizer steps on the CPU). ``True`` pins memory where CUDA is
            available; a ``torch.distributed.fsdp.CPUOffloadPolicy`` of your own is used as given.
        mixed_precision: a ``torch.distributed.fsdp.MixedPrecisionPolicy``; ``None`` (default) derives it
            from the Trainer's ``precision`` (``bf16-mixed``: bf16 parameters in compute, fp32 gradient
            reduction). Give one or the other, not both.
        wrap: module types sharded as units (e.g. ``[GPT2Block]``); default: the repeated blocks, and
            children holding a large share of the parameters. The root is always sharded last.
        backend, timeout, shard_data: as for :class:`~nbtrainer.DDP`.

    Example:
        >>> # torchrun --nproc_per_node=2 train.py, where train.py builds
        >>> # Trainer(model, criterion, optimizer, strategy=FSDP(wrap=[Block]), precision="bf16-mixed")
        >>> strategy = FSDP(reshard_after_forward=True)
    """

    # DTensor parameters: evaluation under no_grad (not inference_mode); gathering the full state is a collective
    # every rank joins; checkpoints may be each rank's shards (nbtrainer._resume._sharded)
    shards_parameters = True

    def __init__(
        self,
        *,
        reshard_after_forward: bool = True,
        offload: bool | Any = False,
        mixed_precision: Any = None,
        wrap: Sequence[type] | None = None,
        backend: str | None = None,
        timeout: float | None = None,
        shard_data: bool = True,
    ) -> None:
        super().__init__(backend=backend, timeout=timeout, shard_data=shard_data)
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        if wrap is not None and (
            isinstance(wrap, (str, type))
            or not all(isinstance(t, type) and issubclass(t, torch.nn.Module) for t in wrap)
        ):
            raise TypeError(f"FSDP(wrap=...) takes a list of nn.Module types (e.g. [MyBlock]), got {wrap!r}.")
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecisionPolicy):
            raise TypeError(
                "FSDP(mixed_precision=...) takes a torch.distributed.fsdp.MixedPrecisionPolicy, got "
                f"{mixed_precision!r}; or leave it None and set Trainer(precision='bf16-mixed')."
            )
        if not isinstance(offload, (bool, CPUOffloadPolicy)):
            raise TypeError(f"FSDP(offload=...) takes True/False or a CPUOffloadPolicy, got {offload!r}.")
        if isinstance(offload, CPUOffloadPolicy) and offload.pin_memory and not torch.cuda.is_available():
            raise ValueError(
                "FSDP(offload=CPUOffloadPolicy(pin_memory=True)) needs CUDA to pin memory, and this torch build "
                "or machine has none ('Cannot access accelerator device'). Use offload=True (pins only where CUDA "
                "is available) or CPUOffloadPolicy(pin_memory=False)."
            )
        self.reshard_after_forward = bool(reshard_after_forward)
        self.offload = offload
        self.mixed_precision = mixed_precision
        self.wrap = list(wrap) if wrap is not None else None
        self.casts_params = False  # a MixedPrecisionPolicy casts: the Trainer's autocast stays off
        self.units: list[str] = []  # names of the sharded units (the root is "")
        self.mesh: Any = None
        self._attached = False

    def __repr__(self) -> str:
        return f"FSDP(rank={self.rank}, world_size={self.world_size}, device={self.device}, units={len(self.units)})"

    # -- sharding ----------------------------------------------------------------------------------
    def _policies(self, precision: str) -> tuple[Any, Any, Any]:
        """(units' MixedPrecisionPolicy, the root's, offload policy)."""
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

        from nbtrainer._setup._precision import autocast_dtype

        dtype = autocast_dtype(precision)
        if self.mixed_precision is not None and dtype is not None:
            raise ValueError(
                f"FSDP(mixed_precision=...) and Trainer(precision={precision!r}) both set the precision: keep one "
                "(the policy with precision='fp32', or precision= alone, which FSDP turns into a policy)."
            )
        unit = self.mixed_precision or MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        if unit.param_dtype is None:
            unit = MixedPrecisionPolicy()
        self.casts_params = unit.param_dtype is not None
        # The root hands its outputs to the loss: fp32 there, as autocast would give the loss.
        root = MixedPrecisionPolicy(
            param_dtype=unit.param_dtype,
            reduce_dtype=unit.reduce_dtype,
            output_dtype=unit.output_dtype or (torch.float32 if unit.param_dtype is not None else None),
            cast_forward_inputs=unit.cast_forward_inputs,
        )
        if self.offload is True:
            offload: Any = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        else:
            offload = self.offload or OffloadPolicy()
        return unit, root, offload

    def attach(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, precision: str, *, by_name: bool = False
    ) -> None:
        """Shard ``model`` (the Trainer's, set up) and rebind ``optimizer`` to the sharded parameters (once).
        ``by_name``: the optimizer was built from its name (``build_optimizer`` chose its implementation)."""
        if self._attached:
            raise RuntimeError(
                "This FSDP strategy object already shards another Trainer's model; create one FSDP(...) per Trainer."
            )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        root = unwrap_model(model)
        _refuse_wrapped(model, root)
        if not any(True for _ in root.parameters()):
            raise ValueError(
                f"strategy='fsdp': {type(root).__name__} has no parameters, so there is nothing to shard. "
                "Use strategy='single' (or 'ddp') for it."
            )
        quantized = sorted({type(p).__name__ for p in root.parameters() if _packed(p)})
        if quantized:
            raise ValueError(
                f"strategy='fsdp' cannot shard bitsandbytes' quantized weights ({', '.join(quantized)}: packed "
                "bytes with a separate quantization state, not DTensor-shardable here). For QLoRA use "
                "strategy='ddp' (each rank holds the small quantized base), or LoRA on an unquantized base "
                "with strategy='fsdp' (lora= without quantize=)."
            )
        if optimizer is not None and not any(p.requires_grad for p in root.parameters()):
            raise RuntimeError(
                "FSDP needs at least one trainable parameter; every parameter has requires_grad=False (unfreeze some)."
            )
        if isinstance(root, FSDPModule) and precision != "fp32":
            raise ValueError(
                f"The model is already sharded with fully_shard, so Trainer(precision={precision!r}) cannot "
                "become its MixedPrecisionPolicy. Pass the plain model (the trainer shards it with the policy), or "
                "give fully_shard your own mp_policy and use precision='fp32'."
            )
        if optimizer is not None:
            _unfuse_for_shards(optimizer, by_name)
        unit_policy, root_policy, offload = self._policies(precision)
        names = {id(p): n for n, p in root.named_parameters()}
        saved_optim = optimizer.state_dict() if optimizer is not None and optimizer.state else None
        if not isinstance(root, FSDPModule):
            units = shard_units(root, self.wrap)
            if self.wrap is not None and not units:
                present = sorted({type(m).__name__ for m in root.modules()})
                raise ValueError(
                    f"FSDP(wrap={[t.__name__ for t in self.wrap]}) matches no module of {type(root).__name__} "
                    f"(its module types: {present}). Pass types that occur in the model, or leave wrap=None."
                )
            self._broadcast_from_rank0(root)
            self.mesh = init_device_mesh(self.device.type, (self.world_size,))
            module_names = {id(m): n for n, m in root.named_modules()}
            common = {"mesh": self.mesh, "reshard_after_forward": self.reshard_after_forward, "offload_policy": offload}
            for unit in units:
                fully_shard(unit, mp_policy=unit_policy, **common)
            fully_shard(root, mp_policy=root_policy, **common)
            self.units = [module_names[id(u)] for u in units] + [""]
        if optimizer is not None:
            sharded = dict(root.named_parameters())
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[id(p)]] if id(p) in names else p for p in group["params"]]
            optimizer.state.clear()
            if saved_optim is not None:  # state built before sharding (e.g. a previous fit): now sharded too
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

                named = optimizer_state_by_name(saved_optim, optimizer_param_names(root, optimizer))
                set_optimizer_state_dict(root, optimizer, named, options=StateDictOptions(full_state_dict=True))
        self._attached = True

    def _broadcast_from_rank0(self, root: torch.nn.Module) -> None:
        """Every rank starts from rank 0's parameters and buffers (DDP's constructor does the same)."""
        if self.world_size == 1:
            return
        with torch.no_grad():
            for tensor in [*root.parameters(), *root.buffers()]:
                buf = tensor.detach().to(self._comm_device)
                dist.broadcast(buf, src=0)
                if buf is not tensor:
                    tensor.copy_(buf)

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model  # sharded by attach() when the Trainer was built

    def no_sync(self, model: torch.nn.Module, skip_sync: bool) -> contextlib.AbstractContextManager:
        # Set before this micro-step's backward; the closing micro-step turns the reduce-scatter back on.
        unwrap_model(model).set_requires_gradient_sync(not skip_sync)  # type: ignore[operator]
        return _NULL

    # -- data ------------------------------------------------------------------------------------
    def prepare_loader(self, loader: Any, *, train: bool) -> Any:
        if (
            not train
            and self.shard_data
            and self.world_size > 1
            and isinstance(loader, Sequence)
            and not isinstance(loader, (str, bytes))
            and len(loader) % self.world_size
        ):
            raise ValueError(
                f"FSDP: a list of {len(loader)} evaluation batches cannot be split evenly across {self.world_size} "
                "ranks, and every forward is a collective (a rank with one batch less would leave the others "
                "waiting). Pass a DataLoader (split exactly by the trainer), or a list whose length is a multiple "
                f"of {self.world_size}."
            )
        return super().prepare_loader(loader, train=train)

    def _prepare_dataloader(self, loader: DataLoader, train: bool) -> DataLoader:
        prepared = super()._prepare_dataloader(loader, train)
        sampler = prepared.sampler
        if train or prepared is loader or not isinstance(sampler, ShardSampler):
            return prepared
        size = prepared.batch_size or 1
        count = math.ceil(math.ceil(sampler.n / self.world_size) / size)  # the largest shard's batches
        # decided on the smallest shard, which every rank computes alike: a rank refusing on its own shard alone
        # would leave the others waiting in the first collective forward
        smallest = sampler.n // self.world_size
        if smallest < count:
            largest = math.ceil(sampler.n / self.world_size)
            fix = f"pass batch_size >= {largest} for it (one batch per rank), or" if smallest else "use"
            raise ValueError(
                f"FSDP: the evaluation set ({sampler.n} samples) is too small to give each of {self.world_size} "
                f"ranks {count} batch(es) of batch_size={size} (the smallest share has {smallest} sample(s)); "
                f"{fix} fewer ranks."
            )
        indices = list(sampler)
        if math.ceil(len(indices) / size) == count:
            return prepared
        kwargs = {k: getattr(prepared, k) for k in _LOADER_ARGS if hasattr(prepared, k)}
        for key in ("batch_size", "drop_last", "generator"):
            kwargs.pop(key, None)
        return DataLoader(prepared.dataset, batch_sampler=_EvenBatches(indices, count), **kwargs)


def _packed(p: torch.Tensor) -> bool:
    """A bitsandbytes quantized weight (told without importing bitsandbytes)."""
    cls = type(p)
    return cls.__module__.startswith("bitsandbytes") and cls.__name__ in _PACKED


def optimizer_param_names(root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of each optimizer parameter, in the optimizer's (index) order: torch's distributed
    state dicts key the optimizer's state by name, its own ``state_dict()`` by that index."""
    names = {id(p): n for n, p in root.named_parameters()}
    order = [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
    if None in order:
        raise CheckpointError(
            "The optimizer holds parameters that are not in the model; under FSDP its state is saved by parameter "
            "name. Build the optimizer from the model's parameters only."
        )
    return [str(n) for n in order]


def optimizer_state_by_name(indexed: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """An optimizer ``state_dict()`` (keyed by index) keyed by parameter ``names`` instead."""
    state = {names[int(i)]: s for i, s in indexed.get("state", {}).items()}
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in indexed["param_groups"]]
    return {"state": state, "param_groups": groups}


def _unfuse_for_shards(optimizer: torch.optim.Optimizer, by_name: bool) -> None:
    """A fused step that DTensor has no rule for would stop at the first step: one nbtrainer chose (an optimizer by
    name) steps unfused instead; one the user asked for is refused now, with the fix."""
    from nbtrainer._setup._model_setup import FUSED_ON_SHARDS
    from nbtrainer._setup._optimizers import Optimizers

    parts = list(optimizer.optimizers.values()) if isinstance(optimizer, Optimizers) else [optimizer]
    for part in parts:
        cls = type(part).__name__
        if cls in FUSED_ON_SHARDS or not any(g.get("fused") for g in part.param_groups):
            continue
        if not by_name:
            raise ValueError(
                f"strategy='fsdp' cannot run {cls}(fused=True): torch has no fused {cls} kernel for sharded "
                f"(DTensor) parameters, so the first optimizer step would fail. Build it without fused=True "
                f"(e.g. torch.optim.{cls}(model.parameters(), lr=..., fused=False)), or use "
                f"{' / '.join(sorted(FUSED_ON_SHARDS))}, whose fused kernels run on shards."
            )
        for group in part.param_groups:
            group["fused"] = False
        part.defaults["fused"] = False


def _refuse_wrapped(model: torch.nn.Module, root: torch.nn.Module) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    for m in (model, root):
        if isinstance(m, FullyShardedDataParallel) or any(isinstance(c, FullyShardedDataParallel) for c in m.modules()):
            raise TypeError(
                "The model is wrapped in FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel), which "
                "strategy='fsdp' cannot combine with FSDP2. Pass the plain model: the trainer applies fully_shard "
                "itself (FSDP(wrap=[BlockType]) picks the units)."
            )
        if isinstance(m, DistributedDataParallel):
            raise TypeError(
                "The model is wrapped in DistributedDataParallel; strategy='fsdp' shards the plain model. Pass "
                "model.module (or use strategy='ddp')."
            )


def make_strategy(strategy: Any, device: Any, seed: int | None) -> Strategy:
    """The placement for ``Trainer(strategy=...)``: one device, DDP under torchrun, FSDP2 (see ``_dist``)."""
    if isinstance(strategy, str) and strategy == "single":
        from nbtrainer._setup._precision import resolve_device

        return SingleDevice(resolve_device(device))
    if isinstance(strategy, str) and strategy == "fsdp":
        strategy = FSDP()
    return resolve_strategy(strategy, device, seed=seed)
