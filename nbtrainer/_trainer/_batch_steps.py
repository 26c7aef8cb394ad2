"""How a Trainer turns a batch into a loss or outputs, and evaluates: :class:`BatchSteps`, the part of the Trainer
that owns the batch protocol's overrides and the validation metrics (``Trainer.batch_steps``).

The batch protocol itself (how a batch is split, the model called, the loss taken) is ``nbtrainer._data._loss``;
this part holds what a Trainer adds to it: the ``compute_loss=`` / ``predict_step=`` functions (a subclass may
override the methods of those names instead), the precision's autocast and the inference context, and the
validation metrics that :meth:`BatchSteps.evaluate` fills. ``fit`` computes its losses here (through the loop's
``LoopHost.compute``), ``evaluate`` and the validation inside ``fit`` run :meth:`BatchSteps.evaluate`, and
``predict`` takes its outputs by the rule of ``nbtrainer._data._predict_collect``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import batch_size_of, move_to_device, overridden
from nbtrainer._data._loss import batch_loss, plain_pairs
from nbtrainer._data._predict_collect import no_cache
from nbtrainer._setup._precision import autocast
from nbtrainer._trainer import _validate

if TYPE_CHECKING:
    from nbtrainer._loop._metrics import MetricSet
    from nbtrainer._options import BatchOptions
    from nbtrainer._trainer._trainer import Trainer

__all__ = ["BatchSteps"]


class BatchSteps:
    """A Trainer's batch steps (see the module docstring): owned by one :class:`~nbtrainer.Trainer`, which it reads
    for the model, criterion, batch spec, precision and placement at the moment of use.

    Attributes:
        compute_loss_fn: ``compute_loss=fn(model, batch)`` given to the Trainer, else None.
        predict_step_fn: ``predict_step=fn(model, batch)`` given to the Trainer, else None.
        chunked_loss: the training loss of ``chunked_loss=`` (``nbtrainer._setup._chunked_loss``), else None;
            evaluation calls the model as usual.
        val_metrics: the metrics :meth:`evaluate` fills (the training metrics' twin, with its own state).
        training_step_fn: ``training_step=fn(step, batch)`` (manual optimization, ``nbtrainer._loop._manual``).
        validation_step_fn: ``validation_step=fn(model, batch) -> {name: scalar}``, what :meth:`evaluate` logs then.
    """

    def __init__(
        self,
        trainer: Trainer,
        options: BatchOptions,
        *,
        val_metrics: MetricSet,
        chunked_loss: Callable[..., Any] | None = None,
    ) -> None:
        self._trainer = trainer
        self.training_step_fn = options.training_step
        self.validation_step_fn = options.validation_step
        self.chunked_loss = chunked_loss
        self.compute_loss_fn = options.compute_loss
        self.predict_step_fn = options.predict_step
        self.val_metrics = val_metrics

    # -- how a batch becomes a loss ------------------------------------------------------------------
    @property
    def custom_loss(self) -> bool:
        """A ``compute_loss=`` function or a subclass's ``compute_loss`` decides the loss (not the protocol)."""
        return self.compute_loss_fn is not None or overridden(self._trainer, "compute_loss")

    def _override(self) -> Any:
        trainer = self._trainer
        return trainer.compute_loss if overridden(trainer, "compute_loss") else None

    def default_compute(self) -> bool:
        """True when (x, y) batches can take the loop's inlined path (same semantics as :meth:`compute`)."""
        trainer = self._trainer
        return plain_pairs(
            spec=trainer.batch_spec, criterion=trainer.criterion, custom=self.compute_loss_fn, override=self._override()
        )

    def compute(self, batch: Any, training: bool = True) -> tuple[Any, Any, Any]:
        """The batch protocol's ``(loss, outputs, targets)`` (``nbtrainer._data._loss``)."""
        trainer = self._trainer
        chunked = self.chunked_loss if training else None
        return batch_loss(
            trainer.model,
            batch,
            spec=trainer.batch_spec,
            criterion=trainer.criterion,
            custom=chunked or self.compute_loss_fn,
            override=self._override(),
            training=training,
            need_outputs=bool(trainer.run_state.train_metrics),
        )

    def first_compute(self, batch: Any) -> tuple[Any, Any, Any]:
        """The first micro-batch of a fresh fit: computed in stages with clear errors, the training metrics tried."""
        trainer = self._trainer
        loss, outputs, targets = _validate.first_compute(trainer, batch)
        metrics = trainer.run_state.train_metrics
        if metrics:
            with torch.no_grad():
                _validate.dry_metrics(trainer, metrics, outputs, targets, "training")
        return loss, outputs, targets

    def check_first_loss(self, loss: Any, outputs: Any, targets: Any) -> None:
        """The first training loss: a scalar tensor that requires grad, else a clear error."""
        _validate.check_loss(self._trainer, loss, "training", needs_grad=True)

    # -- the contexts a forward runs in --------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision's autocast (none under FSDP, whose MixedPrecisionPolicy casts instead)."""
        trainer = self._trainer
        if trainer.strategy.casts_params:
            return contextlib.nullcontext()
        return autocast(trainer.precision, trainer.device)

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        """``inference_mode`` for evaluation; ``no_grad`` under FSDP, whose all-gathered parameters are
        tracked by version counters, which inference tensors do not have."""
        distributed = self._trainer.strategy.shards_parameters
        return torch.no_grad() if distributed else torch.inference_mode()

    # -- evaluation ----------------------------------------------------------------------------------
    def check_can_evaluate(self) -> None:
        """Refuse evaluation (``evaluate``, a fit's val_loader) that has nothing to compute a loss with."""
        if self.training_step_fn is not None and self.validation_step_fn is None:
            raise ValueError(
                "This trainer trains through training_step=, and evaluating needs validation_step=fn(model, batch) "
                "-> {'loss': ..., ...}: give it to the Trainer (its values are logged with the prefix val_)."
            )

    def evaluate(self, loader: Iterable, *, prefix: str) -> dict[str, float]:
        """Loss and metrics over ``loader``'s batches (sample-weighted, reduced across ranks), keys prefixed."""
        if self.validation_step_fn is not None:
            return self._evaluate_steps(loader, prefix=prefix)
        self.check_can_evaluate()
        trainer = self._trainer
        model, metrics, device = trainer.model, self.val_metrics, trainer.device
        was_training = model.training
        model.eval()
        metrics.reset()
        losses: list[torch.Tensor] = []
        sizes: list[int] = []
        try:
            with self.inference(), self.autocast(), no_cache(model):  # HF models build no cache
                for batch in loader:
                    batch = move_to_device(batch, device, trainer.non_blocking)
                    loss, outputs, targets = self.compute(batch, training=False)
                    if loss is not None:
                        losses.append(loss.detach().reshape(()).float())
                    sizes.append(batch_size_of(targets, batch))
                    if metrics:
                        metrics.update(outputs, targets)
            parts = ([torch.stack(losses)] if losses else []) + metrics.drain()
            host = torch.cat([p.reshape(-1).to(device) for p in parts]).tolist() if parts else []  # SYNC: once per eval
        finally:
            model.train(was_training)
        n = len(losses)
        values = {name: host[n + i * len(sizes) : n + (i + 1) * len(sizes)] for i, name in enumerate(metrics.pending)}
        metrics.absorb(values, sizes)
        reduced = trainer.strategy.reduce_sums(
            [float(sum(sizes)), math.fsum(v * b for v, b in zip(host[:n], sizes, strict=True))]
            + [metrics.sums[k] for k in metrics.sums]
        )
        count = reduced[0] or 1.0
        out: dict[str, float] = {}
        if n:
            out[f"{prefix}loss"] = reduced[1] / count
        for name, total in zip(metrics.sums, reduced[2:], strict=True):
            out[f"{prefix}{name}"] = total / count
        for k, v in metrics.compute(int(count)).items():
            if k not in metrics.sums:
                out[f"{prefix}{k}"] = v
        metrics.reset()
        return out

    def _evaluate_steps(self, loader: Iterable, *, prefix: str) -> dict[str, float]:
        """``validation_step``'s values over ``loader`` (sample-weighted means, one read, reduced across ranks)."""
        from nbtrainer._data._step_result import check_step_result

        trainer = self._trainer
        model, device, fn = trainer.model, trainer.device, self.validation_step_fn
        assert fn is not None
        was_training = model.training
        model.eval()
        keys: list[str] | None = None
        rows: list[torch.Tensor] = []
        sizes: list[int] = []
        try:
            with self.inference(), self.autocast(), no_cache(model):
                for batch in loader:
                    batch = move_to_device(batch, device, trainer.non_blocking)
                    values = check_step_result(fn(model, batch), keys, name="validation_step")
                    keys = list(values)
                    rows.append(torch.stack([v.detach().reshape(()).float() for v in values.values()]))
                    sizes.append(batch_size_of(None, batch))
            host = torch.stack(rows).tolist() if rows else []  # SYNC: once per evaluation
        finally:
            model.train(was_training)
        if keys is None:
            return {}
        totals = [math.fsum(row[i] * n for row, n in zip(host, sizes, strict=True)) for i in range(len(keys))]
        reduced = trainer.strategy.reduce_sums([float(sum(sizes)), *totals])
        count = reduced[0] or 1.0
        out = {f"{prefix}{k}": total / count for k, total in zip(keys, reduced[1:], strict=True)}
        if "loss" not in keys:  # as in training: the first value is also the loss, under its own name too
            out = {f"{prefix}loss": out[f"{prefix}{keys[0]}"], **out}
        return out
