"""Ctrl-C (a real SIGINT to a real training script): in a script, fit stops at the next optimizer step, writes
last.ckpt there (ModelCheckpoint's save_on_interrupt, on with save_last), closes the run and re-raises
KeyboardInterrupt (exit status 130); in a notebook it returns the History marked interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nbtrainer import ModelCheckpoint, load_checkpoint

WORKER = Path(__file__).resolve().parent / "_interrupt_worker.py"


def _interrupt(ckpt_dir, *, frontend, accum=1):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NBTRAINER_FRONTEND": frontend}
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(ckpt_dir), "--accum", str(accum)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # readiness: wait for the 5th step, whatever the machine's load
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.strip() == "STEP 5":
            break
    assert lines and lines[-1] == "STEP 5", [*lines, proc.stderr.read() if proc.stderr else ""]
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired as exc:  # say what the script did instead of only that it went on
        proc.kill()
        out, err = proc.communicate()
        tail = [*lines, *out.splitlines()][-5:]
        raise AssertionError(f"the script did not end after SIGINT: {tail}\n{err[-2000:]}") from exc
    lines += out.splitlines()
    return proc.returncode, lines, err


def _last_step(lines):
    return max(int(ln.split()[1]) for ln in lines if ln.startswith("STEP "))


@pytest.mark.slow
@pytest.mark.parametrize("accum", [1, 3])
def test_ctrl_c_in_a_script_saves_last_ckpt_at_the_stop_and_exits_130(tmp_path, accum):
    code, lines, err = _interrupt(tmp_path, frontend="console", accum=accum)
    assert code in (130, -signal.SIGINT), (code, lines, err[-2000:])
    assert "KeyboardInterrupt" in err
    assert "END interrupted" in lines and not [ln for ln in lines if ln.startswith("RETURNED")], lines
    ckpt = load_checkpoint(str(tmp_path / "last.ckpt"))
    # written where the loop stopped: the last optimizer step the run took, not an epoch end behind it
    assert ckpt["loop"]["global_step"] == _last_step(lines) >= 5
    assert ckpt["loop"]["batch"] == ckpt["loop"]["global_step"] * accum and not ckpt["loop"]["epoch_complete"]
    assert ckpt["history"]["status"] == "running"  # the state of the run at that step


@pytest.mark.slow
def test_ctrl_c_in_a_notebook_returns_the_history(tmp_path):
    code, lines, err = _interrupt(tmp_path, frontend="notebook")
    assert code == 0, (code, lines, err[-2000:])
    assert lines[-2:] == ["END interrupted", "RETURNED interrupted"], lines
    assert load_checkpoint(str(tmp_path / "last.ckpt"))["loop"]["global_step"] == _last_step(lines)


def test_save_on_interrupt_follows_save_last():
    assert ModelCheckpoint("d", save_last=True).save_on_interrupt
    assert not ModelCheckpoint("d").save_on_interrupt
    assert not ModelCheckpoint("d", save_last=True, save_on_interrupt=False).save_on_interrupt
    assert ModelCheckpoint("d", save_on_interrupt=True).save_on_interrupt
