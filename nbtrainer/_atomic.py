"""Atomic file writes: a kill at any moment leaves the old file or the new one, never a torn one.

Writes go to a temp file in the target directory, are flushed and fsync'ed, then ``os.replace``'d over the target,
and the directory is fsync'ed. Checkpoints (``_resume``), logs and reports (``_events``, ``_report``) all write through
here; it imports nothing of nbtrainer and no torch.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import tempfile
from collections.abc import Callable
from typing import Any

__all__ = ["CheckpointError", "atomic_write", "atomic_write_bytes", "remove_stale_temps"]


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
