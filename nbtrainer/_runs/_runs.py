"""``Runs``: the runs of a store, as a table, overlaid charts, histories, tags and settings diffs.

The table reads only the ``runs`` table (one row per run, its best values kept up to date by the recorder),
so it costs the same with 10 or 10,000 steps per run; an overlay reads the chosen runs' series through the
``(run_id, step)`` primary key and decimates each to the chart's width (min/max per bucket, like the panel).
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbtrainer._events._history import History
from nbtrainer._report._decimate import minmax_indices
from nbtrainer._report._format import format_count, format_duration, format_value
from nbtrainer._report._html import higher_is_better, use_log_scale
from nbtrainer._report._svg import PALETTE, svg_chart
from nbtrainer._runs._recorder import resolve_store
from nbtrainer._runs._store import RunStore, dumps, open_store

__all__ = ["Run", "RunTable", "Runs", "RunsPlot"]

STEP_SERIES = ("loss", "lr")  # per-step series; every other metric is read from the epoch rows
_COLUMNS = (
    "id, name, status, stop_reason, started, ended, heartbeat, config, model, env, best, checkpoints, tags, "
    "n_steps, n_epochs"
)


@dataclass
class Run:
    """One recorded run (a row of the store); :attr:`history` reads its steps, epochs and events.

    Example:
        >>> # run = nbtrainer.Runs("runs.db")[run_id]; run.history.plot(); run.config["optimizer_params"]["lr"]
    """

    id: str
    name: str
    status: str
    stop_reason: str | None
    started: float
    ended: float | None
    config: dict[str, Any]
    model: dict[str, Any]
    env: dict[str, Any]
    best: dict[str, float]
    checkpoints: list[str]
    tags: dict[str, Any]
    steps: int
    epochs: int
    _store: RunStore | None = field(default=None, repr=False, compare=False)
    _last_seen: float | None = field(default=None, repr=False, compare=False)

    @property
    def duration(self) -> float | None:
        end = self.ended if self.ended is not None else self._last_seen
        return None if end is None else max(end - self.started, 0.0)

    @property
    def history(self) -> History:
        """The run's :class:`~nbtrainer.History` (steps, epoch rows, events, status), read from the store."""
        if self._store is None:
            raise RuntimeError("This Run is not attached to a store.")
        return read_history(self._store, self.id, self.status, self.stop_reason)

    def settings(self) -> dict[str, Any]:
        """Configuration, model and environment flattened to ``key.sub: value`` (what :meth:`Runs.diff` compares)."""
        out: dict[str, Any] = {}
        _flatten(out, "", {"config": self.config, "model": self.model, "env": self.env, "tags": self.tags})
        return out


def _named(params: dict[str, Any]) -> bool:
    """Whether ``optimizer_params`` holds several named optimizers' groups (``{"body": {...}, "head": {...}}``)."""
    return bool(params) and all(isinstance(v, dict) for v in params.values())


def _per_optimizer(value: Any) -> Any:
    """A table cell of named optimizers' values: ``"body: SGD, head: Adam"``."""
    return ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict) else value


def _flatten(out: dict[str, Any], prefix: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(out, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}", v)
            if isinstance(v, dict) and not v:
                out[f"{prefix}{k}"] = {}
    else:
        out[prefix.rstrip(".")] = value


def _run(store: RunStore, row: tuple[Any, ...]) -> Run:
    (rid, name, status, reason, started, ended, beat, config, model, env, best, ckpts, tags, n_steps, n_epochs) = row
    return Run(
        id=rid,
        name=name,
        status=status,
        stop_reason=reason,
        started=float(started),
        ended=None if ended is None else float(ended),
        config=json.loads(config or "{}"),
        model=json.loads(model or "{}"),
        env=json.loads(env or "{}"),
        best=json.loads(best or "{}"),
        checkpoints=json.loads(ckpts or "[]"),
        tags=json.loads(tags or "{}"),
        steps=int(n_steps or 0),
        epochs=int(n_epochs or 0),
        _store=store,
        _last_seen=None if beat is None else float(beat),
    )


def read_history(store: RunStore, run_id: str, status: str = "idle", stop_reason: str | None = None) -> History:
    h = History()
    for step, epoch, loss, lr in store.query(
        "SELECT step, epoch, loss, lr FROM steps WHERE run_id=? ORDER BY step", (run_id,)
    ):
        h.add_steps([(step, math.nan if loss is None else loss, math.nan if lr is None else lr)], epoch)
    for (data,) in store.query("SELECT data FROM epochs WHERE run_id=? ORDER BY epoch", (run_id,)):
        h.add_epoch(json.loads(data))
    for (data,) in store.query("SELECT data FROM events WHERE run_id=? ORDER BY seq", (run_id,)):
        h.add_event(**json.loads(data))
    query = "SELECT step, epoch, name, kind, value FROM samples WHERE run_id=? ORDER BY seq"
    for step, epoch, name, kind, value in store.query(query, (run_id,)):
        h.add_sample(step=step, epoch=epoch, name=name, kind=kind, value=value)
    h.status, h.stop_reason = status, stop_reason
    return h


class RunTable:
    """One row per run: id, name, status, duration, key settings, tags and best values.

    Attributes:
        rows: the rows as dicts (``best_<key>`` for every best value any run has).
    """

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    @property
    def columns(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row))
        return list(seen)

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` indexed by run id (pandas is optional: ``pip install "nbtrainer[pandas]"``)."""
        from nbtrainer._optional import import_optional

        pd = import_optional(
            "pandas", "RunTable.to_pandas()", 'pip install pandas  (or: pip install "nbtrainer[pandas]")'
        )
        return pd.DataFrame(self.rows, columns=self.columns).set_index("id")

    def to_html(self, *, selected: Sequence[str] = ()) -> str:
        cols = [c for c in self.columns if c not in ("started_ts",)]
        best_cols = [c for c in cols if c.startswith("best_")]
        winners = {}
        for c in best_cols:
            vals = [r[c] for r in self.rows if isinstance(r.get(c), (int, float))]
            if vals:
                winners[c] = (max if higher_is_better(c[5:]) else min)(vals)
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = []
        for r in self.rows:
            cells = []
            for c in cols:
                v = r.get(c)
                text = _cell(c, v)
                if c in winners and v == winners[c]:
                    text = f"<b>{text}</b>"
                cells.append(f"<td>{text}</td>")
            mark = " class='nbt-run-selected'" if r["id"] in selected else ""
            body.append(f"<tr data-run='{html.escape(r['id'])}'{mark}>{''.join(cells)}</tr>")
        return (
            "<table class='nbt-runs-table' style='border-collapse:collapse;font-size:12px'>"
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        """The table as text, for a terminal (``print(runs.table())``): the columns of the notebook's table."""
        cols = [c for c in self.columns if c not in ("started_ts",)]
        cells = [[html.unescape(_cell(c, r.get(c))) for c in cols] for r in self.rows]
        heads = [c.removesuffix("_s") if c == "duration_s" else c for c in cols]
        widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(heads)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        return f"RunTable({len(self.rows)} runs)" + ("\n" + "\n".join(lines) if self.rows else "")

    __repr__ = __str__


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "duration_s":
        return html.escape(format_duration(value))
    if key == "params":
        return html.escape(format_count(value))
    if isinstance(value, float):
        return html.escape(format_value(key[5:] if key.startswith("best_") else key, value))
    if isinstance(value, dict):
        return html.escape(", ".join(f"{k}={v}" if v != "" else str(k) for k, v in value.items()))
    return html.escape(str(value))


class RunsPlot:
    """Overlaid curves of several runs (an SVG chart): displays in a notebook, saves as ``.svg`` / ``.html``."""

    def __init__(self, svg: str, curves: list[dict[str, Any]]) -> None:
        self.svg = svg
        self.curves = curves

    def to_svg(self) -> str:
        return self.svg

    def _repr_html_(self) -> str:
        return self.svg

    def save(self, path: str | os.PathLike[str]) -> str:
        from nbtrainer._resume._checkpoint_io import atomic_write_bytes

        path = os.fspath(path)
        text = self.svg.replace("fill='currentColor'", "fill='#24292f'", 1)
        if path.lower().endswith((".html", ".htm")):
            text = f"<!doctype html><meta charset='utf-8'><title>nbtrainer runs</title>{self.svg}"
        elif not path.lower().endswith(".svg"):
            raise ValueError(f"Cannot tell the format of {path!r}: save to a path ending in .svg or .html.")
        atomic_write_bytes(path, text.encode("utf-8"))
        return path


class Runs:
    """The runs of a store: ``Runs()`` this session's (or ``$NBTRAINER_RUNS``'s), ``Runs("runs.db")`` a file's.

    Args:
        path: a store file an earlier fit wrote (``Trainer(..., run_store="runs.db")``), or ``None``.

    Example:
        >>> import nbtrainer
        >>> runs = nbtrainer.Runs()  # every fit of this session
        >>> table = runs.table()  # .rows, .to_pandas(), shown as HTML in a notebook
        >>> # runs.plot("val_loss"); runs[run_id].history; runs.tag(run_id, "baseline"); runs.diff(a, b)
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        if path is None:
            store = resolve_store(None)
        else:
            if not os.path.exists(path):
                raise FileNotFoundError(
                    f"There is no run store at {os.fspath(path)!r}. Pass the file given as run_store= to the "
                    "Trainer, or Runs() for this session's runs."
                )
            try:
                store = open_store(path)
            except PermissionError:  # a store the user may read but not write: read it as it is
                store = open_store(path, read_only=True)
        assert store is not None
        self.store = store
        self.path = store.path

    # -- the runs ---------------------------------------------------------------------------------
    def _all(self) -> list[Run]:
        self.store.flush()
        self.store.mark_killed()
        return [_run(self.store, r) for r in self.store.query(f"SELECT {_COLUMNS} FROM runs ORDER BY started, id")]

    def __len__(self) -> int:
        self.store.flush()
        return int(self.store.query("SELECT COUNT(*) FROM runs")[0][0])

    def __iter__(self) -> Iterator[Run]:
        return iter(self._all())

    @property
    def ids(self) -> list[str]:
        self.store.flush()
        return [r[0] for r in self.store.query("SELECT id FROM runs ORDER BY started, id")]

    def __getitem__(self, key: str | int | Run) -> Run:
        """A run by id, unique id prefix, name, or position (``runs[-1]``: the latest)."""
        if isinstance(key, Run):
            key = key.id
        if isinstance(key, int) and not isinstance(key, bool):
            ids = self.ids
            try:
                key = ids[key]
            except IndexError:
                raise IndexError(f"run index {key} out of range: the store has {len(ids)} runs.") from None
        if not isinstance(key, str):
            raise TypeError(f"A run is picked by id, name or index, got {type(key).__name__}.")
        self.store.flush()
        self.store.mark_killed()
        rows = self.store.query(f"SELECT {_COLUMNS} FROM runs WHERE id=?", (key,))
        if not rows:
            rows = self.store.query(
                f"SELECT {_COLUMNS} FROM runs WHERE name=? OR id LIKE ? ORDER BY started", (key, key + "%")
            )
        if len(rows) != 1:
            what = "no run" if not rows else f"{len(rows)} runs"
            raise KeyError(f"{what} with id or name {key!r} in {self.path or 'this session'}; ids: {self.ids[-10:]}")
        return _run(self.store, rows[0])

    @property
    def last(self) -> Run:
        """The latest run."""
        return self[-1]

    # -- views ----------------------------------------------------------------------------------
    def table(self) -> RunTable:
        """One row per run (oldest first): id, name, status, duration, key settings, tags, best values."""
        rows = []
        for run in self._all():
            c, opt = run.config, run.config.get("optimizer_params", {})
            row: dict[str, Any] = {
                "id": run.id,
                "name": run.name,
                "status": run.status,
                "started": datetime.datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M:%S"),
                "duration_s": run.duration,
                "model": run.model.get("class"),
                "params": run.model.get("params"),
                "optimizer": _per_optimizer(c.get("optimizer")),
                "lr": _per_optimizer({k: g.get("lr") for k, g in opt.items()}) if _named(opt) else opt.get("lr"),
                "batch_size": c.get("batch_size"),
                "precision": c.get("precision"),
                "grad_accum_steps": c.get("grad_accum_steps"),
                "epochs": run.epochs,
                "steps": run.steps,
                "tags": run.tags,
            }
            row.update({f"best_{k}": v for k, v in run.best.items()})
            rows.append(row)
        return RunTable(rows)

    def curves(
        self, metric: str = "val_loss", runs: Any = None, *, x: str | None = None, max_points: int = 400
    ) -> list[dict[str, Any]]:
        """The series of ``metric`` for each chosen run: ``{"run", "x", "y"}`` (decimated to ``max_points``).

        ``x``: ``"step"`` (the default for ``loss`` and ``lr``, per optimizer step) or ``"epoch"`` (the default
        for epoch values; ``"step"`` puts them at each epoch's last step).
        """
        chosen = self._choose(runs)
        per_step = metric in STEP_SERIES
        x = x or ("step" if per_step else "epoch")
        if x not in ("step", "epoch"):
            raise ValueError(f"x must be 'step' or 'epoch', got {x!r}.")
        out = []
        for run in chosen:
            if per_step and x == "step":
                rows = self.store.query(f"SELECT step, {metric} FROM steps WHERE run_id=? ORDER BY step", (run.id,))
                xs = [float(a) for a, _ in rows]
                ys = [math.nan if b is None else float(b) for _, b in rows]
            else:
                xs, ys = [], []
                for (data,) in self.store.query("SELECT data FROM epochs WHERE run_id=? ORDER BY epoch", (run.id,)):
                    row = json.loads(data)
                    v = row.get(metric)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        xs.append(float(row.get("steps" if x == "step" else "epoch", len(xs) + 1)))
                        ys.append(float(v))
            if len(ys) > max_points:
                import numpy as np

                idx = minmax_indices(np.asarray(ys, dtype=float), max_points)
                xs, ys = [xs[i] for i in idx], [ys[i] for i in idx]
            out.append({"run": run, "x": xs, "y": ys})
        if chosen and not any(c["y"] for c in out):
            known = sorted({k for r in chosen for k in r.best} | set(STEP_SERIES))
            raise ValueError(f"None of these runs logged {metric!r}. Logged values: {known}.")
        return out

    def plot(
        self,
        metric: str = "val_loss",
        runs: Any = None,
        *,
        x: str | None = None,
        max_points: int = 400,
        width: int = 560,
        height: int = 300,
    ) -> RunsPlot:
        """Overlay ``metric`` of several runs as one SVG chart (like ``History.plot``).

        Args:
            metric: ``"loss"`` / ``"lr"`` (per step) or any epoch value (``"val_loss"``, ``"val_acc"``...).
            runs: ids, names, indices or :class:`Run` objects; default the 10 latest runs.
            x: ``"step"`` or ``"epoch"`` (see :meth:`curves`).
        """
        curves = self.curves(metric, runs, x=x, max_points=max_points)
        series = [
            {
                "x": c["x"],
                "y": c["y"],
                "label": c["run"].name,
                "color": PALETTE[i % len(PALETTE)],
                "markers": len(c["x"]) <= 30,
            }
            for i, c in enumerate(curves)
        ]
        values = [v for c in curves for v in c["y"]]
        log = metric == "lr" or (metric.endswith("loss") and use_log_scale(values))
        xlabel = "step" if (x or ("step" if metric in STEP_SERIES else "epoch")) == "step" else "epoch"
        svg = svg_chart(
            series,
            title=f"{metric}: {len(curves)} runs",
            xlabel=xlabel,
            ylabel=metric,
            width=width,
            height=height,
            log_y=log,
            y_format="lr" if metric == "lr" else "number",
        )
        return RunsPlot(svg, curves)

    def _choose(self, runs: Any) -> list[Run]:
        if runs is None:
            return self._all()[-10:]
        if isinstance(runs, (str, int, Run)):
            runs = [runs]
        return [self[r] for r in runs]

    # -- editing ----------------------------------------------------------------------------------
    def tag(self, run: str | int | Run, *labels: str, **tags: Any) -> dict[str, Any]:
        """Add tags to a run: labels (``"baseline"``) and ``key=value`` pairs; returns the run's tags."""
        target = self[run]
        new = dict(target.tags)
        new.update(dict.fromkeys((str(label) for label in labels), ""))
        new.update({str(k): v if isinstance(v, (str, int, float, bool)) else str(v) for k, v in tags.items()})
        text = dumps(new)
        self.store.write([lambda conn: conn.execute("UPDATE runs SET tags=? WHERE id=?", (text, target.id))])
        return new

    def delete(self, run: str | int | Run) -> None:
        """Remove a run and its values from the store (a run still training is refused)."""
        target = self[run]
        if target.status == "running":
            raise RuntimeError(f"Run {target.name} ({target.id}) is still training: stop it before deleting it.")

        def drop(conn: Any) -> None:
            for table in ("steps", "epochs", "events", "samples"):
                conn.execute(f"DELETE FROM {table} WHERE run_id=?", (target.id,))
            conn.execute("DELETE FROM runs WHERE id=?", (target.id,))

        self.store.write([drop])

    def diff(self, a: str | int | Run, b: str | int | Run) -> dict[str, tuple[Any, Any]]:
        """The settings that differ between two runs: ``{"config.optimizer_params.lr": (1e-3, 3e-3), ...}``."""
        sa, sb = self[a].settings(), self[b].settings()
        missing = object()
        out = {}
        for key in list(dict.fromkeys([*sa, *sb])):
            va, vb = sa.get(key, missing), sb.get(key, missing)
            if va != vb:
                out[key] = (None if va is missing else va, None if vb is missing else vb)
        return out

    def __repr__(self) -> str:
        return f"Runs({self.path or 'this session'}: {len(self)} runs)"

    def _repr_html_(self) -> str:
        where = html.escape(str(self.path or "this session"))
        return f"<div class='nbtrainer-runs'><b>Runs</b> ({where}: {len(self)} runs){self.table().to_html()}</div>"
