"""The learning-rate range test (Smith 2015; fastai's ``lr_find``): train a few steps while the learning
rate grows exponentially, watch the smoothed loss, stop when it diverges, and suggest a learning rate.

The sweep runs on the trainer's real model and optimizer, from a saved copy of their state that is put
back afterwards (parameters, buffers, optimizer state and hyperparameters, the fp16 scaler, torch's, Python's
and NumPy's RNGs and the loader's shuffling generator), so ``trainer.fit`` after ``trainer.lr_find`` starts
exactly where it would have started without it.

Suggestion rules (``LRFinderResult.suggestions``):

* ``"valley"`` (default, fastai's): the longest stretch over which the smoothed loss keeps decreasing;
  the LR a little past its first third. The search starts once the loss has fallen by 5% of its total
  drop, so a clean, slowly sloping start does not count as valley.
* ``"steepest"``: where the smoothed loss falls fastest per decade of LR (slope over a tenth of the
  sweep), before the minimum (the first
  10% of the points, where the average still rests on a few batches, are left out).
* ``"minimum/10"``: one tenth of the LR at the smoothed loss's minimum.
"""

from __future__ import annotations

import copy
import html
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._cancel import cancel_event
from nbtrainer._data._arrays import as_loaders
from nbtrainer._data._batch import batch_size_of, move_to_device
from nbtrainer._data._predict_collect import frozen_modules, train_mode
from nbtrainer._dist._placement import unwrap_model
from nbtrainer._loop._loop_state import window_loss
from nbtrainer._loop._put_back import ModelPutBack
from nbtrainer._loop._step import TrainStep
from nbtrainer._report._format import format_lr, format_number
from nbtrainer._setup._optim import move_optimizer_state
from nbtrainer._setup._seed import kept_rng, loader_generators

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._nonfinite import NonFiniteGuard

__all__ = ["LRFinderResult", "lr_find", "suggest"]

RULES = ("valley", "steepest", "minimum/10")


# =============================================================================================
# suggestions
# =============================================================================================


def _valley(losses: list[float]) -> int | None:
    """fastai's valley: index a little past the first third of the longest decreasing run."""
    n = len(losses)
    if n < 3:
        return None
    lds = [1] * n
    max_start = max_end = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and lds[i] < lds[j] + 1:
                lds[i] = lds[j] + 1
        if lds[max_end] < lds[i]:
            max_end = i
            max_start = max_end - lds[max_end]
    sections = (max_end - max_start) / 3
    return min(n - 1, max_start + int(sections) + int(sections / 2))


def _steepest(lrs: list[float], losses: list[float]) -> int | None:
    end = min(range(len(losses)), key=losses.__getitem__) + 1
    if end < 3:
        end = len(losses)
    if end < 3:
        return None
    x = [math.log10(v) for v in lrs[:end]]
    y = losses[:end]
    half = max(1, len(losses) // 20)  # slope over ~10% of the sweep: one noisy batch can't make it
    grads = []
    for i in range(end):  # central differences (one-sided at the ends)
        lo, hi = max(i - half, 0), min(i + half, end - 1)
        grads.append((y[hi] - y[lo]) / (x[hi] - x[lo]) if x[hi] != x[lo] else 0.0)
    skip = min(max(1, len(losses) // 10), end - 1)  # the EMA's first points are single, noisy batches
    return min(range(skip, end), key=grads.__getitem__)


def suggest(lrs: list[float], smoothed: list[float]) -> dict[str, float | None]:
    """The LR each rule suggests for a sweep (``None`` where the curve is too short to say).

    Example:
        >>> lrs = [10 ** (-5 + i / 4) for i in range(21)]
        >>> losses = [1 / (1 + math.exp(4 * (math.log10(lr) + 2.5))) + (lr > 0.3) * 10 * lr for lr in lrs]
        >>> s = suggest(lrs, losses)
        >>> 1e-4 < s["valley"] < 1e-2 and 1e-4 < s["steepest"] < 1e-2
        True
    """
    finite = [(lr, v) for lr, v in zip(lrs, smoothed, strict=True) if math.isfinite(v)]
    lrs = [lr for lr, _ in finite]
    losses = [v for _, v in finite]
    out: dict[str, float | None] = dict.fromkeys(RULES)
    if len(losses) < 3:
        return out
    # The valley starts where the loss has begun to fall (5% of its total drop): on a clean curve the
    # long, almost flat start is itself "decreasing" and would pull fastai's rule far to the left.
    first, low = losses[0], min(losses)
    start = next((i for i, v in enumerate(losses) if v < first - 0.05 * (first - low)), 0) if first > low else 0
    start = min(start, max(len(losses) - 3, 0))
    v = _valley(losses[start:])
    out["valley"] = lrs[start + v] if v is not None else None
    s = _steepest(lrs, losses)
    out["steepest"] = lrs[s] if s is not None else None
    out["minimum/10"] = lrs[min(range(len(losses)), key=losses.__getitem__)] / 10
    return out


# =============================================================================================
# the result
# =============================================================================================


@dataclass
class LRFinderResult:
    """What :func:`lr_find` measured.

    Attributes:
        lrs: the learning rate of each step (of parameter group 0; other groups keep their ratio to it).
        losses: the training loss of each step.
        smoothed: the bias-corrected exponential moving average of ``losses``.
        suggestions: ``{"valley": lr, "steepest": lr, "minimum/10": lr}`` (``None`` if undecidable).
        rule: the rule behind :attr:`suggestion`.
        stopped_early: the loss diverged (or became non-finite), or ``stop=`` was set, before ``steps``.
        stop_reason: why the sweep ended.
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestions: dict[str, float | None]
    rule: str = "valley"
    stopped_early: bool = False
    stop_reason: str = ""
    min_lr: float = 1e-7
    max_lr: float = 10.0
    steps: int = 100
    restored: list[str] = field(default_factory=list)

    @property
    def suggestion(self) -> float | None:
        """The LR of the default rule (:attr:`rule`)."""
        return self.suggestions.get(self.rule)

    @property
    def alternatives(self) -> dict[str, float | None]:
        """The other rules' suggestions."""
        return {k: v for k, v in self.suggestions.items() if k != self.rule}

    def to_pandas(self) -> Any:
        """``DataFrame`` with columns ``lr``, ``loss``, ``smoothed`` (index: step)."""
        import pandas as pd

        frame = pd.DataFrame({"lr": self.lrs, "loss": self.losses, "smoothed": self.smoothed})
        frame.index.name = "step"
        return frame

    def __repr__(self) -> str:
        def fmt(v: float | None) -> str:
            return "None" if v is None else format_lr(v)

        alts = ", ".join(f"{k}={fmt(v)}" for k, v in self.alternatives.items())
        return (
            f"LRFinderResult(suggestion={fmt(self.suggestion)} ({self.rule}); {alts}; "
            f"{len(self.lrs)}/{self.steps} steps, {self.stop_reason})"
        )

    # -- chart ---------------------------------------------------------------------------------
    def to_svg(self, width: int = 520, height: int = 300) -> str:
        """The smoothed loss against the LR (log axis), the raw loss faint, the suggestions marked."""
        pts = [
            (lr, raw, sm)
            for lr, raw, sm in zip(self.lrs, self.losses, self.smoothed, strict=True)
            if lr > 0 and math.isfinite(sm)
        ]
        left, right, top, bottom = 56, 14, 14, 40
        w, h = width - left - right, height - top - bottom
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" '
            f'class="nbt-lr-find" role="img" aria-label="LR finder: loss against learning rate">'
        )
        if len(pts) < 2:
            return head + f'<text x="{left}" y="{top + 20}">Too few points to plot ({self.stop_reason}).</text></svg>'
        x0, x1 = math.log10(pts[0][0]), math.log10(pts[-1][0])
        if x1 <= x0:
            x1 = x0 + 1
        sm = [p[2] for p in pts]
        i_min = min(range(len(sm)), key=sm.__getitem__)
        y_lo = sm[i_min]
        y_hi = max(sm[: i_min + 1])  # the plateau before the minimum; the divergence is clipped
        if y_hi - y_lo <= 1e-12 * max(1.0, abs(y_hi)):
            y_hi = y_lo + max(1e-3, abs(y_lo) * 0.1)
        pad = (y_hi - y_lo) * 0.08
        y_lo, y_hi = y_lo - pad, y_hi + 3 * pad

        def px(lr: float) -> float:
            return left + (math.log10(lr) - x0) / (x1 - x0) * w

        def py(v: float) -> float:
            v = min(max(v, y_lo), y_hi) if math.isfinite(v) else y_hi
            return top + (y_hi - v) / (y_hi - y_lo) * h

        parts = [head, f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#bbb"/>']
        for d in range(math.ceil(x0), math.floor(x1) + 1):  # decade ticks
            x = px(10.0**d)
            parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="#eee"/>')
            parts.append(f'<text x="{x:.1f}" y="{top + h + 14}" text-anchor="middle">1e{d}</text>')
        for k in range(5):
            v = y_lo + (y_hi - y_lo) * k / 4
            parts.append(f'<text x="{left - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{format_number(v)}</text>')
        parts.append(f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle">learning rate</text>')
        parts.append(
            f'<text x="12" y="{top + h / 2}" text-anchor="middle" transform="rotate(-90 12 {top + h / 2})">loss</text>'
        )
        raw = " ".join(f"{px(lr):.1f},{py(r):.1f}" for lr, r, _ in pts)
        smooth = " ".join(f"{px(lr):.1f},{py(s):.1f}" for lr, _, s in pts)
        parts.append(f'<polyline points="{raw}" fill="none" stroke="#9ecae1" stroke-width="1"/>')
        parts.append(f'<polyline points="{smooth}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
        colors = {"valley": "#d62728", "steepest": "#2ca02c", "minimum/10": "#9467bd"}
        for n, (rule, lr) in enumerate(self.suggestions.items()):
            if lr is None or not (10.0**x0 <= lr <= 10.0**x1):
                continue
            x, color = px(lr), colors.get(rule, "#555")
            dash = "" if rule == self.rule else ' stroke-dasharray="4 3"'
            parts.append(
                f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + h}" stroke="{color}"{dash}>'
                f"<title>{html.escape(rule)}: {format_lr(lr)}</title></line>"
            )
            parts.append(
                f'<text x="{x + 3:.1f}" y="{top + 12 + 12 * n}" fill="{color}">'
                f"{html.escape(rule)} {format_lr(lr)}</text>"
            )
        parts.append("</svg>")
        return "".join(parts)

    def _repr_html_(self) -> str:
        sug = self.suggestion
        head = (
            f"<b>LR finder</b>: suggestion <b>{format_lr(sug)}</b> ({html.escape(self.rule)})"
            if sug is not None
            else "<b>LR finder</b>: no suggestion"
        )
        alts = ", ".join(f"{html.escape(k)} {format_lr(v)}" for k, v in self.alternatives.items() if v is not None)
        return (
            f"<div class='nbt-lr-find'>{head}; {alts}<br>{self.to_svg()}<br>"
            f"<small>{len(self.lrs)} of {self.steps} steps, {format_lr(self.min_lr)} to {format_lr(self.max_lr)}: "
            f"{html.escape(self.stop_reason)}. Model and optimizer restored.</small></div>"
        )


# =============================================================================================
# the sweep
# =============================================================================================


class _Snapshot:
    """Everything the sweep changes, copied, and put back by :meth:`restore`."""

    def __init__(self, trainer: LoopHost, loader: Any) -> None:
        assert trainer.optimizer is not None  # lr_find refuses a trainer without one first
        self.optimizer = trainer.optimizer
        # what trains, the buffers and each module's training flag (a quantized base: its state dict does not load)
        self.model = ModelPutBack(unwrap_model(trainer.model), self.optimizer)
        self.opt_state = copy.deepcopy(self.optimizer.state_dict())
        self.scaler = trainer.scaler
        self.scaler_state = copy.deepcopy(trainer.scaler.state_dict()) if trainer.scaler is not None else None
        # the random generators (the global ones and the loader's own) are kept around the sweep (kept_rng)
        self.data_order = bool(loader_generators(loader))

    def restore(self) -> list[str]:
        self.model.restore()
        self.optimizer.load_state_dict(self.opt_state)
        what = ["model", "optimizer"]
        if self.scaler is not None and self.scaler_state is not None:
            self.scaler.load_state_dict(self.scaler_state)
            what.append("grad scaler")
        if self.data_order:
            what.append("data order")
        return [*what, "RNG"]


def _batches(loader: Iterable) -> Iterable[Any]:
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("train_loader is empty: nothing to run the LR sweep on.")


def lr_find(
    trainer: LoopHost,
    train_loader: Iterable,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    steps: int = 100,
    *,
    batch_size: int | None = None,
    shuffle: bool | None = None,
    smoothing: float = 0.98,
    diverge: float = 4.0,
    rule: str = "valley",
    stop: threading.Event | None = None,
    nonfinite: NonFiniteGuard | None = None,
) -> LRFinderResult:
    """Run the LR range test with ``trainer``'s model, optimizer, precision and accumulation.

    Each of ``steps`` optimizer steps uses the next ``trainer.grad_accum_steps`` batches (the loader is
    restarted when it runs out) at ``lr = min_lr * (max_lr / min_lr) ** (i / (steps - 1))``. The sweep
    stops early when the smoothed loss exceeds ``diverge`` times its best value (or a loss is not
    finite). The model, optimizer, scaler, RNGs and the loader's shuffling generator are restored
    afterwards, also when the sweep raises.

    Args:
        trainer: a :class:`~nbtrainer.Trainer` (not fitting).
        train_loader: the training batches, or arrays (``(x, y)``, a dict of arrays) with ``batch_size`` and
            ``shuffle`` as for ``fit``.
        min_lr, max_lr: the sweep's range (``0 < min_lr < max_lr``, finite).
        steps: optimizer steps of the whole sweep (>= 5).
        smoothing: EMA factor of the smoothed loss (bias-corrected).
        diverge: stop when ``smoothed > best + (diverge - 1) * |best|`` (a number > 1).
        rule: the default suggestion: ``"valley"``, ``"steepest"`` or ``"minimum/10"``.
        stop: a ``threading.Event`` another thread sets to end the sweep at the next optimizer step (the model and
            optimizer are restored as always; ``stop_reason`` says it was stopped). The panel's ``close()`` sets it.
        nonfinite: the trainer's NaN/inf gate (``Trainer.lr_find`` passes it): each step is fit's own
            :class:`~nbtrainer._loop._step.TrainStep` (DDP ``no_sync``, the NaN/inf gate, clipping after unscaling, each
            micro-batch weighted by its size),
            without the scheduler and the events (the sweep sets the LR itself).

    Returns:
        :class:`LRFinderResult`; set the LR with ``trainer.set_lr(result.suggestion)``.
    """
    if nonfinite is None:
        raise TypeError("lr_find needs the trainer's NaN/inf gate: call trainer.lr_find(...)")
    if trainer.run_state.fitting:
        raise RuntimeError("lr_find cannot run while fit() is running; stop the run first.")
    if not (isinstance(min_lr, (int, float)) and isinstance(max_lr, (int, float)) and 0 < min_lr < max_lr < math.inf):
        raise ValueError(f"Need 0 < min_lr < max_lr, both finite, got min_lr={min_lr!r}, max_lr={max_lr!r}.")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 5:
        raise ValueError(f"steps must be an int >= 5, got {steps!r}.")
    train_loader, _ = as_loaders(train_loader, batch_size=batch_size, shuffle=shuffle, caller="lr_find")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}.")
    # diverge <= 1 ends the sweep at its second step (any loss is above 'best' times it): no curve, no suggestion
    if isinstance(diverge, bool) or not isinstance(diverge, (int, float)) or not 1 < diverge < math.inf:
        raise ValueError(
            f"diverge must be a number > 1 (stop once the smoothed loss exceeds that many times its best), got "
            f"{diverge!r}; the default 4.0 is fastai's."
        )
    cancel_event(stop, caller="lr_find", keyword="stop")
    trainer.model = trainer.strategy.setup_model(trainer.model)
    opt, model = trainer.optimizer, trainer.model
    assert opt is not None  # Trainer.lr_find refuses a trainer without one
    move_optimizer_state(opt, trainer.device)
    step = TrainStep(trainer, nonfinite, events=False, schedule=False)  # the sweep sets the LR: no scheduler, events
    groups = opt.param_groups
    ref = float(groups[0]["lr"])
    factors = [float(g["lr"]) / ref if ref > 0 else 1.0 for g in groups]
    ratio = (max_lr / min_lr) ** (1.0 / (steps - 1))
    k = trainer.grad_accum_steps
    lrs: list[float] = []
    losses: list[float] = []
    smoothed: list[float] = []
    avg, best = 0.0, math.inf
    reason = f"reached max_lr={format_lr(max_lr)}"
    stopped = False
    snap = _Snapshot(trainer, train_loader)
    hooks = step.attach()  # optimizer_in_backward: the sweep's updates happen in backward too
    try:
        # every random generator as it was: torch's, Python's and NumPy's (a dataset's augmentation may draw from
        # those: albumentations, random.random()) and the loader's own, so the fit after the sweep sees them unmoved
        with kept_rng(train_loader):
            train_mode(model, frozen_modules(model))  # as fit trains it: a frozen BatchNorm stays frozen
            opt.zero_grad(set_to_none=True)
            batches = iter(_batches(train_loader))
            for i in range(steps):
                if stop is not None and stop.is_set():
                    reason, stopped = f"stopped at step {i} of {steps}", True
                    break
                lr = min_lr * ratio**i
                for g, f in zip(groups, factors, strict=True):
                    g["lr"] = lr * f
                parts: list[torch.Tensor] = []
                sizes: list[int] = []
                guard, batch_steps = nonfinite, trainer.batch_steps
                for j in range(k):
                    batch = move_to_device(next(batches), trainer.device, trainer.options.data.non_blocking)
                    with step.no_sync(j == k - 1):
                        with batch_steps.autocast():
                            loss, outputs, targets = batch_steps.compute(batch)
                        if i == 0 and j == 0:
                            batch_steps.check_first_loss(loss, outputs, targets)
                        if guard.gating:
                            guard.observe(loss)
                        # weighted by its items in its window, as fit weighs it: a smaller last batch counts less
                        sizes.append(batch_size_of(targets, batch))
                        step.backward(loss, k, sizes[-1], j + 1)
                    parts.append(loss.detach())
                    del loss, outputs, targets, batch
                step.step(step.window_rescale(k, k))
                # one read per step (the sweep needs the curve as it goes), the step's loss as fit records it
                value = window_loss(list(zip(torch.stack(parts).float().tolist(), sizes, strict=True)))
                lrs.append(lr)
                losses.append(value)
                if not math.isfinite(value):
                    smoothed.append(math.nan)
                    reason, stopped = f"loss not finite at lr={format_lr(lr)}", True
                    break
                avg = smoothing * avg + (1 - smoothing) * value
                smooth = avg / (1 - smoothing ** (i + 1))
                smoothed.append(smooth)
                best = min(best, smooth)
                if i > 0 and smooth > best + (diverge - 1) * max(abs(best), 1e-12):
                    reason, stopped = f"diverged at lr={format_lr(lr)}", True
                    break
    finally:
        hooks.remove()
        restored = snap.restore()
    result = LRFinderResult(
        lrs=lrs,
        losses=losses,
        smoothed=smoothed,
        suggestions=suggest(lrs, smoothed),
        rule=rule,
        stopped_early=stopped,
        stop_reason=reason,
        min_lr=float(min_lr),
        max_lr=float(max_lr),
        steps=steps,
        restored=restored,
    )
    trainer.run_state.lr_finder = result  # Health's LR advice takes its valley
    return result
