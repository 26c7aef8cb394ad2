"""Checkpoint I/O: atomic writes (through :mod:`nbtrainer._atomic`) and safe loads.

Writes go to a temp file in the target directory, are flushed and fsync'ed, then ``os.replace``'d
over the target, and the directory is fsync'ed: a kill at any moment leaves the old file or the new
one, never a torn one. Loads use ``torch.load(weights_only=True)``: a checkpoint that needs
unpickling arbitrary objects is refused and runs nothing.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

from nbtrainer._atomic import CheckpointError, atomic_write, atomic_write_bytes, remove_stale_temps

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


def save_checkpoint_file(path: str | os.PathLike, checkpoint: dict[str, Any]) -> None:
    """``torch.save`` straight into the temp file (no in-memory copy of the checkpoint), atomically."""
    atomic_write(path, lambda fh: torch.save(checkpoint, fh))


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
