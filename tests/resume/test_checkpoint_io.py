"""Checkpoint files: atomic under kills and failures, loaded safely, refused with clear messages.

* a process SIGKILLed while saving in a loop leaves the old or the new file, and it loads;
* a failed write (disk full, permission denied, read-only, Ctrl-C, an exception) raises a clear
  error, leaves the previous file byte-identical and leaves no temp file behind;
* ``torch.load(weights_only=True)`` everywhere: a real malicious pickle is refused and runs nothing;
  truncated / empty / random / foreign files are refused with a message saying what they are;
* a crash during a save inside ``fit`` (ModelCheckpoint) never corrupts ``last.ckpt`` and the run
  resumes from it.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import CheckpointError, ModelCheckpoint, Trainer, _atomic, load_checkpoint
from nbtrainer._resume._checkpoint_io import (
    CHECKPOINT_FORMAT,
    atomic_write_bytes,
    remove_stale_temps,
    save_checkpoint_file,
)


def _ckpt(tag: int, size: int = 1000) -> dict:
    return {"format": CHECKPOINT_FORMAT, "tag": tag, "w": torch.full((size,), float(tag))}


def _temps(directory) -> list[str]:
    return [f for f in os.listdir(directory) if f.endswith(".tmp")]


# -- kills while saving ------------------------------------------------------------------------------
_SAVER = textwrap.dedent("""
    import sys, torch
    from nbtrainer._resume._checkpoint_io import save_checkpoint_file, CHECKPOINT_FORMAT
    path, i = sys.argv[1], 0
    print("ready", flush=True)
    while True:
        i += 1
        # ~16 MB per save, so a kill often lands inside the write or the fsync
        save_checkpoint_file(path, {"format": CHECKPOINT_FORMAT, "tag": i, "w": torch.full((4_000_000,), float(i))})
""")


@pytest.mark.slow
def test_sigkill_while_saving_leaves_an_old_or_new_file_that_loads(tmp_path):
    path = tmp_path / "last.ckpt"
    rng = random.Random(7)
    seen = set()
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.3, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if not path.exists():
            continue  # killed before the first save finished: no file at all, never a torn one
        ckpt = load_checkpoint(path)  # never a torn file
        tag = ckpt["tag"]
        assert torch.equal(ckpt["w"], torch.full((4_000_000,), float(tag))), "content of one save, complete"
        seen.add(tag)
    assert seen, "no save completed in any run (machine too slow?)"
    # the temp files the kills stranded are recognised (dead PID, this host) and removed
    removed = remove_stale_temps(tmp_path)
    assert not _temps(tmp_path)
    assert all(name.startswith(".last.ckpt.") for name in removed)


# -- failed writes -----------------------------------------------------------------------------------
def _write_previous(path) -> bytes:
    save_checkpoint_file(path, _ckpt(1))
    return path.read_bytes()


@pytest.mark.parametrize(
    "code,words", [(errno.ENOSPC, "the disk is full"), (errno.EDQUOT, "quota"), (errno.EIO, "I/O error")]
)
def test_os_write_failure_raises_and_keeps_previous(tmp_path, monkeypatch, code, words):
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)
    real_write, budget = os.write, {"left": 3000}

    def failing_write(fd, data):  # a few KB go through, then the disk is "full"
        if budget["left"] <= 0:
            raise OSError(code, os.strerror(code))
        n = real_write(fd, bytes(memoryview(data)[: budget["left"]]))
        budget["left"] -= n
        return n

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint_file(path, _ckpt(2, size=100_000))
    monkeypatch.undo()
    msg = str(err.value)
    assert words in msg and "previous file" in msg and "intact" in msg
    assert path.read_bytes() == before
    assert not _temps(tmp_path)
    assert load_checkpoint(path)["tag"] == 1


def test_fsync_enospc_raises_and_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError, match=r"the disk is full \(fsync.*free some disk space"):
        save_checkpoint_file(path, _ckpt(2))
    monkeypatch.undo()
    assert path.read_bytes() == before and not _temps(tmp_path)


def test_permission_denied_creating_temp_file(tmp_path, monkeypatch):
    """As root, mode bits don't stop writes: simulate the EACCES a read-only directory gives."""
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(_atomic.tempfile, "mkstemp", denied)
    with pytest.raises(CheckpointError, match=r"permission denied.*choose a writable directory"):
        save_checkpoint_file(path, _ckpt(2))
    monkeypatch.undo()
    assert path.read_bytes() == before and not _temps(tmp_path)


def test_replace_failure_keeps_previous(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)

    def ro(*a):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", ro)
    with pytest.raises(CheckpointError, match="read-only"):
        save_checkpoint_file(path, _ckpt(2))
    monkeypatch.undo()
    assert path.read_bytes() == before and not _temps(tmp_path)


@pytest.mark.skipif(
    not os.path.isdir("/sys") or (os.access("/sys", os.W_OK) and sys.platform != "linux"),
    reason="needs a directory the OS refuses to write into",
)
def test_really_unwritable_directory(tmp_path):
    target = "/sys/nbtrainer-cannot-write-here/last.ckpt"
    try:
        save_checkpoint_file(target, _ckpt(1))
    except CheckpointError as err:
        assert "Could not write" in str(err) and "writable directory" in str(err)
    else:  # pragma: no cover - an unusual sandbox
        os.remove(target)
        pytest.skip("/sys is writable here")


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupt_or_error_mid_write_keeps_previous(tmp_path, monkeypatch, exc):
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)
    real_write, calls = os.write, {"n": 0}

    def interrupted(fd, data):
        calls["n"] += 1
        if calls["n"] == 2:
            raise exc("interrupted mid-write")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", interrupted)
    with pytest.raises(exc):
        save_checkpoint_file(path, _ckpt(2, size=100_000))
    monkeypatch.undo()
    assert path.read_bytes() == before and not _temps(tmp_path)


def test_serialization_error_keeps_previous(tmp_path):
    path = tmp_path / "last.ckpt"
    before = _write_previous(path)
    with pytest.raises((pickle.PicklingError, AttributeError)):  # what pickle raises for a local lambda
        save_checkpoint_file(path, {"format": CHECKPOINT_FORMAT, "bad": lambda: 1})  # not picklable
    assert path.read_bytes() == before and not _temps(tmp_path)


def test_files_get_normal_permissions_and_roundtrip(tmp_path):
    path = tmp_path / "sub" / "x.ckpt"
    save_checkpoint_file(path, _ckpt(3))
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert load_checkpoint(path)["tag"] == 3
    atomic_write_bytes(tmp_path / "h.json", b"{}")
    assert (tmp_path / "h.json").read_bytes() == b"{}"


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_stale_temp_of_live_or_foreign_process_is_kept(tmp_path):
    mine = tmp_path / f".last.ckpt.{_atomic.socket.gethostname()}-{os.getpid()}.abc.tmp"
    other_host = tmp_path / ".last.ckpt.some-other-host-1.abc.tmp"
    dead = tmp_path / f".last.ckpt.{_atomic.socket.gethostname()}-{2**22 + 12345}.abc.tmp"
    for p in (mine, other_host, dead):
        p.write_bytes(b"partial")
    assert remove_stale_temps(tmp_path) == [dead.name]
    assert mine.exists() and other_host.exists()


# -- safe loading --------------------------------------------------------------------------------------
class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle-2", "pickle-4"])
def test_malicious_pickle_is_refused_and_runs_nothing(tmp_path, monkeypatch, how):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.ckpt"
    payload = {"format": CHECKPOINT_FORMAT, "model": {}, "x": _Evil(str(marker))}
    if how == "torch.save":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=int(how[-1])))
    # sanity: the file really is malicious (loading it unsafely would run the command)
    probe = tmp_path / "probe"
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"x": _Evil(str(probe))}, unsafe)
    torch.load(unsafe, weights_only=False)
    assert probe.exists()
    # even with the environment variable that flips torch.load's default to unsafe loading
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match="Refused to load") as err:
        load_checkpoint(path)
    assert "ran none of it" in str(err.value) or "Nothing was run" in str(err.value)
    if how != "pickle-4":
        assert "system" in str(err.value)  # names what it wanted to call
    model = mlp()
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), 0.1), progress=False, device="cpu"
    )
    x, y = make_classification(n=32)
    with pytest.raises(CheckpointError, match="Refused to load"):
        trainer.fit(make_loader(x, y, batch_size=16), epochs=1, resume_from=str(path))
    assert not marker.exists()


def _good_bytes(tmp_path) -> bytes:
    model = mlp()
    trainer = Trainer(
        model, torch.nn.CrossEntropyLoss(), torch.optim.Adam(model.parameters()), progress=False, device="cpu"
    )
    x, y = make_classification(n=32)
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    return (tmp_path / "good.ckpt", trainer.save_checkpoint(str(tmp_path / "good.ckpt")))[0].read_bytes()


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.97, 0.999])
def test_truncated_checkpoint(tmp_path, fraction):
    data = _good_bytes(tmp_path)
    path = tmp_path / "cut.ckpt"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match=r"not a readable checkpoint: truncated or corrupt.*earlier checkpoint"):
        load_checkpoint(path)


def test_bit_flipped_checkpoint_is_refused_or_detected(tmp_path):
    data = bytearray(_good_bytes(tmp_path))
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path = tmp_path / "flip.ckpt"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "content,words",
    [
        (b"", r"empty \(0 bytes\)"),
        (os.urandom(4096), "no zip header"),
        (b"epoch,loss\n1,0.5\n", "no zip header"),
    ],
)
def test_not_a_checkpoint(tmp_path, content, words):
    path = tmp_path / "x.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=words):
        load_checkpoint(path)


def test_plain_state_dict_is_not_our_format(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(mlp().state_dict(), path)
    with pytest.raises(CheckpointError, match=r"not an nbtrainer checkpoint.*model.load_state_dict"):
        load_checkpoint(path)


def test_missing_and_directory(tmp_path):
    with pytest.raises(CheckpointError, match="No checkpoint at"):
        load_checkpoint(tmp_path / "nope.ckpt")
    with pytest.raises(CheckpointError, match=r"is a directory.*last\.ckpt"):
        load_checkpoint(tmp_path)


def test_checkpoint_holds_only_plain_data(tmp_path):
    """Every leaf is a tensor or plain python data: it loads with weights_only=True and nothing else."""
    data = _good_bytes(tmp_path)
    ckpt = torch.load(io.BytesIO(data), weights_only=True)

    def leaves(obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                assert isinstance(k, (str, int)), k
                yield from leaves(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from leaves(v)
        else:
            yield obj

    kinds = {type(v) for v in leaves(ckpt)}
    assert kinds <= {torch.Tensor, str, int, float, bool, type(None)}, kinds


# -- inside fit ------------------------------------------------------------------------------------------
def _fit_with_checkpoints(tmp_path, epochs=2, **kw):
    x, y = make_classification(n=128)
    model = mlp()
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        torch.optim.Adam(model.parameters(), 1e-2),
        progress=False,
        device="cpu",
        seed=0,
        callbacks=[ModelCheckpoint(tmp_path, monitor="loss", save_top_k=1, every_n_steps=2, save_last=True)],
        **kw,
    )
    return trainer, make_loader(x, y, batch_size=16, shuffle=True)


@pytest.mark.parametrize("failure", ["enospc", "keyboard"])
def test_failure_during_a_save_inside_fit_keeps_last_ckpt_and_resumes(tmp_path, monkeypatch, failure):
    trainer, loader = _fit_with_checkpoints(tmp_path)
    trainer.fit(loader, epochs=1)  # writes last.ckpt (epoch end) and the best file
    before = {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)}
    real_write, calls = os.write, {"n": 0}

    def broken(fd, data):
        calls["n"] += 1
        if calls["n"] > 3:
            if failure == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise KeyboardInterrupt
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", broken)
    if failure == "enospc":
        with pytest.raises(CheckpointError, match="disk is full"):
            trainer.fit(loader, epochs=2, resume_from="last")
        assert trainer.status == "failed"
    else:
        with pytest.raises(KeyboardInterrupt):  # in a script: re-raised once the run is closed
            trainer.fit(loader, epochs=2, resume_from="last")
        assert trainer.status == "interrupted"
    monkeypatch.undo()
    assert {f: (tmp_path / f).read_bytes() for f in os.listdir(tmp_path)} == before  # nothing changed or lost
    resumed, loader = _fit_with_checkpoints(tmp_path)
    assert resumed.fit(loader, epochs=2, resume_from="last").status == "finished"


def test_unwritable_dirpath_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    trainer = Trainer(
        model,
        torch.nn.CrossEntropyLoss(),
        opt,
        progress=False,
        device="cpu",
        callbacks=[ModelCheckpoint(blocker / "ckpts")],
    )
    x, y = make_classification(n=32)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PermissionError, match="Pass a writable directory"):
        trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)) and not opt.state
