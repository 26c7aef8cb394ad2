"""The callback inside each rank that ``nbtrainer.launch(fn, nprocs=N, view=...)`` started: :class:`RankMonitor`
sends rank 0's progress to the launching process and stops every rank at the same optimizer step when asked
(the channel, and why the step is the same on every rank: ``nbtrainer._dist._launch_monitor``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbtrainer._dist._launch_monitor import LaunchChannel
    from nbtrainer._events._history import History
    from nbtrainer._events._stream import Progress
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["RankMonitor"]


class RankMonitor:
    """The callback inside each launched rank (see the module docstring). Duck-typed: ``on_refresh``,
    ``on_epoch_end``, ``on_optimizer_step``, ``on_fit_end``."""

    def __init__(self, launched: LaunchChannel) -> None:
        self.rank, self.world_size = launched.rank, launched.world_size
        self.channel, self.shared = launched.channel, launched.shared
        self._last_put = 0.0

    def _send(self, kind: str, payload: dict[str, Any]) -> None:
        if self.rank == 0:
            self.channel.put((kind, payload))

    def _snapshot(self, progress: Progress) -> dict[str, Any]:
        return {**progress.to_dict(), "rank": self.rank, "world_size": self.world_size, "time": time.time()}

    def on_refresh(self, trainer: TrainerView, progress: Progress) -> None:
        self._send("progress", self._snapshot(progress))

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        self._send("epoch", {k: v for k, v in logs.items() if isinstance(v, (int, float, str, type(None)))})

    def on_optimizer_step(self, trainer: TrainerView, step: int, skipped: bool) -> None:
        shared = self.shared
        if self.rank == 0 and shared[0] and not shared[1]:
            shared[1] = step + 1  # every other rank has finished at most step `step`: all will see this
        if shared[1] and step >= shared[1]:
            trainer.request_stop("stopped from the launching process")

    def on_fit_end(self, trainer: TrainerView, history: History) -> None:
        final = self._snapshot(trainer.progress)
        final["status"] = history.status or trainer.status
        self._send("end", final)
