"""``Trainer.rollback``: back to a checkpoint in the middle of a fit, at a step boundary, and on from there.

The checkpoint is loaded as a resume loads it (model, optimizer, scheduler, scaler, the loop's position, the
metrics' sums, the callbacks' state, the RNG once the epoch's data order has been replayed), then the running loop
leaves the epoch in progress and goes on from the restored position (``FitLoop.rewind``). The fit's History stays
the same object (``fit`` returns it, the panel reads it): its steps and epochs are the checkpoint's, its events
and health reports are kept (they say why the run was rolled back), with a ``"rollback"`` event. Seconds trained
keep counting.

Where it runs: on the training thread at a step boundary (a callback's ``on_optimizer_step``, or a call from
another thread while the run is paused, handed over through the live control); between fits the state is loaded
in place and ``fit_more`` continues from it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from nbtrainer._atomic import CheckpointError
from nbtrainer._events._model_checkpoint import ModelCheckpoint
from nbtrainer._resume._checkpoint_state import restore

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["checkpoint_path", "rollback"]


def checkpoint_path(trainer: LoopHost, path: str | os.PathLike[str] = "last") -> str:
    """The file ``rollback(path)`` would load, or a :class:`CheckpointError` that says how to get one."""
    path = os.fspath(path)
    if path != "last":
        if not os.path.exists(path):
            raise CheckpointError(
                f"rollback: no checkpoint at {path!r}. Pass a file written by trainer.save_checkpoint() or "
                "ModelCheckpoint, or path='last' for a ModelCheckpoint's last.ckpt."
            )
        return path
    checkpoint = ModelCheckpoint.find(trainer.callbacks.callbacks)
    if checkpoint is None:
        raise CheckpointError(
            "rollback(path='last') has no checkpoint to roll back to: this trainer has no ModelCheckpoint. Add "
            "ModelCheckpoint(dirpath, save_last=True, every_n_steps=200) (last.ckpt every 200 steps), or pass the "
            "path of a checkpoint written by trainer.save_checkpoint()."
        )
    last = checkpoint.last_path
    if not os.path.exists(last):
        raise CheckpointError(
            f"rollback(path='last') has no checkpoint to roll back to yet: no {last!r}. ModelCheckpoint writes it "
            "at each epoch end with save_last=True, or every N steps with every_n_steps=N; or pass a checkpoint path."
        )
    return last


def rollback(trainer: LoopHost, path: str | os.PathLike[str], live: Any) -> str:
    """Load ``path`` (``"last"``: the ModelCheckpoint's ``last.ckpt``) at a step boundary and go on from there.
    ``live`` is the trainer's :class:`~nbtrainer._loop._control.LiveControl`. Returns the checkpoint's path."""
    file = checkpoint_path(trainer, path)
    run = trainer.run_state
    if trainer.strategy.distributed:
        raise RuntimeError(
            "rollback() is not supported under DDP / FSDP (every rank would have to roll back together): stop the "
            "run and resume it with fit(..., resume_from=path)."
        )
    if not run.fitting:
        restore(trainer, file)  # in place: fit_more() continues from it
        return file
    if threading.get_ident() == run.fit_thread:
        if run.loop is not None and run.loop.at_step_boundary():
            _in_fit(trainer, file, live)
        else:  # mid-window (e.g. from on_refresh): at the next step boundary
            live.requests.submit(lambda: _in_fit(trainer, file, live))
        return file
    if not live.requests.paused:
        raise RuntimeError(
            "rollback() while the fit runs in another thread needs it paused first: trainer.pause(), then "
            "trainer.rollback(...), then trainer.resume() (the panel's health card does this for you)."
        )
    # the fit may end before its next step boundary: the checkpoint is then loaded here, as between fits
    live.wait_for(live.requests.submit(lambda: _in_fit(trainer, file, live)), lambda: restore(trainer, file))
    return file


def _in_fit(trainer: LoopHost, file: str, live: Any) -> None:
    """On the training thread, at a step boundary."""
    run = trainer.run_state
    history, elapsed = trainer.history, run.elapsed_before
    before = run.loop_state.global_step
    restore(trainer, file)
    saved = trainer.history  # the checkpoint's History
    history.epochs, history.steps = saved.epochs, saved.steps
    step = run.loop_state.global_step
    history.truncate(step)
    run.history = history
    run.elapsed_before = elapsed  # wall time trained keeps counting
    if run.loop is not None:
        run.loop.rewind()
    st = run.loop_state
    event = {"step": step, "epoch": st.epoch + 1, "kind": "rollback", "old": before, "new": step, "path": file}
    trainer.callbacks.call("on_control", trainer=trainer, event=event)
