"""What ``Trainer.predict`` returns: each batch's outputs trimmed, cast and moved off the device as it
comes, then concatenated (ragged dimensions padded) or returned per batch.

Per batch, in this order:

1. the outputs: ``predict_step=fn(model, batch)``, else an overridden ``Trainer.predict_step``, else the
   outputs of a customised ``compute_loss`` when it returns ``(loss, outputs, targets)``, else
   ``Trainer.predict_step``: the model called on the batch as the batch protocol says (``_batch``);
2. trimmed: of a mapping / dataclass output (Hugging Face ``ModelOutput``) the entries that grow with the
   data set and are rarely wanted are left out: ``loss`` (one per batch), ``hidden_states`` and
   ``attentions`` (with their ``encoder_`` / ``decoder_`` / ``cross_`` variants) and every cache,
   whatever its field is called: entries named ``past_key_values`` / ``cache`` / ``cache_params`` /
   ``mems``, the names in the model's ``config.keys_to_ignore_at_inference``, any transformers ``Cache``
   object (``DynamicCache``...; in a tuple output it becomes ``None``, so positions hold) and named
   entries holding per-layer key/value tuples ``((k, v), ...)`` of 4-d tensors. ``keep=`` opts back in.
   Caches are not even built where that can be said: Hugging Face models run with
   ``config.use_cache=False`` (:func:`no_cache`);
3. moved to the CPU (``to_cpu=True``) and cast: half-precision floats (autocast's bfloat16 / float16)
   become float32 unless ``keep_dtype=True``, so ``.numpy()`` works;
4. nothing else of the batch is kept: the device batch is dropped before the next one is fetched.

Concatenation keeps the structure (tuples, namedtuples, dicts, ``ModelOutput`` and other dataclasses)
and pads dimensions that vary from batch to batch (sequence length under dynamic padding) with
``pad_index`` (default -100, as Hugging Face's Trainer does). Only tensors whose first dimension is the
batch's size (the first dimension of the batch's first tensor) in every batch are concatenated: others,
such as an LSTM's ``(h, c)`` state of shape ``(layers, batch, hidden)``, come back as a list with one
entry per batch, as do non-tensor values; 0-d tensors (a per-batch value) are stacked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from nbtrainer._data._batch import (
    is_record,
    iter_tensors,
    move_to_device,
    rebuild_record,
    rebuild_sequence,
)

__all__ = [
    "DROPPED_BY_DEFAULT",
    "add_note",
    "collect",
    "concat_outputs",
    "dropped_names",
    "eval_mode",
    "ignored_at_inference",
    "is_cache",
    "module_mode",
    "no_cache",
    "prepare_outputs",
]

log = logging.getLogger(__name__)

# transformers 5 renamed GPT-2's (and others') `past_key_values` output field to `cache`; XLNet's is `mems`.
_CACHE_ENTRIES = ("past_key_values", "cache", "cache_params", "mems", "past_buckets_states")
# keep= name -> the output entries it brings back ("past_key_values" and "cache" name the same group)
DROPPED_BY_DEFAULT: dict[str, tuple[str, ...]] = {
    "loss": ("loss",),
    "past_key_values": _CACHE_ENTRIES,
    "cache": _CACHE_ENTRIES,
    "hidden_states": ("hidden_states", "encoder_hidden_states", "decoder_hidden_states"),
    "attentions": ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions"),
}
_HALF = (torch.float16, torch.bfloat16)


def dropped_names(keep: Iterable[str] | str) -> frozenset[str]:
    """The output entries left out when ``keep`` names what to keep (checked: a typo is an error).

    Caches are left out when ``"cache"`` is in the result (then also by value: :func:`is_cache`).
    """
    names = [keep] if isinstance(keep, str) else list(keep)
    unknown = [n for n in names if n not in DROPPED_BY_DEFAULT]
    if unknown:
        raise ValueError(
            f"keep= got {unknown}; it takes the names of the entries predict() leaves out by default: "
            f"{list(DROPPED_BY_DEFAULT)}. Every other output entry is always kept."
        )
    kept = {entry for name in names for entry in DROPPED_BY_DEFAULT[name]}
    return frozenset(entry for group in DROPPED_BY_DEFAULT.values() for entry in group if entry not in kept)


def is_cache(obj: Any) -> bool:
    """A transformers cache object (``Cache``, ``DynamicCache``, ``EncoderDecoderCache``, ``MambaCache``...),
    known by its class (transformers is never imported for it)."""
    return any(
        c.__name__.endswith("Cache") and (c.__module__ or "").startswith("transformers") for c in type(obj).__mro__
    )


def _is_kv_layers(obj: Any) -> bool:
    """Per-layer key/value tuples, the cache format before ``Cache`` objects: ``((k, v), ...)`` (or
    ``(k, v, cross_k, cross_v)`` per layer), every tensor 4-d ``(batch, heads, seq, head_dim)``."""
    if not isinstance(obj, (tuple, list)) or not obj or hasattr(obj, "_fields"):
        return False
    return all(
        isinstance(layer, (tuple, list))
        and len(layer) in (2, 4)
        and all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in layer)
        for layer in obj
    )


def _configs(model: torch.nn.Module) -> list[Any]:
    """The distinct ``config`` objects of ``model`` and its submodules (Hugging Face models, under a
    PEFT / DDP / user wrapper too)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and not isinstance(config, (dict, str)):
            found.setdefault(id(config), config)
    return list(found.values())


def ignored_at_inference(model: torch.nn.Module) -> frozenset[str]:
    """The output names the model's config says to ignore at inference (``keys_to_ignore_at_inference``)."""
    names: set[str] = set()
    for config in _configs(model):
        keys = getattr(config, "keys_to_ignore_at_inference", None)
        if isinstance(keys, (list, tuple)):
            names.update(k for k in keys if isinstance(k, str))
    return frozenset(names)


@contextlib.contextmanager
def module_mode(model: torch.nn.Module, training: bool) -> Iterator[None]:
    """``model.train(training)`` inside; on exit each module's own training flag as it was on entry. Not
    ``model.train(was_training)``: that sets every submodule to the top's flag, so a BatchNorm the user froze in
    eval mode would come back training and move its running statistics in the next fit."""
    flags = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for module, was in flags:
            module.training = was


def frozen_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers with running statistics (BatchNorm, InstanceNorm tracking them) in eval mode inside ``model`` in
    train mode: frozen by the user for fine-tuning, they train frozen (:func:`train_mode`), their statistics kept.

    Only those: other modules in eval mode (Dropout) change no state of the model, and a backbone built with
    ``from_pretrained`` inside a model of the user's own (or the PeftModel of ``lora=``) comes in eval mode, all
    of it, where training has always meant its Dropout on. None when ``model`` itself is in eval mode: inference
    leaves a whole model so, and training it then means training all of it."""
    if not model.training:
        return []
    frozen = [m for m in model.modules() if not m.training and getattr(m, "running_mean", None) is not None]
    if frozen and model not in _TOLD:
        # said once per model: a from_pretrained CNN inside a new model of the user's comes with its BatchNorms in
        # eval mode, and plain PyTorch's model.train() would have trained them: the choice is the user's to see
        _TOLD.add(model)
        names = [name for name, m in model.named_modules() if m in frozen]
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        warnings.warn(
            f"{len(frozen)} layer(s) with running statistics are in eval mode inside a model in train mode ({shown}): "
            "they train frozen, their running statistics kept. To train them as well, call model.train() before "
            "fit.",
            stacklevel=2,
        )
    return frozen


_TOLD: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def train_mode(model: torch.nn.Module, frozen: list[torch.nn.Module]) -> None:
    """``model.train()``, then each of ``frozen`` (:func:`frozen_modules`) back in eval mode: ``model.train()``
    alone would move a frozen BatchNorm's running statistics with every training batch."""
    model.train()
    for module in frozen:
        module.training = False


def eval_mode(model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
    """``model`` in eval mode inside, each module's own flag put back (:func:`module_mode`)."""
    return module_mode(model, False)


@contextlib.contextmanager
def no_cache(model: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Hugging Face models run with ``config.use_cache=False`` inside (put back after): their forward
    builds no cache, which ``evaluate`` / ``predict`` would only throw away. An explicit ``use_cache=True``
    argument still wins (caches made so are left out of predictions by value)."""
    changed = [c for c in _configs(model) if getattr(c, "use_cache", None) is True] if enabled else []
    for config in changed:
        config.use_cache = False
    try:
        yield
    finally:
        for config in changed:
            config.use_cache = True


def _tensor(t: torch.Tensor, keep_dtype: bool, device: torch.device | None) -> torch.Tensor:
    t = t.detach()
    if device is not None and t.device != device:
        t = t.to(device)  # before the cast: half the bytes cross the bus
    if not keep_dtype and t.dtype in _HALF:
        t = t.float()
    return t


def _rebuild_mapping(obj: Mapping[str, Any], items: dict[str, Any]) -> Any:
    if type(obj) is dict:
        return items
    cls: Any = type(obj)
    for build in (lambda: cls(**items), lambda: cls(items)):  # ModelOutput(**kw), Mapping(dict)
        try:
            return build()
        except Exception:
            log.debug("this output class cannot be rebuilt this way: the next way is tried", exc_info=True)
            continue
    return items


def prepare_outputs(
    outputs: Any, *, drop: frozenset[str] = frozenset(), keep_dtype: bool = False, device: torch.device | None = None
) -> Any:
    """One batch's outputs: top-level entries in ``drop`` left out, tensors detached, moved to ``device``
    (None: where they are) and half floats cast to float32 unless ``keep_dtype``. When ``"cache"`` is in
    ``drop``, caches are left out by value too: transformers ``Cache`` objects anywhere (``None`` in a
    sequence) and per-layer key/value tuples among the top-level named entries (of a mapping / dataclass)."""
    caches = "cache" in drop

    def gone(value: Any, top: bool) -> bool:
        return caches and (is_cache(value) or (top and _is_kv_layers(value)))

    def walk(obj: Any, top: bool) -> Any:
        if isinstance(obj, torch.Tensor):
            return _tensor(obj, keep_dtype, device)
        if isinstance(obj, (list, tuple)):
            # kv tuples are looked for in named entries only: a tuple output's (h, c) pairs of 4-d tensors
            # may be a ConvLSTM's state, not a cache
            return rebuild_sequence(obj, [None if gone(o, False) else walk(o, False) for o in obj])
        if isinstance(obj, Mapping):  # dicts and Hugging Face ModelOutputs (only their non-None entries)
            items = {k: walk(v, False) for k, v in obj.items() if not ((top and k in drop) or gone(v, top))}
            return _rebuild_mapping(obj, items)
        if is_record(obj):
            values = {}
            for f in dataclasses.fields(obj):
                value = getattr(obj, f.name)
                values[f.name] = None if (top and f.name in drop) or gone(value, top) else walk(value, False)
            return rebuild_record(obj, values)
        if gone(obj, False):
            return None
        return obj

    return walk(outputs, True)


def _pad_cat(tensors: list[torch.Tensor], pad_index: float) -> torch.Tensor:
    first = tensors[0]
    if first.ndim == 0:
        return torch.stack(tensors)
    if all(t.shape[1:] == first.shape[1:] for t in tensors):
        return torch.cat(tensors, dim=0)
    if any(t.ndim != first.ndim for t in tensors):
        shapes = sorted({tuple(t.shape) for t in tensors})[:4]
        raise ValueError(
            f"predict() cannot concatenate outputs with different numbers of dimensions across batches "
            f"(shapes {shapes}). Use predict(loader, per_batch=True) to get the outputs of each batch."
        )
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    shape = [sum(t.shape[0] for t in tensors)] + [max(t.shape[d] for t in tensors) for d in range(1, first.ndim)]
    try:
        fits = torch.full((), pad_index, dtype=dtype).item() == pad_index  # host-only probe, once per output
    except RuntimeError:  # e.g. an overflow
        fits = False
    if not fits:
        raise ValueError(
            f"pad_index={pad_index!r} cannot be stored in the {dtype} outputs whose shapes vary between batches. "
            "Pass a pad_index that fits, e.g. pad_index=0, or per_batch=True."
        )
    out = torch.full(shape, pad_index, dtype=dtype, device=first.device)
    row = 0
    for t in tensors:
        # the index is built apart: mypy reads `out[(a, *b)]` as 3.11's `out[a, *b]` (valid since 3.5 with parens)
        region = (slice(row, row + t.shape[0]), *(slice(0, s) for s in t.shape[1:]))
        out[region] = t
        row += t.shape[0]
    return out


def _rows(batch: Any) -> int | None:
    """The batch's size: the first dimension of its first tensor that has one (None: no such tensor)."""
    return next((int(t.shape[0]) for t in iter_tensors(batch) if t.ndim), None)


def concat_outputs(chunks: list[Any], pad_index: float = -100, sizes: list[int | None] | None = None) -> Any:
    """Concatenate per-batch outputs along dim 0 keeping their structure; ragged dims padded with ``pad_index``.

    With ``sizes`` (each batch's size), a tensor is concatenated only where its first dimension is the
    batch's size in every batch; otherwise (an RNN's ``(h, c)`` state...) the list of per-batch tensors
    is returned.

    Example:
        >>> import torch
        >>> out = concat_outputs([torch.zeros(2, 3), torch.ones(1, 5)])
        >>> tuple(out.shape), out[0, 4].item()
        ((3, 5), -100.0)
        >>> state = concat_outputs([torch.zeros(2, 4, 8), torch.zeros(2, 3, 8)], sizes=[4, 3])
        >>> type(state).__name__, len(state)
        ('list', 2)
    """
    if not chunks:
        return []
    first = chunks[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(c, torch.Tensor) for c in chunks):
            return chunks
        per_batch = first.ndim > 0 and sizes is not None and None not in sizes
        if per_batch and any(c.ndim == 0 or c.shape[0] != n for c, n in zip(chunks, sizes or (), strict=True)):
            return chunks
        return _pad_cat(chunks, pad_index)
    if isinstance(first, (list, tuple)):
        if _per_item_list(chunks, sizes):  # one plain value per item (names, strings): one list of them all
            return [v for c in chunks for v in c]
        if any(not isinstance(c, (list, tuple)) or len(c) != len(first) for c in chunks):
            return chunks  # a list per batch, as for tensors that are not batch-shaped
        return rebuild_sequence(
            first, [concat_outputs([c[i] for c in chunks], pad_index, sizes) for i in range(len(first))]
        )
    if isinstance(first, Mapping):
        missing = [k for c in chunks for k in first if k not in c]
        if missing:
            raise ValueError(
                f"predict() got outputs without {sorted(set(missing))} in some batches; use "
                "predict(loader, per_batch=True) to get the outputs of each batch."
            )
        return _rebuild_mapping(first, {k: concat_outputs([c[k] for c in chunks], pad_index, sizes) for k in first})
    if is_record(first):
        names = [f.name for f in dataclasses.fields(first)]
        return rebuild_record(
            first, {n: concat_outputs([getattr(c, n) for c in chunks], pad_index, sizes) for n in names}
        )
    if all(c is None for c in chunks):
        return None
    return chunks


def _per_item_list(chunks: list[Any], sizes: list[int | None] | None) -> bool:
    """Each batch's output is a list (not a tuple: a model's structured output) of plain values, one per item."""
    if sizes is None or None in sizes:
        return False
    return all(
        type(c) is list and len(c) == n and not any(isinstance(v, (torch.Tensor, list, tuple, Mapping)) for v in c)
        for c, n in zip(chunks, sizes, strict=True)
    )


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; Python 3.10 has no notes, so there the note ends the message instead."""
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{note}", *exc.args[1:])


def collect(
    loader: Iterable,
    *,
    model: torch.nn.Module,
    check_first: Callable[[Any], None],
    outputs_of: Callable[[Any], Any],
    device: torch.device,
    non_blocking: bool,
    autocast: contextlib.AbstractContextManager[Any],
    per_batch: bool,
    pad_index: float,
    keep_dtype: bool,
    keep: Iterable[str] | str,
    to_cpu: bool,
) -> Any:
    """``Trainer.predict`` (see its docstring): each batch of ``loader`` on ``device``, its outputs by ``outputs_of``
    (the Trainer's rule, ``BatchSteps.predict_outputs``) under ``no_grad`` and ``autocast``, collected; the first
    batch is handed to ``check_first`` before its outputs are made."""
    drop = dropped_names(keep)
    if isinstance(pad_index, bool) or not isinstance(pad_index, (int, float)):
        raise TypeError(f"pad_index must be a number (default -100), got {pad_index!r}.")
    caches = "cache" in drop
    if caches:
        drop |= ignored_at_inference(model)
    target = torch.device("cpu") if to_cpu else None
    chunks: list[Any] = []
    sizes: list[int | None] = []
    # no_grad, not inference_mode: the returned tensors stay usable in autograd and in-place ops.
    with eval_mode(model), torch.no_grad(), autocast, no_cache(model, caches):
        for batch in loader:
            batch = move_to_device(batch, device, non_blocking)
            if not sizes:
                check_first(batch)
            sizes.append(_rows(batch))
            outputs = outputs_of(batch)
            del batch  # the device batch goes before the next one arrives
            chunks.append(prepare_outputs(outputs, drop=drop, keep_dtype=keep_dtype, device=target))
            del outputs
    if not chunks:
        raise ValueError(
            "The predict() loader yielded no batches, so there is nothing to predict: pass at least one batch of "
            "inputs. An iterator or generator already consumed yields none, as does a DataLoader with drop_last=True "
            "over fewer samples than batch_size."
        )
    if per_batch:
        return chunks
    return concat_outputs(chunks, pad_index, sizes)
