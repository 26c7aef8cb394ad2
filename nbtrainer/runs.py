"""Every fit remembered: the run store (``Runs``), MLflow (``MLflowLogger``) and Optuna (``tune``,
``OptunaPruning``). The notebook view is ``nbtrainer.widgets.RunsWidget``."""

from nbtrainer._runs._mlflow import MLflowLogger
from nbtrainer._runs._optuna import OptunaPruning, tune
from nbtrainer._runs._runs import Runs

__all__ = ["MLflowLogger", "OptunaPruning", "Runs", "tune"]
