"""nbtrainer: fast, visible, controllable PyTorch training in Jupyter and in plain scripts.

Public names are resolved lazily (PEP 562), so ``import nbtrainer`` is cheap: torch is imported when
the first trainer name is used, and the widget layer (ipywidgets, bqplot, IPython) only when
``TrainerWidget`` / ``ProfileCard`` / ``CompareWidget`` are touched or ``%load_ext nbtrainer`` runs.

Example:
    >>> import torch
    >>> from nbtrainer import Trainer
    >>> model = torch.nn.Linear(4, 2)
    >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1),
    ...                   progress=False)
    >>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(3)]
    >>> len(trainer.fit(data, epochs=2).epochs)
    2
"""

import importlib as _importlib
import typing as _typing

__version__ = "0.1.0"

# name -> module that defines it (resolved on first use, PEP 562)
_LAZY: dict[str, str] = {
    "Trainer": "nbtrainer._trainer._trainer",
    "MemoryOptions": "nbtrainer._options",
    "plan_memory": "nbtrainer._plan",
    "MemoryPlan": "nbtrainer._plan",
    "PlanRow": "nbtrainer._plan",
    "History": "nbtrainer._events._history",
    "Callback": "nbtrainer._events._callbacks",
    "EarlyStopping": "nbtrainer._events._callbacks",
    "ModelCheckpoint": "nbtrainer._events._model_checkpoint",
    "LRMonitor": "nbtrainer._events._callbacks",
    "Health": "nbtrainer._health._health",
    "HealthReport": "nbtrainer._health._health_report",
    "ProgressBar": "nbtrainer._events._progress",
    "TensorBoardLogger": "nbtrainer._events._loggers",
    "CSVLogger": "nbtrainer._events._loggers",
    "Progress": "nbtrainer._events._stream",
    "EVENTS": "nbtrainer._events._stream",
    "seed_everything": "nbtrainer._setup._seed",
    "precision_support": "nbtrainer._setup._precision",
    "memory_saver_support": "nbtrainer._setup._memory_savers",
    "in_notebook": "nbtrainer._events._frontend",
    "PrecisionError": "nbtrainer._setup._precision",
    "load_checkpoint": "nbtrainer._resume._checkpoint_io",
    "CheckpointError": "nbtrainer._atomic",
    "profile_model": "nbtrainer._profile._model",
    "ModelProfile": "nbtrainer._profile._report",
    "profile_training": "nbtrainer._profile._trace",
    "launch": "nbtrainer._dist._launch",
    "LaunchMonitor": "nbtrainer._dist._launch_monitor",
    "LaunchView": "nbtrainer.widgets",
    "DDP": "nbtrainer._dist._ddp",
    "FSDP": "nbtrainer._dist._fsdp",
    "compare_strategies": "nbtrainer._compare._run",
    "StrategyComparison": "nbtrainer._compare._strategy_table",
    "DistillationLoss": "nbtrainer._inference._distill",
    "quantize_model": "nbtrainer._inference._quantize_model",
    "compare_inference": "nbtrainer._inference._compare",
    "InferenceComparison": "nbtrainer._inference._inference_table",
    "LRFinderResult": "nbtrainer._loop._lr_find",
    "build_optimizer": "nbtrainer._setup._model_setup",
    "freeze_parameters": "nbtrainer._setup._model_setup",
    "ParamCounts": "nbtrainer._setup._model_setup",
    "format_number": "nbtrainer._report._format",
    "format_lr": "nbtrainer._report._format",
    "format_count": "nbtrainer._report._format",
    "format_bytes": "nbtrainer._report._format",
    "format_duration": "nbtrainer._report._format",
    "TrainerWidget": "nbtrainer.widgets",
    "ProfileCard": "nbtrainer.widgets",
    "CompareWidget": "nbtrainer.widgets",
    "Runs": "nbtrainer._runs._runs",
    "MLflowLogger": "nbtrainer._runs._mlflow",
    "OptunaPruning": "nbtrainer._runs._optuna",
    "tune": "nbtrainer._runs._optuna",
    "RunsWidget": "nbtrainer.widgets",
    "quiet_imports": "nbtrainer._quiet",
    "Samples": "nbtrainer._look._samples",
    "Interpretation": "nbtrainer._look._interpretation",
    "DataMap": "nbtrainer._know._datamap",
    "DataReport": "nbtrainer._know._data_report",
    "DataProblem": "nbtrainer._know._data_report",
    "show_batch": "nbtrainer._know._show_batch",
    "as_loaders": "nbtrainer._data._arrays",
    "CleanedDataset": "nbtrainer._data._cleaned",
    "start_training_thread": "nbtrainer._threads",
    "release_openmp_pool": "nbtrainer._threads",
}

# The everyday names (what `from nbtrainer import *`, tab completion and help() show). Every other name of
# _LAZY still imports from here, lazily, so code written against an earlier nbtrainer keeps working; the tools
# live in public submodules: nbtrainer.profile, .compare, .inference, .runs, .dist (and nbtrainer.widgets).
__all__ = [
    "CSVLogger",
    "Callback",
    "CheckpointError",
    "EarlyStopping",
    "History",
    "LRMonitor",
    "MemoryOptions",
    "ModelCheckpoint",
    "PrecisionError",
    "Progress",
    "ProgressBar",
    "Runs",
    "TensorBoardLogger",
    "Trainer",
    "TrainerWidget",
    "__version__",
    "compare_strategies",
    "launch",
    "load_checkpoint",
    "load_ipython_extension",
    "plan_memory",
    "precision_support",
    "profile_model",
    "seed_everything",
    "unload_ipython_extension",
]

#: Public submodules, imported on first access (``nbtrainer.dist`` without ``import nbtrainer.dist``).
_SUBMODULES = ("compare", "dist", "inference", "profile", "runs", "widgets")


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"nbtrainer.{name}")  # the import system sets it on the package
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nbtrainer' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value  # cache: next access is a plain attribute lookup
    return value


def __dir__() -> list[str]:
    # Only the public names (tab completion, help()): not the helpers this module imports for itself.
    return sorted([*__all__, *_SUBMODULES])


def load_ipython_extension(ipython: _typing.Any) -> None:
    """``%load_ext nbtrainer``: register the ``%nbtrainer`` line magic."""
    from nbtrainer._shell import _magics

    _magics.load(ipython)


def unload_ipython_extension(ipython: _typing.Any) -> None:
    """``%unload_ext nbtrainer``: remove the ``%nbtrainer`` magic."""
    from nbtrainer._shell import _magics

    _magics.unload(ipython)


if _typing.TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from nbtrainer._atomic import CheckpointError as CheckpointError
    from nbtrainer._compare._run import compare_strategies as compare_strategies
    from nbtrainer._compare._strategy_table import StrategyComparison as StrategyComparison
    from nbtrainer._data._arrays import as_loaders as as_loaders
    from nbtrainer._data._cleaned import CleanedDataset as CleanedDataset
    from nbtrainer._dist._ddp import DDP as DDP
    from nbtrainer._dist._fsdp import FSDP as FSDP
    from nbtrainer._dist._launch import launch as launch
    from nbtrainer._dist._launch_monitor import LaunchMonitor as LaunchMonitor
    from nbtrainer._events._callbacks import Callback as Callback
    from nbtrainer._events._callbacks import EarlyStopping as EarlyStopping
    from nbtrainer._events._callbacks import LRMonitor as LRMonitor
    from nbtrainer._events._frontend import in_notebook as in_notebook
    from nbtrainer._events._history import History as History
    from nbtrainer._events._loggers import CSVLogger as CSVLogger
    from nbtrainer._events._loggers import TensorBoardLogger as TensorBoardLogger
    from nbtrainer._events._model_checkpoint import ModelCheckpoint as ModelCheckpoint
    from nbtrainer._events._progress import ProgressBar as ProgressBar
    from nbtrainer._events._stream import EVENTS as EVENTS
    from nbtrainer._events._stream import Progress as Progress
    from nbtrainer._health._health import Health as Health
    from nbtrainer._health._health_report import HealthReport as HealthReport
    from nbtrainer._inference._compare import compare_inference as compare_inference
    from nbtrainer._inference._distill import DistillationLoss as DistillationLoss
    from nbtrainer._inference._inference_table import InferenceComparison as InferenceComparison
    from nbtrainer._inference._quantize_model import quantize_model as quantize_model
    from nbtrainer._know._data_report import DataProblem as DataProblem
    from nbtrainer._know._data_report import DataReport as DataReport
    from nbtrainer._know._datamap import DataMap as DataMap
    from nbtrainer._know._show_batch import show_batch as show_batch
    from nbtrainer._look._interpretation import Interpretation as Interpretation
    from nbtrainer._look._samples import Samples as Samples
    from nbtrainer._loop._lr_find import LRFinderResult as LRFinderResult
    from nbtrainer._options import MemoryOptions as MemoryOptions
    from nbtrainer._plan import MemoryPlan as MemoryPlan
    from nbtrainer._plan import PlanRow as PlanRow
    from nbtrainer._plan import plan_memory as plan_memory
    from nbtrainer._profile._model import profile_model as profile_model
    from nbtrainer._profile._report import ModelProfile as ModelProfile
    from nbtrainer._profile._trace import profile_training as profile_training
    from nbtrainer._quiet import quiet_imports as quiet_imports
    from nbtrainer._report._format import format_bytes as format_bytes
    from nbtrainer._report._format import format_count as format_count
    from nbtrainer._report._format import format_duration as format_duration
    from nbtrainer._report._format import format_lr as format_lr
    from nbtrainer._report._format import format_number as format_number
    from nbtrainer._resume._checkpoint_io import load_checkpoint as load_checkpoint
    from nbtrainer._runs._mlflow import MLflowLogger as MLflowLogger
    from nbtrainer._runs._optuna import OptunaPruning as OptunaPruning
    from nbtrainer._runs._optuna import tune as tune
    from nbtrainer._runs._runs import Runs as Runs
    from nbtrainer._setup._memory_savers import memory_saver_support as memory_saver_support
    from nbtrainer._setup._model_setup import ParamCounts as ParamCounts
    from nbtrainer._setup._model_setup import build_optimizer as build_optimizer
    from nbtrainer._setup._model_setup import freeze_parameters as freeze_parameters
    from nbtrainer._setup._precision import PrecisionError as PrecisionError
    from nbtrainer._setup._precision import precision_support as precision_support
    from nbtrainer._setup._seed import seed_everything as seed_everything
    from nbtrainer._threads import release_openmp_pool as release_openmp_pool
    from nbtrainer._threads import start_training_thread as start_training_thread
    from nbtrainer._trainer._trainer import Trainer as Trainer
    from nbtrainer.widgets import CompareWidget as CompareWidget
    from nbtrainer.widgets import LaunchView as LaunchView
    from nbtrainer.widgets import ProfileCard as ProfileCard
    from nbtrainer.widgets import RunsWidget as RunsWidget
    from nbtrainer.widgets import TrainerWidget as TrainerWidget
