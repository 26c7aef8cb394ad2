"""The first batch, checked in stages: batch -> model -> criterion -> loss -> metrics, each failure with the
stage, the shapes and the fix; and the validation loader's first batch under restored RNG.

Part of the checks described in :mod:`nbtrainer._trainer._validate`; a Trainer's batch steps
(``nbtrainer._loop._batch_steps``) run them with its model, criterion and batch protocol.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import re
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._batch import as_mapping, loss_from_outputs

if TYPE_CHECKING:
    from nbtrainer._data._batch import BatchSpec

__all__ = [
    "check_batch",
    "check_criterion_shapes",
    "check_loss",
    "describe_batch",
    "dry_metrics",
    "first_compute",
    "manual_step_errors",
    "no_loss",
    "one_shot",
    "onecycle_overflow",
]

log = logging.getLogger(__name__)

_ELEMENTWISE = (
    torch.nn.MSELoss,
    torch.nn.L1Loss,
    torch.nn.SmoothL1Loss,
    torch.nn.HuberLoss,
    torch.nn.BCELoss,
    torch.nn.BCEWithLogitsLoss,
    torch.nn.SoftMarginLoss,
)


def describe_batch(obj: Any, depth: int = 0) -> str:
    """A short description of a (nested) batch: dtypes and shapes, e.g. ``(float32[8, 64], int64[8])``."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).replace('torch.', '')}{list(obj.shape)}" + (
            "" if obj.device.type == "cpu" else f"@{obj.device}"
        )
    if depth > 2:
        return type(obj).__name__
    mapping = as_mapping(obj)
    if mapping is not None:
        inner = ", ".join(f"{k!r}: {describe_batch(v, depth + 1)}" for k, v in list(mapping.items())[:6])
        return ("{" if type(obj) is dict else f"{type(obj).__name__}{{") + inner + "}"
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        inner = ", ".join(describe_batch(v, depth + 1) for v in list(obj)[:6])
        return f"({inner})" if isinstance(obj, tuple) else f"[{inner}]"
    return type(obj).__name__


def _leaf_problem(obj: Any, path: str, top: bool) -> str | None:
    if isinstance(obj, torch.Tensor) or obj is None:
        return None
    mod = type(obj).__module__ or ""
    if mod.startswith("numpy") and hasattr(obj, "shape"):
        return f"{path} is a numpy.{type(obj).__name__}"
    if mod.startswith("PIL"):
        return f"{path} is a PIL image"
    mapping = as_mapping(obj)
    if mapping is not None:
        for k, v in mapping.items():
            found = _leaf_problem(v, f"{path}[{k!r}]", False)
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(v, (int, float, bool)) for v in obj):
            return f"{path} is a python {type(obj).__name__} of numbers"
        for i, v in enumerate(obj):
            found = _leaf_problem(v, f"{path}[{i}]", False)
            if found:
                return found
        return None
    if top and isinstance(obj, (int, float)):
        return f"{path} is a python {type(obj).__name__}"
    return None


def check_batch(batch: Any, where: str = "train_loader") -> None:
    problem = _leaf_problem(batch, "batch", True)  # other batch types: BatchSpec.split explains them
    if problem:
        raise TypeError(
            f"{where} yields batches with non-tensor data: {problem}. Convert in the Dataset or "
            "transform (torch.as_tensor(...), torchvision.transforms.ToTensor()), or let the "
            "DataLoader's default collate_fn build tensors (a custom collate_fn returned it as is)."
        )


def _rewrap(exc: BaseException, message: str) -> BaseException:
    """The same exception type with a better message (falls back to RuntimeError)."""
    try:
        new = type(exc)(message)
    except Exception:
        log.debug("this exception class takes no message: the message goes in a RuntimeError", exc_info=True)
        new = RuntimeError(message)
    return new


def _passthrough(exc: BaseException) -> bool:
    return not isinstance(exc, Exception) or isinstance(exc, (MemoryError, torch.OutOfMemoryError))


def _model_hint(device: torch.device, exc: BaseException, args: tuple, kwargs: dict, batch: Any) -> str:
    text = str(exc)
    if isinstance(exc, TypeError) and ("positional argument" in text or "keyword argument" in text):
        unnamed = _unnamed_targets_hint(args, kwargs, batch)
        if unnamed:
            return unnamed
        how = f"{len(args)} positional input(s) {describe_batch(args)}" if args else f"keyword inputs {sorted(kwargs)}"
        return (
            f"nbtrainer passed {how}. If the batch holds a different number of inputs, set num_inputs= "
            "(tuple batches: how many leading elements go to the model), yield ((x1, x2), y) to keep the "
            "inputs apart from the targets, set target_keys= (dict batches), or pass compute_loss=fn(model, batch) "
            "(and predict_step=fn(model, batch) for predict)."
        )
    if "same device" in text or ("device" in text and "expected" in text.lower()):
        return (
            f"A tensor the model uses is not on the trainer's device {device}: register tensors the "
            "model creates as buffers (self.register_buffer), and don't pin data to a device in the Dataset."
        )
    if "shapes cannot be multiplied" in text or "size mismatch" in text or "channels" in text or "shape" in text:
        return (
            "The inputs' shape does not fit the model: check the feature size / layout of the data "
            "(flatten images for Linear layers, channels-first for Conv) or the model's input size."
        )
    if "scalar type" in text or "dtype" in text or "Expected object of scalar type" in text:
        return (
            "The inputs' dtype does not match the model's parameters: convert in the Dataset (x.float() "
            "for features, x.long() for token ids)."
        )
    return "Check that the loader's batches match what the model's forward() expects."


def _criterion_hint(criterion: Any, exc: BaseException, outputs: Any, targets: Any) -> str:
    text = str(exc)
    name = type(criterion).__name__
    out_t = outputs if isinstance(outputs, torch.Tensor) else None
    tgt_t = targets if isinstance(targets, torch.Tensor) else None
    if "out of bounds" in text and out_t is not None:
        width = out_t.shape[-1] if out_t.ndim else 1
        if tgt_t is not None and not tgt_t.is_floating_point() and tgt_t.numel() and int(tgt_t.min()) < 0:
            return (
                f"A label is negative ({int(tgt_t.min())}): class labels run from 0 to {width - 1}. If it marks "
                f"items to leave out of the loss, give the criterion that value: {name}(ignore_index="
                f"{int(tgt_t.min())}) (nbtrainer pads with -100, the default)."
            )
        return (
            f"A label is >= the number of model outputs ({width}). Make the last layer as wide as the number of "
            "classes, or make the labels 0-based."
        )
    if isinstance(targets, tuple) and "tuple" in text:
        return (
            f"The targets are a tuple {describe_batch(targets)}: several targets (target_keys= with several keys, in "
            "that order; or the elements after num_inputs=) reach the criterion as one tuple. Unpack them in "
            "the criterion, e.g. def criterion(outputs, targets): y1, y2 = targets; ..."
        )
    out_map = as_mapping(outputs) if out_t is None else None
    if out_map is not None and "logits" in out_map:
        call = f"{name}()" if isinstance(criterion, torch.nn.Module) else "loss_fn"
        # a plain dict has no .logits, a dataclass no ["logits"]: the suggestion must run as pasted
        take = "out.logits" if hasattr(outputs, "logits") else 'out["logits"]'
        # a loss field (None here: no labels were passed) means the model computes one; a dict of logits does not
        own_loss = "loss" in out_map or "loss" in getattr(type(outputs), "__dataclass_fields__", {})
        other = " (or criterion=None to use the model's own loss from 'labels')" if own_loss else ""
        return (
            f"The model returns a {type(outputs).__name__}, and the criterion gets it whole. Take the tensor "
            f"it needs: criterion=lambda out, y: {call}({take}, y){other}."
        )
    if ("0D or 1D target" in text or "multi-target" in text) and tgt_t is not None:
        return (
            f"{name} wants class indices of shape [batch]; the targets are {list(tgt_t.shape)}. Use "
            "y.squeeze(1) (or y.argmax(1) for one-hot targets)."
        )
    if ("Long" in text or "Int" in text) and tgt_t is not None and tgt_t.is_floating_point():
        return f"{name} wants integer class indices; the targets are {tgt_t.dtype}. Convert them: y.long()."
    if "Long" in text and tgt_t is not None and not tgt_t.is_floating_point() and tgt_t.dtype != torch.long:
        return (
            f"{name} wants int64 class indices; the targets are {tgt_t.dtype}. Convert them: y.long() (or build "
            "them as int64: torch.as_tensor(labels, dtype=torch.long), np.asarray(labels, dtype=np.int64))."
        )
    if "can't be cast" in text or ("Float" in text and tgt_t is not None and not tgt_t.is_floating_point()):
        return f"{name} wants float targets; they are {tgt_t.dtype if tgt_t is not None else '?'}: use y.float()."
    if "size" in text or "shape" in text:
        return "Make the model's output and the targets the shapes the criterion expects."
    return "Make the model's output and the targets what the criterion expects (see its documentation)."


def check_criterion_shapes(criterion: Any, outputs: Any, targets: Any) -> None:
    if (
        not isinstance(criterion, _ELEMENTWISE)
        or not isinstance(outputs, torch.Tensor)
        or not isinstance(targets, torch.Tensor)
        or outputs.shape == targets.shape
    ):
        return
    name = type(criterion).__name__
    try:
        bshape = list(torch.broadcast_shapes(outputs.shape, targets.shape))
        silent = f"they would broadcast to {bshape} and give a wrong loss silently (torch only warns)"
    except RuntimeError:
        silent = "they cannot be compared element-wise"
    raise ValueError(
        f"{name} got outputs of shape {list(outputs.shape)} and targets of shape "
        f"{list(targets.shape)}: {silent}. Make them the same shape, e.g. y.view(-1, 1) / "
        "y.unsqueeze(-1) for the targets, or outputs.squeeze(-1) in the model."
    )


def check_log_probabilities(criterion: Any, outputs: Any) -> None:
    """NLLLoss takes log-probabilities; on raw scores (the log_softmax forgotten) its loss falls below zero without
    bound while the run looks healthy. Read once, on the first batch (one host sync, as the first batch's checks)."""
    if not isinstance(criterion, torch.nn.NLLLoss) or not isinstance(outputs, torch.Tensor):
        return
    if not outputs.is_floating_point() or not outputs.numel():
        return
    top = float(outputs.detach().max())  # SYNC: first batch only
    if top > 1e-3:  # a log-probability is <= 0 (log_softmax's rounding stays far below this)
        raise ValueError(
            f"NLLLoss takes log-probabilities (every value <= 0), but the model's outputs reach {top:.3g}: they look "
            "like raw scores (logits), on which NLLLoss falls below zero without bound. Use nn.CrossEntropyLoss() on "
            "the raw outputs (it applies log_softmax itself), or end the model with nn.LogSoftmax(dim=1)."
        )


def one_shot(loader: Any) -> bool:
    # Never call iter() to find out: a DataLoader's iter() draws its base seed from the RNG.
    return isinstance(loader, Iterator)


def first_compute(
    batch: Any,
    *,
    model: torch.nn.Module,
    criterion: Any,
    spec: BatchSpec,
    device: torch.device,
    compute: Callable[[Any], tuple[Any, Any, Any]],
    custom: bool,
    training: bool = True,
    where: str | None = None,
) -> tuple[Any, Any, Any]:
    """The first micro-batch's ``(loss, outputs, targets)``, computed in stages with clear errors.

    For the default batch handling this runs exactly what the loop runs (``model(*inputs)`` then
    ``criterion(outputs, targets)``), so the run is the same as without the checks. ``compute``: the Trainer's
    ``(loss, outputs, targets)`` of a batch, which ``custom`` (``compute_loss=``, a chunked loss) takes whole.
    ``where``: the loader the messages name (default: ``train_loader``, or ``val_loader`` when not ``training``).
    """
    where = where or ("train_loader" if training else "val_loader")
    check_batch(batch, where)
    spec.check_applies(batch, where)
    if custom or (not training and criterion is not None and spec.split(batch)[2] is None):
        try:
            return compute(batch)
        except BaseException as exc:
            if _passthrough(exc):
                raise
            hint = (
                "Check compute_loss against the batch structure." if custom else _model_hint(device, exc, (), {}, batch)
            )
            raise _rewrap(
                exc,
                f"Computing the loss of the first {where} batch {describe_batch(batch)} failed: "
                f"{type(exc).__name__}: {exc}. {hint}",
            ) from exc
    args, kwargs, targets = spec.split(batch)
    try:
        outputs = model(*args, **kwargs)
    except BaseException as exc:
        if _passthrough(exc):
            raise
        raise _rewrap(
            exc,
            f"The model could not take the first {where} batch {describe_batch(batch)}: "
            f"{type(exc).__name__}: {str(exc)[:400].rstrip('.')}. {_model_hint(device, exc, args, kwargs, batch)}",
        ) from exc
    check_criterion_shapes(criterion, outputs, targets)
    check_log_probabilities(criterion, outputs)
    try:
        loss = loss_from_outputs(criterion, outputs, targets, batch=batch, spec=spec)
    except BaseException as exc:
        if _passthrough(exc) or criterion is None or targets is None:
            raise
        raise _rewrap(
            exc,
            f"The criterion {type(criterion).__name__} failed on the first {where} batch "
            f"with outputs {describe_batch(outputs)} and targets {describe_batch(targets)}: {type(exc).__name__}: "
            f"{str(exc)[:300].rstrip('.')}. {_criterion_hint(criterion, exc, outputs, targets)}",
        ) from exc
    return loss, outputs, targets


def explain_late_label(exc: BaseException, *, epoch: int, step: int) -> None:
    """A label out of range in a batch after the first (the first batch's are explained before any step): append
    what is wrong and how to find every such item before training to ``exc``'s message (the caller re-raises it).
    Only the error path pays: the labels of each batch are not read (no host sync per step)."""
    text = str(exc.args[0]) if exc.args and isinstance(exc.args[0], str) else ""
    found = re.search(r"Target (-?\d+) is out of bounds", text)
    if found is None or "on the first" in text:
        return
    label = int(found.group(1))
    what = "negative (class labels start at 0; an item left out of the loss needs the criterion's ignore_index=)"
    if label >= 0:
        what = (
            "not below the number of model outputs (make the last layer as wide as the number of classes, or the "
            "labels 0-based)"
        )
    exc.args = (
        f"{text.rstrip('.')}: a batch of epoch {epoch} (after optimizer step {step}) holds the label {label}, "
        f"{what}. The first batch's labels were in range, so the check before the first step did not see it: "
        "Trainer(check_data=True), or trainer.check_data(loader), finds every such item before training.",
        *exc.args[1:],
    )


def onecycle_overflow(total_steps: int, *, epoch: int, batch: int, global_step: int) -> ValueError:
    """The error raised in the loop, before the optimizer step a OneCycleLR schedule has no room for
    (a train_loader without len() could not be counted before the run); ``epoch`` 1-based."""
    return ValueError(
        f"OneCycleLR was built for total_steps={total_steps} and this fit has used them all (epoch "
        f"{epoch}, batch {batch}, after optimizer step {global_step}); the next step would make "
        "the scheduler fail. The train_loader has no len(), so this could not be checked before the run. "
        "Build the scheduler with total_steps = (batches per epoch / grad_accum_steps) x epochs, or pass "
        f"max_steps={total_steps} to fit() to end the run with the schedule."
    )


def no_loss(where: str) -> ValueError:
    """A batch that gave no loss: without targets, evaluation has neither a loss nor metrics to compute."""
    return ValueError(
        f"The {where} batch gave no loss: it has no targets for the criterion (inputs alone), or compute_loss "
        "returned None. Pass inputs with their targets: fit(..., val_data=(x_val, y_val)), evaluate((x, y)), a "
        "loader yielding (inputs, targets); num_inputs= / target_keys= say where the targets are in a batch. For "
        "the outputs alone, use predict(x)."
    )


def check_loss(loss: Any, where: str, *, model: torch.nn.Module, needs_grad: bool = False) -> None:
    """A scalar tensor (and, for training, one autograd can differentiate), else an error naming the fix."""
    if loss is None:
        raise no_loss(where)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"The {where} loss is a {type(loss).__name__}, not a tensor: the criterion / compute_loss "
            "must return a scalar torch.Tensor (don't call .item() on it)."
        )
    if loss.ndim != 0:
        raise ValueError(
            f"The {where} loss has shape {tuple(loss.shape)}; it must be a scalar. Use "
            "reduction='mean' (or 'sum') in the criterion, or reduce it in compute_loss."
        )
    if needs_grad and not loss.requires_grad:
        frozen = not any(p.requires_grad for p in model.parameters())
        why = (
            "every parameter of the model has requires_grad=False (unfreeze some)"
            if frozen
            else "it was computed without autograd "
            "(torch.no_grad / inference_mode / .detach() in the model or criterion)"
        )
        raise RuntimeError(f"The {where} loss has no grad_fn: {why}. Nothing can be trained from it.")


@contextlib.contextmanager
def manual_step_errors(name: str) -> Iterator[None]:
    """A ``training_step`` / ``validation_step`` that fails on the first batch: its error, said to come from it."""
    try:
        yield
    except (TypeError, ValueError) as exc:
        if "training_step" in str(exc) or "validation_step" in str(exc):
            raise
        raise type(exc)(f"{name} failed on the first batch: {exc}") from exc


def dry_metrics(metrics: Any, outputs: Any, targets: Any, where: str) -> None:
    """Each metric on one batch, on copies (the real ones keep their state): must run and give a number.

    Structured outputs (a ``ModelOutput``, a tuple...) reach a metric whole, or their ``.logits`` / first
    tensor when it fails on them (``MetricSet.inputs``); this is where that is decided for the run. ``metrics`` is
    the stage's ``MetricSet``, used through its methods (this folder sits below the loop's)."""

    def failed(exc: Exception, name: str, what: str, fix: str) -> BaseException:
        notes = " ".join(str(n) for n in getattr(exc, "__notes__", ()))
        return _rewrap(
            exc,
            f"Metric {name!r}{what} on the first {where} batch (outputs {describe_batch(outputs)}, targets "
            f"{describe_batch(targets)}): {type(exc).__name__}: {str(exc)[:300].rstrip('.')}."
            f"{' ' + notes if notes else ''} {fix}",
        )

    for name, fn in metrics.callables:
        try:
            value = fn(metrics.inputs(name, fn, outputs, targets), targets)
        except Exception as exc:
            raise failed(
                exc,
                name,
                " raised",
                "A metric is called as fn(outputs, targets) (outputs whole, or their .logits / first tensor when "
                "it fails on them) and must return one number per batch.",
            ) from exc
        _check_value(name, value)
    for name, metric in metrics.torchmetrics:
        probe = metrics.probe(metric)
        try:
            probe.update(metrics.inputs(name, metric, outputs, targets), targets)
            value = probe.compute()
        except Exception as exc:
            raise failed(
                exc,
                name,
                f" ({type(metric).__name__}) failed",
                "Configure it for this task (task=, num_classes=) or adapt the model's outputs.",
            ) from exc
        values = value.items() if isinstance(value, dict) else [(name, value)]
        for key, val in values:
            metrics.scalar(key, val)


def _check_value(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"Metric {name!r} returned a tensor of shape {tuple(value.shape)}; a metric must "
                "return one number per batch (reduce it, e.g. with .mean())."
            )
        return
    if _is_numpy_array(value):  # sklearn-style metrics: np.asarray(score), np.mean(..., keepdims=True)
        if value.size != 1:
            raise ValueError(
                f"Metric {name!r} returned a numpy array of shape {tuple(value.shape)}; a metric must return one "
                "number per batch (reduce it, e.g. with .mean())."
            )
        if value.dtype.kind not in "iuf":
            raise TypeError(
                f"Metric {name!r} returned a numpy array of dtype {value.dtype}; it must return a number per batch."
            )
        return
    # numbers.Real: NumPy's scalars too (a float32 output's .numpy().mean() is no Python float)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(
            f"Metric {name!r} returned a {type(value).__name__}; it must return a number or a 0-d tensor per batch."
        )


def _is_numpy_array(value: Any) -> bool:
    """A ``numpy.ndarray``. NumPy is not imported for it: a value cannot be an array unless NumPy is loaded."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _unnamed_targets_hint(args: tuple, kwargs: dict[str, Any], batch: Any) -> str:
    """A dict batch whose label entry has none of the names looked for: every entry went to the model (none was
    taken as the target), and the fix is ``target_keys=`` ("" when that is not the case)."""
    from nbtrainer._data._batch import _DEFAULT_TARGET_KEYS

    mapping = as_mapping(batch)
    if args or not kwargs or mapping is None or set(mapping) - set(kwargs):
        return ""
    looked = ", ".join(_DEFAULT_TARGET_KEYS)
    return (
        f"nbtrainer passed every entry {sorted(kwargs)} to the model as keyword inputs: it takes as the targets the "
        f"first entry named {looked}, and the batch has none. Name the target entry with target_keys= (e.g. "
        f"Trainer(..., target_keys={_guess_target(kwargs)!r}); several: a tuple), or pass compute_loss=fn(model, "
        "batch) (and predict_step=fn(model, batch) for predict)."
    )


def _guess_target(kwargs: dict[str, Any]) -> str:
    """The entry most likely to be the target: an integer tensor of one dimension, else the last entry."""
    for key, value in kwargs.items():
        if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point():
            return str(key)
    return str(list(kwargs)[-1])
