"""A run store the user cannot write, on real files: a read-only folder, a read-only store file. The checks run in a
child process without the capabilities that let root ignore permission bits (``setpriv``), so they hold for root too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import Trainer

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys, torch
sys.path[:0] = [{root!r}, {tests!r}]  # this checkout's nbtrainer
from conftest import make_classification, make_loader, mlp
import nbtrainer

def outcome(fn):
    try:
        return ["ok", fn()]
    except Exception as exc:
        return [type(exc).__name__, str(exc)]

def fit(store):
    x, y = make_classification(n=32)
    t = nbtrainer.Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=store)
    return t.fit(make_loader(x, y, batch_size=16), epochs=1).status

def read(store):
    return [[r.status, r.steps, len(r.history.steps["step"])] for r in nbtrainer.Runs(store)]

d = {folder!r}
print(json.dumps({{
    "fit_in_read_only_folder": outcome(lambda: fit(d + "/locked/runs.db")),
    "fit_into_read_only_file": outcome(lambda: fit(d + "/rofile/runs.db")),
    "read_read_only_file": outcome(lambda: read(d + "/rofile/runs.db")),
    "read_in_read_only_folder_without_shm": outcome(lambda: read(d + "/sealed/runs.db")),
    "tag_read_only_file": outcome(lambda: nbtrainer.Runs(d + "/rofile/runs.db").tag(0, "best")),
}}))
"""


def _unprivileged(script: Path) -> dict:
    cmd = [sys.executable, str(script)]
    if os.geteuid() == 0:  # root writes through permission bits; drop the capabilities that allow it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permissions cannot be enforced")
        caps = "-dac_override,-dac_read_search"
        cmd = [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _store_with_a_run(path: Path) -> None:
    x, y = make_classification(n=32)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, run_store=path)
    trainer.fit(make_loader(x, y, batch_size=16), epochs=1)


@pytest.mark.slow  # starts an interpreter as another user (docs/testing.md: slow; the inner loop leaves it out)
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permission bits")
def test_a_store_the_user_cannot_write_is_said_so_and_runs_reads_it(tmp_path):
    locked, rofile, sealed = tmp_path / "locked", tmp_path / "rofile", tmp_path / "sealed"
    for folder in (locked, rofile, sealed):
        folder.mkdir()
    _store_with_a_run(rofile / "runs.db")
    _store_with_a_run(tmp_path / "made.db")
    shutil.copy(tmp_path / "made.db", sealed / "runs.db")  # the .db alone: no -wal or -shm beside it
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), folder=str(tmp_path)))
    os.chmod(rofile / "runs.db", 0o444)
    os.chmod(locked, 0o555)
    os.chmod(sealed, 0o555)
    try:
        seen = _unprivileged(script)
    finally:
        for folder in (locked, sealed):
            os.chmod(folder, 0o755)
        os.chmod(rofile / "runs.db", 0o644)
    kind, message = seen["fit_in_read_only_folder"]
    assert kind == "PermissionError", seen
    assert f"{locked}/runs.db' cannot be created: the folder {locked} is not writable" in message
    assert "run_store=False" in message
    kind, message = seen["fit_into_read_only_file"]
    assert kind == "PermissionError" and f"{rofile}/runs.db' is read-only" in message and "chmod u+w" in message
    assert seen["read_read_only_file"] == ["ok", [["finished", 2, 2]]]
    assert seen["read_in_read_only_folder_without_shm"] == ["ok", [["finished", 2, 2]]]
    kind, message = seen["tag_read_only_file"]
    assert kind == "PermissionError" and "is open read-only" in message
