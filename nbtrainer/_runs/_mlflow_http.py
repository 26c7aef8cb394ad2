"""Bounded HTTP retries and timeouts for MLflowLogger's own calls to a tracking server.

MLflow's HTTP client retries a refused connection 7 times with a backoff of 2 s doubling (about 2 minutes per call)
and waits 120 s for an answer: a server that goes down mid-fit held the logger's thread, and ``fit`` (which waits
for the end of the run), for minutes. MLflow reads those bounds from ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR`` and ``MLFLOW_HTTP_REQUEST_TIMEOUT`` at every request (process-wide: setting
them would change every other MLflow call of the process, from any thread); ``http_request`` takes them per call,
but the tracking store and the artifact repository never pass them. So the logger's thread marks its calls
(:func:`bounded_calls`, thread-local) and MLflow's ``http_request`` is wrapped once to apply the bounds to marked
calls only: every other caller gets MLflow's own defaults, unchanged.

The bounds are the user's ``MLFLOW_HTTP_REQUEST_*`` values when set, else 2 retries, a backoff factor of 1 s and a
15 s timeout: a refused connection fails in about 3 s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

# (environment variable, http_request's keyword, the logger's bound when the variable is not set)
BOUNDS = (
    ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "max_retries", 2),
    ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "backoff_factor", 1),
    ("MLFLOW_HTTP_REQUEST_TIMEOUT", "timeout", 15),
)
_LOCAL = threading.local()
_LOCK = threading.Lock()
_WRAPPED = "_nbtrainer_bounded"


def bounds() -> dict[str, int]:
    """The keyword arguments the logger's requests get: the user's ``MLFLOW_HTTP_REQUEST_*`` or the logger's own."""
    out = {}
    for env, keyword, default in BOUNDS:
        raw = os.environ.get(env, "").strip()
        try:
            out[keyword] = int(raw) if raw else default
        except ValueError:  # MLflow itself refuses it at its next request, with its own message
            log.debug("%s=%r is not an integer: the logger uses %d", env, raw, default)
            out[keyword] = default
    return out


def _bounded(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def http_request(*args: Any, **kwargs: Any) -> Any:
        marked = getattr(_LOCAL, "bounds", None)
        if marked:  # a call from the logger's thread: no more than its bounds
            for keyword, value in marked.items():
                given = kwargs.get(keyword)
                kwargs[keyword] = value if given is None else min(given, value)
        return original(*args, **kwargs)

    setattr(http_request, _WRAPPED, True)
    return http_request


def _install() -> None:
    """Wrap ``http_request`` where MLflow's tracking store and HTTP artifact repository look it up (once)."""
    from mlflow.utils import rest_utils

    modules: list[Any] = [rest_utils]
    try:
        from mlflow.store.artifact import http_artifact_repo

        modules.append(http_artifact_repo)
    except ImportError:  # an MLflow without it: artifacts go through rest_utils or another repository
        log.debug("mlflow.store.artifact.http_artifact_repo not importable", exc_info=True)
    with _LOCK:
        for module in modules:
            current = getattr(module, "http_request", None)
            if callable(current) and not getattr(current, _WRAPPED, False):
                module.http_request = _bounded(current)


@contextlib.contextmanager
def bounded_calls() -> Iterator[None]:
    """MLflow HTTP requests made on this thread inside the block retry and wait no more than :func:`bounds`."""
    _install()
    _LOCAL.bounds = bounds()
    try:
        yield
    finally:
        _LOCAL.bounds = None
