"""Manual optimization: ``Trainer(model, None, optimizer={"d": opt_d, "g": opt_g}, training_step=fn)``.

``fn(step, batch)`` trains one micro-batch itself (a GAN's two updates, a custom schedule of steps) through the
:class:`StepHandle` it gets, and returns a dict of named scalar tensors, logged like metrics (read at the throttled
refresh, never synced here); ``"loss"``, when present, is the History's loss, else the first value is also the loss
and keeps its own name (``{"d_loss": ..., "g_loss": ...}`` logs ``loss``, ``d_loss`` and ``g_loss``). The handle
keeps what the Trainer promises for an automatic step:

* ``step.backward(loss, optimizer="d")``: scaled by the fp16 ``GradScaler``, divided by the size of the actual
  accumulation window; with a name only that optimizer's parameters get gradients (a generator's loss leaves the
  discriminator's gradients alone, as ``zero_grad`` before each update does in a hand loop);
* ``step.step("d", closure=None)``: unscale, clip (``max_grad_norm``, that optimizer's parameters), the non-finite
  gate, the step, that optimizer's scheduler and ``zero_grad``; under accumulation only at the window's last
  micro-batch (earlier calls are no-ops, so every optimizer steps once per window).

``fn`` runs under the precision's autocast; backward and the steps run outside it, as in torch's AMP recipe, and each
step drops autocast's low-precision copies of the weights, so a forward after ``step.step("d")`` (the generator's
loss) sees D as just updated.

A window in which ``fn`` never called ``step.step`` is refused at the first one (nothing would train).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from nbtrainer._data._batch import batch_size_of
from nbtrainer._data._step_result import check_step_result
from nbtrainer._loop._host import scheduler_per_step
from nbtrainer._setup._optimizers import Optimizers

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._nonfinite import NonFiniteGuard

__all__ = ["ManualStep", "StepHandle", "check_manual"]

_NULL = contextlib.nullcontext()


class StepHandle:
    """What ``training_step(step, batch)`` gets: ``step.model``, ``step.backward``, ``step.step``.

    Example:
        >>> def training_step(step, batch):
        ...     x, _ = batch
        ...     loss = step.model(x).pow(2).mean()
        ...     step.backward(loss, optimizer="main")
        ...     step.step("main")
        ...     return {"loss": loss}
    """

    def __init__(self, host: LoopHost, nonfinite: NonFiniteGuard) -> None:
        self._host, self._nonfinite = host, nonfinite
        self._per_step = scheduler_per_step(host)
        self._window = 1
        self._closes = True
        self._batch_bad: torch.Tensor | None = None  # on_nonfinite gating: a loss of this micro-batch was non-finite
        self.held: set[str] = set()  # names whose step the window's close held back (non-finite loss, fp16 overflow)
        self.called: set[str] = set()  # names given to step() in the current window
        self.stepped: set[str] = set()  # names whose optimizer really stepped in the current window
        #: every param group's LR before the window's first scheduler step (the LRs its steps used), else None
        self.used_lrs: list[float] | None = None

    @property
    def model(self) -> torch.nn.Module:
        """The model to call. Under DDP the module inside the wrapper: DDP reduces gradients in backward only
        after its own forward and expects every parameter it saw to get one, which a GAN's partial backward
        (the discriminator's loss) breaks; :meth:`step` averages each optimizer's gradients across ranks instead,
        once per window."""
        model = self._host.model
        return model.module if isinstance(model, DistributedDataParallel) else model

    @property
    def optimizers(self) -> Any:
        return self._host.optimizer

    def _optimizer(self, name: str, what: str) -> torch.optim.Optimizer:
        children: dict[str, torch.optim.Optimizer] = getattr(self._host.optimizer, "optimizers", {})
        if name not in children:
            raise ValueError(f"step.{what}({name!r}): no optimizer of that name; the optimizers are {list(children)}.")
        return children[name]

    def backward(self, loss: torch.Tensor, optimizer: str | None = None) -> None:
        """Back-propagate ``loss`` as this micro-batch's share of the window (fp16: scaled). ``optimizer``: only
        that optimizer's parameters get gradients."""
        host = self._host
        inputs = None
        if optimizer is not None:
            opt = self._optimizer(optimizer, "backward")
            inputs = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
            if not inputs:  # frozen since the fit started (a callback): torch's own error would not say which
                raise frozen_optimizer(optimizer, opt)
        guard = self._nonfinite
        if guard.gating:
            guard.observe(loss)
            bad = ~torch.isfinite(loss.detach())
            self._batch_bad = bad if self._batch_bad is None else self._batch_bad | bad
        scaled = loss / self._window if self._window != 1 else loss
        scaler = host.scaler
        if scaler is not None:
            scaled = scaler.scale(scaled)
        with self._outside_autocast():
            torch.autograd.backward(scaled, inputs=inputs)

    def _outside_autocast(self) -> contextlib.AbstractContextManager[Any]:
        """torch's AMP recipe: backward and the optimizer step run outside autocast, which ``fn`` runs inside."""
        kind = self._host.device.type
        return torch.autocast(kind, enabled=False) if torch.is_autocast_enabled(kind) else _NULL

    def step(self, name: str, closure: Callable[[], Any] | None = None) -> None:
        """Step the optimizer ``name`` (see the module docstring); a no-op before the window's last micro-batch."""
        opt = self._optimizer(name, "step")
        self.called.add(name)
        if not self._closes:
            return
        kind = self._host.device.type
        if not torch.is_autocast_enabled(kind):
            self._update(name, opt, closure)
            return
        if closure is not None:
            closure = _under_autocast(closure, kind, torch.get_autocast_dtype(kind))
        with torch.autocast(kind, enabled=False):
            self._update(name, opt, closure)
        # autocast keeps its low-precision copies of the weights until the outermost region exits, and an in-place
        # update does not invalidate them: a later forward in fn would use the weights from before this step
        torch.clear_autocast_cache()

    def _update(self, name: str, opt: torch.optim.Optimizer, closure: Callable[[], Any] | None) -> None:
        host = self._host
        params = [p for g in opt.param_groups for p in g["params"]]
        if isinstance(host.model, DistributedDataParallel):
            average_gradients(params, host.model.process_group)
        scaler = host.scaler
        if scaler is not None:
            scaler.unscale_(opt)
        max_norm = host.options.step.max_grad_norm
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)  # the norm is never read: no sync
        guard = self._nonfinite
        # every loss of the window so far: one back-propagated after an earlier step.step is not in that step
        allowed = guard.allow_step(opt, scaler, keep=True) if guard.gating else True
        did: list[bool] = []
        hook = opt.register_step_post_hook(lambda *_: did.append(True))
        try:
            if scaler is not None:
                scaler.step(opt, closure) if closure is not None else scaler.step(opt)
            elif allowed:
                opt.step(closure) if closure is not None else opt.step()
        finally:
            hook.remove()
        (self.stepped if did else self.held).add(name)
        schedulers = getattr(host.scheduler, "schedulers", None)
        if did and schedulers and name in schedulers and self._per_step:
            if self.used_lrs is None:
                groups: list[dict[str, Any]] = getattr(host.optimizer, "param_groups", [])
                self.used_lrs = [g["lr"] for g in groups]
            schedulers[name].step()
        opt.zero_grad(set_to_none=True)


def _under_autocast(closure: Callable[[], Any], kind: str, dtype: torch.dtype) -> Callable[[], Any]:
    """A closure's forward in ``fn``'s autocast, with casts of the weights as they are at each call (a line search
    evaluates it again after changing them)."""

    def run() -> Any:
        torch.clear_autocast_cache()
        with torch.autocast(kind, dtype=dtype):
            return closure()

    return run


def average_gradients(params: list[torch.Tensor], group: Any) -> None:
    """Average the gradients of ``params`` across the ranks of ``group`` in one all-reduce (the window's only
    gradient sync), as DDP would have. Parameters without a gradient keep none (an optimizer skips them); which
    parameters have one must be the same on every rank, as DDP requires (else the ranks' buffers differ in size
    and the collective fails)."""
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])  # no host read: the step stays asynchronous
    dist.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group))
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g))
        offset += n


class ManualStep:
    """One micro-batch through the user's ``training_step`` (see the module docstring)."""

    def __init__(self, host: LoopHost, fn: Callable[[StepHandle, Any], Any], nonfinite: NonFiniteGuard) -> None:
        self.host = host
        self.fn = fn
        self.handle = StepHandle(host, nonfinite)
        self.keys: list[str] | None = None
        children: dict[str, torch.optim.Optimizer] = getattr(host.optimizer, "optimizers", {})
        for name, opt in children.items():  # before the first step: another optimizer may not have stepped yet
            if not any(p.requires_grad for g in opt.param_groups for p in g["params"]):
                raise frozen_optimizer(name, opt)

    def run(self, batch: Any, window: int, closes: bool, amp: Any) -> tuple[torch.Tensor, int]:
        """``fn(step, batch)`` under autocast; returns the main loss (on the device) and the batch size."""
        handle = self.handle
        if handle._closes:  # a new window starts
            handle.called, handle.stepped, handle.held, handle.used_lrs = set(), set(), set(), None
            handle._nonfinite.new_window()
        handle._window, handle._closes, handle._batch_bad = window, closes, None
        with amp:
            result = self.fn(handle, batch)
        values = check_step_result(result, self.keys)
        self.keys = list(values)
        main = values.pop("loss", None)
        if main is None:  # the first value is also the loss, and keeps its own name in the History
            main = next(iter(values.values()))
        if values:
            self.host.run_state.train_metrics.add_values(values)
        main = main.detach().reshape(())
        bad = handle._batch_bad
        if bad is not None:  # a skipped window's logged loss is non-finite: left out, and reported (_nonfinite)
            main = torch.where(bad, torch.full_like(main, float("nan")), main)
        return main, batch_size_of(None, batch)

    def window_closed(self, first_window: bool) -> bool:
        """After the window's last micro-batch: whether it counts as stepped (some optimizer stepped and none was held
        back). The first window without any ``step.step`` call is refused."""
        handle = self.handle
        if first_window and not handle.called:
            raise ValueError(
                "training_step never called step.step(name) during its first accumulation window: nothing would "
                f"train. Call step.step(...) for each optimizer ({list(getattr(self.host.optimizer, 'names', []))}) "
                "after its step.backward(...)."
            )
        return bool(handle.stepped) and not handle.held


def frozen_optimizer(name: str, opt: torch.optim.Optimizer) -> ValueError:
    n = sum(len(g["params"]) for g in opt.param_groups)
    return ValueError(
        f"training_step=: the optimizer {name!r} holds no parameter that trains (its {n} tensors are all frozen, "
        f"requires_grad=False, e.g. by freeze= / trainable=), so step.backward(loss, optimizer={name!r}) has nothing "
        f"to give gradients to. Unfreeze some of them, or drop it from optimizer={{...}} and its step.backward / "
        "step.step calls from training_step."
    )


def check_manual(
    training_step: Any,
    validation_step: Any,
    *,
    criterion: Any,
    compute_loss: Any,
    optimizer: Any,
    metrics: Any,
    strategy: Any,
    options: dict[str, Any],
) -> None:
    """``training_step=`` / ``validation_step=`` and what they cannot be combined with, refused with the fix."""
    if validation_step is not None and training_step is None:
        raise ValueError("validation_step= goes with training_step= (manual optimization); use compute_loss= else.")
    if training_step is None:
        return
    for name, fn in (("training_step", training_step), ("validation_step", validation_step)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a function, got {type(fn).__name__}.")
    if criterion is not None or compute_loss is not None:
        raise ValueError(
            "training_step= computes its own losses: pass criterion=None and no compute_loss= "
            "(Trainer(model, None, optimizer={...}, training_step=fn))."
        )
    if not isinstance(optimizer, Optimizers):
        raise ValueError(
            "training_step= steps its optimizers by name: pass optimizer={'name': torch.optim.AdamW(...), ...} "
            "(one entry for a single optimizer)."
        )
    if metrics:
        raise ValueError(
            "metrics= are computed from the model's outputs, which a training_step keeps to itself: return the "
            "values from training_step instead ({'loss': ..., 'acc': ...}): each is logged like a metric."
        )
    for name, value in options.items():
        if value:
            raise ValueError(f"training_step= cannot be combined with {name}={value!r}. Remove that option.")
    if strategy.shards_parameters:  # FSDP: its reduce-scatter runs inside every backward
        raise ValueError(
            "training_step= with strategy='fsdp' is not supported: FSDP2 reduce-scatters gradients inside each "
            "backward, while a manual step averages each optimizer's gradients across ranks once per window, at "
            "its step.step. Use strategy='ddp' (or one device)."
        )
