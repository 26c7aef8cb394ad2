"""What Health makes of what the refresh delivers: the sampled norms and dead units (one host read), the per-step
losses (spikes, a rising loss, a run that does not learn, a fix's verdict), the step-time samples (data wait).

A skipped step's non-finite loss is located here too. A Readings is part of one :class:`~nbtrainer.Health` and
works on its state; it keeps none of its own.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._health._advice import data_advice
from nbtrainer._health._fix import next_step
from nbtrainer._health._health_report import SignalState
from nbtrainer._health._judge import Draft, judge_dead, judge_norms
from nbtrainer._health._locate import locate_nonfinite, nonfinite_kind
from nbtrainer._health._norms import stack_to_host
from nbtrainer._health._units import chance_level
from nbtrainer._report._format import format_number

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["DATA_SHARE", "Readings"]

DATA_SHARE = 0.3  # the loader taking this share of the step time gets a warning


class Readings:
    """The refresh's half of ``health`` (see the module docstring)."""

    def __init__(self, health: Any) -> None:
        # the Health whose state this works on, typed Any: _health imports this module (a type-only import back
        # would be a cycle, tests/test_architecture.py)
        self.health = health

    def read_samples(self, trainer: LoopHost) -> None:
        """The sampled steps' norms and dead units, with one host read for all of them."""
        h = self.health
        probe, units = h._probe, h._units
        norms = probe.pending if probe is not None else []
        dead = units.pending if units is not None else []
        if not norms and not dead:
            return
        start = time.perf_counter()
        parts = [sample.tensors() for sample in norms]
        flat = stack_to_host([t for part in parts for t in part] + [c for _, _, counts, _ in dead for c in counts])
        if probe is not None:
            probe.pending = []
        if units is not None:
            units.pending = []
            h._loss.chance = chance_level(trainer.criterion, units.classes)
        at = 0
        for sample, part in zip(norms, parts, strict=True):
            grads, ratios, weights = probe.reduce(sample, flat[at : at + len(part)])
            at += len(part)
            self.norm_sample(trainer, sample.step, grads, ratios, weights)
        for step, names, _, sizes in dead:
            counts = flat[at : at + len(names)]
            at += len(names)
            self.unit_sample(trainer, step, {n: (int(c), s) for n, c, s in zip(names, counts, sizes, strict=True)})
        h._spent += time.perf_counter() - start  # the samples' cost includes their reading (Health._too_soon)

    def norm_sample(
        self, trainer: LoopHost, step: int, grads: list[float], ratios: list[float] | None, weights: list[float]
    ) -> None:
        h = self.health
        probe = h._probe
        assert probe is not None
        names = ["total", *probe.names]
        health = trainer.history.health
        series = health.setdefault("grad_norm", {})
        for name, value in zip(names, grads, strict=True):
            series.setdefault(name, []).append((step, value))
        if ratios is not None:
            series = health.setdefault("update_ratio", {})
            for name, value in zip(names, ratios, strict=True):
                series.setdefault(name, []).append((step, value))
            at = h._sample_lrs.pop(step, None)
            if math.isfinite(ratios[0]) and at:
                h._ratios.append((step, ratios[0], at))
        lr = h._lrs[-1][2] if h._lrs else None
        drafts, lights = judge_norms(step, probe.names, grads, ratios, weights, h._grad_totals, lr)
        for draft in drafts:  # the steps before at this LR were as large: the damage may start with the first
            draft.onset = min(h._since, step) if draft.kind == "update_ratio" else draft.onset
        if "learning rate" in lights:
            h._lights["ratio"] = lights.pop("learning rate")
        h._light(lights)
        for draft in drafts:
            h._file(trainer, draft)
        h._lr_light()

    def unit_sample(self, trainer: LoopHost, step: int, found: dict[str, tuple[int, int]]) -> None:
        h = self.health
        for name, (dead, total) in found.items():
            if dead < total:
                h._alive_at[name] = step
            elif step == h._first_step and h._fresh_run and total >= 2:
                h._dead_at_init.add(name)  # dead before any update: the initialization
        drafts, lights, shares = judge_dead(found, step, h._epoch, h._units.types if h._units else None)
        for module, share in shares.items():
            h._store(trainer, "dead_units", module, step, share)
            if h._problem_at is None:
                h._healthy_dead[module] = share  # what "units that died" is measured against
        h._light(lights)
        for draft in drafts:
            if draft.level == "problem":
                modules = list(draft.data.get("modules", {}))
                draft.onset = min((h._alive_at.get(m, h._first_step) for m in modules), default=step)
            h._file(trainer, draft)

    def watch_loss(self, trainer: LoopHost, progress: Any) -> None:
        h = self.health
        points = progress.step_points
        h._lrs.extend(points[-h.window - 1 :])  # the points themselves (step, loss, lr): the deque keeps those
        last = points[-1][0]
        # every point of one refresh is in progress.epoch (the epoch's end has a refresh of its own): a step's
        # batch counts back from where the loop is
        k = max(progress.grad_accum_steps, 1)
        for spike in h._loss.add(points):
            batch = progress.batch - 1 - (progress.global_step - spike.step) * k
            epoch = progress.epoch
            at = f"step {spike.step}" + (f", batch {batch} of epoch {epoch}" if batch >= 0 else "")
            raised = self.lr_raised(spike.step)
            advice = f"It follows an LR increase ({raised})." if raised else f"Look at batch {batch} of epoch {epoch}."
            message = (
                f"the loss spiked to {format_number(spike.loss)} at {at}: {spike.zscore:.0f} standard deviations "
                f"above the mean {format_number(spike.mean)} of the last steps"
            )
            data = {"batch": batch, "loss": spike.loss, "mean": spike.mean}
            draft = Draft("loss_spike", spike.step, message, advice, data, lr_advice=bool(raised), epoch=epoch)
            draft.clip_advice = not raised and trainer.max_grad_norm is None
            if not raised and trainer.max_grad_norm is not None:  # its step was clipped: a bad batch, capped
                draft.level = "warning"
                draft.advice = f"{advice} Clipping at {format_number(trainer.max_grad_norm)} capped its step."
            draft.onset = min(h._since, spike.step) if raised else spike.step  # after an LR increase: from it
            h._file(trainer, draft)
        rise = h._loss.rise(last)
        if rise is not None:
            message = (
                f"the loss rose from {format_number(rise.before)} to {format_number(rise.after)} over the last "
                f"{h.window} steps"
            )
            data = {"before": rise.before, "after": rise.after}
            draft = Draft("loss_rise", last, message, "The training is diverging.", data, lr_advice=True)
            draft.onset = max(last - h.window, h._first_step)
            h._file(trainer, draft)
        self.learning(trainer, last)

    def learning(self, trainer: LoopHost, step: int) -> None:
        """Whether the run learns (the learning-rate light), and the verdict of the last fix."""
        h = self.health
        loss, chance = h._loss, h._loss.chance
        if loss.mean is not None:
            h._light({"loss": SignalState("ok", f"mean {format_number(loss.mean)} over the last steps, no spike")})
        if loss.seen >= h.window and h._fixer.check is not None and loss.mean is not None:
            verdict = h._fixer.verdict(loss.mean, chance)
            if verdict is not None:
                check, worked = verdict
                if worked:
                    before = f"{check.before:.3g}" if check.before is not None else "?"
                    h._fix_note = f"the fix at step {check.step} worked (loss {before} -> {loss.mean:.3g})"
                else:
                    message, advice, data = next_step(check, loss.mean, chance)
                    h._file(trainer, Draft("fix_failed", step, message, advice, data))
        stuck = loss.stuck(step)
        if stuck is not None:
            h._file(trainer, h._remedy.stuck_draft(stuck))
            return
        if loss.start is not None and loss.mean is not None:
            said = f"learning: loss {loss.start:.3g} -> {loss.mean:.3g}"
            h._lights["learning"] = SignalState("ok", f"{h._fix_note} · {said}" if h._fix_note else said)
            h._lr_light()

    def lr_raised(self, step: int) -> str | None:
        """Why the LR at ``step`` counts as raised: a warm-up or a change within the last ``window`` steps."""
        h = self.health
        if h._lr_raised_at is not None and 0 <= step - h._lr_raised_at <= h.window:
            return f"set at step {h._lr_raised_at}"
        recent = [lr for s, _, lr in h._lrs if s <= step]
        if len(recent) >= 2 and recent[-1] > 1.05 * min(recent[:-1]):
            return "the LR is warming up or was raised"
        return None

    def data_sample(self, trainer: LoopHost, step: int, times: dict[str, float]) -> None:
        h = self.health
        total = sum(times.values())
        if total <= 0:
            return
        share = times.get("data", 0.0) / total
        h._data.append(share)
        trainer.history.health.setdefault("data_wait", []).append((step, share))
        # Three warm samples in a row over the share (the loop's 11th, 21st and 31st micro-batches first): the fit's
        # first sample is the loader's start (workers spawning); one sample may be a fetch the OS descheduled or a
        # garbage collection stalled (measured: one read 98% under 4x load with an in-memory loader), and on a busy
        # machine the next may read over the share too (a fetch stalled 50 ms at micro-batch 21, then 37% at 51).
        recent = h._data[1:][-3:]
        level = "warning" if len(recent) == 3 and min(recent) > DATA_SHARE else "ok"
        h._light({"data": SignalState(level, f"waiting for data {share:.0%} of the step time")})
        if level == "warning":
            loop = trainer.run_state.loop
            advice = data_advice(
                loop.train_loader if loop is not None else None,
                mode=loop.data_mode if loop is not None else None,
                device_type=trainer.device.type,
                fast_fetch=trainer.options.data.fast_fetch,
            )
            message = f"the step waits for the loader {sum(recent) / len(recent):.0%} of its time (step-time samples)"
            h._file(trainer, Draft("data_wait", step, message, advice, {"share": share}, level="warning"))

    def raised_draft(self, trainer: LoopHost, error: str) -> Draft:
        """The report of a fit that ``on_nonfinite="raise"`` ended: the weights took the bad steps, so the model
        cannot say where the value started; the data still can (non-finite values in the inputs)."""
        step = trainer.global_step
        advice = (
            "That step updated the weights, so where it started cannot be found now: Trainer(on_nonfinite='skip') "
            "keeps the weights of such a step, and Health then names the module where the value first appears."
        )
        data: dict[str, Any] = {"where": "loss", "skipped": False}
        found = _nonfinite_data(self.health._kept, trainer.run_state.loop)
        if found is not None:
            advice = (
                f"The likely cause is the data: {found}. Remove or impute those values (torch.nan_to_num, or drop the "
                "items) before training again; no LR or clipping helps with them."
            )
            data["where"] = "input"
        draft = Draft("nonfinite", step, f"{error.split('. ')[0]} (on_nonfinite='raise' ended the fit)", advice)
        draft.data, draft.lr_advice = data, found is None and bool(self.lr_raised(step))
        return draft

    def after_skip(self, trainer: LoopHost, step: int) -> None:
        """A skipped step: its non-finite loss found among the window's kept losses, its source located."""
        h = self.health
        kept = h._kept
        values = torch.stack([loss.detach().float().reshape(()) for loss in kept.losses]).tolist()  # skipped only
        bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
        if not bad:
            return  # fp16 overflow with a finite loss: the scaler's own business
        h._skipped_nonfinite += 1
        state = SignalState("problem", f"{h._skipped_nonfinite} step(s) skipped, the last at step {step}")
        h._light({"non-finite": state})
        if h._throttled("nonfinite", step):
            return
        i = bad[0]
        batch_idx = trainer.run_state.loop_state.batch - (len(values) - i)
        where = f"at step {step}, batch {batch_idx} of epoch {h._epoch}"
        data: dict[str, Any] = {"batch": batch_idx, "skipped": True, "where": "loss"}
        if trainer.batch_steps.training_step_fn is None and not trainer.strategy.distributed:
            steps = trainer.batch_steps
            finding = locate_nonfinite(h._model, steps.compute, kept.batches[i], steps.autocast())
            message = f"{finding.describe()} {where}"
            data.update(where=finding.where, module=finding.module, module_type=finding.type, value=finding.value)
        else:
            message = f"the loss is {'NaN' if math.isnan(values[i]) else 'inf'} {where}"
        advice = "That step was skipped: the weights are as they were before it."
        draft = Draft("nonfinite", step, message, advice, data, lr_advice=bool(self.lr_raised(step)))
        told = [r for r in h.reports if r.kind == "nonfinite" and r.data.get("skipped")]
        if any(r.data.get("module") == data.get("module") for r in told):
            # the same source again (a batch that comes back each epoch): counted and told, without another pause
            draft.level, draft.advice = "warning", f"{advice} It is the same source as at step {told[0].step}."
        h._file(trainer, draft)


def _nonfinite_data(kept: Any, loop: Any) -> str | None:
    """Where the training data holds NaN / inf: a batch of the last window, else (in memory: one pass over
    tensors already there) the training loader's TensorDataset. None when neither shows any."""
    batches = [*kept.batches, kept.last] if kept is not None else []
    for batch in batches:
        value = nonfinite_kind(batch) if batch is not None else None
        if value is not None:
            return f"a batch of the last step holds {value} values"
    dataset = getattr(getattr(loop, "train_loader", None), "dataset", None)
    indices = None
    if isinstance(dataset, torch.utils.data.Subset):
        indices = torch.as_tensor(list(dataset.indices))
        dataset = dataset.dataset
    if not isinstance(dataset, torch.utils.data.TensorDataset):
        return None
    for k, t in enumerate(dataset.tensors):
        if not t.is_floating_point() or not len(t):
            continue
        rows = t if indices is None else t[indices]
        bad = ~torch.isfinite(rows.reshape(len(rows), -1)).all(1)
        if bool(bad.any()):
            first = int(bad.nonzero()[0])
            first = int(indices[first]) if indices is not None else first  # the dataset's index, as the user has it
            what = "inputs" if k < len(dataset.tensors) - 1 else "targets"
            return f"{int(bad.sum())} training items have NaN / inf {what} (the first: item {first})"
    return None
