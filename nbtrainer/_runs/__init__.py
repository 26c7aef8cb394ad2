"""Runs: every fit recorded in a store, compared in the notebook, tracked in MLflow, searched with Optuna.

=============  ================================================================================
``_store``     RunStore: SQLite in memory or in a file (WAL), one writer thread, schema migration
``_recorder``  RunRecorder: the callback that records each fit (attached by the Trainer)
``_runs``      Runs, Run, RunTable, RunsPlot: table, overlays, histories, tags, diffs
``_mlflow``    MLflowLogger: the same events into MLflow (local SQLite or a tracking server)
``_optuna``    OptunaPruning, tune: hyperparameter search, each trial a run
=============  ================================================================================
"""

__all__: list[str] = []
