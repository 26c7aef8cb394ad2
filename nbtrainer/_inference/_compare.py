"""``compare_inference``: each quantization method applied to a model, and other models (a distilled student), run
on the same batches and compared with a baseline: size, latency, throughput, metric, output drift.

How it measures:

* the loader's batches are read once and kept (at most ``max_batches``), so every variant sees the same batches
  in the same order and the timing excludes data loading;
* one untimed pass per variant computes the metric and the largest output difference from the baseline; it is
  also the warm-up (first-call allocations, lazy kernels);
* then ``rounds`` timed rounds in which the variants take turns (``_measure.time_rounds``); latency is per full
  batch (a smaller last batch is left out of the percentiles), throughput counts every sample;
* a variant that cannot be built or run here (torchao missing, no supported layer, an operator the method lacks
  on this device) is a row with the reason.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import BatchSpec, move_to_device
from nbtrainer._data._predict_collect import eval_mode
from nbtrainer._data._validate_batch import describe_batch
from nbtrainer._inference._inference_table import InferenceComparison
from nbtrainer._inference._logits import logits_of
from nbtrainer._inference._quantize_model import QUANT_METHODS, quantize_model
from nbtrainer._inference._size_latency import disk_bytes, memory_bytes, param_count, spread_of, time_rounds

__all__ = ["DEFAULT_METHODS", "METHODS", "compare_inference"]

log = logging.getLogger(__name__)

DEFAULT_METHODS = ("fp32", "bf16", "int8-dynamic", "int8-weight", "int4-weight", "codebook4")
METHODS = ("fp32", "bf16", *QUANT_METHODS)
_NOISY = 0.10  # a run-to-run spread above ±10% is called out even when the ranking holds


class _Bf16(nn.Module):
    """A bf16 copy of a model that takes and returns float32 (inputs cast in, logits cast out)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = copy.deepcopy(model).to(torch.bfloat16).eval()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        def cast(v: Any) -> Any:
            return v.to(torch.bfloat16) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

        return self.model(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})


# A label that is not counted: CrossEntropyLoss's ignore_index and Hugging Face's padded labels (predict's pad_index).
_IGNORED = -100


class _Accuracy:
    """The default metric: the share of the counted labels predicted right, over all the batches (a batch of
    mostly padding weighs what its labels weigh). Labels of -100 are not counted; a single output is a logit."""

    def __init__(self, single_logit: bool) -> None:
        self.single_logit = single_logit

    def counts(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        if self.single_logit:
            predicted = (logits[..., 0] > 0).long()
            targets = targets.reshape(predicted.shape)  # [N] or [N, 1] labels for [N, 1] logits
        else:
            predicted = logits.argmax(-1)
        counted = targets != _IGNORED
        return float(((predicted == targets) & counted).sum()), float(counted.sum())


def _default_metric(shape: tuple[int, ...], targets: Any) -> tuple[str | None, _Accuracy | None]:
    """Accuracy when the first batch's targets are class indices for these outputs, or 0/1 labels for a single
    output; else no metric (a single output with other targets is a regression: accuracy would mean nothing)."""
    if not isinstance(targets, torch.Tensor) or not shape:
        return None, None
    if shape[-1] == 1 and tuple(targets.shape) in (shape[:-1], shape):
        labels = targets[targets != _IGNORED]
        binary = labels.numel() > 0 and bool(((labels == 0) | (labels == 1)).all())
        return ("acc", _Accuracy(single_logit=True)) if binary else (None, None)
    if not targets.is_floating_point() and tuple(targets.shape) == shape[:-1]:
        return "acc", _Accuracy(single_logit=False)
    return None, None


def _resolve_metric(
    metric: Any, shape: tuple[int, ...], targets: Any
) -> tuple[str | None, Callable | _Accuracy | None]:
    if metric is None:
        return _default_metric(shape, targets)
    if isinstance(metric, Mapping):
        if len(metric) != 1:
            raise ValueError(f"metric= takes one metric ({{'name': fn}}), got {len(metric)}: {list(metric)}.")
        ((name, fn),) = metric.items()
        if not callable(fn):
            raise TypeError(f"metric {name!r} must be a function fn(logits, targets) -> scalar tensor.")
        return str(name), fn
    if callable(metric):
        name = getattr(metric, "__name__", "metric")
        return ("metric" if name == "<lambda>" else name), metric
    raise TypeError(
        f"metric must be None (accuracy for class labels), fn(logits, targets) -> scalar tensor, or {{'name': fn}}, "
        f"got {type(metric).__name__}."
    )


def _check_args(model: Any, methods: Any, models: Any, baseline: Any, rounds: int) -> tuple[list[str], dict]:
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare_inference takes a torch.nn.Module as model, got {type(model).__name__}.")
    methods = [methods] if isinstance(methods, str) else list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from {', '.join(METHODS)}.")
    extra = dict(models or {})
    for name, other in extra.items():
        if not isinstance(other, nn.Module):
            raise TypeError(f"models[{name!r}] must be a torch.nn.Module, got {type(other).__name__}.")
        if name in methods:
            raise ValueError(f"models has an entry named {name!r}, like a method: give it another name.")
    names = methods + list(extra)
    if len(set(names)) != len(names):
        raise ValueError(f"Each variant needs its own name; got {names}.")
    if baseline not in names:
        raise ValueError(f"baseline={baseline!r} is not one of the variants {names}: name a method or a model.")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}.")
    return methods, extra


def _build(model: nn.Module, method: str) -> nn.Module:
    if method == "fp32":
        return model
    if method == "bf16":
        return _Bf16(model)
    return quantize_model(model, method)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def compare_inference(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    methods: Iterable[str] = DEFAULT_METHODS,
    models: Mapping[str, nn.Module] | None = None,
    metric: Any = None,
    baseline: str = "fp32",
    rounds: int = 5,
    max_batches: int | None = None,
) -> InferenceComparison:
    """Size, latency, metric and output drift of ``model`` under each method, and of other ``models``.

    Args:
        model: the trained model (its device is where everything runs; left in the mode it was in).
        loader: batches in the Trainer's batch protocol (``(x, y)``, dicts, Hugging Face batches...).
        methods: ``"fp32"`` (the model as it is), ``"bf16"`` (a bfloat16 copy, float32 in and out) and the
            :func:`quantize_model` methods.
        models: more variants, name -> model, run as they are (a distilled student, its quantized copy...) in eval
            mode, each module's mode put back after. Their outputs must have the baseline's shape.
        metric: ``fn(logits, targets) -> scalar tensor`` (or ``{"name": fn}``), a batch mean weighted by batch
            size; ``None``: accuracy (``"acc"``, the share of all the counted labels predicted right) when the
            targets are class indices (the argmax of the last dimension; labels of -100, Hugging Face's padding
            and ``CrossEntropyLoss``'s ignore_index, are not counted) or 0/1 labels for a single output, read as a
            logit (class 1 when > 0, as ``BCEWithLogitsLoss`` trains it: a model that outputs probabilities needs
            ``metric=``); else no metric (a single output with other targets, a regression).
        baseline: the variant the ratios and differences refer to.
        rounds: timed rounds over the batches (the variants take turns in each).
        max_batches: use only the first batches of ``loader`` (they are all kept in memory).

    Returns:
        An :class:`InferenceComparison` (``print`` it, ``.rows``, ``to_pandas()``, ``CompareWidget(result)``).

    Example:
        >>> import torch
        >>> from nbtrainer import compare_inference
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        >>> data = [(torch.randn(32, 64), torch.randint(0, 10, (32,))) for _ in range(4)]
        >>> table = compare_inference(model, data, methods=("fp32", "bf16"), rounds=2)
        >>> table.names, table["bf16"]["size_ratio"] < 0.6
        (['fp32', 'bf16'], True)
    """
    method_list, extra = _check_args(model, methods, models, baseline, rounds)
    if max_batches is not None and (not isinstance(max_batches, int) or max_batches < 1):
        raise ValueError(f"max_batches must be an int >= 1 or None, got {max_batches!r}.")
    device = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(0)).device
    spec = BatchSpec()
    batches = []
    for batch in itertools.islice(loader, max_batches):
        args, kwargs, targets = spec.split(move_to_device(batch, device))
        batches.append((args, kwargs, targets))
    if not batches:
        raise ValueError("The loader yielded no batches: compare_inference needs at least one batch of data.")
    sizes = [_batch_size(b) for b in batches]

    with contextlib.ExitStack() as modes:  # the extra models too: they are the user's, used again after this
        for module in (model, *extra.values()):
            modes.enter_context(eval_mode(module))
        return _compare(model, method_list, extra, batches, sizes, metric, baseline, rounds, device)


def _batch_size(batch: tuple[tuple, dict, Any]) -> int:
    args, kwargs, targets = batch
    for value in (targets, *args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim:
            return int(value.shape[0])
    return 1


def _compare(
    model: nn.Module,
    method_list: list[str],
    extra: dict[str, nn.Module],
    batches: list[tuple[tuple, dict, Any]],
    sizes: list[int],
    metric: Any,
    baseline: str,
    rounds: int,
    device: torch.device,
) -> InferenceComparison:
    rows: dict[str, dict[str, Any]] = {}
    variants: dict[str, nn.Module] = {}
    for name in [*method_list, *extra]:
        row: dict[str, Any] = {"name": name, "kind": "method" if name in method_list else "model", "status": "ok"}
        rows[name] = row
        try:
            variant = _build(model, name) if name in method_list else extra[name]
        except Exception as exc:  # a method that cannot run here is a row, not an error
            log.debug("a method that cannot run here is a row of the table, not an error", exc_info=True)
            row.update(status="failed", reason=_reason(exc))
            continue
        variants[name] = variant
        row["note"] = _note(variant)

    # Shapes first, on the first batch: a model with other outputs is a mistake to report before any timing.
    args, kwargs, targets = batches[0]
    shapes: dict[str, tuple[int, ...]] = {}
    on_batch: Exception | None = None  # the first variant's error on the batch: raised when none runs
    with torch.inference_mode():
        for name, variant in list(variants.items()):
            try:
                shapes[name] = tuple(logits_of(variant(*args, **kwargs), who=f"Variant {name!r}").shape)
            except Exception as exc:
                if rows[name]["kind"] == "model":
                    if isinstance(exc, torch.OutOfMemoryError):  # not a mistake in the model: its own advice applies
                        raise
                    raise _model_failed(name, exc, args, kwargs) from exc
                rows[name].update(status="failed", reason=_reason(exc))
                on_batch = on_batch or exc
                del variants[name]
    if not variants:
        raise _none_ran(rows, on_batch) from on_batch
    reference = shapes.get(baseline) or next(iter(shapes.values()), None)
    wrong = {n: s for n, s in shapes.items() if s != reference}
    if wrong:
        raise ValueError(
            f"The variants' outputs differ in shape on the same batch: {baseline!r} gives {reference}, "
            + ", ".join(f"{n!r} gives {s}" for n, s in wrong.items())
            + ". Compare models that predict the same thing (same classes, same output layer size)."
        )

    metric_name, metric_fn = _resolve_metric(metric, reference or (), targets)
    base_logits: list[torch.Tensor] | None = None
    order = [baseline, *[n for n in variants if n != baseline]] if baseline in variants else list(variants)
    for name in order:
        variant, row = variants[name], rows[name]
        logits_all = []
        total, weighted = 0.0, 0.0
        with torch.inference_mode():
            for args, kwargs, targets in batches:
                logits = logits_of(variant(*args, **kwargs)).float()
                logits_all.append(logits)
                if metric_fn is not None and targets is not None:
                    if isinstance(metric_fn, _Accuracy):
                        right, counted = metric_fn.counts(logits, targets)
                    else:
                        counted = _batch_size((args, kwargs, targets))
                        right = float(metric_fn(logits, targets)) * counted
                    weighted, total = weighted + right, total + counted
        row["metric"] = weighted / total if total else None
        if name == baseline:
            base_logits = logits_all
        if base_logits is not None:
            row["max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(logits_all, base_logits, strict=True))
        row.update(params=param_count(variant), size_bytes=disk_bytes(variant), memory_bytes=memory_bytes(variant))

    full = [i for i, s in enumerate(sizes) if s == sizes[0]] if len(sizes) > 1 else [0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def runner(variant: nn.Module) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            args, kwargs, _ = batches[i]
            with torch.inference_mode():
                return variant(*args, **kwargs)

        return run

    times = time_rounds({n: runner(v) for n, v in variants.items()}, len(batches), rounds=rounds, sync=sync)
    for name, laps in times.items():
        row = rows[name]
        per_batch = sorted(lap[i] for lap in laps for i in full)
        row["latency_p50_s"] = statistics.median(per_batch)
        row["latency_p90_s"] = per_batch[min(len(per_batch) - 1, math.ceil(0.9 * len(per_batch)) - 1)]
        row["round_medians_s"] = [statistics.median(lap[i] for i in full) for lap in laps]
        row["latency_spread"] = spread_of(row["round_medians_s"])
        row["samples_per_s"] = sum(sizes) * len(laps) / sum(sum(lap) for lap in laps)
    _ratios(rows, baseline)
    result = InferenceComparison(
        rows=list(rows.values()),
        baseline=baseline,
        metric=metric_name,
        environment={
            "device": str(device),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "batch_size": sizes[0],
            "batches": len(batches),
            "rounds": rounds,
        },
    )
    result.warnings.extend(_rank_warnings(result.rows))
    return result


def _model_failed(name: str, exc: Exception, args: tuple, kwargs: dict) -> RuntimeError:
    """An extra model that cannot take the batch the main model takes: a mistake in what was passed as
    ``models=``, so an error (a method failing is a row instead) that says which model and on what inputs."""
    inputs = " and ".join(describe_batch(part) for part in (args, kwargs) if part)
    return RuntimeError(
        f"compare_inference: models[{name!r}] could not take the loader's first batch (inputs {inputs}): "
        f"{type(exc).__name__}: {str(exc)[:300]}. Each extra model is called on the same inputs as the model, split "
        f"from the batch as the Trainer does: check that models[{name!r}] takes the same inputs as the model (its "
        "input size and layout, its forward's arguments) and is on the same device."
    )


def _none_ran(rows: dict[str, dict[str, Any]], on_batch: Exception | None) -> RuntimeError:
    """No variant ran: the table would be empty and the timings divide by zero variants, so the reasons are the
    error (a model that cannot take the loader's batch fails every variant the same way)."""
    reasons = "; ".join(f"{name!r}: {row['reason']}" for name, row in rows.items())
    fix = (
        "The model fails on the loader's first batch: check that the batches are what the model takes "
        "(calling the model on one gives the same error)."
        if on_batch is not None
        else "Pick methods this model and device can run."
    )
    return RuntimeError(f"compare_inference: no variant could run, so there is nothing to compare ({reasons}). {fix}")


def _note(variant: nn.Module) -> str:
    info = getattr(variant, "quantization", None)
    if not isinstance(info, dict):
        return ""
    done, skipped = len(info["layers"]), len(info["skipped"])
    note = f"{done}/{done + skipped} Linear quantized"
    if info["method"] == "int4-weight":
        note += "; int4 stored one value per byte (torchao UNPACKED_TO_INT8)"
    return note


def _ratios(rows: dict[str, dict[str, Any]], baseline: str) -> None:
    base = rows.get(baseline)
    if base is None or base["status"] != "ok":
        return
    for row in rows.values():
        if row["status"] != "ok":
            continue
        for key, ratio in (
            ("size_bytes", "size_ratio"),
            ("memory_bytes", "memory_ratio"),
            ("latency_p50_s", "latency_ratio"),
            ("samples_per_s", "samples_per_s_ratio"),
        ):
            b, v = base.get(key), row.get(key)
            row[ratio] = v / b if isinstance(b, (int, float)) and b and isinstance(v, (int, float)) else None
        b, v = base.get("metric"), row.get("metric")
        row["metric_delta"] = v - b if v is not None and b is not None else None


def _rank_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """Pairs of variants whose latencies are closer than their run-to-run spread, and very noisy variants."""
    ok = sorted((r for r in rows if r["status"] == "ok" and r.get("round_medians_s")), key=lambda r: r["latency_p50_s"])
    if len(ok) < 2 or len(ok[0]["round_medians_s"]) < 2:
        return ["latency: one round only, no spread to judge the ranking by (use rounds >= 3)"] if len(ok) > 1 else []
    warnings = []
    ties = [
        f"{a['name']} / {b['name']}"
        for a, b in itertools.pairwise(ok)
        if max(a["round_medians_s"]) >= min(b["round_medians_s"])
    ]
    if ties:
        warnings.append(
            "latency: too close to rank (their per-round medians overlap): " + ", ".join(ties) + "; more rounds "
            "or a quieter machine may separate them"
        )
    noisy = [f"{r['name']} ±{r['latency_spread']:.0%}" for r in ok if r["latency_spread"] > _NOISY]
    if noisy:
        warnings.append("latency spread above ±10% (a busy machine?): " + ", ".join(noisy))
    return warnings
