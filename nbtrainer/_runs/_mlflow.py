"""MLflowLogger: a fit's values, settings, events, status and checkpoints in MLflow, for teams that use it.

It consumes the same events as the other loggers (per-step values from ``on_refresh``'s ``step_points``,
already on the host; epoch rows at ``on_epoch_end``; panel changes from ``on_control``) and hands every MLflow
call to its own thread, so a slow server or the SQLite schema creation of a fresh ``mlflow.db`` (seconds)
never stalls the loop. ``fit`` returns once that thread has ended the run (bounded by ``flush_timeout``;
``wait=False`` returns at once); :meth:`MLflowLogger.flush` waits on demand, and a process waits for it at exit.

A tracking URI that cannot be reached is said once (a warning) and the fit goes on: its values stay in the
History and the run store. A tracking server that goes down mid-fit is found within seconds (the logger's own HTTP
calls retry twice and wait 15 s at most: ``_mlflow_http``); the logger then skips its calls until the next fit.
Only rank 0 logs under DDP.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import queue
import re
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer._events._callbacks import Callback
from nbtrainer._events._stream import CONTROL_KINDS
from nbtrainer._optional import import_optional, require
from nbtrainer._runs._mlflow_crash import TOKEN_TAG, checkpoint_state, end_earlier, new_token, read_state
from nbtrainer._runs._mlflow_http import bounded_calls
from nbtrainer._runs._mlflow_values import (
    control_value,
    epoch_values,
    history_sizes,
    history_values,
    step_values,
)
from nbtrainer._runs._recorder import _checkpoints, _config, _environment, _model

if TYPE_CHECKING:
    from nbtrainer._loop._host import LoopHost

__all__ = ["MLflowLogger"]

log = logging.getLogger(__name__)

_INSTALL = 'pip install "nbtrainer[mlflow]"  (or: pip install mlflow)'
# MLflow's limits (mlflow.utils.validation): key length, param value length, entities per log_batch
MAX_KEY, MAX_PARAM, MAX_TAG, MAX_METRICS, MAX_PARAMS = 250, 6000, 8000, 1000, 100
_STATUS = {"finished": "FINISHED", "stopped": "KILLED", "interrupted": "KILLED", "failed": "FAILED"}
# What MLflow takes in a metric or param name (mlflow.utils.validation): word characters, - . space / and, but on
# Windows, ':' ("top:5" stays as it is)
_BAD = re.compile(r"[^\w\-. /]" if os.name == "nt" else r"[^\w\-. /:]")
_LIVE: weakref.WeakSet[MLflowLogger] = weakref.WeakSet()  # loggers with calls that may still be queued


def _key(name: str) -> str:
    """A key MLflow accepts: its characters, no leading slash or ``..``, at most 250 characters."""
    key = _BAD.sub("_", name).strip("/").replace("..", "_")
    return key[:MAX_KEY] or "_"


def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Nested settings as ``{"optimizer_params.lr": "0.001", ...}``, keys and values cut to MLflow's limits.

    Example:
        >>> flatten_params({"optimizer_params": {"lr": 0.001, "betas": [0.9, 0.999]}, "seed": None})
        {'optimizer_params.lr': '0.001', 'optimizer_params.betas': '[0.9, 0.999]', 'seed': 'None'}
    """
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten_params(v, f"{prefix}{k}."))
        return out
    text = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    if len(text) > MAX_PARAM:
        text = text[: MAX_PARAM - 3] + "..."
    out[_key(prefix.rstrip("."))] = text
    return out


def _reachable(uri: str) -> str | None:
    """Why ``uri`` cannot be used now (``None``: it can), checked quickly on the caller's thread."""
    if uri.startswith(("http://", "https://")):
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=3) as resp:
                resp.read()
        except urllib.error.HTTPError:
            return None  # it answers (an older server without /health, or a proxy): good enough
        except OSError as exc:
            return f"no answer: {getattr(exc, 'reason', exc)}"
        return None
    if uri.startswith("sqlite:///"):
        folder = os.path.dirname(os.path.abspath(uri[len("sqlite:///") :])) or "."
        if not os.path.isdir(folder):
            return f"the folder {folder} does not exist"
    return None


class MLflowLogger(Callback):
    """Log each fit to MLflow: settings as params, per-step and epoch values, panel changes, status, checkpoints.

    What goes where: params are the run's flattened settings (``optimizer``, ``optimizer_params.lr``, ``precision``,
    ``batch_size``, ``model.params``...; values longer than MLflow's 6000 characters are cut); metrics ``step/loss`` and
    ``step/lr`` (and ``step/lr_group1``... with several param groups) at the refresh interval (the mean loss of the
    steps since the last refresh and the LR, at the last of those steps; ``every_step=True``: every step's values),
    every epoch value under its own name (``loss``, ``val_loss``, ``val_acc``...) at the epoch's last step,
    ``control/lr`` and ``control/grad_accum_steps`` where the panel (or ``set_lr``) changed them, ``health/<kind>``
    where :class:`~nbtrainer.Health` reported (its message in the tag ``nbtrainer.health.<kind>``); tags
    ``nbtrainer.status``, ``nbtrainer.stop_reason``, ``nbtrainer.run_id`` (the run in ``nbtrainer.Runs``) and yours; the
    events as ``events.json``; with ``log_checkpoints=True`` every ModelCheckpoint file under ``checkpoints/``. The
    MLflow run ends FINISHED, KILLED (stopped, interrupted) or FAILED. ``fit_more`` extends the trainer's run; a resume
    (``resume_from=``) in a new process starts a run that holds the whole History, tagged ``nbtrainer.resumed_from``
    (the run the checkpoint names by its id or its tag ``nbtrainer.fit_token``), which gets ``nbtrainer.continued_by``
    and, if a killed process left it RUNNING, ends KILLED. A character MLflow does not take in a name becomes ``_``; two
    metrics that would then share a name (``acc@1``, ``acc#1``) stay apart (``acc_1``, ``acc_1_2``, said once in a
    warning).

    Args:
        tracking_uri: ``None``: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working folder
            (MLflow's file store needs ``MLFLOW_ALLOW_FILE_STORE=true`` now; SQLite is the local default).
            ``http://host:port`` for a tracking server.
        experiment: the experiment's name (created when missing).
        run_name: the MLflow run's name (default: MLflow picks one).
        log_checkpoints: upload the checkpoint files of ModelCheckpoint callbacks at the end of the fit.
        tags: more tags for the run.
        every_step: send every optimizer step's loss and LR (MLflow's SQL store costs about 0.1 ms CPU per value,
            a fifth of a tiny model's step); by default one point per refresh window. The run store keeps every
            step either way.
        send_interval: seconds between sends of the gathered points to MLflow (also at each epoch end and at
            the end of the fit): each send is one ``log_batch``, about 6 ms CPU on a local SQLite store.
        wait: ``fit`` returns once MLflow has the whole run, ended (default; bounded by ``flush_timeout``), so a
            notebook that reads MLflow right after ``fit`` sees every metric and the final status. ``False``:
            ``fit`` returns at once and the calls finish in the background (:meth:`flush` waits for them, and so
            does the end of the process).
        flush_timeout: the longest :meth:`flush` (and ``wait=True``) waits, in seconds.

    A tracking server that stops answering mid-fit: the logger's own HTTP calls retry twice and wait 15 s at most
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``_BACKOFF_FACTOR``, ``_TIMEOUT`` when you set them; other MLflow calls of
    the process keep MLflow's defaults), so the first failed call sets :attr:`error` (the URI and the cause) within
    seconds and warns once; the later calls of the fit are skipped, ``fit`` and the end of the process wait on none
    of them, and the run ends FAILED (tag ``nbtrainer.mlflow_error``) if the server answers again at the fit's end.

    Raises:
        ImportError: ``mlflow`` is not installed (``pip install "nbtrainer[mlflow]"``).

    Example:
        >>> from nbtrainer import MLflowLogger
        >>> logger = MLflowLogger(tracking_uri="sqlite:///mlflow.db", experiment="digits")
        >>> # Trainer(..., callbacks=[logger]); then `mlflow ui --backend-store-uri sqlite:///mlflow.db`
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "nbtrainer",
        run_name: str | None = None,
        log_checkpoints: bool = False,
        *,
        tags: dict[str, Any] | None = None,
        every_step: bool = False,
        send_interval: float = 10.0,
        wait: bool = True,
        flush_timeout: float = 120.0,
    ) -> None:
        require("mlflow", "MLflowLogger", _INSTALL)
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.abspath('mlflow.db')}"
        if not isinstance(tracking_uri, str) or not tracking_uri:
            raise TypeError(f"tracking_uri must be a URI string such as 'sqlite:///mlflow.db', got {tracking_uri!r}.")
        if not isinstance(experiment, str) or not experiment:
            raise ValueError(f"experiment must be a non-empty name, got {experiment!r}.")
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.log_checkpoints = bool(log_checkpoints)
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.every_step = bool(every_step)
        self.send_interval = float(send_interval)
        self.wait = bool(wait)
        self.flush_timeout = float(flush_timeout)
        self.run_id: str | None = None  # the MLflow run id of the current (or last) fit
        self.error: str | None = None  # why MLflow could not be used, when it could not
        self._client: Any = None
        self._pending: list[tuple[str, float, int]] = []  # (key, value, step) not yet handed to MLflow's thread
        self._last_send = 0.0
        self._experiment_id: str | None = None
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._on = False
        self._names: dict[str, str] = {}  # metric name -> its MLflow key (the worker thread's)
        self._owners: dict[str, str] = {}  # MLflow key -> the metric name it holds
        self._epoch_due: tuple[int, dict[str, Any]] | None = None  # an epoch row not sent yet
        # The MLflow run of the current (or last) fit, which checkpoints name: its id once the logger's thread has it,
        # and the token it is tagged with (known at once): _mlflow_crash
        self._fit_run: str | None = None
        self._fit_token: str | None = None
        self._resumed: dict[str, Any] | None = None  # the MLflow run the checkpoint being resumed names
        # Each trainer's last MLflow run with its metric keys (the worker thread's): one logger may serve several
        # trainers in a notebook, and a fit_more extends its own trainer's run, not the one this logger logged last.
        self._runs: weakref.WeakKeyDictionary[Any, tuple[str, dict[str, str], dict[str, str]]] = (
            weakref.WeakKeyDictionary()
        )

    # -- the worker thread -------------------------------------------------------------------------
    def _submit(self, op: Callable[[], None]) -> None:
        _LIVE.add(self)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._work, name="nbtrainer-mlflow", daemon=True)
            self._thread.start()
        self._queue.put(op)

    def _work(self) -> None:
        http = self.tracking_uri.startswith(("http://", "https://"))
        while True:
            op = self._queue.get()
            try:
                if op is not None and (self.error is None or getattr(op, "after_error", False)):
                    with bounded_calls() if http else contextlib.nullcontext():
                        op()
            except Exception as exc:
                log.debug("an MLflow call failed: the logger stops and warns once (the run goes on)", exc_info=True)
                # a server gone: said as at the start ("no answer: [Errno 111] Connection refused"), not as the
                # client's exception (a page of urllib3 retry text)
                gone = _reachable(self.tracking_uri) if http else None
                self._fail(gone or f"{type(exc).__name__}: {exc}", during_run=self.run_id is not None)
            finally:
                self._queue.task_done()

    def _fail(self, reason: str, *, during_run: bool = False) -> None:
        if self.error is None:  # said once; the fit goes on
            self.error = f"{self.tracking_uri}: {reason}" if self.tracking_uri not in reason else reason
            held = (
                f" The MLflow run {self.run_id} holds what was sent before; the logger skips its calls until the "
                "next fit."
                if during_run
                else ""
            )
            fix = (
                f" Check that the tracking server at {self.tracking_uri} is running and reachable."
                if self.tracking_uri.startswith(("http://", "https://"))
                else ""
            )
            warnings.warn(
                f"MLflowLogger: cannot log to {self.tracking_uri} ({reason}).{held} Training goes on; its values "
                f"are kept in the History and the run store (nbtrainer.Runs).{fix}",
                RuntimeWarning,
                stacklevel=2,
            )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the queued MLflow calls (False if ``timeout`` ran out first)."""
        deadline = time.monotonic() + (self.flush_timeout if timeout is None else timeout)
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _metrics(self, values: list[tuple[str, float, int]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [Metric(self._metric_key(k), float(v), now, int(s)) for k, v, s in values]
        for i in range(0, len(ms), MAX_METRICS):
            self._client.log_batch(self.run_id, metrics=ms[i : i + MAX_METRICS])

    def _metric_key(self, name: str) -> str:
        """``name``'s MLflow key: cleaned to what MLflow takes, and distinct from every other metric's key of the run
        (``acc@1`` and ``acc#1`` would both clean to ``acc_1`` and interleave as one series); said once per pair."""
        key = self._names.get(name)
        if key is not None:
            return key
        key = base = _key(name)
        n = 1
        while key in self._owners:
            n += 1
            key = f"{base[: MAX_KEY - len(str(n)) - 1]}_{n}"
        if key != base:
            warnings.warn(
                f"MLflowLogger: the metrics {self._owners[base]!r} and {name!r} both become {base!r} in MLflow (it "
                f"takes letters, digits, _ - . / : and spaces); {name!r} is logged as {key!r}. Rename one of the "
                "metrics to choose the names.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._names[name], self._owners[key] = key, name
        return key

    # -- the event stream ----------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        self._on = bool(trainer.is_global_zero)
        if not self._on:
            return
        # fit_more (and a fit that continues the History) extends this trainer's MLflow run, as it does the run store's
        fresh = trainer.fresh_fit
        resumed, self._resumed, self._fit_run = None if fresh else self._resumed, None, None
        self._fit_token = None
        self.error = None
        self._pending, self._last_send = [], time.monotonic()
        reason = _reachable(self.tracking_uri)
        if reason is not None:
            self._fail(reason)
            self._on = False
            return
        token = self._fit_token = new_token()
        params = flatten_params({**_config(trainer), "model": _model(trainer), "env": _environment(trainer)})
        accum, step = trainer.grad_accum_steps, trainer.global_step
        history, sizes = trainer.history, history_sizes(trainer.history)

        def start() -> None:
            mlflow = import_optional("mlflow", "MLflowLogger", _INSTALL)
            from mlflow.entities import Metric, Param, RunTag

            if self._client is None:
                self._client = mlflow.MlflowClient(tracking_uri=self.tracking_uri)
            client = self._client
            if self._experiment_id is None:
                location = None
                if self.tracking_uri.startswith("sqlite:///"):  # artifacts beside the database, not in the cwd
                    db = os.path.abspath(self.tracking_uri[len("sqlite:///") :])
                    location = "file://" + os.path.join(os.path.dirname(db), "mlartifacts")
                self._experiment_id = _experiment(client, self.experiment, location)
            exp_id = self._experiment_id
            # read here, after the calls of the fits before (queued in order), which recorded their runs
            earlier = None if fresh else self._runs.get(trainer)
            accum_metric = Metric("control/grad_accum_steps", float(accum), int(time.time() * 1000), step)
            if earlier is not None:  # params stay as logged (MLflow refuses a changed value); metrics go on
                continued, self._names, self._owners = earlier
                self.run_id = self._fit_run = continued
                client.update_run(continued, status="RUNNING")
                running = [RunTag("nbtrainer.status", "running"), RunTag(TOKEN_TAG, token)]
                client.log_batch(continued, metrics=[accum_metric], tags=running)
                return
            tags = {"nbtrainer.status": "running", TOKEN_TAG: token, "nbtrainer.model": str(params.get("model.class"))}
            tags.update(self.tags)
            self.run_id = self._fit_run = client.create_run(exp_id, run_name=self.run_name, tags=tags).info.run_id
            self._names, self._owners = {}, {}  # each run names its metrics afresh
            self._runs[trainer] = (self.run_id, self._names, self._owners)
            items = [Param(k, v) for k, v in params.items()]
            for i in range(0, len(items), MAX_PARAMS):  # the first batch carries the accumulation too
                client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS], metrics=[] if i else [accum_metric])
            if not fresh:
                # a resume that starts a new MLflow run (another trainer, a new process) sends what the History held
                # before it, as the run store's run of it holds it: else the MLflow run would begin at the resume
                self._metrics(history_values(history, sizes, self.every_step))
            if resumed is not None:  # the run a killed process left RUNNING ends; the two point at each other
                old = end_earlier(client, resumed, self.tracking_uri, self.run_id)
                if old is not None:
                    client.set_tag(self.run_id, "nbtrainer.resumed_from", old)

        self._submit(start)

    def state_dict(self) -> dict[str, Any]:
        return checkpoint_state(self._fit_run, self._fit_token, self.tracking_uri, self.experiment)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resumed = read_state(state)

    def on_refresh(self, trainer: LoopHost, progress: Any) -> None:
        if not self._on or self.error is not None or not progress.step_points:
            return
        # by default one point per refresh window: MLflow's SQL store spends ~0.1 ms on each value it stores
        self._pending += step_values(progress.step_points, self.every_step, progress.step_group_lrs)
        if time.monotonic() - self._last_send >= self.send_interval:
            self._send()

    def _send(self, extra: list[tuple[str, float, int]] | None = None) -> None:
        """Hand the values gathered since the last send to MLflow's thread (one ``log_batch``: ~6 ms CPU each)."""
        values, self._pending = self._pending + (extra or []), []
        self._last_send = time.monotonic()
        if values:
            self._submit(lambda: self._metrics(values))

    def on_control(self, trainer: LoopHost, event: dict[str, Any]) -> None:
        if not self._on or self.error is not None or event.get("kind") not in CONTROL_KINDS:
            return
        self._pending.append(control_value(event))

    def on_health(self, trainer: LoopHost, report: Any) -> None:
        """A health report: metric ``health/<kind>`` (1 at its step) and tag ``nbtrainer.health.<kind>`` (its
        message and advice, the newest of its kind)."""
        if not self._on or self.error is not None:
            return
        self._pending.append((f"health/{report.kind}", 1.0, int(report.step)))
        key, text = f"nbtrainer.health.{report.kind}", f"{report.message} {report.advice}".strip()[:MAX_TAG]
        self._submit(lambda: self._client.set_tag(self.run_id, key, text))

    def on_epoch_end(self, trainer: LoopHost, epoch: int, logs: dict[str, Any]) -> None:
        if not self._on or self.error is not None:
            return

        # Sent once every callback has added its keys to the row. A callback that ends the fit from this event
        # (OptunaPruning raises) drops the deferred calls: the row stays due and on_fit_end sends it.
        self._epoch_due = (trainer.global_step, logs)
        trainer.defer(self._queue_epoch)

    def _queue_epoch(self) -> None:
        due, self._epoch_due = self._epoch_due, None
        if due is None:
            return
        step, logs = due
        self._send(epoch_values(logs, step))

    def on_fit_end(self, trainer: LoopHost, history: Any) -> None:
        if not self._on:
            return
        self._on = False
        if self.error is None:
            self._queue_epoch()  # the last epoch's row, when the fit ended before its deferred send
        values, self._pending, self._epoch_due = self._pending, [], None
        status, reason = history.status, history.stop_reason
        events, has_events = json.dumps(history.events, default=str), bool(history.events)
        run_id = trainer.run_id
        files = [p for p in _checkpoints(trainer) if os.path.isfile(p)] if self.log_checkpoints else []

        @_after_error
        def end() -> None:
            from mlflow.entities import RunTag

            if self.error is not None:  # failed mid-fit (now or before): ended FAILED if MLflow answers again
                self._end_failed(status)
                return
            client = self._client
            if values:
                self._metrics(values)
            tags = [RunTag("nbtrainer.status", status)]
            if reason:
                tags.append(RunTag("nbtrainer.stop_reason", str(reason)[:MAX_TAG]))
            if run_id:
                tags.append(RunTag("nbtrainer.run_id", str(run_id)))
            client.log_batch(self.run_id, tags=tags)
            if has_events:
                client.log_text(self.run_id, events, "events.json")
            for path in files:
                client.log_artifact(self.run_id, path, artifact_path="checkpoints")
            client.set_terminated(self.run_id, status=_STATUS.get(status, "FINISHED"))

        self._submit(end)
        if self.wait and not self.flush() and self.error is None:
            warnings.warn(
                f"MLflowLogger: MLflow calls still running after {self.flush_timeout:.0f} s; they go on in the "
                "background.",
                RuntimeWarning,
                stacklevel=2,
            )

    def _end_failed(self, status: str) -> None:
        """On the logger's thread, after a failure mid-fit: the MLflow run ends FAILED (the reason in the tag
        ``nbtrainer.mlflow_error``) when the tracking URI answers again; a server still gone costs one quick check,
        no retries, and its run stays as MLflow last heard of it."""
        from mlflow.entities import RunTag

        if self.run_id is None or self._client is None or _reachable(self.tracking_uri) is not None:
            return
        tags = [RunTag("nbtrainer.status", status), RunTag("nbtrainer.mlflow_error", str(self.error)[:MAX_TAG])]
        self._client.log_batch(self.run_id, tags=tags)
        self._client.set_terminated(self.run_id, status="FAILED")


def _after_error(op: Callable[[], None]) -> Callable[[], None]:
    """Marks ``op`` to run on the logger's thread even after a failure (the worker skips every other call)."""
    op.after_error = True  # type: ignore[attr-defined]
    return op


@atexit.register
def _flush_at_exit() -> None:  # a script that ends right after fit: MLflow still gets the end of the run
    for logger in list(_LIVE):
        if logger.error is None:  # a failed logger's calls are skipped: nothing of it to wait for
            logger.flush(timeout=30)


def _experiment(client: Any, name: str, location: str | None) -> str:
    """The id of experiment ``name``, created when missing. Another process may create it between the lookup and the
    create (two notebooks, a sweep's trials), or the server may have done so for a request of ours that the client
    sent again after a slow answer: then the create fails with RESOURCE_ALREADY_EXISTS and the lookup is made again."""
    from mlflow.exceptions import MlflowException  # imported by the caller already: mlflow is installed

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except MlflowException as exc:  # a server's RestException and a local store's alike
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)
