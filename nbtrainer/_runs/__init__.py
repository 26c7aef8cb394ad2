"""Runs: every fit recorded in a store, compared in the notebook, tracked in MLflow, searched with Optuna.

==================  ============================================================================
``_store``          RunStore: SQLite in memory or in a file (WAL), one writer thread, schema migration
``_recorder``       RunRecorder: the callback that records each fit (attached by the Trainer)
``_runs``           Runs, Run, RunTable, RunsPlot: table, overlays, histories, tags, diffs
``_mlflow``         MLflowLogger: the same events into MLflow (local SQLite or a tracking server)
``_mlflow_crash``   the MLflow run a checkpoint names: ended KILLED when a resume finds its process gone
``_mlflow_http``    bounded HTTP retries and timeouts for MLflowLogger's own calls to a tracking server
``_mlflow_values``  the metric points MLflowLogger sends: per step, per epoch, a resumed History's
``_optuna``         OptunaPruning, tune: hyperparameter search, each trial a run
==================  ============================================================================
"""

from nbtrainer._runs._mlflow import MLflowLogger
from nbtrainer._runs._optuna import OptunaPruning, tune
from nbtrainer._runs._recorder import RunRecorder, resolve_store
from nbtrainer._runs._runs import Run, Runs, RunsPlot, RunTable
from nbtrainer._runs._store import RunStore, open_store, session_store

__all__ = [
    "MLflowLogger",
    "OptunaPruning",
    "Run",
    "RunRecorder",
    "RunStore",
    "RunTable",
    "Runs",
    "RunsPlot",
    "open_store",
    "resolve_store",
    "session_store",
    "tune",
]
