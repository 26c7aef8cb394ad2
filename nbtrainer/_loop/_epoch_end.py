"""The end of an epoch in a fit (``FitLoop``): its History row, validation, the epoch scheduler, deferred saves."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from nbtrainer._events._history import plain_values
from nbtrainer._loop._control import step_epoch_scheduler
from nbtrainer._loop._host import scheduler_per_step
from nbtrainer._loop._metrics import VAL_PREFIX

if TYPE_CHECKING:
    from nbtrainer._data._order import ShuffleOrder
    from nbtrainer._events._stream import Progress
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._loop._loop_state import LoopState

__all__ = ["end_epoch"]


def end_epoch(
    t: LoopHost,
    st: LoopState,
    live: LiveControl,
    order: ShuffleOrder,
    progress: Progress,
    val_data: Any,
    epoch_time: float,
) -> None:
    """The epoch's row (sums reduced over the ranks) with validation, ``on_epoch_end``, the epoch scheduler and the
    deferred saves; a stop one rank asked for is every rank's. The loop's last refresh of the epoch came before
    (``FitLoop._end_epoch``: the loop's parts are handed in, so that this module does not import the loop's)."""
    cb = t.callbacks
    metrics = t.run_state.train_metrics
    epoch_no = st.epoch + 1
    samples, loss_sum = st.samples, st.loss_sum
    metric_sums = [metrics.sums[n] for n in metrics.sums]
    reduced = t.strategy.reduce_sums([float(samples), loss_sum, float(samples - st.nonfinite_samples), *metric_sums])
    count = reduced[0] or 1.0
    loss = reduced[1] / reduced[2] if reduced[2] else math.nan
    # the LR the epoch's last step used: a per-step scheduler has already moved progress.lr on to the next epoch's
    lr = progress.step_lrs[0] if progress.step_lrs else progress.lr
    # the keys written here besides the metrics' are _metrics.LOOP_KEYS, which no metric may take
    logs: dict[str, Any] = {"epoch": epoch_no, "lr": lr, "loss": loss}
    for name, total in zip(metrics.sums, reduced[3:], strict=True):
        logs[name] = total / count
    logs.update({k: v for k, v in metrics.compute(int(count)).items() if k not in metrics.sums})
    if val_data is not None and epoch_no % t.options.run.val_every_n_epochs == 0:
        cb.call("on_validation_start", trainer=t)
        progress.stage = "val"
        val_logs = t.batch_steps.evaluate(val_data, prefix=VAL_PREFIX)
        cb.call("on_validation_end", trainer=t, logs=val_logs)
        logs.update(val_logs)
    logs["time"] = epoch_time
    logs["samples_per_s"] = samples * t.strategy.world_size / epoch_time if epoch_time > 0 else 0.0
    logs["steps"] = st.global_step
    logs["skipped_steps"] = st.skipped_steps
    gen = order.generator
    if gen is not None:
        st.sampler_state = gen.get_state()  # the next epoch starts from here (also after a resume)
    order.give_back()
    st.epoch_complete = True
    st.epoch_time = epoch_time
    cb.call("on_epoch_end", trainer=t, epoch=epoch_no, logs=logs)
    plain_values(logs)  # before the deferred saves and log writes: what callbacks added, as plain numbers
    # After the callbacks, so they see the LR this epoch trained with (LRMonitor's lr_group0 is logs["lr"]);
    # before the deferred saves, so a checkpoint holds the stepped schedule the next epoch starts from.
    if t.scheduler is not None and not scheduler_per_step(t):
        step_epoch_scheduler(t, logs)
    live.run_deferred()
    # A stop requested by a callback at epoch end (EarlyStopping) is decided on every rank together.
    requests = live.requests
    if t.strategy.any_rank(requests.stop_requested) and not requests.stop_requested:
        requests.request_stop("another rank stopped")
