"""The run store: SQLite (stdlib ``sqlite3``), in memory for the session or in a file, written by one thread.

Writes to a file never run on the training thread: :meth:`RunStore.submit` appends a closure to a pending
list and wakes the store's writer thread, which applies everything pending in one transaction (so a
refresh's values are one commit, whatever their number). The session's memory store applies a write at once
(no disk: microseconds per refresh). Reads run on the caller's thread under the same lock.

A file store is opened in WAL mode with a busy timeout, and every write batch is a ``BEGIN IMMEDIATE``
transaction: two processes writing one store wait for each other and lose nothing, and a process killed
mid-write leaves the last committed batch (SQLite's journal), never a damaged file. The end of each fit and the
process's exit copy the WAL into the file (``wal_checkpoint(TRUNCATE)``), so the ``.db`` file alone holds every
finished run.

Schema: ``PRAGMA application_id`` marks an nbtrainer store and ``PRAGMA user_version`` is its version.
Version 1 (nbtrainer 0.1) had no liveness columns, tags nor counters; version 2 no ``samples`` table (what
``nbtrainer.Samples`` took: text, or an image's PNG bytes); :func:`_migrate` adds them. A run
left ``running`` by a process that is gone (same host: its pid is dead or now belongs to another process,
told apart by the process start time; another host: no heartbeat for an hour) is marked ``killed`` when
the store is opened or listed, its end time its last heartbeat.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "RunStore", "open_store", "process_start", "session_store"]

log = logging.getLogger(__name__)

APPLICATION_ID = 0x6E627472  # "nbtr"
SCHEMA_VERSION = 3
_STALE_REMOTE_S = 3600.0  # a run of another host with no heartbeat for this long is taken as killed
_BUSY_TIMEOUT_MS = 60_000
_CHECKPOINT_BUSY_MS = 2_000

_TABLES = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, stop_reason TEXT,
    started REAL NOT NULL, ended REAL,
    config TEXT NOT NULL DEFAULT '{}', model TEXT NOT NULL DEFAULT '{}', env TEXT NOT NULL DEFAULT '{}',
    best TEXT NOT NULL DEFAULT '{}', checkpoints TEXT NOT NULL DEFAULT '[]',
    heartbeat REAL, pid INTEGER, host TEXT, proc_start TEXT,
    tags TEXT NOT NULL DEFAULT '{}', n_steps INTEGER NOT NULL DEFAULT 0, n_epochs INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, epoch INTEGER, loss REAL, lr REAL, PRIMARY KEY (run_id, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS epochs (
    run_id TEXT NOT NULL, epoch INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, epoch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samples (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, step INTEGER NOT NULL, epoch INTEGER, name TEXT NOT NULL,
    kind TEXT NOT NULL, value BLOB, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"""
# columns version 2 added to version 1's runs table (ALTER TABLE ADD COLUMN keeps old writers working)
_V2_COLUMNS = (
    "heartbeat REAL",
    "pid INTEGER",
    "host TEXT",
    "proc_start TEXT",
    "tags TEXT NOT NULL DEFAULT '{}'",
    "n_steps INTEGER NOT NULL DEFAULT 0",
    "n_epochs INTEGER NOT NULL DEFAULT 0",
)

_STORES: dict[str, RunStore] = {}
_STORES_LOCK = threading.Lock()


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux: ``/proc/<pid>/stat`` field 22), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the command name may contain spaces and parentheses
    return fields[19] if len(fields) > 19 else None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    now = process_start(pid)
    return start is None or now is None or now == start


class RunStore:
    """One store (a file, or ``None``: memory), shared by every trainer and reader of this process."""

    def __init__(self, path: str | None, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only  # opened with mode=ro: for reading a store the user cannot write (Runs)
        self._lock = threading.RLock()  # the connection: the writer thread and readers take turns
        self._cond = threading.Condition()
        self._pending: list[Callable[[sqlite3.Connection], Any]] = []
        self._busy = False
        self._thread: threading.Thread | None = None
        self._warned = False
        self.batches = 0  # write transactions so far (one per drain of the queue)
        self.pid, self.host, self.proc_start = os.getpid(), socket.gethostname(), process_start(os.getpid())
        self._conn = self._connect()
        self.mark_killed()

    # -- opening ------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        path = self.path
        if path is None:
            conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            _create_tables(conn)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return conn
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(
                f"The run store {path!r} is in a folder that does not exist ({folder}). Create the folder "
                "(os.makedirs) or pass run_store= a path in an existing one."
            )
        if os.path.isdir(path):
            raise IsADirectoryError(f"The run store {path!r} is a folder: pass a file path such as 'runs.db'.")
        if self.read_only:
            return self._connect_read_only(path)
        existed = os.path.exists(path)
        try:  # a new file in a read-only folder fails here already
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=_BUSY_TIMEOUT_MS / 1000)
        except sqlite3.Error as exc:
            raise _not_writable(path, existed, exc) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a killed process
            self._init_schema(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if _access_denied(exc):  # a read-only file, or a folder where SQLite cannot create -wal / -shm
                raise _not_writable(path, existed, exc) from exc
            raise ValueError(
                f"{path!r} is not an nbtrainer run store ({exc}). Pass a new file name, or the path of a store "
                "an earlier fit wrote."
            ) from exc
        except Exception:
            conn.close()
            raise
        return conn

    def _connect_read_only(self, path: str) -> sqlite3.Connection:
        """Open a store the user cannot write (``mode=ro``). A WAL store whose folder is read-only and has no -shm
        file cannot be opened so; then as ``immutable`` (nobody can write it while the folder stays read-only)."""
        from urllib.parse import quote

        if not os.path.exists(path):
            raise FileNotFoundError(f"There is no run store at {path!r}.")
        base = "file:" + quote(os.path.abspath(path))
        for query in ("mode=ro", "mode=ro&immutable=1"):
            conn = sqlite3.connect(f"{base}?{query}", uri=True, check_same_thread=False, isolation_level=None)
            try:
                app, version, tables = _schema(conn)
            except sqlite3.DatabaseError as exc:
                conn.close()
                if _access_denied(exc) and query == "mode=ro":
                    continue
                raise ValueError(f"{path!r} is not an nbtrainer run store ({exc}).") from exc
            if app != APPLICATION_ID or not tables:
                conn.close()
                raise ValueError(f"{path!r} is not an nbtrainer run store (tables {sorted(tables)}).")
            if version != SCHEMA_VERSION:
                conn.close()
                raise PermissionError(
                    f"The run store {path!r} has schema version {version} and this nbtrainer reads version "
                    f"{SCHEMA_VERSION}; it is read-only, so it cannot be brought up to date. Make it and its folder "
                    "writable once (chmod u+w) and open it again"
                    + (", or upgrade nbtrainer." if version > SCHEMA_VERSION else ".")
                )
            return conn
        raise AssertionError("unreachable: the immutable open either returns or raises")

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            app, version, tables = _schema(conn)
            if app != APPLICATION_ID and tables:
                raise sqlite3.DatabaseError(f"an SQLite database of another application (tables {sorted(tables)})")
            if version > SCHEMA_VERSION:
                raise RuntimeError(
                    f"The run store {self.path!r} has schema version {version}, newer than this nbtrainer's "
                    f"({SCHEMA_VERSION}): upgrade nbtrainer to open it."
                )
            if not tables:
                _create_tables(conn)
            elif version < SCHEMA_VERSION:
                _migrate(conn, version)
            conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # -- writing (the writer thread) ---------------------------------------------------------
    def submit(self, op: Callable[[sqlite3.Connection], Any]) -> None:
        """Queue a write; returns at once (the writer thread applies it with whatever else is pending).

        The memory store applies it now, on the caller's thread: no disk, and a refresh's rows take microseconds,
        so it needs no thread of its own.
        """
        if self.path is None:
            try:
                self.write([op])
            except Exception as exc:
                log.debug("a run store write failed: the store warns (the run goes on)", exc_info=True)
                self._warn(exc)
            return
        with self._cond:
            self._pending.append(op)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_loop, name="nbtrainer-run-store", daemon=True)
                self._thread.start()
            self._cond.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write is committed (False if ``timeout`` ran out first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                ops, self._pending, self._busy = self._pending, [], True
            try:
                self.write(ops)
            except Exception as exc:
                log.debug("a run store write failed: the store warns (the run goes on)", exc_info=True)
                self._warn(exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _warn(self, exc: Exception) -> None:
        if not self._warned:  # the History keeps every value; the store says once that it lost some
            self._warned = True
            warnings.warn(f"nbtrainer run store {self.path or ':memory:'}: a write failed ({exc}).", stacklevel=3)

    def write(self, ops: list[Callable[[sqlite3.Connection], Any]]) -> None:
        """Apply ``ops`` in one transaction now (the writer thread's work; also for tests and tools)."""
        if self.read_only:
            raise PermissionError(
                f"The run store {self.path!r} is open read-only (the file or its folder is not writable): tagging "
                "and deleting runs need write access. Make it writable (chmod u+w) and open it again."
            )
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                for op in ops:
                    op(conn)
                conn.execute("COMMIT")
                self.batches += 1
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- reading -------------------------------------------------------------------------------
    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def mark_killed(self) -> int:
        """Mark the runs left ``running`` by processes that are gone as ``killed``; returns how many."""
        if self.path is None or self.read_only:  # a read-only store shows them as they were left
            return 0
        now = time.time()
        rows = self.query("SELECT id, pid, host, proc_start, heartbeat, started FROM runs WHERE status='running'")
        dead = []
        for run_id, pid, host, start, beat, started in rows:
            if pid is None:  # a version-1 run: no way to tell; it ended without saying so
                gone = True
            elif host == self.host:
                gone = not _alive(int(pid), start)
            else:
                gone = now - float(beat or started) > _STALE_REMOTE_S
            if gone:
                dead.append((float(beat or started), run_id))
        if dead:

            def mark(conn: sqlite3.Connection) -> None:
                conn.executemany(
                    "UPDATE runs SET status='killed', ended=?, stop_reason=COALESCE(stop_reason, "
                    "'the process ended without finishing the run (killed?)') WHERE id=? AND status='running'",
                    dead,
                )

            self.write([mark])
        return len(dead)

    def checkpoint(self) -> bool:
        """Copy the committed writes from ``<path>-wal`` into the file itself and empty the WAL (at the end of a fit
        and at exit): until then a copy of the ``.db`` file alone (a backup, a mail, another machine) misses them.
        Returns False when another process's reader kept it from completing (it is done again at the next end)."""
        if self.path is None or self.read_only:
            return True
        self.flush(timeout=30)
        with self._lock:
            conn = self._conn
            # TRUNCATE waits (busy handler) for the other connections' readers: bounded far below the writers'
            # 60 s, since the next fit's end or the exit tries again.
            conn.execute(f"PRAGMA busy_timeout={_CHECKPOINT_BUSY_MS}")
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            except sqlite3.Error:
                log.debug(
                    "the WAL checkpoint of %s failed (retried at the next fit end or exit)", self.path, exc_info=True
                )
                return False
            finally:
                conn.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
        return not busy

    def integrity(self) -> str:
        return str(self.query("PRAGMA integrity_check")[0][0])

    def close(self) -> None:
        self.flush(timeout=30)
        with self._lock:
            self._conn.close()


def _schema(conn: sqlite3.Connection) -> tuple[int, int, set[str]]:
    """The store's application id, schema version and tables."""
    app = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    return int(app), int(version), tables


#: SQLite's primary result codes for "no permission": SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN
_ACCESS_CODES = frozenset({3, 8, 14})


def _access_denied(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF in _ACCESS_CODES
    text = str(exc)
    return "readonly" in text or "unable to open" in text or "access permission" in text


def _not_writable(path: str, existed: bool, exc: sqlite3.Error) -> PermissionError:
    folder = os.path.dirname(os.path.abspath(path))
    if existed:
        what = (
            f"is read-only: the file, or its folder {folder} where SQLite keeps the store's -wal and -shm files, "
            "cannot be written"
        )
    else:
        what = f"cannot be created: the folder {folder} is not writable"
    return PermissionError(
        f"The run store {path!r} {what} ({exc}). Pass run_store= a path in a writable folder, make it writable "
        "(chmod u+w), or run_store=False to record nothing; nbtrainer.Runs(path) reads a read-only store."
    )


def _create_tables(conn: sqlite3.Connection) -> None:
    for statement in _TABLES.split(";"):  # not executescript: it would commit the open transaction
        if statement.strip():
            conn.execute(statement)


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a store of an older schema to :data:`SCHEMA_VERSION` (inside the open transaction)."""
    if version < 2:
        have = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
        for column in _V2_COLUMNS:
            if column.split()[0] not in have:
                conn.execute(f"ALTER TABLE runs ADD COLUMN {column}")
        conn.execute("UPDATE runs SET n_steps=(SELECT COUNT(*) FROM steps WHERE steps.run_id=runs.id)")
        conn.execute("UPDATE runs SET n_epochs=(SELECT COUNT(*) FROM epochs WHERE epochs.run_id=runs.id)")
    if version < 3:
        _create_tables(conn)  # IF NOT EXISTS: only the samples table is new


def session_store() -> RunStore:
    """This process's in-memory store (every fit records here unless told otherwise)."""
    return _cached(None)


def open_store(path: str | os.PathLike[str] | None, *, read_only: bool = False) -> RunStore:
    """The store at ``path`` (one per file in a process), or the session store for ``None``; checked now.
    ``read_only``: opened for reading only (``Runs`` of a store the user cannot write)."""
    return _cached(None if path is None else os.path.abspath(os.fspath(path)), read_only=read_only)


def _cached(key: str | None, *, read_only: bool = False) -> RunStore:
    name = (key or "") + ("?mode=ro" if read_only else "")
    with _STORES_LOCK:
        store = _STORES.get(name)
        if store is None:
            store = RunStore(key, read_only=read_only)
            _STORES[name] = store
        return store


def dumps(value: Any) -> str:
    return json.dumps(value, default=str, allow_nan=True)


@atexit.register
def _flush_all() -> None:  # a script that ends right after fit: its last batch still lands, in the .db file itself
    for store in list(_STORES.values()):
        if store.flush(timeout=10):
            store.checkpoint()
