"""History: per-epoch rows, per-step series and control events, as plain data.

Plain data (lists, dicts, floats) so it can travel inside a ``weights_only=True`` checkpoint and be
written as CSV/JSON without pickle.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
from collections.abc import Iterator
from typing import Any

from nbtrainer._events._sample_list import SampleList

__all__ = ["History", "append_steps", "group_lr_key", "group_lr_keys", "group_lrs_of"]

_BASE_STEP_KEYS = ("step", "epoch", "loss", "lr")
_EVENT_KEYS = ("step", "epoch", "kind", "old", "new")


def group_lr_key(index: int) -> str:
    """The name of param group ``index``'s LR: in an epoch's row (``LRMonitor``), a step's column (index 1 up: group
    0's is ``lr``) and the loggers' series."""
    return f"lr_group{index}"


def group_lr_keys(steps: dict[str, list]) -> list[str]:
    """The param groups' LR columns of a History's ``steps`` (``lr_group1``...), in group order."""
    keys = [k for k in steps if k.startswith("lr_group") and k[len("lr_group") :].isdigit()]
    return sorted(keys, key=lambda k: int(k[len("lr_group") :]))


def group_lrs_of(steps: dict[str, list]) -> dict[int, tuple[float, ...]]:
    """A History's group LR columns by step, as ``Progress.step_group_lrs`` delivers them (group 0's first; NaN for a
    group a step did not have); empty with one param group."""
    keys = group_lr_keys(steps)
    if not keys:
        return {}
    columns = [steps["lr"], *(steps[k] for k in keys)]
    return {step: tuple(c[i] for c in columns) for i, step in enumerate(steps["step"])}


def append_steps(
    steps: dict[str, list], points: list[tuple[int, float, float]], epoch: int, group_lrs: dict[int, Any] | None = None
) -> None:
    """Append ``points`` (``(step, loss, lr)``) to the columns ``steps``; ``group_lrs``: every param group's LR at the
    steps taken with several groups (``Progress.step_group_lrs``), into ``lr_group1``... A column starts at the first
    step with its group (NaN before), and a step without the group (one param group then) has NaN in it."""
    for step, loss, lr in points:
        steps["step"].append(step)
        steps["epoch"].append(epoch)
        steps["loss"].append(loss)
        steps["lr"].append(lr)
        lrs = group_lrs.get(step) if group_lrs else None
        if lrs is None and len(steps) == len(_BASE_STEP_KEYS):  # one param group: the usual case, nothing more
            continue
        n = len(steps["step"])
        for i, value in enumerate(lrs[1:] if lrs else (), 1):
            steps.setdefault(group_lr_key(i), [math.nan] * (n - 1)).append(value)
        for column in steps.values():
            if len(column) < n:
                column.append(math.nan)


class History:
    """What a fit produced.

    Attributes:
        epochs: one dict per epoch: ``epoch, lr, loss, <metric>, val_loss, val_<metric>, time,
            samples_per_s, steps, skipped_steps``. ``lr`` is the LR (param group 0) the epoch's last optimizer step
            used, before a per-step scheduler moved it on. ``steps`` and ``skipped_steps`` are run totals at the
            epoch's end (optimizer steps taken since the run started, resumed and ``fit_more`` runs counted on;
            skipped ones among them: fp16 overflow, ``on_nonfinite="skip"``), not per-epoch counts: an epoch's
            own are the difference with the row before.
        steps: per optimizer step, columnar: ``{"step": [...], "epoch": [...], "loss": [...], "lr": [...]}``
            (``lr``: param group 0's LR the step used); with several param groups, also ``lr_group1``,
            ``lr_group2``... (named as :class:`~nbtrainer.LRMonitor` names them): each group's LR the step used.
        events: control changes and notable moments (``{"step", "epoch", "kind", "old", "new"}``; a health
            report is one of kind ``"health"``).
        samples: what :class:`~nbtrainer.Samples` took: ``{"step", "epoch", "name", "kind": "text" | "image",
            "value"}`` (an image's value is PNG bytes; base64 text in :meth:`state_dict` and JSON).
        health: what :class:`~nbtrainer.Health` measured: ``health["grad_norm"][name]`` and
            ``health["update_ratio"][name]`` as ``[(step, value), ...]`` per block (``"total"``: the whole model),
            ``health["dead_units"][block]`` (the share of dead ReLU units), ``health["data_wait"]`` (the share of
            the step spent waiting for the loader) and ``health["reports"]`` (each report as a dict).
        status: ``"finished"``, ``"stopped"``, ``"interrupted"`` or ``"failed"`` once a fit ends.

    Example:
        >>> h = History()
        >>> h.add_epoch({"epoch": 1, "loss": 0.5})
        >>> h["loss"]
        [0.5]
    """

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []
        self.steps: dict[str, list] = {"step": [], "epoch": [], "loss": [], "lr": []}
        self.events: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = SampleList()
        self.health: dict[str, Any] = _no_health()
        self.status: str = "idle"
        self.stop_reason: str | None = None

    # -- recording ---------------------------------------------------------------------------
    def add_epoch(self, row: dict[str, Any]) -> None:
        # The same dict the callbacks receive: keys they add in on_epoch_end (LRMonitor) land here too.
        self.epochs.append(row)

    def add_steps(
        self, points: list[tuple[int, float, float]], epoch: int, group_lrs: dict[int, Any] | None = None
    ) -> None:
        """Append a refresh's step points; ``group_lrs`` as :func:`append_steps` takes them."""
        append_steps(self.steps, points, epoch, group_lrs)

    def add_event(self, **event: Any) -> None:
        self.events.append(event)

    def add_sample(self, *, step: int, epoch: int, name: str, kind: str, value: str | bytes) -> None:
        self.samples.append({"step": step, "epoch": epoch, "name": name, "kind": kind, "value": value})

    def add_health(self, report: dict[str, Any]) -> None:
        """A health report (``HealthReport.to_dict()``): kept in ``health["reports"]`` and as a ``"health"`` event."""
        self.health.setdefault("reports", []).append(report)
        self.add_event(
            step=report["step"], epoch=report["epoch"], kind="health", old=report["kind"], new=report["message"]
        )

    def truncate(self, step: int) -> None:
        """Forget the steps after ``step`` (a rollback): per-step values, samples and health series; events stay
        (they say what happened, the rollback included)."""
        keep = sum(1 for s in self.steps["step"] if s <= step)
        self.steps = {k: v[:keep] for k, v in self.steps.items()}
        self.samples = SampleList(s for s in self.samples if s["step"] <= step)
        for key, series in self.health.items():
            if key == "data_wait":
                self.health[key] = [p for p in series if p[0] <= step]
            elif key != "reports":
                self.health[key] = {n: [p for p in pts if p[0] <= step] for n, pts in series.items()}

    # -- reading -----------------------------------------------------------------------------
    @property
    def interrupted(self) -> bool:
        return self.status == "interrupted"

    @property
    def last(self) -> dict[str, Any]:
        return self.epochs[-1] if self.epochs else {}

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.epochs:
            seen.update(dict.fromkeys(row))
        return list(seen)

    def __getitem__(self, key: str) -> list[Any]:
        if key not in self.keys():
            raise KeyError(f"{key!r} is not in the history; available: {self.keys()}")
        return [row.get(key) for row in self.epochs]

    def __len__(self) -> int:
        return len(self.epochs)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.epochs)

    def best(self, monitor: str = "val_loss", mode: str = "auto") -> dict[str, Any] | None:
        """The epoch row with the best finite ``monitor`` value (None if no epoch has one yet).

        ``mode="auto"`` maximizes accuracies, F1, AUROC and the like and minimizes losses and errors, the rule
        ``EarlyStopping``, ``ModelCheckpoint`` and the report's bold use; ``"min"`` or ``"max"`` to say it. A
        ``monitor`` no epoch logged is a ``KeyError`` naming the keys that were.

        Example:
            >>> h = History()
            >>> for e, acc in ((1, 0.6), (2, 0.9), (3, 0.8)):
            ...     h.add_epoch({"epoch": e, "val_acc": acc})
            >>> h.best("val_acc")["epoch"]
            2
        """
        from nbtrainer._report._html import resolve_mode

        mode = resolve_mode(monitor, mode)  # anything but min/max/auto refused: "minimum" once picked the maximum
        if self.epochs and monitor not in self.keys():  # a typo once returned None, and best[...] failed far away
            raise KeyError(f"{monitor!r} was not logged in this history's {len(self.epochs)} epochs: {self.keys()}")
        rows = [r for r in self.epochs if isinstance(r.get(monitor), (int, float)) and math.isfinite(r[monitor])]
        if not rows:
            return None
        pick = min if mode == "min" else max
        return pick(rows, key=lambda r: r[monitor])

    def __repr__(self) -> str:
        from nbtrainer._report._format import format_value

        # each value in the one format the progress lines use, with its unit: an LR of 1.52e-6 must not read as 0.0,
        # the epoch's time reads "12.3 ms"
        def shown(key: str, value: Any) -> str:
            text = format_value(key, value)
            return f"{text} samples/s" if key == "samples_per_s" else text

        last = ", ".join(f"{k}={shown(k, v)}" for k, v in self.last.items() if k not in ("epoch", "steps"))
        return (
            f"History(epochs={len(self.epochs)}, steps={len(self.steps['step'])}, status={self.status!r}"
            + (f", last epoch: {last}" if last else "")
            + ")"
        )

    # -- charts and reports (plain SVG/HTML: no plotting library) --------------------------------
    def to_svg(self, *, columns: int = 2) -> str:
        """The summary charts (loss, learning rate, metrics per epoch) as one SVG document.

        Text is drawn in ``currentColor`` (the page's text colour when the SVG is inlined in HTML); use
        ``plot().save("run.svg")`` for a standalone file with dark text.
        """
        from nbtrainer._report._html import HistoryPlot

        return HistoryPlot(self, columns=columns).to_svg()

    def plot(self, *, max_points: int = 400, smoothing: float = 0.9) -> Any:
        """The charts as an object that displays in a notebook and saves with ``.save("run.svg" | "run.html")``.

        Example:
            >>> h = History()
            >>> h.add_steps([(1, 0.9, 1e-3), (2, 0.5, 1e-3)], epoch=1)
            >>> "<svg" in h.plot()._repr_html_()
            True
        """
        from nbtrainer._report._html import HistoryPlot

        return HistoryPlot(self, max_points=max_points, smoothing=smoothing)

    def to_html(self, *, title: str = "nbtrainer run") -> str:
        """A report: status line, the per-epoch table and the charts, as HTML with inline SVG."""
        from nbtrainer._report._html import summary_html

        return summary_html(self, title=title)

    def _repr_html_(self) -> str:
        return self.to_html(title="History")

    # -- export ------------------------------------------------------------------------------
    def to_pandas(self, what: str = "epochs") -> Any:
        """``what="epochs"`` (default), ``"steps"``, ``"events"`` or ``"samples"`` as a ``pandas.DataFrame``.

        pandas is optional (not a dependency of nbtrainer): without it this raises an ImportError that
        says to ``pip install pandas`` (or ``nbtrainer[pandas]``); :meth:`to_csv` / :meth:`to_json` need nothing.
        """
        if what not in ("epochs", "steps", "events", "samples"):
            raise ValueError(f"what must be 'epochs', 'steps', 'events' or 'samples', got {what!r}.")
        from nbtrainer._optional import import_optional

        pd = import_optional(
            "pandas", "History.to_pandas()", 'pip install pandas  (or: pip install "nbtrainer[pandas]")'
        )

        data = {"epochs": self.epochs, "steps": self.steps, "events": self.events, "samples": self.samples}[what]
        frame = pd.DataFrame(data)
        if what == "epochs" and "epoch" in frame:
            frame = frame.set_index("epoch")
        return frame

    def to_csv(self, path: str | os.PathLike[str] | None = None, *, what: str = "epochs") -> str:
        """Write a table as CSV (atomically) and return the text: ``what="epochs"`` (default) the epoch rows,
        ``"steps"`` one row per optimizer step (:attr:`steps`), ``"events"`` the control events.

        A fit that ended inside its first epoch (``max_steps``, a stop, an interrupt) has no epoch row: its epoch
        table is the header ``epoch`` alone (an empty table that csv and pandas read as such), and its steps are
        in ``to_csv(what="steps")``. Samples hold image bytes: :meth:`to_json` writes them.
        """
        if what not in ("epochs", "steps", "events"):
            raise ValueError(
                f"what must be 'epochs', 'steps' or 'events', got {what!r} (the samples, images included, are in "
                "to_json())."
            )
        if what == "steps":
            fields = list(self.steps)
            rows: list[dict[str, Any]] = [
                dict(zip(fields, r, strict=True)) for r in zip(*self.steps.values(), strict=True)
            ]
        elif what == "events":
            rows = self.events
            fields = list(dict.fromkeys([*_EVENT_KEYS, *(k for e in rows for k in e)]))
        else:
            rows, fields = self.epochs, self.keys() or ["epoch"]
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        text = buf.getvalue()
        if path is not None:
            from nbtrainer._atomic import atomic_write_bytes

            atomic_write_bytes(path, text.encode())
        return text

    def to_json(self, path: str | None = None) -> str:
        """Write everything (epochs, steps, events, status) as JSON (atomically) and return the text."""
        text = json.dumps(self.state_dict(), allow_nan=True)
        if path is not None:
            from nbtrainer._atomic import atomic_write_bytes

            atomic_write_bytes(path, text.encode())
        return text

    def state_dict(self) -> dict[str, Any]:
        return {
            "epochs": [dict(r) for r in self.epochs],
            "steps": {k: list(v) for k, v in self.steps.items()},
            "events": [dict(e) for e in self.events],
            # an image's PNG bytes as base64 text: plain data for JSON and for a weights_only checkpoint alike
            "samples": [_encoded(s) for s in self.samples],
            "health": _copy_health(self.health),
            "status": self.status,
            "stop_reason": self.stop_reason,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs = [dict(r) for r in state.get("epochs", [])]
        steps = state.get("steps") or {}
        self.steps = {k: list(steps.get(k, [])) for k in (*_BASE_STEP_KEYS, *group_lr_keys(steps))}
        self.events = [dict(e) for e in state.get("events", [])]
        self.samples = SampleList(_decoded(s) for s in state.get("samples", []))
        self.health = _no_health()
        self.health.update(_copy_health(state.get("health") or {}, pairs=tuple))
        self.status = state.get("status", "idle")
        self.stop_reason = state.get("stop_reason")

    @classmethod
    def from_json(cls, path: str) -> History:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        history = cls()
        history.load_state_dict(state)
        return history


def plain_values(row: dict[str, Any]) -> None:
    """Make ``row``'s tensor and numpy values plain Python numbers (lists for arrays), in place.

    Callbacks add keys to an epoch's row in ``on_epoch_end`` (``logs["f1"] = f1_score(...)``, an ``np.float64``;
    ``logs["grad_norm"] = clip_grad_norm_(...)``, a tensor). Kept as they were, a numpy value made every later
    checkpoint unloadable (``weights_only=True`` refuses numpy's pickles), the loggers dropped them (TensorBoard,
    MLflow) or wrote ``tensor(2.5000)`` (CSV), and the run store a string.
    """
    for key, value in row.items():
        row[key] = _plain(value)


def _plain(value: Any) -> Any:
    kind = type(value)
    if value is None or kind in (str, bool, int, float):
        return value
    module = kind.__module__.partition(".")[0]
    if module == "torch" and hasattr(value, "numel"):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if module == "numpy" and hasattr(value, "tolist"):
        return value.item() if getattr(value, "size", 0) == 1 else value.tolist()
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def _encoded(sample: dict[str, Any]) -> dict[str, Any]:
    value = sample["value"]
    return {**sample, "value": base64.b64encode(value).decode("ascii")} if isinstance(value, bytes) else dict(sample)


def _decoded(sample: dict[str, Any]) -> dict[str, Any]:
    value = sample.get("value")
    if sample.get("kind") == "image" and isinstance(value, str):
        return {**sample, "value": base64.b64decode(value)}
    return dict(sample)


def _no_health() -> dict[str, Any]:
    return {"grad_norm": {}, "update_ratio": {}, "dead_units": {}, "data_wait": [], "reports": []}


def _copy_health(health: dict[str, Any], pairs: Any = list) -> dict[str, Any]:
    """A copy of plain data (``(step, value)`` pairs as lists for a checkpoint or JSON, as tuples when loaded)."""
    out: dict[str, Any] = {}
    for key, value in health.items():
        if key == "reports":
            out[key] = [dict(r) for r in value]
        elif isinstance(value, dict):
            out[key] = {n: [pairs(p) for p in pts] for n, pts in value.items()}
        else:
            out[key] = [pairs(p) for p in value]
    return out
