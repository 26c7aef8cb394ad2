"""The run store on real SQLite files: what a fit records, batched writes, a SIGKILLed run, two writing processes,
a store of the previous schema, and the errors for bad paths."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_classification, make_loader, mlp

from nbtrainer import EarlyStopping, Runs, Trainer
from nbtrainer._runs._store import APPLICATION_ID, SCHEMA_VERSION, open_store

ROOT = Path(__file__).resolve().parents[2]


def _trainer(store, **kw):
    return Trainer(mlp(), torch.nn.CrossEntropyLoss(), "adamw", lr=1e-2, progress=False, run_store=store, **kw)


def _data():
    x, y = make_classification(n=128)
    return make_loader(x, y, batch_size=16), make_loader(x[:32], y[:32], batch_size=16)


def test_a_fit_is_recorded_in_full(tmp_path):
    path = tmp_path / "runs.db"
    train, val = _data()
    trainer = _trainer(path, refresh_interval=0.0, seed=3, grad_accum_steps=2)
    history = trainer.fit(train, val, epochs=3)
    run = Runs(path)[trainer.run_id]
    assert run.status == "finished" and run.ended is not None and (run.duration or 0) > 0
    assert run.steps == len(history.steps["step"]) == 12 and run.epochs == 3
    stored = run.history
    assert stored.steps == history.steps  # every per-step value, exactly
    assert [r["val_loss"] for r in stored.epochs] == history["val_loss"]
    assert run.best["val_loss"] == min(history["val_loss"])
    assert run.config["grad_accum_steps"] == 2 and run.config["seed"] == 3 and run.config["batch_size"] == 16
    assert run.config["optimizer"] == "AdamW" and run.config["optimizer_params"]["lr"] == 1e-2
    assert run.model == {"class": "Sequential", "params": 227, "trainable": 227, "frozen": 0}
    assert run.env["torch"] == torch.__version__ and run.env["device"] == "cpu"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_writes_are_batched_at_the_refresh_not_per_step(tmp_path):
    store = open_store(tmp_path / "runs.db")
    x, y = make_classification(n=512)
    trainer = _trainer(tmp_path / "runs.db", refresh_interval=3600.0)  # no refresh inside the fit
    before = store.batches
    trainer.fit(make_loader(x, y, batch_size=4), epochs=2)  # 256 optimizer steps
    assert Runs(tmp_path / "runs.db")[trainer.run_id].steps == 256
    # start, one per epoch end (pushed after the callbacks), the end: never one per step
    assert store.batches - before <= 6


def test_control_events_status_and_fit_more_extend_the_same_run(tmp_path):
    path = tmp_path / "runs.db"
    train, val = _data()

    class Lower:
        def on_epoch_end(self, trainer, epoch, logs):
            if epoch == 1:
                trainer.set_lr(1e-3)

    trainer = _trainer(path, callbacks=[Lower(), EarlyStopping("val_loss", patience=0, min_delta=10.0)])
    trainer.fit(train, val, epochs=5)
    runs = Runs(path)
    run = runs[trainer.run_id]
    assert run.status == "stopped" and "EarlyStopping" in (run.stop_reason or "")
    assert any(e["kind"] == "lr" and e["new"] == 1e-3 for e in run.history.events)
    more = trainer.fit_more(train, val, epochs=1)
    assert len(runs) == 1  # the same run, continued
    run = runs[trainer.run_id]
    assert run.epochs == len(more.epochs) and run.steps == len(more.steps["step"])
    assert run.history.steps == more.steps


def test_env_var_names_the_default_store(tmp_path, monkeypatch):
    path = tmp_path / "env.db"
    monkeypatch.setenv("NBTRAINER_RUNS", str(path))
    train, _ = _data()
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    trainer.fit(train, epochs=1)
    assert trainer.run_id is not None
    assert Runs(path)[trainer.run_id].status == "finished"
    assert Runs()[trainer.run_id].steps == 8  # Runs() reads the same default


def test_run_store_false_records_nothing(tmp_path):
    trainer = _trainer(False)
    trainer.fit(_data()[0], epochs=1)
    assert getattr(trainer, "run_id", None) is None


_KILLED_CHILD = """
import sys, time, torch
sys.path.insert(0, {tests!r})
from conftest import make_classification, make_loader, mlp
from nbtrainer import Trainer

class Tap:  # every refresh's points, as the child saw them, before it hands them to the store
    def __init__(self, path):
        self.fh = open(path, "a")
    def on_refresh(self, trainer, progress):
        for step, loss, lr in progress.step_points:
            self.fh.write(f"{{step}} {{loss!r}}\\n")
        self.fh.flush()
    def on_optimizer_step(self, trainer, step, skipped):
        time.sleep(0.002)

x, y = make_classification(n=4096)
trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.05, progress=False, refresh_interval=0.05,
                  run_store={store!r}, callbacks=[Tap({tap!r})])
trainer.fit(make_loader(x, y, batch_size=4), epochs=100)
"""


@pytest.mark.slow
def test_a_sigkilled_run_shows_as_killed_with_every_value_up_to_its_last_refresh(tmp_path):
    store, tap = tmp_path / "runs.db", tmp_path / "tap.txt"
    script = tmp_path / "child.py"
    script.write_text(_KILLED_CHILD.format(tests=str(ROOT / "tests"), store=str(store), tap=str(tap)))
    proc = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not tap.exists() or len(tap.read_text().splitlines()) < 200):
            assert proc.poll() is None, "the child ended before it was killed"
            time.sleep(0.1)
        seen = tap.read_text().splitlines()
        assert len(seen) >= 200
        # the kill comes once the store holds the last step the child handed over (its writer thread commits a
        # refresh within milliseconds, on a loaded machine when it next gets the CPU), read from the file itself
        last = max(int(line.split()[0]) for line in seen)
        uri = f"file:{store}?mode=ro"
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the child ended before it was killed"
            with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
                if (db.execute("SELECT MAX(step) FROM steps").fetchone()[0] or 0) >= last:
                    break
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    runs = Runs(store)  # opening the store finds the dead process
    (run,) = list(runs)
    assert run.status == "killed" and run.ended is not None
    stored = run.history.steps
    by_step = dict(zip(stored["step"], stored["loss"], strict=True))
    for line in seen:  # every value the child had handed over before the kill is there, exactly
        step, loss = line.split()
        assert by_step[int(step)] == float(loss)
    assert stored["step"] == list(range(1, len(stored["step"]) + 1))  # no hole
    db = sqlite3.connect(store)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT status FROM runs").fetchone()[0] == "killed"  # written back, not only shown


_WRITER_CHILD = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from conftest import make_classification, make_loader, mlp
from nbtrainer import Trainer

x, y = make_classification(n=256, seed={seed})
out = {{}}
for i in range(3):
    trainer = Trainer(mlp(seed=i), torch.nn.CrossEntropyLoss(), "sgd", lr=0.05, progress=False,
                      refresh_interval=0.0, run_store={store!r})
    h = trainer.fit(make_loader(x, y, batch_size=4), make_loader(x[:32], y[:32]), epochs=2)
    out[trainer.run_id] = [h.steps["loss"], h["val_loss"]]
print(json.dumps(out))
"""


@pytest.mark.slow
def test_two_processes_writing_one_store_lose_nothing(tmp_path):
    store = tmp_path / "shared.db"
    procs = []
    for seed in (1, 2):
        script = tmp_path / f"writer{seed}.py"
        script.write_text(_WRITER_CHILD.format(tests=str(ROOT / "tests"), store=str(store), seed=seed))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)], stdout=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
        )
    expected = {}
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0
        expected.update(json.loads(out))
    runs = Runs(store)
    assert sorted(runs.ids) == sorted(expected) and len(expected) == 6
    for run_id, (losses, val_losses) in expected.items():
        run = runs[run_id]
        assert run.status == "finished"
        assert run.history.steps["loss"] == losses and run.history["val_loss"] == val_losses
    assert runs.store.integrity() == "ok"


# The schema nbtrainer 0.1 wrote (version 1): no liveness columns, no tags, no counters.
_V1 = """
CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, stop_reason TEXT,
    started REAL NOT NULL, ended REAL, config TEXT NOT NULL DEFAULT '{}', model TEXT NOT NULL DEFAULT '{}',
    env TEXT NOT NULL DEFAULT '{}', best TEXT NOT NULL DEFAULT '{}', checkpoints TEXT NOT NULL DEFAULT '[]');
CREATE TABLE steps (run_id TEXT NOT NULL, step INTEGER NOT NULL, epoch INTEGER, loss REAL, lr REAL,
    PRIMARY KEY (run_id, step)) WITHOUT ROWID;
CREATE TABLE epochs (run_id TEXT NOT NULL, epoch INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, epoch)) WITHOUT ROWID;
CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
"""


@pytest.fixture
def v1_store(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(_V1)
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute("PRAGMA user_version=1")
    db.execute(
        "INSERT INTO runs VALUES ('old1', 'mlp-1', 'finished', NULL, 1000.0, 1060.0, ?, ?, '{}', ?, '[]')",
        (json.dumps({"optimizer": "SGD", "optimizer_params": {"lr": 0.1}}), json.dumps({"class": "MLP"}),
         json.dumps({"val_loss": 0.5})),
    )  # fmt: skip
    db.execute("INSERT INTO runs (id, name, status, started) VALUES ('old2', 'mlp-2', 'running', 2000.0)")
    db.executemany("INSERT INTO steps VALUES ('old1', ?, 1, ?, 0.1)", [(i, 1.0 / i) for i in range(1, 11)])
    db.execute("INSERT INTO epochs VALUES ('old1', 1, ?)", (json.dumps({"epoch": 1, "loss": 0.3, "val_loss": 0.5}),))
    db.commit()
    db.close()
    return path


def test_a_store_of_the_previous_schema_opens_and_takes_new_runs(v1_store):
    runs = Runs(v1_store)
    table = {r["id"]: r for r in runs.table().rows}
    assert table["old1"]["status"] == "finished" and table["old1"]["best_val_loss"] == 0.5
    assert table["old1"]["steps"] == 10 and table["old1"]["tags"] == {}
    assert table["old2"]["status"] == "killed"  # a version-1 'running' run: its process cannot be asked
    assert runs["old1"].history.steps["loss"] == [1.0 / i for i in range(1, 11)]
    trainer = _trainer(v1_store)
    trainer.fit(_data()[0], epochs=1)
    runs.tag("old1", "baseline")
    assert len(runs) == 3 and runs["old1"].tags == {"baseline": ""}
    db = sqlite3.connect(v1_store)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_store_of_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (id TEXT)")
    db.execute(f"PRAGMA application_id={APPLICATION_ID}")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.commit()
    with pytest.raises(RuntimeError, match=r"newer than this nbtrainer.*upgrade"):
        _trainer(path)


def test_bad_store_paths_are_refused_before_training(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"folder that does not exist.*Create the folder"):
        _trainer(tmp_path / "missing" / "runs.db")
    text = tmp_path / "notes.db"
    text.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(ValueError, match="is not an nbtrainer run store"):
        _trainer(text)
    assert text.read_text().startswith("these are my notes")  # left as it was
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE customers (name TEXT)").connection.commit()
    with pytest.raises(ValueError, match="another application"):
        _trainer(other)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        _trainer(tmp_path)
    with pytest.raises(TypeError, match="run_store must be a file path"):
        _trainer(123)


def test_a_copy_of_the_db_file_alone_holds_the_finished_run(tmp_path):
    """The WAL holds commits until a checkpoint: a user who copies runs.db (not runs.db-wal) after fit must get the
    run, not an empty store."""
    import shutil

    path = tmp_path / "runs.db"
    trainer = _trainer(path, refresh_interval=0.0)
    history = trainer.fit(_data()[0], epochs=2)
    assert os.path.getsize(f"{path}-wal") == 0  # everything is in the file itself
    (tmp_path / "copy").mkdir()
    shutil.copy(path, tmp_path / "copy" / "runs.db")
    run = Runs(tmp_path / "copy" / "runs.db")[trainer.run_id]
    assert run.status == "finished" and run.history.steps == history.steps


_TAG_AND_EXIT = """
import sys, torch
sys.path[:0] = [{root!r}, {tests!r}]  # this checkout's nbtrainer
from conftest import make_classification, make_loader, mlp
from nbtrainer import Runs, Trainer

x, y = make_classification(n=64)
trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.05, progress=False, run_store={store!r})
trainer.fit(make_loader(x, y, batch_size=16), epochs=1)
Runs({store!r}).tag(trainer.run_id, "after-fit")  # written after the fit's checkpoint: the exit copies it in
print(trainer.run_id)
"""


@pytest.mark.slow  # starts an interpreter (docs/testing.md: such tests are slow; the inner loop leaves them out)
def test_writes_after_the_last_fit_reach_the_db_file_at_exit(tmp_path):
    import shutil

    store = tmp_path / "runs.db"
    script = tmp_path / "child.py"
    script.write_text(_TAG_AND_EXIT.format(root=str(ROOT), tests=str(ROOT / "tests"), store=str(store)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    (tmp_path / "copy").mkdir()
    shutil.copy(store, tmp_path / "copy" / "runs.db")
    assert "after-fit" in Runs(tmp_path / "copy" / "runs.db")[out.stdout.split()[-1]].tags


def _plans(store, statements):
    """The query plans of the statements that read the steps table (inserts only write the new rows)."""
    reads = [s for s in statements if "steps" in s and not s.lstrip().upper().startswith("INSERT")]
    return {s: [r[3] for r in store.query("EXPLAIN QUERY PLAN " + s)] for s in reads}


def test_a_refresh_write_reads_only_its_own_steps_not_the_whole_run(tmp_path):
    """Counting the run's steps at every refresh scanned all its rows (45 ms a refresh at 1M steps): every read of the
    steps table must be bounded to the refresh's step range, while the run's step count stays exact."""
    store = open_store(tmp_path / "runs.db")
    statements: list[str] = []
    trainer = _trainer(tmp_path / "runs.db", refresh_interval=0.0)
    store._conn.set_trace_callback(statements.append)  # the SQL the writer thread runs
    try:
        history = trainer.fit(_data()[0], epochs=2)
        history = trainer.fit_more(_data()[0], epochs=1)  # the same run, extended
    finally:
        store._conn.set_trace_callback(None)
    plans = _plans(store, statements)
    assert plans, "no statement read the steps table"
    for sql, plan in plans.items():
        for line in plan:
            assert "steps" not in line or "step>" in line, f"{sql!r} reads the whole run: {plan}"
    run = Runs(tmp_path / "runs.db")[trainer.run_id]
    assert run.steps == len(history.steps["step"]) == 24 and run.epochs == 3
    assert store.query("SELECT COUNT(*) FROM steps WHERE run_id=?", (trainer.run_id,))[0][0] == 24
