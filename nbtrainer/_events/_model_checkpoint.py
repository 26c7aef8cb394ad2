"""ModelCheckpoint: top-k / last / periodic checkpoints, written atomically, on rank 0 only."""

from __future__ import annotations

import math
import os
import shutil
import string
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nbtrainer._atomic import remove_stale_temps
from nbtrainer._events._callbacks import Callback, check_monitor, resolve_mode

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView

__all__ = ["ModelCheckpoint"]

#: best_k, best_model_path, last_model_path and the pending drops, as they were before an event's saves
_Bookkeeping = tuple[list[tuple[float, str]], str | None, str | None, list[str]]


class ModelCheckpoint(Callback):
    """Save full training checkpoints (model, optimizer, scheduler, scaler, loop state, RNG, history).

    Args:
        dirpath: directory for the files (created; must be writable: checked before training).
        monitor: log key to rank checkpoints by (``None``: keep the most recent ``save_top_k``). An epoch that
            does not log it, or a key ``filename`` uses (validation every n epochs: ``val_every_n_epochs``), writes
            no ranked checkpoint (``last.ckpt`` still).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (as ``EarlyStopping``'s: max for accuracy-like names, min for a loss).
        save_top_k: how many ranked checkpoints to keep (``-1`` all, ``0`` none besides ``last``).
        save_last: also keep ``last.ckpt``, overwritten at every save (``resume_from="last"`` finds it).
        every_n_epochs: save at the end of every n-th epoch.
        every_n_steps: also save ``last.ckpt`` every n optimizer steps (mid-epoch; needs ``save_last``
            or is implied by it).
        filename: format string with ``{epoch}``, ``{step}`` (ints) and any log key (floats); checked here by
            formatting sample values, so a spec they cannot take (``{val_loss:d}``) fails before training. A name
            whose file is kept (an earlier fit's, another ``ModelCheckpoint``'s, a kept epoch that formats alike)
            gets ``-v1``, ``-v2``...; only the file a save pushes out of the top k is replaced.
        save_on_interrupt: on Ctrl-C, write ``last.ckpt`` where the run stopped (the next optimizer step after
            the interrupt); default: on with ``save_last``.
        sharded: under ``strategy="fsdp"``, write each checkpoint as a directory of per-rank shards
            (``torch.distributed.checkpoint``, renamed into place when complete) instead of gathering the
            full state to rank 0: for models whose full state does not fit in one host's memory. It resumes
            (``resume_from=``) on the same number of processes; the default full file moves anywhere.

    Attributes:
        best_model_path: the file of the best checkpoint so far by ``monitor`` (without a monitor: the most
            recent ranked one), or ``None`` before the first save. Updated at each epoch end, kept in the
            callback's state (a resumed run knows it). Load it with ``nbtrainer.load_checkpoint(path)``;
            ``ckpt["model"]`` is the state dict for ``trainer.load_model_state_dict``.
        last_model_path: ``last.ckpt`` once it has been written (``save_last`` / ``every_n_steps``), else ``None``.
        best_k: ``[(score, path), ...]`` of the kept ranked checkpoints, best first.

    Example:
        >>> ckpt = ModelCheckpoint("checkpoints", monitor="val_loss", save_top_k=2, save_last=True)
        >>> ckpt.best_model_path is None  # set by the first save; then, e.g., after trainer.fit(...):
        True
        >>> # trainer.load_model_state_dict(load_checkpoint(ckpt.best_model_path)["model"])
    """

    def __init__(
        self,
        dirpath: str | os.PathLike = "checkpoints",
        *,
        monitor: str | None = None,
        mode: str = "auto",
        save_top_k: int = 1,
        save_last: bool = False,
        every_n_epochs: int = 1,
        every_n_steps: int | None = None,
        filename: str | None = None,
        save_on_interrupt: bool | None = None,
        sharded: bool = False,
    ) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}.")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(
                f"save_top_k must be an int: -1 (keep all), 0 (none besides last.ckpt) or k >= 1 (the best k), got "
                f"{save_top_k!r}."
            )
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or None, got {every_n_steps}.")
        self.dirpath = os.fspath(dirpath)
        self.monitor = monitor
        self.mode = resolve_mode(monitor, mode) if monitor else "max"
        self.save_top_k = save_top_k
        self.save_last = save_last or every_n_steps is not None
        self.save_on_interrupt = self.save_last if save_on_interrupt is None else bool(save_on_interrupt)
        self.every_n_epochs = every_n_epochs
        self.every_n_steps = every_n_steps
        self.filename = filename or ("epoch{epoch:03d}-{" + monitor + ":.4f}" if monitor else "epoch{epoch:03d}")
        _check_filename(self.filename)
        self.best_k: list[tuple[float, str]] = []  # (score, path), best first
        self.best_model_path: str | None = None
        self.last_model_path: str | None = None
        self._pending_drops: list[str] = []  # top-k files pushed out, removed after the new save succeeded
        self._on_disk_at_start: set[str] = set()  # files in dirpath when this fit started: never written over
        self.sharded = bool(sharded)

    @property
    def last_path(self) -> str:
        return os.path.join(self.dirpath, "last.ckpt")

    @staticmethod
    def find(callbacks: Iterable[Any]) -> ModelCheckpoint | None:
        """The first ``ModelCheckpoint`` among ``callbacks`` (``trainer.callbacks.callbacks``), else None: where
        ``resume_from="last"``, ``rollback("last")``, ``Health``'s save at a stop and the panel's rollback button
        find ``last.ckpt``.

        Example:
            >>> ckpt = ModelCheckpoint("checkpoints", save_last=True)
            >>> ModelCheckpoint.find([object(), ckpt]) is ckpt, ModelCheckpoint.find([]) is None
            (True, True)
        """
        return next(iter(ModelCheckpoint.all_in(callbacks)), None)

    @staticmethod
    def all_in(callbacks: Iterable[Any]) -> list[ModelCheckpoint]:
        """Every ``ModelCheckpoint`` among ``callbacks``, in order (:meth:`find` is the first)."""
        return [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]

    def files(self) -> list[str]:
        """The checkpoint files this callback has written and keeps: the best, ``last.ckpt``, the kept top k."""
        paths = [p for p in (self.best_model_path, self.last_model_path) if p is not None]
        return [*paths, *(path for _, path in self.best_k if path not in paths)]

    def on_fit_start(self, trainer: TrainerView) -> None:
        if self.monitor:
            check_monitor("ModelCheckpoint", self.monitor, trainer)
        if trainer.fresh_fit:
            # A new run ranks its own epochs (fit_more and a resume carry the ranking on). An earlier fit's files stay
            # on disk: they are no longer this run's to replace.
            self.best_k, self.best_model_path, self.last_model_path, self._pending_drops = [], None, None, []
        if self.sharded and not trainer.strategy.shards_parameters:
            raise ValueError(
                "ModelCheckpoint(sharded=True) writes per-rank shards, which needs Trainer(strategy='fsdp'). "
                "Drop sharded=True: the full checkpoint file holds the same state."
            )
        # Listed on every rank (before any save of this fit), so that all ranks name a colliding file alike.
        self._on_disk_at_start = self._listing()
        if not trainer.is_global_zero:
            return
        try:
            os.makedirs(self.dirpath, exist_ok=True)
        except OSError as exc:
            raise PermissionError(
                f"ModelCheckpoint cannot create dirpath {self.dirpath!r}: {exc.strerror}. Pass a writable directory."
            ) from exc
        if not os.access(self.dirpath, os.W_OK | os.X_OK) or not _can_create_file(self.dirpath):
            raise PermissionError(
                f"ModelCheckpoint dirpath {self.dirpath!r} is not writable. Pass a writable "
                "directory (or fix its permissions) before training."
            )
        remove_stale_temps(self.dirpath)  # temp files of a run that was killed while saving
        if self.sharded:  # sharded saves of a killed run
            for name in os.listdir(self.dirpath):
                if name.endswith((".partial", ".old")) and os.path.isdir(os.path.join(self.dirpath, name)):
                    shutil.rmtree(os.path.join(self.dirpath, name), ignore_errors=True)

    def on_optimizer_step(self, trainer: TrainerView, step: int, skipped: bool) -> None:
        if self.every_n_steps and step % self.every_n_steps == 0:
            before = self._bookkeeping()
            self.last_model_path = self.last_path
            self._save(trainer, self.last_path, before)

    def save_now(self, trainer: TrainerView) -> str:
        """Write ``last.ckpt`` at once (not deferred): fit calls it at a Ctrl-C, once the loop has stopped."""
        trainer.save_checkpoint(self.last_path)
        self.last_model_path = self.last_path
        return self.last_path

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        if epoch % self.every_n_epochs:
            return
        # The epoch is complete: the saved loop state points at the start of the next epoch.
        # An epoch that does not log the monitor or a key of the filename (no validation this epoch under
        # val_every_n_epochs > 1) is not ranked; keys the fit never logs were refused before the first step.
        needs = _format_fields(self.filename) | ({self.monitor} if self.monitor else set())
        before = self._bookkeeping()
        if self.save_top_k != 0 and needs <= logs.keys() | {"epoch", "step"}:
            score = float(logs[self.monitor]) if self.monitor else float(epoch)
            if math.isfinite(score) and self._qualifies(score):
                name = self.filename.format(**{**logs, "epoch": epoch, "step": trainer.global_step})
                path = self._free_path(os.path.join(self.dirpath, name), trainer)
                self._save(trainer, path, before)
                self._insert(score, path, remove=trainer.is_global_zero)
        if self.save_last:
            self._save(trainer, self.last_path, before)
            self.last_model_path = self.last_path
        if self._pending_drops:  # only once the saves above went through: a failed save keeps the old best
            trainer.defer(self._remove_dropped)

    def _qualifies(self, score: float) -> bool:
        if self.save_top_k < 0 or len(self.best_k) < self.save_top_k:
            return True
        worst = self.best_k[-1][0]
        return score < worst if self.mode == "min" else score > worst

    def _free_path(self, stem: str, trainer: TrainerView) -> str:
        """``stem.ckpt``, or ``stem-v1.ckpt``, ``-v2``... when that file is kept: two epochs whose values format alike
        (``{val_loss:.1f}``) or an earlier fit's file of the same name (``epoch003.ckpt``) would otherwise be written
        over, and then removed when this run's ranking drops it. Only the file this save pushes out of the top k
        may be replaced (``filename="best"`` stays one file)."""
        pushed_out = self.best_k[-1][1] if 0 < self.save_top_k <= len(self.best_k) else None
        taken = self._on_disk_at_start | {p for _, p in self.best_k} | {self.last_path}
        for other in ModelCheckpoint.all_in(trainer.callbacks.callbacks):
            if other is not self:  # another ModelCheckpoint into the same directory: its files are its own
                taken.update(other.files(), [other.last_path])
        path, version = stem + ".ckpt", 0
        while path in taken and path != pushed_out:
            version += 1
            path = f"{stem}-v{version}.ckpt"
        return path

    def _insert(self, score: float, path: str, remove: bool = True) -> None:
        self.best_k = [(s, p) for s, p in self.best_k if p != path]
        self.best_k.append((score, path))
        self.best_k.sort(key=lambda sp: sp[0], reverse=self.mode == "max")
        while self.save_top_k >= 0 and len(self.best_k) > self.save_top_k:
            _, dropped = self.best_k.pop()
            if remove and dropped != self.last_path and os.path.exists(dropped):  # rank 0 only under DDP
                self._pending_drops.append(dropped)
        self.best_model_path = self.best_k[0][1] if self.best_k else None

    def _remove_dropped(self) -> None:
        drops, self._pending_drops = self._pending_drops, []
        for path in drops:
            try:
                if os.path.isdir(path):  # a sharded checkpoint
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            except FileNotFoundError:
                pass

    def _bookkeeping(self) -> _Bookkeeping:
        return list(self.best_k), self.best_model_path, self.last_model_path, list(self._pending_drops)

    def _save(self, trainer: TrainerView, path: str, before: _Bookkeeping) -> None:
        # Deferred until every callback has seen this event, so their state (patience counters, this
        # callback's own top-k list) is saved as it will be when training continues.
        def save() -> None:
            try:
                if self.sharded:
                    trainer.save_checkpoint(path, sharded=True)
                else:
                    trainer.save_checkpoint(path)
            except BaseException:
                # The ranking was moved on for a file that is not there (disk full, Ctrl-C): back to the files
                # that are, so best_model_path still loads and a fit_more ranks against what is on disk.
                self.best_k, self.best_model_path, self.last_model_path, self._pending_drops = before
                raise

        trainer.defer(save)

    def state_dict(self) -> dict[str, Any]:
        return {
            "best_k": [[s, p] for s, p in self.best_k],
            "best_model_path": self.best_model_path,
            "last_model_path": self.last_model_path,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the ranking a checkpoint saved, reconciled with this callback's directory as it is now.

        A checkpoint holds the top k as of its own save: resumed or rolled back from an earlier (the best) one, the
        run went on and removed some of those files and wrote others. A removed file would hold a place in the top
        k with nothing on disk, and a file in another directory (a resume into a new ``dirpath``) is not this
        callback's to remove, so both leave the ranking. Files on disk that the restored ranking does not list (the
        later epochs of the run it went back from) are never written over nor removed: they are not its files.
        """
        here = os.path.realpath(self.dirpath)

        def owned(path: str) -> bool:
            return os.path.realpath(os.path.dirname(path)) == here and os.path.exists(path)

        self.best_k = [(float(s), str(p)) for s, p in state.get("best_k", []) if owned(str(p))]
        self.best_model_path = self.best_k[0][1] if self.best_k else None
        last = state.get("last_model_path")
        self.last_model_path = last if last is not None and owned(last) else None
        self._pending_drops = []
        self._on_disk_at_start = self._listing()  # a rollback mid-fit restores with no on_fit_start to list them

    def _listing(self) -> set[str]:
        try:
            return {os.path.join(self.dirpath, name) for name in os.listdir(self.dirpath)}
        except OSError:  # not created yet: nothing in it to keep
            return set()


#: the epoch row's keys that hold ints; every other logged value is a float
_INT_KEYS = frozenset({"epoch", "step", "steps", "skipped_steps"})


class _Sample(dict[str, Any]):
    def __missing__(self, key: str) -> Any:
        return 1 if key in _INT_KEYS else 0.5


def _check_filename(filename: str) -> None:
    """Format ``filename`` with values of the types the epoch end passes, so that a format spec the values cannot
    take fails now, not after the first epoch trained (which keys the fit logs is checked at fit: ``check_fit``)."""
    try:
        filename.format_map(_Sample())
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"ModelCheckpoint filename {filename!r} cannot be formatted: {type(exc).__name__}: {exc}. {{epoch}} and "
            "{step} are ints, every other logged value a float: use specs these take, e.g. "
            "filename='epoch{epoch:03d}-{val_loss:.4f}', and name each field (no bare {})."
        ) from exc


def _can_create_file(directory: str) -> bool:
    """``os.access`` says yes to root on any mode bits; actually create (and remove) a file."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".nbt-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _format_fields(fmt: str) -> set[str]:
    """The log keys a filename format string reads (``"{val_loss:.4f}"``: ``val_loss``)."""
    return {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(fmt) if field}
