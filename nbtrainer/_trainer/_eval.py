"""Evaluation and prediction, and the overridable steps that turn a batch into a loss or outputs (mixed into
:class:`~nbtrainer.Trainer`): ``evaluate``, ``predict``, ``compute_loss``, ``predict_step``.

The work is the Trainer's :class:`~nbtrainer._trainer._batch_steps.BatchSteps` (the overrides, the loss of a batch,
the evaluation loop and its metrics); these are the public verbs over it. How a batch is split is the batch
protocol (``nbtrainer._data._batch``); what ``predict`` keeps of the outputs is ``nbtrainer._data._predict_collect``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nbtrainer._data import _arrays
from nbtrainer._data._loss import batch_loss
from nbtrainer._loop import _oom
from nbtrainer._loop._fit_loop import _safe_len
from nbtrainer._trainer._base import TrainerBase

__all__ = ["TrainerEval"]


class TrainerEval(TrainerBase):
    """Mixin of :class:`~nbtrainer.Trainer` (its state is declared in :class:`TrainerBase`)."""

    @_oom.on_oom("evaluate")
    def evaluate(self, loader: Any, *, prefix: str = "val_", batch_size: int | None = None) -> dict[str, float]:
        """Loss and metrics over ``loader`` (sample-weighted), keys prefixed (``val_loss``, ``val_acc``).

        Runs in eval mode under ``torch.inference_mode`` and the trainer's precision; needs no optimizer.
        Fires ``on_validation_start`` / ``on_validation_end(logs)``, as the validation inside :meth:`fit` does.
        ``loader`` may be arrays as in :meth:`fit` (``batch_size`` default 256).

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> model = torch.nn.Linear(3, 2)
            >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), progress=False)  # evaluation only
            >>> sorted(trainer.evaluate([(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]))
            ['val_loss']
        """
        loader = _arrays.eval_loader(loader, batch_size, name="evaluate() loader")
        if _safe_len(loader) == 0:
            raise ValueError("The evaluation loader is empty (len 0).")
        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        # the same events as fit's validation: a stateful compute_loss resets its state on them
        self.callbacks.call("on_validation_start", trainer=self)
        batches = self._batches(self.strategy.prepare_loader(loader, train=False))
        logs = self._steps.evaluate(batches, prefix=prefix)
        self.callbacks.call("on_validation_end", trainer=self, logs=logs)
        return logs

    @_oom.on_oom("predict")
    def predict(
        self,
        loader: Any,
        *,
        batch_size: int | None = None,
        per_batch: bool = False,
        pad_index: float = -100,
        keep_dtype: bool = False,
        keep: Iterable[str] | str = (),
        to_cpu: bool = True,
    ) -> Any:
        """Model outputs for the whole loader, concatenated along the batch dimension, structure kept.

        Outputs come from ``predict_step=`` / :meth:`predict_step` (see the class docstring for the rule
        when only ``compute_loss`` is customised). Runs in eval mode under ``torch.no_grad`` and the
        trainer's precision.

        Args:
            loader: any iterable of batches (targets, if present, are not needed by the default step), or
                arrays as in :meth:`fit` (``predict(x)`` for inputs only; ``batch_size`` default 256).
            batch_size: the batch size when ``loader`` is arrays.
            per_batch: return a list with each batch's outputs instead of concatenating them.
            pad_index: fills the dimensions that vary between batches (sequence length under dynamic
                padding) when concatenating, like Hugging Face's Trainer (-100).
            keep_dtype: keep autocast's bfloat16 / float16 outputs; by default they come back as float32
                (so ``.numpy()`` works under ``precision="bf16-mixed"``).
            keep: entries of mapping / ``ModelOutput`` outputs to keep that are left out by default because
                they grow with the data set: ``"loss"`` (one per batch), ``"cache"`` (alias
                ``"past_key_values"``: every cache, whatever it is called, see ``nbtrainer._data._predict_collect``;
                Hugging Face models then also run with ``use_cache=False``), ``"hidden_states"``, ``"attentions"``
                (with their encoder/decoder/cross variants).
            to_cpu: move each batch's outputs to the CPU as they come (device memory stays bounded);
                ``False`` keeps them on the trainer's device.

        Returns:
            A tensor, or the model's structure (tuple, dict, ``ModelOutput``, dataclass) of concatenated
            tensors (only tensors whose first dimension is the batch's size; others, such as an LSTM's
            ``(h, c)``, as a list per batch); a list per batch with ``per_batch=True``.

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> trainer = Trainer(torch.nn.Linear(3, 2), None, progress=False)  # no optimizer: predict only
            >>> out = trainer.predict([torch.randn(4, 3), torch.randn(2, 3)])
            >>> tuple(out.shape), out.dtype
            ((6, 2), torch.float32)
        """
        from nbtrainer._data._predict_collect import run_predict

        loader = self._batches(_arrays.eval_loader(loader, batch_size, name="predict() loader"))
        self.model = self.strategy.setup_model(self.model) if not self._run.fitting else self.model
        return run_predict(
            self._whole,
            loader,
            per_batch=per_batch,
            pad_index=pad_index,
            keep_dtype=keep_dtype,
            keep=keep,
            to_cpu=to_cpu,
        )

    def _batches(self, loader: Any) -> Any:
        """``loader``'s batches by the fastest equivalent path (``_prefetch``); one pass of evaluate or
        predict does not copy the dataset to the device (``fraction=0``)."""
        from nbtrainer._data._prefetch import DataPath

        return DataPath(loader, device=self.device, enabled=self.fast_fetch, fraction=0.0)

    # -- how a batch becomes a loss / outputs ----------------------------------------------------
    def compute_loss(self, batch: Any) -> tuple[torch.Tensor | None, Any, Any]:
        """Override in a subclass to change how a batch becomes ``(loss, outputs, targets)``.

        The default splits the batch by the batch protocol (class docstring), calls the model and the
        criterion (or takes the model's ``.loss`` when ``criterion=None``).
        """
        return batch_loss(self.model, batch, spec=self.batch_spec, criterion=self.criterion)

    def predict_step(self, batch: Any) -> Any:
        """A batch's outputs for :meth:`predict`; override in a subclass (or pass ``predict_step=``).

        The default calls the model on the batch's inputs, split by the batch protocol.

        Example:
            >>> import torch
            >>> from nbtrainer import Trainer
            >>> class Probabilities(Trainer):
            ...     def predict_step(self, batch):
            ...         return self.model(batch[0]).softmax(-1)
            >>> trainer = Probabilities(torch.nn.Linear(3, 2), None, progress=False)
            >>> trainer.predict([(torch.randn(4, 3), torch.zeros(4))]).sum(1).allclose(torch.ones(4))
            True
        """
        args, kwargs, _ = self.batch_spec.split(batch)
        return self.model(*args, **kwargs)
