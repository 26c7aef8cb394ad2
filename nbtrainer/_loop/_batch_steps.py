"""How a Trainer turns a batch into a loss or outputs, and evaluates and predicts: :class:`BatchSteps`, the part of
the Trainer that owns the batch protocol's overrides and the validation metrics (``Trainer.batch_steps``).

The batch protocol itself (how a batch is split, the model called, the loss taken) is ``nbtrainer._data._loss``;
this part holds what a Trainer adds to it: the ``compute_loss=`` / ``predict_step=`` functions (a subclass may
override the methods of those names instead), the precision's autocast and the inference context, the first batch's
staged checks (``nbtrainer._data._validate_batch``), the validation metrics that :meth:`BatchSteps.evaluate` fills,
and :meth:`BatchSteps.predict`, whose outputs are collected by ``nbtrainer._data._predict_collect``. ``fit`` computes
its losses here, ``evaluate`` and the validation inside ``fit`` run :meth:`BatchSteps.evaluate`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data import _validate_batch as _first
from nbtrainer._data._batch import batch_size_of, move_to_device, overridden
from nbtrainer._data._batch_norm import batch_norm_inputs, check_last_batch
from nbtrainer._data._loss import batch_loss, plain_pairs
from nbtrainer._data._predict_collect import add_note, collect, eval_mode, no_cache
from nbtrainer._data._prefetch import DataPath
from nbtrainer._data._step_result import check_step_result
from nbtrainer._setup._precision import autocast
from nbtrainer._setup._seed import capture_rng, restore_rng

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView
    from nbtrainer._loop._metrics import MetricSet
    from nbtrainer._loop._run_state import RunState
    from nbtrainer._options import BatchOptions

__all__ = ["BatchSteps"]


class BatchSteps:
    """A Trainer's batch steps (see the module docstring): owned by one :class:`~nbtrainer.Trainer` (``owner``), which
    it reads for the model, criterion, batch spec, precision and placement at the moment of use.

    Attributes:
        options: the Trainer's :class:`~nbtrainer._options.BatchOptions` (``compute_loss=``, ``predict_step=``,
            ``training_step=``, ``validation_step=``; the ``*_fn`` attributes read them).
        chunked_loss: the training loss of ``chunked_loss=`` (``nbtrainer._setup._chunked_loss``), else None;
            evaluation calls the model as usual.
        val_metrics: the metrics :meth:`evaluate` fills (the training metrics' twin, with its own state).
    """

    def __init__(
        self,
        owner: TrainerView,
        run: RunState,
        options: BatchOptions,
        *,
        val_metrics: MetricSet,
        chunked_loss: Callable[..., Any] | None = None,
    ) -> None:
        self._owner = owner
        self._run = run
        self.options = options
        self.chunked_loss = chunked_loss
        self.val_metrics = val_metrics

    @property
    def compute_loss_fn(self) -> Callable[..., Any] | None:
        return self.options.compute_loss

    @property
    def predict_step_fn(self) -> Callable[..., Any] | None:
        return self.options.predict_step

    @property
    def training_step_fn(self) -> Callable[..., Any] | None:
        """``training_step=fn(step, batch)`` (manual optimization, ``nbtrainer._loop._manual``), else None."""
        return self.options.training_step

    @property
    def validation_step_fn(self) -> Callable[..., Any] | None:
        """``validation_step=fn(model, batch) -> {name: scalar}``, what :meth:`evaluate` logs then, else None."""
        return self.options.validation_step

    # -- how a batch becomes a loss ------------------------------------------------------------------
    @property
    def custom_loss(self) -> bool:
        """A ``compute_loss=`` function or a subclass's ``compute_loss`` decides the loss (not the protocol)."""
        return self.compute_loss_fn is not None or overridden(self._owner, "compute_loss")

    def _override(self) -> Any:
        owner = self._owner
        return owner.compute_loss if overridden(owner, "compute_loss") else None

    def default_compute(self) -> bool:
        """True when (x, y) batches can take the loop's inlined path (same semantics as :meth:`compute`)."""
        owner = self._owner
        return plain_pairs(
            spec=owner.batch_spec, criterion=owner.criterion, custom=self.compute_loss_fn, override=self._override()
        )

    def compute(self, batch: Any, training: bool = True) -> tuple[Any, Any, Any]:
        """The batch protocol's ``(loss, outputs, targets)`` (``nbtrainer._data._loss``)."""
        owner = self._owner
        chunked = self.chunked_loss if training else None
        return batch_loss(
            owner.model,
            batch,
            spec=owner.batch_spec,
            criterion=owner.criterion,
            custom=chunked or self.compute_loss_fn,
            override=self._override(),
            training=training,
            need_outputs=bool(self._run.train_metrics),
        )

    def _staged(self, batch: Any, training: bool, where: str | None = None) -> tuple[Any, Any, Any]:
        owner = self._owner
        custom = self.custom_loss or (training and self.chunked_loss is not None)
        return _first.first_compute(
            batch,
            model=owner.model,
            criterion=owner.criterion,
            spec=owner.batch_spec,
            device=owner.device,
            compute=lambda b: self.compute(b, training=training),
            custom=custom,
            training=training,
            where=where,
        )

    def first_compute(self, batch: Any) -> tuple[Any, Any, Any]:
        """The first micro-batch of a fresh fit: computed in stages with clear errors, the training metrics tried, a
        BatchNorm that the epoch's last batch would break refused (``nbtrainer._data._batch_norm``)."""
        owner, state = self._owner, self._run.loop_state
        with batch_norm_inputs(owner.model) as norms:
            loss, outputs, targets = self._staged(batch, training=True)
        accum = owner.options.step.grad_accum_steps
        check_last_batch(norms, state.loader_size, max_steps=state.fit_max_steps, accum=accum, model=owner.model)
        metrics = self._run.train_metrics
        if metrics:
            with torch.no_grad():
                _first.dry_metrics(metrics, outputs, targets, "training")
        return loss, outputs, targets

    def _first_evaluation(self, batch: Any, stage: str, where: str) -> tuple[Any, Any, Any]:
        """The first batch of an evaluation: computed in stages with clear errors, its loss checked and the
        validation metrics tried on copies (``stage``: "validation" or "evaluation"; ``where``: the loader named)."""
        loss, outputs, targets = self._staged(batch, training=False, where=where)
        _first.check_loss(loss, stage, model=self._owner.model)
        _first.dry_metrics(self.val_metrics, outputs, targets, stage)
        return loss, outputs, targets

    def check_first_loss(self, loss: Any, outputs: Any, targets: Any) -> None:
        """The first training loss: a scalar tensor that requires grad, else a clear error."""
        _first.check_loss(loss, "training", model=self._owner.model, needs_grad=True)

    def check_val_loader(self, val_loader: Any) -> None:
        """Run the first validation batch (eval mode, inference_mode) and put every RNG back."""
        if val_loader is None or _first.one_shot(val_loader):
            return
        gens: list[tuple[torch.Generator, torch.Tensor]] = []
        for holder in (getattr(val_loader, "sampler", None), val_loader):
            gen = getattr(holder, "generator", None)
            if isinstance(gen, torch.Generator) and all(gen is not g for g, _ in gens):
                gens.append((gen, gen.get_state()))
        rng = capture_rng()
        model = self._owner.model
        try:
            with eval_mode(model):
                it = iter(val_loader)
                try:
                    batch = next(it)
                except StopIteration:
                    if self._owner.strategy.distributed:  # this rank's share of a set smaller than the world:
                        return  # the set was checked non-empty before sharding, and no rank may refuse alone
                    raise ValueError(
                        "val_loader yielded no batches: pass None to skip validation or fix the dataset."
                    ) from None
                finally:
                    del it
                batch = move_to_device(batch, self._owner.device)
                fn = self.validation_step_fn
                if fn is not None:  # manual optimization: validation_step's values, checked
                    with self.inference(), self.autocast(), _first.manual_step_errors("validation_step"):
                        check_step_result(fn(model, batch), None, name="validation_step")
                    return
                with self.inference(), self.autocast():
                    self._first_evaluation(batch, "validation", "val_loader")
        finally:
            restore_rng(rng)
            for gen, state in gens:
                gen.set_state(state)

    # -- the contexts a forward runs in --------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision's autocast (none under FSDP, whose MixedPrecisionPolicy casts instead)."""
        owner = self._owner
        if owner.strategy.casts_params:
            return contextlib.nullcontext()
        return autocast(owner.precision, owner.device)

    def inference(self) -> contextlib.AbstractContextManager[Any]:
        """``inference_mode`` for evaluation; ``no_grad`` under FSDP, whose all-gathered parameters are
        tracked by version counters, which inference tensors do not have."""
        distributed = self._owner.strategy.shards_parameters
        return torch.no_grad() if distributed else torch.inference_mode()

    def batches(self, loader: Any) -> Any:
        """``loader``'s batches by the fastest equivalent path (``nbtrainer._data._prefetch``); one pass of evaluate or
        predict does not copy the dataset to the device (``fraction=0``)."""
        owner = self._owner
        return DataPath(loader, device=owner.device, enabled=owner.options.data.fast_fetch, fraction=0.0)

    # -- evaluation ----------------------------------------------------------------------------------
    def evaluate_loader(self, loader: Any, *, prefix: str) -> dict[str, float]:
        """``Trainer.evaluate``'s pass, with the events of a fit's validation (a stateful ``compute_loss`` resets its
        state on them)."""
        callbacks = self._owner.callbacks
        callbacks.call("on_validation_start", trainer=self._owner)
        logs = self.evaluate(self.batches(loader), prefix=prefix, standalone=True)
        callbacks.call("on_validation_end", trainer=self._owner, logs=logs)
        return logs

    def check_can_evaluate(self) -> None:
        """Refuse evaluation (``evaluate``, a fit's val_loader) that has nothing to compute a loss with."""
        if self.training_step_fn is not None and self.validation_step_fn is None:
            raise ValueError(
                "This trainer trains through training_step=, and evaluating needs validation_step=fn(model, batch) "
                "-> {'loss': ..., ...}: give it to the Trainer (its values are logged with the prefix val_)."
            )

    def evaluate(self, loader: Iterable, *, prefix: str, standalone: bool = False) -> dict[str, float]:
        """Loss and metrics over ``loader``'s batches (sample-weighted, reduced across ranks), keys prefixed.
        ``standalone``: ``Trainer.evaluate``'s pass, whose first batch is computed through the staged checks that a
        fit runs on its val_loader before training (a fit's validation passes were checked so, and skip them)."""
        if self.validation_step_fn is not None:
            return self._evaluate_steps(loader, prefix=prefix, standalone=standalone)
        self.check_can_evaluate()
        owner = self._owner
        model, metrics, device = owner.model, self.val_metrics, owner.device
        metrics.reset()
        losses: list[torch.Tensor] = []
        sizes: list[int] = []
        with eval_mode(model), self.inference(), self.autocast(), no_cache(model):  # HF models build no cache
            check = standalone
            for batch in loader:
                batch = move_to_device(batch, device, owner.options.data.non_blocking)
                if check:  # the checked computation is the batch's own: no second forward pass
                    loss, outputs, targets = self._first_evaluation(batch, "evaluation", "evaluate() loader")
                    check = False
                else:
                    loss, outputs, targets = self.compute(batch, training=False)
                if loss is None:  # no targets: neither a loss nor metrics (fit checked its first batch)
                    raise _first.no_loss("evaluation")
                losses.append(loss.detach().reshape(()).float())
                sizes.append(batch_size_of(targets, batch))
                if metrics:
                    metrics.update(outputs, targets)
        parts = ([torch.stack(losses)] if losses else []) + metrics.drain()
        host = torch.cat([p.reshape(-1).to(device) for p in parts]).tolist() if parts else []  # SYNC: once per eval
        n = len(losses)
        values = {name: host[n + i * len(sizes) : n + (i + 1) * len(sizes)] for i, name in enumerate(metrics.pending)}
        metrics.absorb(values, sizes)
        reduced = owner.strategy.reduce_sums(
            [float(n), float(sum(sizes)), math.fsum(v * b for v, b in zip(host[:n], sizes, strict=True))]
            + [metrics.sums[k] for k in metrics.sums]
        )
        if standalone and not reduced[0]:  # counted on every rank: one rank refusing alone would leave the rest waiting
            raise _no_batches()
        count = reduced[1] or 1.0
        out: dict[str, float] = {}
        if reduced[0]:  # batches on any rank: a rank whose share was empty reports the same loss as the others
            out[f"{prefix}loss"] = reduced[2] / count
        for name, total in zip(metrics.sums, reduced[3:], strict=True):
            out[f"{prefix}{name}"] = total / count
        for k, v in metrics.compute(int(count)).items():
            if k not in metrics.sums:
                out[f"{prefix}{k}"] = v
        metrics.reset()
        return out

    def _evaluate_steps(self, loader: Iterable, *, prefix: str, standalone: bool) -> dict[str, float]:
        """``validation_step``'s values over ``loader`` (sample-weighted means, one read, reduced across ranks)."""
        from nbtrainer._data._step_result import check_step_result

        owner = self._owner
        model, device, fn = owner.model, owner.device, self.validation_step_fn
        assert fn is not None
        keys: list[str] | None = None
        rows: list[torch.Tensor] = []
        sizes: list[int] = []
        with eval_mode(model), self.inference(), self.autocast(), no_cache(model):
            for batch in loader:
                batch = move_to_device(batch, device, owner.options.data.non_blocking)
                values = check_step_result(fn(model, batch), keys, name="validation_step")
                keys = list(values)
                rows.append(torch.stack([v.detach().reshape(()).float() for v in values.values()]))
                sizes.append(batch_size_of(None, batch))
        host = torch.stack(rows).tolist() if rows else []  # SYNC: once per evaluation
        if keys is None:
            if standalone:
                raise _no_batches()
            return {}
        totals = [math.fsum(row[i] * n for row, n in zip(host, sizes, strict=True)) for i in range(len(keys))]
        reduced = owner.strategy.reduce_sums([float(sum(sizes)), *totals])
        count = reduced[0] or 1.0
        out = {f"{prefix}{k}": total / count for k, total in zip(keys, reduced[1:], strict=True)}
        if "loss" not in keys:  # as in training: the first value is also the loss, under its own name too
            out = {f"{prefix}loss": out[f"{prefix}{keys[0]}"], **out}
        return out

    # -- prediction ---------------------------------------------------------------------------------------
    def predict(
        self,
        loader: Iterable,
        *,
        per_batch: bool,
        pad_index: float,
        keep_dtype: bool,
        keep: Iterable[str] | str,
        to_cpu: bool,
    ) -> Any:
        """The body of ``Trainer.predict`` (see its docstring): each batch's outputs by :meth:`predict_outputs`,
        collected by ``nbtrainer._data._predict_collect``."""
        owner = self._owner
        return collect(
            loader,
            model=owner.model,
            check_first=self._check_predict_batch,
            outputs_of=self.predict_outputs,
            device=owner.device,
            non_blocking=owner.options.data.non_blocking,
            autocast=self.autocast(),
            per_batch=per_batch,
            pad_index=pad_index,
            keep_dtype=keep_dtype,
            keep=keep,
            to_cpu=to_cpu,
        )

    def _check_predict_batch(self, batch: Any) -> None:
        """predict's first batch: ``num_inputs=`` / ``target_keys=`` refused where its batches never read them, as a
        fit refuses them (a ``predict_step`` of the user's own splits the batch itself, and is left to it)."""
        owner = self._owner
        if self.predict_step_fn is None and not overridden(owner, "predict_step"):
            owner.batch_spec.check_applies(batch, "predict() loader")

    def predict_outputs(self, batch: Any) -> Any:
        """One batch's outputs for ``predict``, by the rule of ``nbtrainer._data._predict_collect``'s docstring."""
        owner = self._owner
        fn = self.predict_step_fn
        if fn is not None:
            return fn(owner.model, batch)
        if overridden(owner, "predict_step"):
            return owner.predict_step(batch)
        loss_fn = self.compute_loss_fn
        if loss_fn is not None or overridden(owner, "compute_loss"):
            try:
                result = loss_fn(owner.model, batch) if loss_fn is not None else owner.compute_loss(batch)
            except Exception as exc:  # the user's function, called for a use it may not have been written for
                raise ValueError(
                    f"predict() has no predict_step, so it ran compute_loss on the batch for its outputs, and "
                    f"compute_loss raised {type(exc).__name__}: {exc} (a batch without targets?). Pass "
                    "Trainer(..., predict_step=fn(model, batch) -> outputs), or override Trainer.predict_step in a "
                    "subclass."
                ) from exc
            if isinstance(result, tuple) and len(result) == 3:
                return result[1]
            # Only a loss: the model is called on the batch as the protocol splits it (an autoencoder's x).
            try:
                return owner.predict_step(batch)
            except Exception as exc:
                add_note(
                    exc,
                    "compute_loss returned only a loss, so predict() called the model on the batch as the batch "
                    "protocol splits it, and that failed. Return (loss, outputs, targets) from compute_loss, or pass "
                    "predict_step=fn(model, batch) -> outputs (or override Trainer.predict_step in a subclass).",
                )
                raise
        try:
            return owner.predict_step(batch)
        except TypeError as exc:
            n = len(batch) if isinstance(batch, (list, tuple)) else 0
            if n >= 2 and owner.batch_spec.num_inputs is None and "required positional argument" in str(exc):
                add_note(
                    exc,
                    f"predict() took the batch's last element as its targets (the batch protocol), so the model got "
                    f"{n - 1} of the batch's {n} tensors. For batches of inputs alone, pass Trainer(..., "
                    f"num_inputs={n}).",
                )
            raise


def _no_batches() -> ValueError:
    """``evaluate()`` on a loader without ``len()`` that yields nothing (one with ``len() == 0`` is refused before)."""
    return ValueError(
        "The evaluate() loader yielded no batches, so there is no loss or metric to report: pass at least one batch "
        "of inputs with their targets. An iterator or generator already consumed yields none, as does a DataLoader "
        "with drop_last=True over fewer samples than batch_size."
    )
