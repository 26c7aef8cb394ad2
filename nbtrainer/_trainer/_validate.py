"""Catch the mistakes users really make before they cost anything.

Three layers, each raising an error that names the problem and the fix:

* :func:`check_args` (``Trainer.__init__``): the arguments themselves (a class where an instance is
  expected, a list where a dict is expected, a device this machine does not have...).
* :func:`check_fit` (``Trainer.fit``, before anything runs): loaders, monitors and filenames that
  will only be looked at later, schedules that would run out, parameters the precision can't train.
* the first batch (:mod:`nbtrainer._data._validate_batch`, run by the batch steps, ``nbtrainer._loop._batch_steps``):
  ``first_compute`` runs the first micro-batch's forward and loss in stages (batch -> model -> criterion) so a
  failure says which stage and with what shapes; the loop checks the loss (scalar, has grad_fn) and the metrics
  right after, all before the first backward. The validation loader's first batch is tried too
  (``BatchSteps.check_val_loader``) under restored RNG, so a broken validation set fails now rather than after an
  epoch of training.

The first batch is the real first micro-batch of the run, not an extra step: nothing is repeated,
so nothing needs undoing. The validation peek runs in eval mode under ``inference_mode`` and puts
back every RNG it could have touched (python, numpy, torch, CUDA, the loader's generator).
"""

from __future__ import annotations

import difflib
import functools
import math
import string
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch

from nbtrainer._data._validate_batch import one_shot

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "between_fits",
    "check_accum",
    "check_args",
    "check_callback",
    "check_fit",
    "check_lr",
    "check_optimizer_params",
    "check_scheduler",
    "no_optimizer",
    "requires_optimizer",
]

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


# -- Trainer.__init__ ------------------------------------------------------------------------------
def check_callback(cb: Any) -> None:
    """A callback must be an instance, must not rely on hook names nbtrainer never calls, and its hooks must take the
    keywords they are called with."""
    from nbtrainer._events._stream import EVENTS, check_hook_signatures

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
    check_hook_signatures(cb)


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
    from nbtrainer._loop._metrics import is_collection
    from nbtrainer._loop._nonfinite import check_mode

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
                f"{type(scheduler).__name__}. Build one from torch.optim.lr_scheduler on the Trainer's optimizer; "
                "with the optimizer given by name, build the Trainer first, then attach it: "
                "trainer.set_scheduler(torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=10))."
            )
    if metrics is not None and not isinstance(metrics, Mapping) and not is_collection(metrics):
        raise TypeError(
            f"metrics must be a dict of name -> metric or a torchmetrics MetricCollection, got a "
            f"{type(metrics).__name__}. Name each one, e.g. metrics={{'acc': torchmetrics.Accuracy("
            "task='multiclass', num_classes=10)}."
        )
    for name, metric in metrics.items() if isinstance(metrics, Mapping) else ():
        if isinstance(metric, type):  # called with (outputs, targets), a class builds a metric from them, or fails
            raise TypeError(
                f"metrics[{name!r}] is the class {metric.__name__}, not a metric. Pass an instance: "
                f"{metric.__name__}(...) (torchmetrics: {metric.__name__}(task='multiclass', num_classes=...))."
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


def check_accum(steps: Any) -> None:
    """``grad_accum_steps`` (``Trainer(...)`` and ``set_grad_accum_steps``): an int >= 1."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"grad_accum_steps must be an int >= 1, got {steps!r}.")


def check_in_backward_now(trainer: LoopHost, **changes: Any) -> None:
    """``optimizer_in_backward=True`` against the trainer's settings as they would be after ``changes``
    (``grad_accum_steps=``, ``max_grad_norm=``, ``precision=``, ``callbacks=``); the callbacks too, as some
    are added after construction."""
    if not trainer.options.memory.optimizer_in_backward:
        return
    from nbtrainer._loop._in_backward import check_in_backward

    settings = {
        "grad_accum_steps": trainer.grad_accum_steps,
        "max_grad_norm": trainer.max_grad_norm,
        "precision": trainer.precision,
        "callbacks": list(trainer.callbacks.callbacks),
        **changes,
    }
    check_in_backward(optimizer=trainer.optimizer, distributed=bool(trainer.strategy.distributed), **settings)


def check_max_grad_norm(max_grad_norm: Any) -> None:
    if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}.")


def check_optimization(
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    *,
    scheduler_interval: Any,
    val_every_n_epochs: Any,
    grad_accum_steps: Any,
    max_grad_norm: Any,
    predict_step: Any,
) -> torch.optim.Optimizer | None:
    """The Trainer's optimizer (given, or built from its name; returned), its scheduler and the step options,
    checked before anything is set."""
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}. "
                "Build it from the model's parameters, e.g. torch.optim.AdamW(model.parameters())."
            )
        check_optimizer_params(model, optimizer)
    elif scheduler is not None:
        raise ValueError(
            "A scheduler was given without an optimizer (optimizer=None). Pass the optimizer the scheduler "
            "was built from: Trainer(model, criterion, optimizer, scheduler=...)."
        )
    if predict_step is not None and not callable(predict_step):
        raise TypeError(f"predict_step must be a function fn(model, batch) -> outputs, got {predict_step!r}.")
    if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
        raise ValueError(
            "The scheduler is bound to a different optimizer than the one given to the Trainer. "
            "Create the scheduler from this trainer's optimizer."
        )
    if scheduler_interval not in ("step", "epoch"):
        raise ValueError(f"scheduler_interval must be 'step' or 'epoch', got {scheduler_interval!r}.")
    check_accum(grad_accum_steps)
    check_max_grad_norm(max_grad_norm)
    if not isinstance(val_every_n_epochs, int) or val_every_n_epochs < 1:
        raise ValueError(f"val_every_n_epochs must be an int >= 1, got {val_every_n_epochs!r}.")
    return optimizer


def check_change(trainer: LoopHost, **changes: Any) -> None:
    """A change of settings (``set_precision``, ``set_grad_accum_steps``) against the step in backward and a closure
    optimizer, as the settings would be after it."""
    check_in_backward_now(trainer, **changes)
    check_closure_now(trainer, **changes)


def check_closure_now(trainer: LoopHost, **changes: Any) -> None:
    """A closure optimizer (LBFGS) against the trainer's settings as they would be after ``changes``
    (``grad_accum_steps=``, ``precision=``)."""
    from nbtrainer._loop._closure import check_closure

    settings: dict[str, Any] = {
        "grad_accum_steps": trainer.grad_accum_steps,
        "precision": trainer.precision,
        "on_nonfinite": trainer.options.step.on_nonfinite,
        "memory_budget": trainer.options.budget is not None,
    }
    in_backward = trainer.options.memory.optimizer_in_backward
    check_closure(trainer.optimizer, optimizer_in_backward=in_backward, **{**settings, **changes})


def requires_optimizer(what: str, extra: str = "") -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A Trainer method that needs an optimizer: on a Trainer built with ``optimizer=None`` it raises
    :func:`no_optimizer` (``what`` needs one) before doing anything."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if getattr(args[0], "optimizer", None) is None:
                raise no_optimizer(what, extra)
            return fn(*args, **kwargs)

        return checked

    return wrap


def between_fits(what: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A Trainer method that changes ``what`` between fits only: refused while ``fit`` runs."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if getattr(args[0], "run_state").fitting:  # noqa: B009 (args[0] is the Trainer: a method's self)
                raise RuntimeError(f"{what} cannot change while fit() is running; stop the run first.")
            return fn(*args, **kwargs)

        return checked

    return wrap


def check_scheduler(scheduler: Any, interval: Any, optimizer: Any) -> None:
    """``set_scheduler``'s scheduler (bound to the trainer's optimizer) and interval."""
    if scheduler is not None and optimizer is None:
        raise no_optimizer("A scheduler")
    if scheduler is not None and getattr(scheduler, "optimizer", optimizer) is not optimizer:
        raise ValueError("The scheduler is bound to a different optimizer; build it from trainer.optimizer.")
    if interval not in ("step", "epoch"):
        raise ValueError(f"interval must be 'step' or 'epoch', got {interval!r}.")


def check_lr(lr: Any, source: Any) -> None:
    """``set_lr``'s value and who set it."""
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}.")
    if source is not None and not isinstance(source, str):
        raise TypeError(f"source must be a short string (e.g. 'typed') or None, got {source!r}.")


def no_optimizer(what: str, extra: str = "") -> ValueError:
    """The error for a trainer built without an optimizer when ``what`` needs one."""
    return ValueError(
        f"{what} needs an optimizer, but this Trainer was built with optimizer=None (it only evaluates and "
        "predicts). Pass one: Trainer(model, criterion, torch.optim.AdamW(model.parameters(), lr=1e-3)), or "
        f"optimizer='adamw' with lr=.{extra}"
    )


# -- Trainer.fit, before anything runs ----------------------------------------------------------------
def _check_loader(name: str, loader: Any) -> None:
    # (a bare tensor never gets here: _arrays.fit_loaders batches it or refuses it with the fix)
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


def check_fit(trainer: LoopHost, train_loader: Any, val_loader: Any, epochs: int, max_steps: int | None) -> None:
    from nbtrainer._events._callbacks import check_monitor, no_validation_hint
    from nbtrainer._events._model_checkpoint import ModelCheckpoint
    from nbtrainer._loop._control import plateau_monitor

    _check_loader("train_loader", train_loader)
    check_in_backward_now(trainer)  # callbacks added since construction, settings changed between fits
    if val_loader is not None:
        _check_loader("val_loader", val_loader)
        trainer.batch_steps.check_can_evaluate()  # training_step= validates through validation_step= only
    if epochs > 1 and max_steps is None and one_shot(train_loader):  # a stream with max_steps is fine
        raise TypeError(
            f"train_loader is a one-shot iterator ({type(train_loader).__name__}): epoch 2 would get "
            f"no batches. Pass something iterable again each epoch (a DataLoader or a list), not "
            "iter(...) or a generator."
        )
    if val_loader is not None and one_shot(val_loader) and epochs > 1:
        raise TypeError(
            f"val_loader is a one-shot iterator ({type(val_loader).__name__}): only the first "
            "validation would see batches. Pass a DataLoader or a list."
        )
    keys = trainer.expected_log_keys()
    sched = trainer.scheduler
    monitor = trainer.options.step.scheduler_monitor
    if monitor is not None and not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        what = "no scheduler" if sched is None else f"a {type(sched).__name__}, which steps without a metric"
        raise ValueError(
            f"scheduler_monitor={monitor!r} is read only by a ReduceLROnPlateau scheduler, and this fit has {what}: "
            "it would be silently ignored. Pass scheduler=ReduceLROnPlateau(optimizer) to step on it, or drop "
            "scheduler_monitor= (on a built Trainer: trainer.scheduler_monitor = None)."
        )
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
        key = plateau_monitor(trainer)
        if key not in keys:
            hint = no_validation_hint(key, trainer)
            raise ValueError(
                f"ReduceLROnPlateau would monitor {key!r}, which this fit never logs{hint}. Set "
                f"scheduler_monitor= to one of {sorted(keys)}."
            )
    # (a OneCycleLR too short for this fit: nbtrainer._resume._continue.check_schedule, counting this rank's share)
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


def _check_model(trainer: LoopHost) -> None:
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
    groups = trainer.optimizer.param_groups if trainer.optimizer is not None else []
    opt_params = [p for g in groups for p in g["params"]]
    if opt_params and not any(p.requires_grad for p in opt_params):
        raise ValueError(
            "Every parameter the optimizer holds has requires_grad=False, so nothing would be "
            "trained. Unfreeze them (p.requires_grad_(True)) before building the optimizer, or "
            "build it from the trainable ones: [p for p in model.parameters() if p.requires_grad]. To "
            "evaluate or predict only, no fit is needed: Trainer(model, criterion, optimizer=None)."
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


def check_optimizer_params(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model_ids = {id(p) for p in model.parameters()}
    opt_params = [p for g in optimizer.param_groups for p in g["params"]]
    if not opt_params:
        raise ValueError(
            "The optimizer holds no parameters. Build it from model.parameters(), or pass optimizer=None "
            "for a trainer that only evaluates and predicts."
        )
    if not any(id(p) in model_ids for p in opt_params):
        raise ValueError(
            "The optimizer holds none of the model's parameters (was it built for another model "
            "instance, or before the model was re-created?). Build it from this model's parameters (or pass "
            "optimizer=None to only evaluate and predict)."
        )


def device_is_fixed(trainer: Any, device: Any) -> None:
    """``trainer.device = ...``: refused. The model, its optimizer's state and the strategy were placed when the
    Trainer was built; replacing the option alone would leave them where they are and the batches going elsewhere."""
    raise AttributeError(
        f"trainer.device is fixed when the Trainer is built (the model and its optimizer state are on "
        f"{trainer.device}); to train on {device!r}, build a new one: Trainer(model, ..., device={str(device)!r})."
    )
