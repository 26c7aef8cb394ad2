"""``Trainer(chunked_loss=True)``: a causal LM's loss without its full logits in memory.

A Hugging Face ``*ForCausalLM`` computes ``logits = lm_head(hidden)`` for every token (batch x sequence x vocab,
in fp32 for the loss), then the cross-entropy; backward adds the softmax's gradient and the logits' gradient,
each as large again. For a 128k-token vocabulary and 8k tokens a batch that is 4 GiB per copy, and after
activation checkpointing it is often the step's peak. Here the decoder runs as usual, and the head and the
cross-entropy run on ``chunk`` tokens at a time under activation checkpointing: a chunk's logits exist only while
its loss (or, in backward, its gradient) is computed. The loss is the model's own (``ForCausalLMLoss``: tokens
predict the next one, ``-100`` ignored, the mean over the counted tokens), up to the order of the float sums.

Training only: ``evaluate`` and ``predict`` call the model as usual (they need no backward, and predict wants the
logits). Refused up front, with the reason and the fix: a model that is not a Hugging Face causal LM with
``get_decoder()`` / ``get_output_embeddings()``, one whose logits are transformed after the head (Gemma 2's soft
capping, Cohere's ``logit_scale``, Granite's ``logits_scaling``), a ``criterion=`` or ``compute_loss=`` (they
take the logits), ``metrics=`` (no logits exist to measure), and DDP / FSDP (the decoder and the head are
called past the wrapper's forward).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["ChunkedCausalLMLoss", "check_chunked_loss"]

DEFAULT_CHUNK = 1024  # tokens: 1024 x a 128k vocabulary is 0.5 GiB of fp32 logits per chunk
# config attributes that change the logits after the head (ForCausalLM forward code applies them)
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def _causal_lm(model: nn.Module) -> Any:  # a transformers PreTrainedModel (untyped here)
    get_base = getattr(model, "get_base_model", None)  # a PEFT model: the causal LM it wraps
    return get_base() if callable(get_base) else model


def check_chunked_loss(
    value: Any, *, model: nn.Module, criterion: Any, compute_loss: Any, metrics: Any, distributed: bool
) -> ChunkedCausalLMLoss | None:
    """The loss function for ``chunked_loss=value`` (``True`` or tokens per chunk), or None when off; raises
    ``ValueError`` / ``TypeError`` with the reason and the fix where it cannot apply."""
    if value is False or value is None:
        return None
    if value is True:
        chunk = DEFAULT_CHUNK
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        chunk = value
    else:
        raise TypeError(f"chunked_loss= takes True, False or the tokens per chunk (an int >= 1), got {value!r}.")

    def refuse(problem: str, fix: str) -> None:
        raise ValueError(f"chunked_loss: {problem}. {fix}.")

    lm = _causal_lm(model)
    name = type(lm).__name__
    if not (
        name.endswith("ForCausalLM")
        and callable(getattr(lm, "get_decoder", None))
        and callable(getattr(lm, "get_output_embeddings", None))
    ):
        refuse(
            f"{name} is not a Hugging Face causal LM (a *ForCausalLM with get_decoder() and get_output_embeddings())",
            "Use it with such a model, or remove chunked_loss",
        )
    config = getattr(lm, "config", None)
    for attr in _LOGIT_TRANSFORMS:
        if getattr(config, attr, None) not in (None, 1, 1.0):
            refuse(
                f"{name} transforms its logits after the head ({attr}={getattr(config, attr)}), which the "
                "chunked loss does not reproduce",
                "Remove chunked_loss for this model",
            )
    if not isinstance(lm.get_output_embeddings(), nn.Module):
        refuse(f"{name} has no output head module", "Remove chunked_loss")
    if criterion is not None or compute_loss is not None:
        refuse(
            "it replaces the model's own causal-LM loss, and a criterion= or compute_loss= reads the full logits",
            "Use criterion=None (labels in the batch) or remove chunked_loss",
        )
    if metrics:
        refuse(
            "training metrics read the logits, which are never materialized whole",
            "Remove metrics= (the loss is logged; evaluate() computes metrics with full logits), or chunked_loss",
        )
    if distributed:
        refuse(
            "DDP and FSDP synchronize through the wrapped model's forward, and the decoder and the head are "
            "called past it",
            "Train on one process, or remove chunked_loss",
        )
    return ChunkedCausalLMLoss(chunk)


def _chunk_loss(head: nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # the model's loss upcasts too
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


class ChunkedCausalLMLoss:
    """``fn(model, batch) -> loss``: the causal-LM loss with the head and cross-entropy ``chunk`` tokens at a time.

    Example:
        >>> # Trainer(llama, None, "adamw", chunked_loss=True)  # or chunked_loss=2048 tokens per chunk
    """

    def __init__(self, chunk: int = DEFAULT_CHUNK) -> None:
        self.chunk = int(chunk)

    def __call__(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if not isinstance(batch, Mapping) or "labels" not in batch:
            raise ValueError(
                "chunked_loss needs dict batches with 'labels' (token ids, -100 where not counted), as a Hugging "
                f"Face causal LM takes them; got {type(batch).__name__}"
                + (f" with keys {sorted(batch)}" if isinstance(batch, Mapping) else "")
                + "."
            )
        lm = _causal_lm(model)
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        hidden = lm.get_decoder()(**inputs, use_cache=False).last_hidden_state
        # tokens < n predict n: the last position predicts nothing (ForCausalLMLoss pads labels with -100)
        h = hidden[:, :-1, :].reshape(-1, hidden.shape[-1])
        y = batch["labels"][:, 1:].reshape(-1).to(h.device)
        head = lm.get_output_embeddings()
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], self.chunk):
            part = h[start : start + self.chunk]
            # recomputed in backward: only this chunk's logits (and their gradient) ever exist
            total = total + checkpoint(_chunk_loss, head, part, y[start : start + self.chunk], use_reentrant=False)
        # the mean over counted tokens, as the model's loss; a device division, no host read
        return total / (y != -100).sum().clamp_min(1)
