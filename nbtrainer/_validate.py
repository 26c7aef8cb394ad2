"""Catch the mistakes users really make before they cost anything.

Three layers, each raising an error that names the problem and the fix:

* :func:`check_args` (``Trainer.__init__``): the arguments themselves (a class where an instance is
  expected, a list where a dict is expected, a device this machine does not have...).
* :func:`check_fit` (``Trainer.fit``, before anything runs): loaders, monitors and filenames that
  will only be looked at later, schedules that would run out, parameters the precision can't train.
* the first batch: :func:`first_compute` runs the first micro-batch's forward and loss in stages
  (batch -> model -> criterion) so a failure says which stage and with what shapes; the loop checks
  the loss (scalar, has grad_fn) and the metrics right after, all before the first backward. The
  validation loader's first batch is tried too (:func:`check_val_loader`) under restored RNG, so a
  broken validation set fails now rather than after an epoch of training.

The first batch is the real first micro-batch of the run, not an extra step: nothing is repeated,
so nothing needs undoing. The validation peek runs in eval mode under ``inference_mode`` and puts
back every RNG it could have touched (python, numpy, torch, CUDA, the loader's generator).
"""

from __future__ import annotations

import copy
import difflib
import math
import string
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from nbtrainer._batch import loss_from_outputs

__all__ = ["check_args", "check_callback", "check_fit", "check_val_loader", "first_compute"]

# Hook names other trainers use, mapped to ours (a callback using them would silently never run).
_FOREIGN_HOOKS = {
    "on_train_start": "on_fit_start",
    "on_train_end": "on_fit_end",
    "on_train_begin": "on_fit_start",
    "on_epoch_begin": "on_epoch_start",
    "on_train_epoch_start": "on_epoch_start",
    "on_train_epoch_end": "on_epoch_end",
    "on_batch_end": "on_train_batch_end",
    "on_batch_begin": "on_train_batch_start",
    "on_batch_start": "on_train_batch_start",
    "on_train_batch_begin": "on_train_batch_start",
    "on_validation_epoch_end": "on_validation_end",
    "on_validation_epoch_start": "on_validation_start",
    "on_step_end": "on_optimizer_step",
    "on_before_backward": "on_train_batch_end",
    "on_exception_raised": "on_exception",
}

_ELEMENTWISE = ("MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss", "SoftMarginLoss")


def _desc(obj: Any, depth: int = 0) -> str:
    """A short description of a (nested) batch: dtypes and shapes."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).replace('torch.', '')}{list(obj.shape)}" + (
            "" if obj.device.type == "cpu" else f"@{obj.device}"
        )
    if depth > 2:
        return type(obj).__name__
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k!r}: {_desc(v, depth + 1)}" for k, v in list(obj.items())[:6]) + "}"
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        inner = ", ".join(_desc(v, depth + 1) for v in list(obj)[:6])
        return f"({inner})" if isinstance(obj, tuple) else f"[{inner}]"
    return type(obj).__name__


# -- Trainer.__init__ ------------------------------------------------------------------------------
def check_callback(cb: Any) -> None:
    """A callback must be an instance, and must not rely on hook names nbtrainer never calls."""
    from nbtrainer._events import EVENTS

    if isinstance(cb, type):
        raise TypeError(
            f"callbacks got the class {cb.__name__}, not an instance. Pass {cb.__name__}(...) "
            "(with its arguments), e.g. callbacks=[EarlyStopping('val_loss')]."
        )
    if cb is None or isinstance(cb, (str, int, float, bool, dict, list, tuple)):
        raise TypeError(
            f"callbacks must hold callback objects, got {cb!r}. Pass objects with hook methods "
            "(see nbtrainer.EVENTS), e.g. callbacks=[ModelCheckpoint('ckpts')]."
        )
    names = [n for n in dir(type(cb)) if n.startswith("on_") and callable(getattr(type(cb), n, None))]
    for name in names:
        if name in EVENTS:
            continue
        right = _FOREIGN_HOOKS.get(name) or next(iter(difflib.get_close_matches(name, EVENTS, n=1, cutoff=0.85)), None)
        if right is not None:
            raise ValueError(
                f"Callback {type(cb).__name__} defines {name}(), which nbtrainer never calls "
                f"(it would be silently ignored). Rename it to {right}(); the hooks are: "
                f"{', '.join(EVENTS)}."
            )


def check_args(
    *,
    criterion: Any,
    optimizer: Any,
    scheduler: Any,
    metrics: Any,
    callbacks: Any,
    device: Any,
    seed: Any,
    refresh_interval: Any,
    on_nonfinite: Any,
) -> None:
    from nbtrainer._nonfinite import check_mode

    if isinstance(criterion, type):
        raise TypeError(
            f"criterion is the class {criterion.__name__}, not an instance. Pass "
            f"{criterion.__name__}() (note the parentheses)."
        )
    if isinstance(optimizer, type):
        raise TypeError(
            f"optimizer is the class {optimizer.__name__}, not an optimizer. Build it from the "
            f"model's parameters: {optimizer.__name__}(model.parameters(), lr=...), or pass its "
            "name as a string ('adamw')."
        )
    if scheduler is not None:
        if isinstance(scheduler, type):
            raise TypeError(
                f"scheduler is the class {scheduler.__name__}, not a scheduler. Build it from the "
                f"optimizer: {scheduler.__name__}(optimizer, ...)."
            )
        if not (callable(getattr(scheduler, "step", None)) and callable(getattr(scheduler, "state_dict", None))):
            raise TypeError(
                f"scheduler must be a torch LR scheduler (with step() and state_dict()), got "
                f"{type(scheduler).__name__}. Build one from torch.optim.lr_scheduler."
            )
    if metrics is not None and not isinstance(metrics, Mapping):
        raise TypeError(
            f"metrics must be a dict of name -> metric, got a {type(metrics).__name__}. Name each "
            "one, e.g. metrics={'acc': torchmetrics.Accuracy(task='multiclass', num_classes=10)}."
        )
    if callbacks is not None:
        if not isinstance(callbacks, Iterable) or isinstance(callbacks, (str, bytes, Mapping)):
            raise TypeError(
                f"callbacks must be a list of callbacks, got a {type(callbacks).__name__}. Wrap "
                "it in a list: callbacks=[cb]."
            )
        if isinstance(callbacks, (list, tuple)):
            for cb in callbacks:
                check_callback(cb)
    if not isinstance(device, torch.device):
        if not isinstance(device, str) and device is not None:
            raise TypeError(
                f"device must be a string or torch.device, got {type(device).__name__}. "
                "Use 'auto', 'cpu', 'cuda', 'cuda:1' or 'mps'."
            )
        if device not in (None, "auto"):
            try:
                device = torch.device(device)
            except (RuntimeError, ValueError) as exc:
                raise ValueError(
                    f"Unknown device {device!r} ({str(exc).splitlines()[0][:120]}). Use 'auto', "
                    "'cpu', 'cuda', 'cuda:1' or 'mps'."
                ) from None
    if isinstance(device, torch.device):
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(
                    f"device={str(device)!r} but CUDA is not available here (no GPU, or a CPU-only "
                    f"torch {torch.__version__}). Use device='cpu' (or 'auto'), or install a CUDA "
                    "build of torch on a machine with a GPU."
                )
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise RuntimeError(
                    f"device={str(device)!r} but only {torch.cuda.device_count()} CUDA device(s) "
                    "are visible. Pick an index below that (check CUDA_VISIBLE_DEVICES)."
                )
        if device.type == "mps":
            mps = getattr(torch.backends, "mps", None)
            if mps is None or not mps.is_available():
                raise RuntimeError("device='mps' but MPS is not available here. Use device='cpu' or 'auto'.")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise TypeError(f"seed must be an int or None, got {seed!r}. Pass e.g. seed=42.")
    if (
        not isinstance(refresh_interval, (int, float))
        or isinstance(refresh_interval, bool)
        or not (refresh_interval >= 0 and math.isfinite(refresh_interval))
    ):
        raise ValueError(f"refresh_interval must be a number of seconds >= 0, got {refresh_interval!r}.")
    check_mode(on_nonfinite)


# -- Trainer.fit, before anything runs ----------------------------------------------------------------
def _one_shot(loader: Any) -> bool:
    # Never call iter() to find out: a DataLoader's iter() draws its base seed from the RNG.
    return isinstance(loader, Iterator)


def _check_loader(name: str, loader: Any) -> None:
    if isinstance(loader, torch.Tensor):
        raise TypeError(
            f"{name} is a tensor, not a loader (iterating it would yield single rows). Wrap the "
            "data: DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)."
        )
    if isinstance(loader, torch.utils.data.Dataset) and not isinstance(loader, torch.utils.data.IterableDataset):
        raise TypeError(
            f"{name} is a Dataset ({type(loader).__name__}), not a loader: iterating it yields "
            "single samples without a batch dimension. Wrap it: DataLoader(dataset, "
            "batch_size=32, shuffle=True)."
        )
    if not isinstance(loader, Iterable) and not hasattr(loader, "__getitem__"):
        raise TypeError(
            f"{name} must be an iterable of batches (a DataLoader, a list...), got {type(loader).__name__}."
        )


def _format_keys(fmt: str) -> set[str]:
    keys = set()
    for _, field, _, _ in string.Formatter().parse(fmt):
        if field:
            keys.add(field.split(".")[0].split("[")[0])
    return keys


def check_fit(
    trainer: Any, train_loader: Any, val_loader: Any, epochs: int, max_steps: int | None, resuming: bool
) -> None:
    from nbtrainer._callbacks import check_monitor
    from nbtrainer._checkpoint_cb import ModelCheckpoint
    from nbtrainer._loop import _safe_len

    _check_loader("train_loader", train_loader)
    if val_loader is not None:
        _check_loader("val_loader", val_loader)
    if epochs > 1 and max_steps is None and _one_shot(train_loader):  # a stream with max_steps is fine
        raise TypeError(
            f"train_loader is a one-shot iterator ({type(train_loader).__name__}): epoch 2 would get "
            f"no batches. Pass something iterable again each epoch (a DataLoader or a list), not "
            "iter(...) or a generator."
        )
    if val_loader is not None and _one_shot(val_loader) and epochs > 1:
        raise TypeError(
            f"val_loader is a one-shot iterator ({type(val_loader).__name__}): only the first "
            "validation would see batches. Pass a DataLoader or a list."
        )
    keys = trainer.expected_log_keys()
    sched = trainer.scheduler
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        key = trainer.scheduler_monitor or ("val_loss" if trainer.has_validation else "loss")
        if key not in keys:
            hint = (
                " (no val_loader was given to fit())" if key.startswith("val_") and not trainer.has_validation else ""
            )
            raise ValueError(
                f"ReduceLROnPlateau would monitor {key!r}, which this fit never logs{hint}. Set "
                f"scheduler_monitor= to one of {sorted(keys)}."
            )
    elif (
        isinstance(sched, torch.optim.lr_scheduler.OneCycleLR) and trainer.scheduler_interval == "step" and not resuming
    ):
        # (a resume steps the checkpoint's scheduler: nbtrainer._continue checks that one before loading it)
        n = _safe_len(train_loader)
        if n:
            need = math.ceil(n / trainer.grad_accum_steps) * epochs
            if max_steps is not None:
                need = min(need, max_steps)
            if sched.total_steps < need:
                raise ValueError(
                    f"OneCycleLR was built for total_steps={sched.total_steps} but this fit takes "
                    f"{need} optimizer steps ({n} batches / grad_accum_steps="
                    f"{trainer.grad_accum_steps}, {epochs} epochs); it would fail part-way. Build it "
                    "with total_steps=trainer.total_steps(train_loader, epochs)."
                )
    for cb in trainer.callbacks.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor:
            check_monitor("ModelCheckpoint", cb.monitor, trainer)
        if isinstance(cb, ModelCheckpoint) and cb.save_top_k != 0:
            missing = sorted(_format_keys(cb.filename) - keys - {"epoch", "step"})
            if missing:
                raise ValueError(
                    f"ModelCheckpoint filename {cb.filename!r} uses {missing}, which this fit never "
                    f"logs. Use {{epoch}}, {{step}} or one of {sorted(keys)}."
                )
    _check_model(trainer)


def _check_model(trainer: Any) -> None:
    model, device = trainer.model, trainer.device
    params = list(model.parameters())
    if any(p.is_meta for p in params):
        names = [n for n, p in model.named_parameters() if p.is_meta][:4]
        raise RuntimeError(
            f"The model has parameters on the 'meta' device (no data), e.g. {names}. Materialize "
            "it first: model.to_empty(device=...) then load its weights."
        )
    if trainer.precision == "fp16-mixed":
        half = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16][:4]
        if half:
            raise TypeError(
                f"precision='fp16-mixed' trains fp32 master weights under autocast, but parameters "
                f"{half} are float16 (model.half()?); the GradScaler cannot unscale fp16 gradients. "
                "Drop .half() (autocast casts on the fly), or use precision='fp32' for a pure "
                "half model."
            )
    opt_params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    if opt_params and not any(p.requires_grad for p in opt_params):
        raise ValueError(
            "Every parameter the optimizer holds has requires_grad=False, so nothing would be "
            "trained. Unfreeze them (p.requires_grad_(True)) before building the optimizer, or "
            "build it from the trainable ones: [p for p in model.parameters() if p.requires_grad]."
        )
    # Plain tensor attributes (not parameters/buffers) are not moved by .to(device): the classic
    # "Expected all tensors to be on the same device" once training starts.
    for mod_name, mod in model.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not attr.startswith("_") and value.device.type != device.type:
                where = f"{mod_name}.{attr}" if mod_name else attr
                raise RuntimeError(
                    f"model.{where} is a plain tensor attribute on {value.device}, not on the "
                    f"trainer's device {device}: .to(device) does not move it. Register it: "
                    f"self.register_buffer('{attr}', tensor) (persistent=False to keep it out of "
                    "the state_dict)."
                )


# -- the first batch ------------------------------------------------------------------------------------
def _leaf_problem(obj: Any, path: str, top: bool) -> str | None:
    if isinstance(obj, torch.Tensor) or obj is None:
        return None
    mod = type(obj).__module__ or ""
    if mod.startswith("numpy") and hasattr(obj, "shape"):
        return f"{path} is a numpy.{type(obj).__name__}"
    if mod.startswith("PIL"):
        return f"{path} is a PIL image"
    if isinstance(obj, dict):
        for k, v in obj.items():
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
        new = RuntimeError(message)
    return new


def _passthrough(exc: BaseException) -> bool:
    return not isinstance(exc, Exception) or isinstance(exc, (MemoryError, torch.OutOfMemoryError))


def _model_hint(trainer: Any, exc: BaseException, args: tuple, kwargs: dict, batch: Any) -> str:
    text = str(exc)
    if isinstance(exc, TypeError) and ("positional argument" in text or "keyword argument" in text):
        how = f"{len(args)} positional input(s) {_desc(args)}" if args else f"keyword inputs {sorted(kwargs)}"
        return (
            f"nbtrainer passed {how}. If the batch holds a different number of inputs, set num_inputs= "
            "(tuple batches: how many leading elements go to the model) or target_keys= (dict batches), "
            "or pass compute_loss=fn(model, batch)."
        )
    if "same device" in text or ("device" in text and "expected" in text.lower()):
        return (
            f"A tensor the model uses is not on the trainer's device {trainer.device}: register tensors the "
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
        return (
            f"A label is >= the number of model outputs ({out_t.shape[-1] if out_t.ndim else 1}). Make the "
            "last layer as wide as the number of classes, or make the labels 0-based."
        )
    if ("0D or 1D target" in text or "multi-target" in text) and tgt_t is not None:
        return (
            f"{name} wants class indices of shape [batch]; the targets are {list(tgt_t.shape)}. Use "
            "y.squeeze(1) (or y.argmax(1) for one-hot targets)."
        )
    if ("Long" in text or "Int" in text) and tgt_t is not None and tgt_t.is_floating_point():
        return f"{name} wants integer class indices; the targets are {tgt_t.dtype}. Convert them: y.long()."
    if "can't be cast" in text or ("Float" in text and tgt_t is not None and not tgt_t.is_floating_point()):
        return f"{name} wants float targets; they are {tgt_t.dtype if tgt_t is not None else '?'}: use y.float()."
    if "size" in text or "shape" in text:
        return "Make the model's output and the targets the shapes the criterion expects."
    return "Make the model's output and the targets what the criterion expects (see its documentation)."


def check_criterion_shapes(criterion: Any, outputs: Any, targets: Any) -> None:
    if (
        type(criterion).__name__ not in _ELEMENTWISE
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


def first_compute(trainer: Any, batch: Any, training: bool = True) -> tuple[Any, Any, Any]:
    """The first micro-batch's ``(loss, outputs, targets)``, computed in stages with clear errors.

    For the default batch handling this runs exactly what the loop runs (``model(*inputs)`` then
    ``criterion(outputs, targets)``), so the run is the same as without the checks.
    """
    where = "train_loader" if training else "val_loader"
    check_batch(batch, where)
    default = trainer._compute_loss_fn is None and type(trainer).compute_loss is _trainer_cls().compute_loss
    if not default or (not training and trainer.criterion is not None and trainer.batch_spec.split(batch)[2] is None):
        try:
            return trainer._compute(batch, training=training)
        except BaseException as exc:
            if _passthrough(exc):
                raise
            hint = (
                "Check compute_loss against the batch structure."
                if not default
                else _model_hint(trainer, exc, (), {}, batch)
            )
            raise _rewrap(
                exc,
                f"Computing the loss of the first {where} batch {_desc(batch)} failed: "
                f"{type(exc).__name__}: {exc}. {hint}",
            ) from exc
    args, kwargs, targets = trainer.batch_spec.split(batch)
    try:
        outputs = trainer.model(*args, **kwargs)
    except BaseException as exc:
        if _passthrough(exc):
            raise
        raise _rewrap(
            exc,
            f"The model could not take the first {where} batch {_desc(batch)}: "
            f"{type(exc).__name__}: {str(exc)[:400]}. {_model_hint(trainer, exc, args, kwargs, batch)}",
        ) from exc
    check_criterion_shapes(trainer.criterion, outputs, targets)
    try:
        loss = loss_from_outputs(trainer.criterion, outputs, targets)
    except BaseException as exc:
        if _passthrough(exc) or trainer.criterion is None or targets is None:
            raise
        raise _rewrap(
            exc,
            f"The criterion {type(trainer.criterion).__name__} failed on the first {where} batch "
            f"with outputs {_desc(outputs)} and targets {_desc(targets)}: {type(exc).__name__}: "
            f"{str(exc)[:300]}. {_criterion_hint(trainer.criterion, exc, outputs, targets)}",
        ) from exc
    return loss, outputs, targets


def _trainer_cls() -> Any:
    from nbtrainer._trainer import Trainer

    return Trainer


def check_loss(trainer: Any, loss: Any, where: str, *, needs_grad: bool = False) -> None:
    """A scalar tensor (and, for training, one autograd can differentiate), else an error naming the fix."""
    if loss is None:
        return
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
        frozen = not any(p.requires_grad for p in trainer.model.parameters())
        why = (
            "every parameter of the model has requires_grad=False (unfreeze some)"
            if frozen
            else "it was computed without autograd "
            "(torch.no_grad / inference_mode / .detach() in the model or criterion)"
        )
        raise RuntimeError(f"The {where} loss has no grad_fn: {why}. Nothing can be trained from it.")


def check_val_loader(trainer: Any, val_loader: Any) -> None:
    """Run the first validation batch (eval mode, inference_mode) and put every RNG back."""
    from nbtrainer._seed import capture_rng, restore_rng

    if val_loader is None or _one_shot(val_loader):
        return
    gens = []
    for holder in (getattr(val_loader, "sampler", None), val_loader):
        gen = getattr(holder, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g, _ in gens):
            gens.append((gen, gen.get_state()))
    rng = capture_rng()
    model = trainer.model
    was_training = model.training
    model.eval()
    try:
        it = iter(val_loader)
        try:
            batch = next(it)
        except StopIteration:
            raise ValueError(
                "val_loader yielded no batches: pass None to skip validation or fix the dataset."
            ) from None
        finally:
            del it
        from nbtrainer._batch import move_to_device

        batch = move_to_device(batch, trainer.device)
        with torch.inference_mode(), trainer._autocast():
            loss, outputs, targets = first_compute(trainer, batch, training=False)
            check_loss(trainer, loss, "validation")
            dry_metrics(trainer, trainer._val_metrics, outputs, targets, "validation")
    finally:
        model.train(was_training)
        restore_rng(rng)
        for gen, state in gens:
            gen.set_state(state)


def dry_metrics(trainer: Any, metrics: Any, outputs: Any, targets: Any, where: str) -> None:
    """Each metric on one batch, on copies (the real ones keep their state): must run and give a number."""
    from nbtrainer._metrics import _scalar

    for name, fn in metrics.callables:
        try:
            value = fn(outputs, targets)
        except Exception as exc:
            raise _rewrap(
                exc,
                f"Metric {name!r} raised on the first {where} batch (outputs {_desc(outputs)}, "
                f"targets {_desc(targets)}): {type(exc).__name__}: {str(exc).rstrip('.')}. A metric is called as "
                "fn(outputs, targets) and must return one number per batch.",
            ) from exc
        _check_value(name, value)
    for name, metric in metrics.torchmetrics:
        probe = copy.deepcopy(metric)
        probe.reset()
        try:
            probe.update(outputs, targets)
            value = probe.compute()
        except Exception as exc:
            raise _rewrap(
                exc,
                f"Metric {name!r} ({type(metric).__name__}) failed on the first {where} batch "
                f"(outputs {_desc(outputs)}, targets {_desc(targets)}): {type(exc).__name__}: "
                f"{str(exc)[:300].rstrip('.')}. Configure it for this task (task=, num_classes=) or adapt "
                "the model's outputs.",
            ) from exc
        values = value.items() if isinstance(value, dict) else [(name, value)]
        for key, val in values:
            _scalar(key, val)


def _check_value(name: str, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"Metric {name!r} returned a tensor of shape {tuple(value.shape)}; a metric must "
                "return one number per batch (reduce it, e.g. with .mean())."
            )
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(
            f"Metric {name!r} returned a {type(value).__name__}; it must return a number or a 0-d tensor per batch."
        )
