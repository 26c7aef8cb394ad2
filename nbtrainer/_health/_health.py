"""``nbtrainer.Health``: training health as a consumer of the event stream, which says what went wrong and acts.

Signals and what each costs (none adds a host read per step; ``tests/loop/test_sync_budget.py`` holds it):

* gradient and update norms (``_norms``): on the device at the first step of a fit and every ``every_n_steps``
  steps, read at the refresh with one ``tolist()``;
* loss spikes and a rising loss (``_loss``): from the per-step losses the refresh has already read;
* non-finite values (``_locate``): a window whose step was skipped (``on_nonfinite="skip"/"stop"``, or fp16's
  scaler) has its losses read (a skipped step is rare) and, when one is non-finite, its batch is run once more
  with forward hooks that name the first module whose output is non-finite; the batches of the open window are
  references the loop had anyway (no copy), dropped at each optimizer step;
* dead units: one diagnostic forward of one batch at the end of each epoch;
* data wait: the step-time samples the loop already takes (``Progress.step_times``);
* learning-rate advice (``_advice``): from the LR series the refresh delivers and ``on_control`` events.

Per step it only keeps references (the batch, the loss tensor) and appends ``(step, epoch, batch)`` to a deque.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer._dist._placement import unwrap_model
from nbtrainer._events._callbacks import Callback
from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._health._advice import data_advice, suggest_lr
from nbtrainer._health._health_report import KINDS, SIGNALS, HealthReport, SignalState
from nbtrainer._health._judge import Draft, judge_dead, judge_norms
from nbtrainer._health._locate import dead_units, locate_nonfinite
from nbtrainer._health._loss_watch import LossWatch
from nbtrainer._health._norms import NormProbe, hook_step
from nbtrainer._loop._closure import needs_closure
from nbtrainer._loop._nonfinite import NonFiniteLossError
from nbtrainer._report._format import format_lr, format_number

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["ON_PROBLEM", "Health"]

log = logging.getLogger(__name__)

ON_PROBLEM = ("warn", "pause", "stop")
DATA_SHARE = 0.3  # the loader taking this share of the step time gets a warning


def _check(every_n_steps: Any, on_problem: Any, spike_zscore: Any, window: Any) -> None:
    if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
        raise ValueError(
            f"Health(every_n_steps=...) must be an int >= 1 (measure the gradient norms every that many optimizer "
            f"steps), got {every_n_steps!r}. Use every_n_steps=50 (the default) or larger for less overhead."
        )
    if on_problem not in ON_PROBLEM:
        raise ValueError(
            f"Health(on_problem=...) must be one of {', '.join(repr(m) for m in ON_PROBLEM)}, got {on_problem!r}: "
            "'warn' reports and trains on, 'pause' also pauses at the next step boundary, 'stop' ends the run "
            "(saving last.ckpt when a ModelCheckpoint(save_last=True) is there)."
        )
    if isinstance(spike_zscore, bool) or not isinstance(spike_zscore, (int, float)) or not spike_zscore > 0:
        raise ValueError(f"Health(spike_zscore=...) must be a number > 0 (e.g. 6.0), got {spike_zscore!r}.")
    if not isinstance(window, int) or isinstance(window, bool) or window < 8:
        raise ValueError(f"Health(window=...) must be an int >= 8 (steps of loss statistics), got {window!r}.")


def _params(optimizer: Any) -> list[Any]:
    groups = list(getattr(optimizer, "param_groups", None) or [])
    for child in (getattr(optimizer, "optimizers", None) or {}).values():
        groups += child.param_groups
    seen: dict[int, Any] = {}
    for group in groups:
        for p in group["params"]:
            seen.setdefault(id(p), p)
    return list(seen.values())


class Health(Callback):
    """Watches a fit's health and says what went wrong, where, and what to do; acts on problems.

    Findings arrive as :class:`HealthReport` through the ``on_health(trainer, report)`` event (to the History, the
    progress line once per kind, the run store, MLflow and the panel's health card). Gradient norms per block and the
    update-to-weight ratios are kept in ``history.health["grad_norm"][name]`` / ``["update_ratio"][name]`` as
    ``(step, value)`` lists (``"total"``: the whole model). Nothing is read from the device per step.

    Args:
        every_n_steps: measure the gradient norms and update ratios at the first step of a fit and then every this
            many optimizer steps.
        on_problem: what a problem (not a warning) does: ``"warn"`` reports it, ``"pause"`` also pauses at the next
            step boundary, ``"stop"`` ends the run (writing ``last.ckpt`` when a ``ModelCheckpoint(save_last=True)``
            is there).
        spike_zscore: a loss more than this many standard deviations above the running mean is a spike.
        window: steps of loss statistics (spikes, a rising loss).

    Attributes:
        signals: ``{"gradients" | "loss" | "non-finite" | "learning rate" | "dead units" | "data": SignalState}``,
            a light (``"ok"``, ``"warning"``, ``"problem"``) and a one-line summary each, as of the last refresh.
        reports: this fit's reports, oldest first.

    Example:
        >>> import torch
        >>> from nbtrainer import Health, Trainer
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[Health()],
        ...                   progress=False)
        >>> history = trainer.fit([(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 4, epochs=1)
        >>> sorted(history.health["grad_norm"])
        ['0', '2', 'total']
    """

    def __init__(
        self, *, every_n_steps: int = 50, on_problem: str = "warn", spike_zscore: float = 6.0, window: int = 100
    ) -> None:
        _check(every_n_steps, on_problem, spike_zscore, window)
        self.every_n_steps = every_n_steps
        self.on_problem = on_problem
        self.spike_zscore = float(spike_zscore)
        self.window = window
        self.signals: dict[str, SignalState] = {s: SignalState() for s in SIGNALS}
        self.reports: list[HealthReport] = []
        self._probe: NormProbe | None = None
        self._hooks: list[Any] = []
        self._batches: list[Any] = []
        self._losses: list[Any] = []
        self._last_batch: Any = None
        self._model: Any = None

    @property
    def last_problem(self) -> HealthReport | None:
        """The newest report of this fit with level ``"problem"`` (what the panel's buttons act on)."""
        return next((r for r in reversed(self.reports) if r.level == "problem"), None)

    # -- a fit starts and ends ----------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        self.reports = []
        self.signals = {s: SignalState() for s in SIGNALS}
        st = trainer.run_state.loop_state
        self._epoch = st.epoch + (2 if st.epoch_complete else 1)
        self._model = unwrap_model(trainer.model)
        params = _params(trainer.optimizer)
        why = self._why_no_norms(trainer)
        self._probe = NormProbe(self._model, params) if why is None and params else None
        if why is not None:
            self.signals["gradients"] = SignalState("ok", f"not measured: {why}")
            self.signals["learning rate"] = SignalState("ok", f"update ratio not measured: {why}")
        self._loss = LossWatch(window=self.window, zscore=self.spike_zscore)
        self._where: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=1 << 16)
        self._batches, self._losses, self._last_batch, self._batch_idx = [], [], None, 0
        self._lrs: collections.deque[tuple[int, float]] = collections.deque(maxlen=self.window + 1)
        self._lr_raised_at: int | None = None
        self._grad_totals: list[float] = []
        self._data: list[float] = []
        self._times: Any = None
        self._reported: dict[str, int] = {}  # kind -> step of its last report (one per window steps)
        self._skipped_nonfinite = 0
        self._first_step = trainer.global_step + 1
        self._step = trainer.global_step
        self.signals["non-finite"] = SignalState("ok", "every loss finite so far")
        if not trainer.options.run.timing_every:
            self.signals["data"] = SignalState("ok", "not measured (Trainer(timing_every=0))")
        self._arm(trainer, self._first_step)

    def on_fit_end(self, trainer: LoopHost, history: Any) -> None:
        self._unhook()
        if self._probe is not None:
            self._probe.forget()
        self._batches, self._losses, self._last_batch = [], [], None  # no batch outlives the fit

    @staticmethod
    def _why_no_norms(trainer: LoopHost) -> str | None:
        if trainer.options.memory.optimizer_in_backward:
            return "with optimizer_in_backward the gradients never exist together"
        if trainer.batch_steps.training_step_fn is not None:
            return "training_step steps the optimizers itself"
        if needs_closure(trainer.optimizer):
            return "LBFGS computes its gradients inside its step"
        if trainer.strategy.shards_parameters:
            return "FSDP shards the gradients"
        return None

    # -- per micro-batch and per step: references only --------------------------------------------------------
    def on_epoch_start(self, trainer: LoopHost, epoch: int) -> None:
        self._epoch = epoch

    def on_train_batch_start(self, trainer: LoopHost, batch: Any, batch_idx: int) -> None:
        self._batches.append(batch)
        self._batch_idx = batch_idx

    def on_train_batch_end(self, trainer: LoopHost, batch_idx: int, loss: Any) -> None:
        self._losses.append(loss)

    def on_optimizer_step(self, trainer: LoopHost, step: int, skipped: bool) -> None:
        if self._hooks:
            self._unhook()
        if skipped and self._losses:
            self._after_skip(trainer, step)
        self._where.append((step, self._epoch, self._batch_idx))
        batches = self._batches
        if batches:
            self._last_batch = batches[-1]
            batches.clear()
            self._losses.clear()
        if not (step + 1) % self.every_n_steps:
            self._arm(trainer, step + 1)

    def _arm(self, trainer: LoopHost, step: int) -> None:
        """Hook the optimizer's next step (``step``) to measure it; removed at its ``on_optimizer_step``."""
        probe = self._probe
        if probe is None or trainer.optimizer is None:
            return
        loop = trainer.run_state.loop

        def before(optimizer: Any) -> None:
            pre_clip = loop.grad_norm if loop is not None else None
            probe.before_step(pre_clip, trainer.max_grad_norm, ratio=True)

        self._hooks = hook_step(trainer.optimizer, probe, before, lambda optimizer: probe.after_step(step))

    def _unhook(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # -- the refresh: values already on the host ------------------------------------------------------------------
    def on_refresh(self, trainer: LoopHost, progress: Any) -> None:
        self._step = progress.global_step
        if self._probe is not None and self._probe.pending:
            self._read_norms(trainer)
        if progress.step_points:
            self._watch_loss(trainer, progress.step_points)
        times = progress.step_times
        if times and times is not self._times:
            self._times = times
            # the loop samples micro-batches 1, 11, 51...: past the 11th, a sample is not the loader's start
            warm = progress.global_step * max(progress.grad_accum_steps, 1) > 11
            self._data_sample(trainer, progress.global_step, times, warm)

    def _store(self, trainer: LoopHost, key: str, name: str, step: int, value: float) -> None:
        trainer.history.health.setdefault(key, {}).setdefault(name, []).append((step, value))

    def _read_norms(self, trainer: LoopHost) -> None:
        probe = self._probe
        assert probe is not None
        names = ["total", *probe.names]
        for step, grads, ratios, weights in probe.read():
            for name, value in zip(names, grads, strict=True):
                self._store(trainer, "grad_norm", name, step, value)
            if ratios is not None:
                for name, value in zip(names, ratios, strict=True):
                    self._store(trainer, "update_ratio", name, step, value)
            lr = self._lrs[-1][1] if self._lrs else None
            drafts, lights = judge_norms(step, probe.names, grads, ratios, weights, self._grad_totals, lr)
            self._light(lights)
            for draft in drafts:
                self._file(trainer, draft)

    def _light(self, lights: dict[str, SignalState]) -> None:
        """New states of the lights; a problem stays lit for ``window`` steps after its report."""
        for signal, state in lights.items():
            held = self.signals[signal]
            if held.level == "problem" and state.level != "problem" and not self._cleared(signal):
                continue
            self.signals[signal] = state

    def _cleared(self, signal: str) -> bool:
        kinds = [k for k, s in KINDS.items() if s == signal]
        steps = [self._reported[k] for k in kinds if k in self._reported]
        return not steps or self._step - max(steps) >= self.window

    def _watch_loss(self, trainer: LoopHost, points: list[tuple[int, float, float]]) -> None:
        self._lrs.extend((step, lr) for step, _, lr in points)
        where = {}
        last = points[-1][0]
        queue = self._where
        while queue and queue[0][0] <= last:
            s, epoch, batch = queue.popleft()
            where[s] = (epoch, batch)
        for spike in self._loss.add([(step, loss) for step, loss, _ in points]):
            epoch, batch = where.get(spike.step, (self._epoch, -1))
            at = f"step {spike.step}" + (f", batch {batch} of epoch {epoch}" if batch >= 0 else "")
            raised = self._lr_raised(spike.step)
            advice = (
                f"It follows an LR increase ({raised})."
                if raised
                else "A bad batch or too large a step: Trainer(max_grad_norm=1.0) clips such steps; "
                f"look at batch {batch} of epoch {epoch}."
            )
            message = (
                f"the loss spiked to {format_number(spike.loss)} at {at}: {spike.zscore:.0f} standard deviations "
                f"above the mean {format_number(spike.mean)} of the last steps"
            )
            data = {"batch": batch, "loss": spike.loss, "mean": spike.mean}
            self._file(
                trainer, Draft("loss_spike", spike.step, message, advice, data, lr_advice=bool(raised), epoch=epoch)
            )
        rise = self._loss.rise(last)
        if rise is not None:
            message = (
                f"the loss rose from {format_number(rise.before)} to {format_number(rise.after)} over the last "
                f"{self.window} steps"
            )
            data = {"before": rise.before, "after": rise.after}
            self._file(trainer, Draft("loss_rise", last, message, "The training is diverging.", data, lr_advice=True))
        mean = self._loss.mean
        if mean is not None:
            self._light({"loss": SignalState("ok", f"mean {format_number(mean)} over the last steps, no spike")})

    def _lr_raised(self, step: int) -> str | None:
        """Why the LR at ``step`` counts as raised: a warm-up or a change within the last ``window`` steps."""
        if self._lr_raised_at is not None and 0 <= step - self._lr_raised_at <= self.window:
            return f"set at step {self._lr_raised_at}"
        recent = [lr for s, lr in self._lrs if s <= step]
        if len(recent) >= 2 and recent[-1] > 1.05 * min(recent[:-1]):
            return "the LR is warming up or was raised"
        return None

    def _data_sample(self, trainer: LoopHost, step: int, times: dict[str, float], warm: bool) -> None:
        total = sum(times.values())
        if total <= 0:
            return
        share = times.get("data", 0.0) / total
        self._data.append(share)
        trainer.history.health.setdefault("data_wait", []).append((step, share))
        # two samples in a row, or one taken past the start (a worker starting up must not read as a slow loader)
        recent = self._data[-2:] if len(self._data) >= 2 or not warm else self._data[-1:]
        level = "warning" if (len(recent) == 2 or warm) and min(recent) > DATA_SHARE else "ok"
        self._light({"data": SignalState(level, f"waiting for data {share:.0%} of the step time")})
        if level == "warning":
            loop = trainer.run_state.loop
            advice = data_advice(
                loop.train_loader if loop is not None else None,
                mode=loop.data_mode if loop is not None else None,
                device_type=trainer.device.type,
                fast_fetch=trainer.options.data.fast_fetch,
            )
            message = f"the step waits for the loader {sum(recent) / len(recent):.0%} of its time (step-time samples)"
            self._file(trainer, Draft("data_wait", step, message, advice, {"share": share}, level="warning"))

    # -- the epoch's end: dead units -------------------------------------------------------------------------------
    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        batch = self._last_batch
        if batch is None or trainer.batch_steps.training_step_fn is not None:
            return
        names = self._probe.names if self._probe is not None else []
        try:
            found = dead_units(
                self._model, trainer.batch_steps.compute, batch, trainer.batch_steps.autocast(), _owner(names)
            )
        except Exception as exc:  # a diagnostic never ends the run: the light says why it could not look
            log.debug("the dead-units diagnostic failed (it never ends the run): its light says why", exc_info=True)
            self._light({"dead units": SignalState("ok", f"not checked: {type(exc).__name__}: {exc}"[:120])})
            return
        step = trainer.global_step
        drafts, lights, shares = judge_dead(found, step, epoch)
        for block, share in shares.items():
            self._store(trainer, "dead_units", block, step, share)
        self._light(lights)
        for draft in drafts:
            self._file(trainer, draft)

    # -- non-finite losses ------------------------------------------------------------------------------------
    def _after_skip(self, trainer: LoopHost, step: int) -> None:
        import torch

        losses = self._losses
        values = torch.stack([loss.detach().float().reshape(()) for loss in losses]).tolist()  # a skipped step only
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if not bad:
            return  # fp16 overflow with a finite loss: the scaler's own business
        self._skipped_nonfinite += 1
        self._light(
            {
                "non-finite": SignalState(
                    "problem", f"{self._skipped_nonfinite} step(s) skipped, the last at step {step}"
                )
            }
        )
        if self._throttled("nonfinite", step):
            return
        i = bad[0]
        batch_idx = self._batch_idx - (len(losses) - 1 - i)
        where = f"at step {step}, batch {batch_idx} of epoch {self._epoch}"
        data: dict[str, Any] = {"batch": batch_idx, "skipped": True, "where": "loss"}
        if i < len(self._batches) and trainer.batch_steps.training_step_fn is None and not trainer.strategy.distributed:
            finding = locate_nonfinite(
                self._model, trainer.batch_steps.compute, self._batches[i], trainer.batch_steps.autocast()
            )
            message = f"{finding.describe()} {where}"
            data.update(where=finding.where, module=finding.module, module_type=finding.type, value=finding.value)
        else:
            message = f"the loss is {'NaN' if math.isnan(values[i]) else 'inf'} {where}"
        advice = "That step was skipped: the weights are as they were before it."
        self._file(trainer, Draft("nonfinite", step, message, advice, data, lr_advice=bool(self._lr_raised(step))))

    def on_exception(self, trainer: LoopHost, exception: BaseException) -> None:
        if not isinstance(exception, NonFiniteLossError) or any(r.kind == "nonfinite" for r in self.reports):
            return
        first = str(exception).split(". ")[0]
        advice = (
            "That step updated the weights, so where it started cannot be found now: Trainer(on_nonfinite='skip') "
            "keeps the weights of such a step, and Health then names the module where the value first appears."
        )
        draft = Draft("nonfinite", trainer.global_step, f"{first} (on_nonfinite='raise' ended the fit)", advice)
        draft.data, draft.lr_advice = {"where": "loss", "skipped": False}, True
        self._file(trainer, draft, act=False)

    # -- control: a changed LR, a rollback ------------------------------------------------------------------
    def on_control(self, trainer: LoopHost, event: dict[str, Any]) -> None:
        kind = event.get("kind", "")
        if kind.startswith("lr"):
            old, new = event.get("old"), event.get("new")
            if isinstance(old, (int, float)) and isinstance(new, (int, float)) and new > old:
                self._lr_raised_at = int(event.get("step") or 0)
        elif kind == "rollback":  # the steps after the checkpoint are gone: so are their statistics
            self._loss.reset()
            self._where.clear()
            self._grad_totals.clear()
            self._batches.clear()
            self._losses.clear()
            if self._probe is not None:
                self._probe.forget()
            self._unhook()
            st = trainer.run_state.loop_state
            self._epoch = st.epoch + (2 if st.epoch_complete else 1)
            self._arm(trainer, trainer.global_step + 1)

    # -- reporting and acting ------------------------------------------------------------------------------------
    def _throttled(self, kind: str, step: int) -> bool:
        """One report of a kind per ``window`` steps (a run that keeps spiking is told once, not at every step)."""
        last = self._reported.get(kind)
        return last is not None and 0 <= step - last < self.window

    def _file(self, trainer: LoopHost, draft: Draft, *, act: bool = True) -> None:
        """File a report (one of a kind per ``window`` steps), with a concrete LR when the draft asks; act on a
        problem as ``on_problem`` says."""
        if self._throttled(draft.kind, draft.step):
            return
        advice, data = draft.advice, dict(draft.data)
        if draft.lr_advice:
            suggestion = suggest_lr(trainer.optimizer, trainer.run_state.lr_finder)
            if suggestion is not None:
                lr, why = suggestion
                data["lr"] = lr
                advice = f"{advice} Lower the LR to {format_lr(lr)} ({why}).".strip()
        epoch = draft.epoch if draft.epoch is not None else self._epoch
        report = HealthReport(draft.kind, draft.step, epoch, _sentence(draft.message), advice, data, draft.level)
        self._emit(trainer, report)
        if act and report.level == "problem":
            self._act(trainer, report)

    def _emit(self, trainer: LoopHost, report: HealthReport) -> None:
        self._reported[report.kind] = report.step
        self.reports.append(report)
        signal = report.signal
        if self.signals[signal].level != "problem" or report.level == "problem":
            self.signals[signal] = SignalState(report.level, report.message)
        trainer.callbacks.call("on_health", trainer=trainer, report=report)

    def _act(self, trainer: LoopHost, report: HealthReport) -> None:
        if self.on_problem == "pause":
            trainer.pause()
        elif self.on_problem == "stop":
            for checkpoint in ModelCheckpoint.all_in(trainer.callbacks.callbacks):
                if checkpoint.save_last:  # last.ckpt at the step boundary where the run stops
                    trainer.defer(_saver(checkpoint, trainer))
            trainer.request_stop(f"Health: {report.message}")


def _sentence(text: str) -> str:
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def _owner(blocks: list[str]) -> Any:
    """``module name -> its block`` (the longest block name that is the module's or a prefix of it)."""
    ordered = sorted(blocks, key=len, reverse=True)

    def block_of(module: str) -> str | None:
        return next((b for b in ordered if module == b or module.startswith(b + ".")), None)

    return block_of


def _saver(checkpoint: ModelCheckpoint, trainer: LoopHost) -> Callable[[], Any]:
    return lambda: checkpoint.save_now(trainer)
