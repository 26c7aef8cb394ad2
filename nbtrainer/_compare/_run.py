"""Measure training strategies on your own model: one call, one table.

``compare_strategies`` trains a fresh copy of the model once per strategy (mixed precision, gradient
accumulation, activation checkpointing, a lighter optimizer, freezing, compile... any Trainer option),
each from the same initial weights and over the same data order, and reports per strategy:

* step time: the median time of an optimizer step after ``warmup`` steps (CUDA: synchronized), and its
  spread (half the interquartile range of the steps, or of the repeats' medians, as a fraction of the
  median); the table warns under rows whose spread makes their ratios unreliable;
* samples/s: the median over those steps of samples / step time;
* peak memory: on CUDA the peak allocated bytes during the fit (``torch.cuda.max_memory_allocated``);
  elsewhere the *measured* peak of live tensor storage over one steady-state optimizer step (the second) of
  a private copy trained with the strategy's options (``nbtrainer._memory._peak.track_peak``: every
  tensor tracked, not a sum of parts). The peak's split into parameters, gradients, optimizer state,
  activations (with temporaries) and the rest is ``memory_detail`` (on CUDA measured the same way);
* notes that say what a strategy does here: ``accumN`` cuts each batch into N micro-batches (of batch/N
  samples) and steps once per batch; a half precision the CPU only emulates is marked;
* the final training loss (mean over the last 10% of optimizer steps) and a validation metric;
* ratios to the baseline row (the first strategy unless ``baseline=`` says otherwise).

A strategy that fails (out of memory, a precision the device can't run, a bad option) gets a row with
the reason; the others still run.
"""

from __future__ import annotations

import copy
import gc
import logging
import statistics
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from nbtrainer._compare._data import DataOrder, SplitLoader, split_batch
from nbtrainer._compare._presets import inapplicable, resolve_strategies
from nbtrainer._compare._run_measure import (
    StepTimer,
    accuracy,
    emulated_note,
    environment,
    failure_reason,
    final_loss,
    measure_step_peak,
    stored_batches,
)
from nbtrainer._compare._strategy_table import StrategyComparison
from nbtrainer._data._batch import first_tensor
from nbtrainer._look._side import kept_rng
from nbtrainer._optimizer_kinds import OPTIMIZERS
from nbtrainer._setup._optim import OptimizerFn, build_from_params, check_optimizer_fn

__all__ = ["compare_strategies"]

log = logging.getLogger(__name__)


class _SharedModel(ValueError):
    """A row's model is (or shares parameters with) the first one make_model returned: the comparison is refused
    as a whole, not reported as a failed row."""


def _check_new_model(first: list[weakref.ref[Any]], model: Any) -> None:
    # rows reload the initial weights but not requires_grad, hooks or wrappers: a shared model carries one row's
    # changes into the next, and the caller's model comes back trained. ``first``: weak references to the first
    # model and its parameters, alive only where something else holds them (never a false match on a reused id)
    if not isinstance(model, nn.Module):
        return
    alive = {id(x) for x in (ref() for ref in first) if x is not None}
    if id(model) in alive:
        what = "the same model object"
    elif not alive.isdisjoint(id(p) for p in model.parameters()):
        what = "a model sharing parameters with the one before"
    else:
        return
    raise _SharedModel(
        f"compare_strategies: make_model returned {what}; each strategy would train on from the last one (its "
        "weights, its frozen layers) and the caller's model would come back trained. make_model must return a "
        "new model each call, e.g. lambda: copy.deepcopy(model)."
    )


def _optimizer_for(name: str, kwargs: dict[str, Any], model: nn.Module, default: Any) -> tuple[Any, dict[str, Any]]:
    """The optimizer argument for a strategy's Trainer over ``model``, and its other options (no callbacks)."""
    opts = {k: v for k, v in kwargs.items() if k not in ("callbacks", "optimizer")}
    opt = kwargs.get("optimizer")
    if opt is None and isinstance(default, str):  # a name, as Trainer takes it: each strategy's Trainer builds it
        opt = default
    if isinstance(opt, str) or (opt is None and default is None):
        if "lr" not in opts and default is not None and not isinstance(default, str):
            opts["lr"] = float(build_from_params(default, model).param_groups[0]["lr"])
        return opt or "adamw", opts
    if opt is None or (callable(opt) and not isinstance(opt, torch.optim.Optimizer)):
        # a strategy may bring its own callable of the parameters
        what = "optimizer" if opt is None else f"strategy {name!r}: optimizer"
        fn = cast(OptimizerFn, opt if opt is not None else default)  # both None: the branch above
        built = build_from_params(fn, model, argument=what)
        if "lr" in opts:  # a strategy's lr= with the usual optimizer: set it on every group
            lr = float(opts.pop("lr"))
            for group in built.param_groups:
                group["lr"] = lr
        return built, opts
    return opt, opts


def spread(times: list[float], medians: list[float]) -> float | None:
    """How much a row's step time varies, as a ± fraction of its median: half the range of the repeats'
    medians with several repeats, else half the interquartile range of the steps."""
    values = medians if len(medians) > 1 else times
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    if mid <= 0:
        return None
    if len(medians) > 1:
        return (max(values) - min(values)) / 2 / mid
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / 2 / mid


def accum_note(batch: Any, accum: int, split: bool) -> str:
    """What gradient accumulation does to each batch in this comparison, in words."""
    if accum <= 1:
        return ""
    first = first_tensor(batch)
    size = int(first.shape[0]) if first is not None and first.dim() > 0 else None
    if not split or size is None:
        what = f"{size} samples" if size is not None else "a batch"
        return f"{accum} whole batches of {what} per optimizer step ({accum}x the baseline's samples per step)"
    parts = split_batch(batch, accum)
    sizes = sorted({int(t.shape[0]) for t in map(first_tensor, parts) if t is not None}, reverse=True)
    each = "/".join(str(n) for n in sizes)
    return f"each batch of {size} split into {len(parts)} micro-batches of {each}, one optimizer step per batch"


# Every strategy's run is seeded (seed_everything): the caller's generators are put back afterwards, as they were.
@kept_rng()
def compare_strategies(
    make_model: Callable[[], nn.Module],
    optimizer: OptimizerFn | str | None,
    criterion: Callable | None,
    train_loader: Iterable,
    val_loader: Iterable | None = None,
    strategies: Mapping[str, Mapping[str, Any]] | Sequence[str] | None = None,
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    epochs: int | None = None,
    steps: int | None = None,
    metric: str | None = "val_acc",
    metrics: Mapping[str, Any] | None = None,
    baseline: str | None = None,
    warmup: int = 2,
    seed: int = 0,
    device: str | torch.device = "auto",
    split_batches: bool = True,
    measure_memory: bool = True,
    repeats: int = 1,
    trainer_kwargs: Mapping[str, Any] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> StrategyComparison:
    """Train once per strategy from the same weights and data order, and tabulate time, memory, quality.

    Args:
        make_model: ``() -> model``, a new model each call (``lambda: copy.deepcopy(model)`` for one you
            hold; the same object, or one sharing its parameters, is refused before anything trains); called once
            per strategy (weights are then set to the first model's, so every strategy starts identical).
        optimizer: a callable of the parameters, as torch's own classes are: ``torch.optim.AdamW``,
            ``functools.partial(torch.optim.AdamW, lr=1e-3)`` or ``lambda params: ...``; called once per
            strategy with that strategy's model parameters (``None``: AdamW, fused where possible), or a name
            as :class:`~nbtrainer.Trainer` takes it (``"adamw"``, ``"sgd"``...; ``trainer_kwargs={"lr": ...}``). A
            strategy's ``optimizer="adafactor"`` (any name of :func:`nbtrainer.build_optimizer`) replaces it,
            with the strategy's ``lr`` or else the learning rate ``optimizer`` would use; a strategy's
            ``optimizer`` may also be its own callable of the parameters.
        criterion: the loss, as for :class:`~nbtrainer.Trainer`.
        train_loader, val_loader: the data (the loader's shuffling generator is reset before each strategy), or
            arrays (``(x, y)``, a dict of arrays) with ``batch_size`` and ``shuffle`` as for ``Trainer.fit``.
        strategies: ``{name: {trainer options}}`` (``precision``, ``grad_accum_steps``,
            ``activation_checkpointing``, ``optimizer``, ``lr``, ``trainable``, ``freeze``, ``compile``,
            ``channels_last``, ``max_grad_norm``...), or preset names (:data:`PRESETS`, ``"accumN"``). Default:
            ``fp32, bf16, ckpt, accum4, adafactor`` less what cannot apply to this model on this device (``ckpt``
            without repeated blocks, ``bf16`` where it does not run), named in one line under the table.
        epochs / steps: how long each strategy trains (``steps``: optimizer steps; default 1 epoch).
        metric: the validation key to report (``"val_acc"``: an argmax accuracy is added when ``metrics``
            has no ``acc``); ``None`` for none.
        metrics: trainer metrics (``{"acc": torchmetrics.Accuracy(...)}``).
        baseline: the row ratios refer to (default: the first strategy).
        warmup: optimizer steps left out of the step-time median and samples/s.
        seed: seeds every strategy's fit (dropout, shuffling); the global generators (Python's, NumPy's, torch's)
            are put back as they were when the comparison returns or raises.
        device: ``"auto"``, ``"cuda"``, ``"cpu"``...
        split_batches: a strategy with ``grad_accum_steps=k`` gets each loader batch as ``k`` micro-batches,
            so every strategy makes the same optimizer steps on the same samples (``False``: whole batches,
            k of them per step). A strategy may set ``split_batches`` itself.
        measure_memory: measure the peak memory of one step, and its split, per strategy (two extra
            optimizer steps on a copy of the model, the second one tracked).
        repeats: train every strategy this many times, round-robin, and pool the timed steps (timings on a
            busy machine); loss, metric and memory come from the first run.
        trainer_kwargs: options for every strategy's Trainer (a strategy's own options win).
        on_row: called with each row as soon as it is measured (progress display).

    Returns:
        :class:`StrategyComparison` (``to_pandas()``, HTML in notebooks, ``str()`` as text).

    Example:
        >>> # table = compare_strategies(make_model, functools.partial(torch.optim.AdamW, lr=1e-3),
        >>> #                            nn.CrossEntropyLoss(), train_loader, val_loader,
        >>> #                            ["fp32", "bf16", "ckpt", "accum4"], steps=50)
    """
    from nbtrainer._data._arrays import as_loaders
    from nbtrainer._setup._precision import resolve_device
    from nbtrainer._setup._seed import seed_everything
    from nbtrainer._trainer._trainer import Trainer

    plan = resolve_strategies(strategies)
    train_loader, val_loader = as_loaders(
        train_loader, val_loader, batch_size=batch_size, shuffle=shuffle, caller="compare_strategies"
    )
    if epochs is not None and steps is not None:
        raise ValueError("Pass epochs= or steps=, not both.")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}.")
    if epochs is None:
        epochs = 1 if steps is None else 10**9  # steps: as many (re-)passes over the data as needed
    baseline = baseline if baseline is not None else next(iter(plan))
    if baseline not in plan:
        raise ValueError(f"baseline {baseline!r} is not one of the strategies {list(plan)}.")
    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    metrics = dict(metrics or {})
    if metric and metric.startswith("val_") and metric[4:] == "acc" and "acc" not in metrics:
        metrics["acc"] = accuracy
    if metric and val_loader is None:
        metric = None
    memory_kind = (
        "CUDA peak allocated over the fit (torch.cuda.max_memory_allocated); split: tracked tensors at the peak "
        "of one step"
        if cuda
        else "measured peak of live tensor storage over one optimizer step (every tensor tracked, not a sum of parts)"
    )
    order = DataOrder([train_loader, val_loader])
    seed_everything(seed)
    first_model = make_model()
    if isinstance(optimizer, str):  # a misspelt name fails here, not in every row
        if optimizer.strip().lower() not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer name {optimizer!r}: use one of {sorted(OPTIMIZERS)}.")
    elif optimizer is not None:  # a model -> optimizer function (the old convention) fails here, not in every row
        build_from_params(optimizer, first_model)
    for name, options in plan.items():
        if callable(options.get("optimizer")) and not isinstance(options["optimizer"], torch.optim.Optimizer):
            check_optimizer_fn(options["optimizer"], argument=f"strategy {name!r}: optimizer")
    left_out = inapplicable(first_model, dev) if strategies is None else {}
    plan = {name: options for name, options in plan.items() if name not in left_out}
    if baseline in left_out:  # the ratios need its row: say so now, not after every other row has trained
        raise ValueError(
            f"baseline {baseline!r} is left out of the default list: {left_out[baseline]}. Pick one that runs "
            f"here: baseline={next(iter(plan))!r} (or another of {list(plan)})."
        )
    initial = {k: v.detach().to("cpu", copy=True) for k, v in first_model.state_dict().items()}
    first_refs = [weakref.ref(x) for x in (first_model, *first_model.parameters())]
    del first_model
    first_batch: Any = next(iter(train_loader), None)  # its size names accumulation's micro-batches
    order.reset()

    def run(name: str, options: dict[str, Any], measure: bool) -> dict[str, Any]:
        options = dict(options)
        split = options.pop("split_batches", split_batches)
        row: dict[str, Any] = {
            "name": name,
            "status": "ok",
            "reason": None,
            "options": dict(options),
            "note": "",
            **dict.fromkeys(
                (
                    "steps",
                    "step_time_s",
                    "samples_per_s",
                    "samples_per_step",
                    "train_time_s",
                    "peak_memory_bytes",
                    "memory_detail",
                    "final_loss",
                    "metric",
                )
            ),
        }
        trainer = model = None
        try:
            if "device" in options:
                raise ValueError("device is chosen for the whole comparison: compare_strategies(device=...)")
            order.reset()
            seed_everything(seed)
            model = make_model()
            _check_new_model(first_refs, model)
            model.load_state_dict(initial)
            kwargs = {**dict(trainer_kwargs or {}), **options}
            accum = int(kwargs.get("grad_accum_steps", 1))
            common = {"metrics": metrics, "seed": seed, "device": dev, "progress": False}  # a strategy's own win
            if measure:  # first, on a copy: the timed run below starts from the same weights and RNG state
                copy_model = copy.deepcopy(model)

                def make_measured(callbacks: list[Any]) -> Any:
                    opt_copy, opts = _optimizer_for(name, kwargs, copy_model, optimizer)
                    return Trainer(copy_model, criterion, opt_copy, callbacks=callbacks, **{**common, **opts})

                batches = stored_batches(train_loader, 2 if split else 2 * accum)
                order.reset()
                try:
                    loader_m = SplitLoader(batches, accum) if split and accum > 1 else batches
                    peak, row["memory_detail"], row["memory_resident"] = measure_step_peak(make_measured, loader_m)
                    row["peak_memory_bytes"] = peak
                except Exception as exc:
                    log.debug("this strategy's memory could not be measured: its row says why", exc_info=True)
                    row["peak_memory_bytes"], row["note"] = None, f"memory not measured: {failure_reason(exc)}"
                del copy_model, make_measured, batches
                gc.collect()
                seed_everything(seed)
            opt, opts = _optimizer_for(name, kwargs, model, optimizer)
            loader = SplitLoader(train_loader, accum) if split and accum > 1 else train_loader
            timer = StepTimer(dev)
            trainer = Trainer(
                model,
                criterion,
                opt,
                callbacks=[*kwargs.get("callbacks", ()), timer],
                **{**common, **opts},
            )
            notes = [accum_note(first_batch, accum, split), emulated_note(dev, str(trainer.precision))]
            row["note"] = "; ".join(n for n in [*notes, row["note"]] if n)
            if cuda:
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
            start = time.perf_counter()
            # steps=: validate once at the end, not at every pass over a short loader
            history = trainer.fit(loader, val_loader if steps is None else None, epochs=epochs, max_steps=steps)
            row["train_time_s"] = time.perf_counter() - start
            if cuda:
                # The trainer resets CUDA's peak per refresh window (nbtrainer._memory._window): its fit-wide
                # peak wins.
                peak = max(torch.cuda.max_memory_allocated(dev), trainer.progress.memory_peak or 0)
                row["peak_memory_bytes"] = int(peak)
            times, samples = timer.times, timer.samples
            skip = warmup if len(times) > warmup else (1 if len(times) > 1 else 0)
            if skip < warmup:
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"only {len(times)} steps: warm-up {skip}"
            row["_timed"] = list(zip(times[skip:], samples[skip:], strict=True))
            row["_medians"] = [statistics.median(times[skip:])] if times[skip:] else []
            row["steps"] = len(times)
            row["final_loss"] = final_loss(history)
            if metric:
                value = history.last.get(metric) if history.epochs else None
                if value is None and val_loader is not None:
                    value = trainer.evaluate(val_loader).get(metric)
                if value is None:
                    row["note"] = (row["note"] + "; " if row["note"] else "") + f"{metric} not logged"
                row["metric"] = value
            row["setup"] = trainer.model_setup.describe()
        except _SharedModel:
            raise
        except Exception as exc:
            log.debug(
                "a strategy that fails is a row of the table (its status and reason), not an error", exc_info=True
            )
            row.update(status="failed", reason=failure_reason(exc))
        finally:
            del trainer, model
            if cuda:  # give the next strategy the memory back (and a clean peak)
                gc.collect()
                torch.cuda.empty_cache()
            order.reset()
        return row

    def finish(row: dict[str, Any]) -> None:
        timed = row.pop("_timed", [])
        if row["status"] == "ok":
            row["train_time_s"] /= repeats
            # medians, not sums: on a shared machine one stalled step must not move the row
            row["step_time_s"] = statistics.median(t for t, _ in timed) if timed else None
            rates = [n / t for t, n in timed if t > 0]
            row["samples_per_s"] = statistics.median(rates) if rates else None
            row["samples_per_step"] = statistics.median(n for _, n in timed) if timed else None
            row["repeats"] = repeats
            row["step_time_spread"] = spread([t for t, _ in timed], row.pop("_medians", []))
        row.pop("_medians", None)
        if on_row is not None:
            on_row(row)

    rows: dict[str, dict[str, Any]] = {}
    for rep in range(repeats):  # round-robin: a slow spell of a shared machine hits every strategy alike
        for name, options in plan.items():
            if rep and rows[name]["status"] != "ok":
                continue  # failed before: already finished
            row = run(name, options, measure=measure_memory and rep == 0)
            if rep == 0:
                rows[name] = row
            elif row["status"] != "ok":
                rows[name].update(status="failed", reason=f"repeat {rep + 1}: {row['reason']}")
            else:
                rows[name]["_timed"] += row["_timed"]
                rows[name]["_medians"] += row["_medians"]
                rows[name]["train_time_s"] += row["train_time_s"]
                if cuda:
                    rows[name]["peak_memory_bytes"] = max(rows[name]["peak_memory_bytes"], row["peak_memory_bytes"])
            if rep == repeats - 1 or rows[name]["status"] != "ok":
                finish(rows[name])
    table = list(rows.values())

    base = next(r for r in table if r["name"] == baseline)
    for row in table:
        for key, ratio_key in (
            ("step_time_s", "step_time_ratio"),
            ("samples_per_s", "samples_per_s_ratio"),
            ("peak_memory_bytes", "peak_memory_ratio"),
        ):
            b, v = base.get(key), row.get(key)
            both_ok = base["status"] == "ok" and row["status"] == "ok"
            row[ratio_key] = v / b if both_ok and b and v is not None else None
    return StrategyComparison(
        rows=table,
        baseline=baseline,
        metric=metric,
        memory_kind=memory_kind,
        environment=environment(dev),
        settings={
            "epochs": None if steps is not None else epochs,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "split_batches": split_batches,
            "repeats": repeats,
        },
        left_out=left_out,
    )
