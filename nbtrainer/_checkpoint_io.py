"""Checkpoint I/O: atomic writes and safe loads.

Writes go to a temp file in the target directory, are flushed and fsync'ed, then ``os.replace``'d
over the target, and the directory is fsync'ed: a kill at any moment leaves the old file or the new
one, never a torn one. Loads use ``torch.load(weights_only=True)``: a checkpoint that needs
unpickling arbitrary objects is refused and runs nothing.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
from typing import Any

import torch

__all__ = ["CheckpointError", "atomic_write_bytes", "save_checkpoint_file", "load_checkpoint", "CHECKPOINT_FORMAT"]

CHECKPOINT_FORMAT = "nbtrainer.checkpoint"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says why and what to do."""


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + fsync + os.replace)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise CheckpointError(
            f"Cannot write {path!r}: {exc.strerror or exc}. Choose a writable directory (check permissions "
            "and free space); nothing was written and any previous file is intact."
        ) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CheckpointError(
                f"Writing {path!r} failed: {exc.strerror or exc}. The previous file (if any) is intact; "
                "free disk space or pick another directory."
            ) from exc
        raise
    _fsync_dir(directory)


def save_checkpoint_file(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """Serialize with ``torch.save`` into memory, then write atomically."""
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    atomic_write_bytes(path, buf.getvalue())


def _why(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if "Unsupported global" in ln or "Unsupported operand" in ln]
    return (lines[0] if lines else str(exc).splitlines()[0])[:300]


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``) and check it is an nbtrainer checkpoint.

    Raises:
        CheckpointError: missing, truncated, unsafe (needs arbitrary unpickling) or not a checkpoint.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "x.ckpt")
        >>> save_checkpoint_file(p, {"format": CHECKPOINT_FORMAT, "version": 1})
        >>> load_checkpoint(p)["version"]
        1
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"No checkpoint at {path!r}. Check the path (or use resume_from='last' with "
                              "the ModelCheckpoint dirpath that wrote it).")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path!r} is empty (0 bytes): not a checkpoint. Resume from another file.")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"Refused to load {path!r}: it needs unpickling objects that are not plain tensors/containers "
            f"({_why(exc)}). nbtrainer loads with weights_only=True and ran none of it. "
            "Only load checkpoints you trust; nbtrainer's own checkpoints never need this."
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path!r} is not a readable checkpoint (truncated or corrupt?): {type(exc).__name__}: "
            f"{str(exc)[:200]}. Resume from an earlier checkpoint."
        ) from exc
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path!r} loaded but is not an nbtrainer checkpoint (no format marker). For a bare state_dict "
            "use model.load_state_dict(torch.load(path, weights_only=True))."
        )
    return obj
