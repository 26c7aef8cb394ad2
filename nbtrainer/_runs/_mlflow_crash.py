"""The MLflow run a checkpoint names, and what a resume from another process does with it.

A process killed mid-fit (SIGKILL, out of memory, a preempted job) never ends its MLflow run: MLflow shows it RUNNING
for good. Its checkpoint names the run (:func:`checkpoint_state`, in ``MLflowLogger.state_dict``), so the resume ends
it KILLED, as the run store marks a run whose process is gone, and the two runs point at each other (tags
``nbtrainer.continued_by`` and ``nbtrainer.resumed_from``). The resume logs into a new run, not into the killed one:
MLflow cannot remove the points the killed process logged after its checkpoint, and the resumed steps would be
drawn over them.

A checkpoint written before the logger's thread has created the run (the first seconds of a fit; a fresh SQLite
store's schema alone takes seconds) cannot hold its id: it holds the fit's token instead, which the run carries as the
tag ``nbtrainer.fit_token`` and a resume searches for. Waiting for the id would stall the training thread.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

from nbtrainer._runs._store import _alive, process_start

__all__ = ["KILLED_REASON", "TOKEN_TAG", "checkpoint_state", "end_earlier", "new_token", "read_state"]

log = logging.getLogger(__name__)

#: the stop reason of a run ended for its process, the run store's words for it
KILLED_REASON = "the process ended without finishing the run (killed?)"
TOKEN_TAG = "nbtrainer.fit_token"


def new_token() -> str:
    return uuid.uuid4().hex


def checkpoint_state(run_id: str | None, token: str | None, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """What a checkpoint keeps of the fit's MLflow run: its id (``None`` until the logger's thread has it) and token,
    where it is, and the process that logs it (to tell, on resume, a process that died from one that still trains)."""
    if token is None:  # the logger is off (another rank, an unreachable URI)
        return {}
    pid = os.getpid()
    return {
        "run_id": run_id,
        "token": token,
        "tracking_uri": tracking_uri,
        "experiment": experiment,
        "host": socket.gethostname(),
        "pid": pid,
        "proc_start": process_start(pid),
    }


def read_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """A checkpoint's :func:`checkpoint_state`, or ``None`` when it holds none (older checkpoints)."""
    if not isinstance(state.get("token"), str) or not isinstance(state.get("tracking_uri"), str):
        return None
    return state


def _earlier_run(client: Any, earlier: dict[str, Any]) -> Any:
    """The MLflow run ``earlier`` names (by id, else by its token), or ``None`` when the store has none."""
    from mlflow.exceptions import MlflowException

    run_id = earlier.get("run_id")
    try:
        if isinstance(run_id, str):
            return client.get_run(run_id)
        experiment = client.get_experiment_by_name(str(earlier.get("experiment")))
        if experiment is None:
            return None
        token = "".join(c for c in str(earlier["token"]) if c.isalnum())  # a uuid's hex; nothing else in the filter
        found = client.search_runs([experiment.experiment_id], f"tags.`{TOKEN_TAG}` = '{token}'", max_results=1)
        return found[0] if found else None
    except MlflowException:
        log.debug("the MLflow run a checkpoint names is not found (deleted?)", exc_info=True)
        return None


def _still_running(earlier: dict[str, Any]) -> bool:
    if earlier.get("host") != socket.gethostname():
        # Another machine's process cannot be looked at from here. A resume elsewhere is nearly always a job that
        # died there (preempted, requeued); if it does train on, its own end marks the run again.
        return False
    pid = earlier.get("pid")
    return isinstance(pid, int) and _alive(pid, earlier.get("proc_start"))


def end_earlier(client: Any, earlier: dict[str, Any], tracking_uri: str, run_id: str) -> str | None:
    """On the logger's thread, once run ``run_id`` resumes ``earlier`` (a checkpoint's state): the earlier run gets
    the tag ``nbtrainer.continued_by``, and is ended KILLED when its process left it RUNNING and is gone. Returns the
    earlier run's id (``None``: not in this MLflow)."""
    from mlflow.entities import RunTag

    if earlier["tracking_uri"] != tracking_uri:  # in another MLflow: nothing here to end or tag
        return None
    run = _earlier_run(client, earlier)
    if run is None:
        return None
    old = run.info.run_id
    tags = [RunTag("nbtrainer.continued_by", run_id)]
    killed = run.info.status == "RUNNING" and not _still_running(earlier)
    if killed:
        tags += [RunTag("nbtrainer.status", "killed"), RunTag("nbtrainer.stop_reason", KILLED_REASON)]
    client.log_batch(old, tags=tags)
    if killed:
        client.set_terminated(old, status="KILLED")
    return str(old)
