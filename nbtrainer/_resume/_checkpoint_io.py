"""Checkpoint I/O: atomic writes and safe loads.

Writes go to a temp file in the target directory, are flushed and fsync'ed, then ``os.replace``'d
over the target, and the directory is fsync'ed: a kill at any moment leaves the old file or the new
one, never a torn one. Loads use ``torch.load(weights_only=True)``: a checkpoint that needs
unpickling arbitrary objects is refused and runs nothing.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import socket
import tempfile
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointError",
    "atomic_write",
    "atomic_write_bytes",
    "load_checkpoint",
    "remove_stale_temps",
    "save_checkpoint_file",
]

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


class _FdWriter:
    """A minimal binary file over a raw fd: every byte goes through ``os.write`` (short writes retried),
    so a full disk or a lost permission surfaces as the OSError it is, at the write that hit it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.written += total
        return total

    def flush(self) -> None:
        pass


_TMP_SUFFIX = ".tmp"


def _tmp_prefix(path: str) -> str:
    # ".<name>.<host>-<pid>." : a stale temp file of a killed process can be recognised and removed.
    return f".{os.path.basename(path)}.{socket.gethostname()}-{os.getpid()}."


def _file_mode() -> int:
    """0o666 minus the umask (mkstemp creates 0o600; a checkpoint should be as readable as any file)."""
    umask = 0o022
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
                    break
    except (OSError, ValueError):
        pass
    return 0o666 & ~umask


_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.ENOENT: "the directory does not exist",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EIO: "an I/O error",
}


def _write_error(path: str, exc: OSError, stage: str) -> CheckpointError:
    reason = _REASONS.get(exc.errno or -1, exc.strerror or str(exc))
    fix = (
        "free some disk space or choose another directory"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else "choose a writable directory (or fix its permissions)"
    )
    return CheckpointError(
        f"Could not write {path!r}: {reason} ({stage}: {exc.strerror or exc}). The previous "
        f"file, if any, is intact and no partial file was left behind; {fix}."
    )


def atomic_write(path: str | os.PathLike, write: Callable[[Any], Any]) -> None:
    """Call ``write(fh)`` on a temp file in the target's directory, fsync it and ``os.replace`` it over
    ``path`` (then fsync the directory). A kill at any moment leaves the old file or the new one; a
    failure (``OSError`` -> :class:`CheckpointError`, or any exception, KeyboardInterrupt included)
    removes the temp file and leaves the old file untouched."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=_TMP_SUFFIX, dir=directory)
    except OSError as exc:
        raise _write_error(path, exc, "creating a temp file") from exc
    stage = "writing"
    try:
        try:
            os.fchmod(fd, _file_mode())
        except OSError:
            pass
        write(_FdWriter(fd))
        stage = "fsync"
        os.fsync(fd)
        os.close(fd)
        fd = -1
        stage = "replacing the old file"
        os.replace(tmp, path)
    except BaseException as exc:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(tmp)
        except OSError:
            pass
        interrupt = _interrupt_in(exc)
        if interrupt is not None and interrupt is not exc:
            # torch's zip writer turns a Ctrl-C inside torch.save into its own RuntimeError on exit
            raise interrupt.with_traceback(interrupt.__traceback__) from None
        os_error = _os_error_in(exc)
        if os_error is not None:
            raise _write_error(path, os_error, stage) from exc
        raise
    _fsync_dir(directory)


def _interrupt_in(exc: BaseException | None) -> BaseException | None:
    """A KeyboardInterrupt/SystemExit anywhere in the context chain of ``exc``."""
    for _ in range(8):
        if exc is None:
            return None
        if not isinstance(exc, Exception):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _os_error_in(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc`` (torch's zip writer can mask it with its own RuntimeError on exit)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return exc
        if not isinstance(exc, Exception):  # KeyboardInterrupt & co. propagate as they are
            return None
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + fsync + os.replace)."""
    atomic_write(path, lambda fh: fh.write(data))


def save_checkpoint_file(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """``torch.save`` straight into the temp file (no in-memory copy of the checkpoint), atomically."""
    atomic_write(path, lambda fh: torch.save(checkpoint, fh))


def remove_stale_temps(directory: str | os.PathLike) -> list[str]:
    """Remove temp files that a killed process left in ``directory`` (ours: same host, dead PID)."""
    removed: list[str] = []
    host = socket.gethostname()
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(".") and name.endswith(_TMP_SUFFIX)):
            continue
        match = re.match(r"^\..+\.(?P<host>[^.]+)-(?P<pid>\d+)\.[^.]+" + re.escape(_TMP_SUFFIX) + "$", name)
        if match is None or match["host"] != host or _alive(int(match["pid"])):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _verify_crc(path: str) -> None:
    """torch's reader does not check the CRC-32 that torch.save writes for every record; a damaged
    file would load with wrong weights. Check them (one read of the file)."""
    import zipfile
    import zlib

    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size:  # written without CRCs: nothing to check
                    continue
                crc = 0
                with archive.open(info) as member:
                    while chunk := member.read(1 << 22):
                        crc = zlib.crc32(chunk, crc)
                if crc != info.CRC:
                    raise CheckpointError(
                        f"{path!r} is corrupt: record {info.filename!r} fails its CRC check (damaged "
                        "on disk or in transfer). Resume from an earlier checkpoint."
                    )
    except zipfile.BadZipFile as exc:
        raise CheckpointError(
            f"{path!r} is not a readable checkpoint: truncated or corrupt ({exc}). Resume from an earlier checkpoint."
        ) from None
    except zipfile.error:
        pass  # let torch.load judge formats zipfile does not know


def _why(exc: BaseException) -> str:
    text = str(exc)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"Unsupported global: ([\w.]+)", text)
    if found:
        return f"it asks to import and call {found.group(1)}"
    lines = [ln.strip() for ln in text.splitlines() if "Unsupported" in ln]
    return (lines[0] if lines else text.splitlines()[0] if text else type(exc).__name__)[:200]


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
        raise CheckpointError(
            f"No checkpoint at {path!r}. Check the path (or use resume_from='last' with "
            "the ModelCheckpoint dirpath that wrote it)."
        )
    if os.path.isdir(path):
        raise CheckpointError(
            f"{path!r} is a directory, not a checkpoint file. Pass the file, e.g. "
            f"{os.path.join(path, 'last.ckpt')!r}, or resume_from='last' with ModelCheckpoint({path!r})."
        )
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path!r} is empty (0 bytes): not a checkpoint. Resume from another file.")
    with open(path, "rb") as fh:
        head = fh.read(4)
    is_zip = head == b"PK\x03\x04"
    if is_zip:
        _verify_crc(path)
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if is_zip or re.search(r"GLOBAL ", str(exc)):
            raise CheckpointError(
                f"Refused to load {path!r}: {_why(exc)}, which only arbitrary unpickling can do, and such a file "
                "can run code. nbtrainer loads with weights_only=True and ran none of it. Only load checkpoints "
                "you trust; nbtrainer's own checkpoints never need this."
            ) from None
        kind = "a raw pickle stream" if head[:1] == b"\x80" else "not a torch checkpoint archive"
        raise CheckpointError(
            f"Refused to load {path!r}: it is {kind} (no zip header), which the safe loader cannot read "
            f"({_why(exc)}); it may be corrupt, another format, or a pickle that would run code. Nothing was run. "
            "Resume from a checkpoint written by nbtrainer."
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        what = "truncated or corrupt" if is_zip else "not a torch checkpoint archive (no zip header)"
        raise CheckpointError(
            f"{path!r} is not a readable checkpoint: {what} ({type(exc).__name__}: "
            f"{str(exc).split('. ')[0][:160]}). Resume from an earlier checkpoint."
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path!r} loaded but is not an nbtrainer checkpoint (no format marker). For a bare state_dict "
            "use model.load_state_dict(torch.load(path, weights_only=True)); to resume, use a file written by "
            "ModelCheckpoint or trainer.save_checkpoint()."
        )
    return obj
