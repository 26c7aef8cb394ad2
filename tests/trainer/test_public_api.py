"""The public API holds: every keyword ``Trainer(...)`` takes, every public name of a Trainer and every name of the
root namespace keeps working. An addition is listed here on purpose (``ADDED_*``), a removal fails."""

from __future__ import annotations

import inspect
from typing import Any, cast

import pytest
import torch
from conftest import make_classification, make_loader, mlp

import nbtrainer
from nbtrainer import Trainer

# Trainer(model, criterion, optimizer=None, *, ...): the keywords of 2026-11-28 (main at 52cdadf).
TRAINER_KEYWORDS = [
    "model",
    "criterion",
    "optimizer",
    "scheduler",
    "scheduler_interval",
    "scheduler_monitor",
    "metrics",
    "callbacks",
    "precision",
    "grad_accum_steps",
    "max_grad_norm",
    "device",
    "seed",
    "deterministic",
    "progress",
    "num_inputs",
    "target_keys",
    "compute_loss",
    "predict_step",
    "refresh_interval",
    "timing_every",
    "val_every_n_epochs",
    "non_blocking",
    "lr",
    "activation_checkpointing",
    "trainable",
    "freeze",
    "compile",
    "channels_last",
    "on_nonfinite",
    "strategy",
    "fast_fetch",
    "data_on_device",
    "quantize",
    "lora",
    "save_base",
    "offload_activations",
    "offload_optimizer",
    "optimizer_in_backward",
    "chunked_loss",
    "attention",
    "run_store",
    "memory_budget_gb",
    "training_step",
    "validation_step",
]
ADDED_TRAINER_KEYWORDS: tuple[str, ...] = ("check_data",)  # the data checked at the start of a fit (issue 55)

# A Trainer's public names (methods, properties and the attributes a built Trainer has).
TRAINER_NAMES = [
    "active",
    "add_callback",
    "batch_steps",
    "checkpointed_blocks",
    "compute_loss",
    "current_epoch",
    "current_lr",
    "defer",
    "evaluate",
    "expected_log_keys",
    "fit",
    "fit_more",
    "global_step",
    "has_validation",
    "history",
    "interpret",
    "is_global_zero",
    "load_model_state_dict",
    "load_state_dict",
    "lr",
    "lr_find",
    "lrs",
    "memory_plan",
    "merge_lora",
    "model_setup",
    "model_state_dict",
    "param_counts",
    "pause",
    "predict",
    "predict_step",
    "remove_callback",
    "request_stop",
    "resume",
    "rollback",
    "run_recorder",
    "run_state",
    "save_checkpoint",
    "set_activation_checkpointing",
    "set_grad_accum_steps",
    "set_lr",
    "set_max_grad_norm",
    "set_precision",
    "set_scheduler",
    "state_dict",
    "total_steps",
    "model",
    "criterion",
    "optimizer",
    "scheduler",
    "scheduler_interval",
    "scheduler_monitor",
    "precision",
    "device",
    "strategy",
    "scaler",
    "grad_accum_steps",
    "micro_split",
    "options",
    "max_grad_norm",
    "optimizer_in_backward",
    "seed",
    "deterministic",
    "batch_spec",
    "refresh_interval",
    "timing_every",
    "val_every_n_epochs",
    "non_blocking",
    "fast_fetch",
    "data_on_device",
    "callbacks",
    "progress",
    "status",
    "run_id",
]
ADDED_TRAINER_NAMES = (
    "KEYWORDS",  # the valid keywords, for the panel's own check (issue 53)
    "check_data",  # issue 55: the data checked before training, its last report, a batch as the model gets it
    "data_report",
    "show_batch",
    "fresh_fit",  # whether a fit started a new run, for callbacks that keep state across fits
    "should_stop",  # Lightning's and Keras' stop flags: refused (AttributeError naming request_stop), never read
    "stop_training",
)

ROOT_ALL = [
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
ROOT_LAZY = [
    "CSVLogger",
    "Callback",
    "CheckpointError",
    "CompareWidget",
    "DDP",
    "DistillationLoss",
    "EVENTS",
    "EarlyStopping",
    "FSDP",
    "Health",
    "HealthReport",
    "History",
    "InferenceComparison",
    "Interpretation",
    "LRFinderResult",
    "LRMonitor",
    "LaunchMonitor",
    "LaunchView",
    "MLflowLogger",
    "MemoryOptions",
    "MemoryPlan",
    "ModelCheckpoint",
    "ModelProfile",
    "OptunaPruning",
    "ParamCounts",
    "PlanRow",
    "PrecisionError",
    "ProfileCard",
    "Progress",
    "ProgressBar",
    "Runs",
    "RunsWidget",
    "Samples",
    "StrategyComparison",
    "TensorBoardLogger",
    "Trainer",
    "TrainerWidget",
    "build_optimizer",
    "compare_inference",
    "compare_strategies",
    "format_bytes",
    "format_count",
    "format_duration",
    "format_lr",
    "format_number",
    "freeze_parameters",
    "in_notebook",
    "launch",
    "load_checkpoint",
    "memory_saver_support",
    "plan_memory",
    "precision_support",
    "profile_model",
    "profile_training",
    "quantize_model",
    "quiet_imports",
    "release_openmp_pool",
    "seed_everything",
    "start_training_thread",
    "tune",
]
ADDED_ROOT_ALL: tuple[str, ...] = ()
ADDED_ROOT_LAZY: tuple[str, ...] = (
    "CleanedDataset",  # issue 55: knowing the data
    "DataMap",
    "DataProblem",
    "DataReport",
    "show_batch",
    "as_loaders",  # the loaders fit makes of arrays, for the panel (TrainerWidget(..., (x, y), batch_size=32))
)


def test_the_trainer_takes_the_same_keywords():
    assert set(Trainer.KEYWORDS) == {*TRAINER_KEYWORDS, *ADDED_TRAINER_KEYWORDS}
    # help(Trainer), IPython's completion and inspect see every keyword with its default
    parameters = inspect.signature(Trainer).parameters
    assert list(parameters)[:3] == ["model", "criterion", "optimizer"]
    assert set(parameters) == set(Trainer.KEYWORDS)
    assert parameters["precision"].default is None and parameters["grad_accum_steps"].default == 1
    assert parameters["criterion"].default is inspect.Parameter.empty  # positional, required, as before


def test_a_built_trainer_keeps_its_public_names():
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    missing = [name for name in TRAINER_NAMES if not hasattr(trainer, name)]
    assert not missing, missing
    extra = {n for n in dir(trainer) if not n.startswith("_")} - {*TRAINER_NAMES, *ADDED_TRAINER_NAMES}
    assert not extra, f"new public names of a Trainer (list them in ADDED_TRAINER_NAMES on purpose): {sorted(extra)}"


def test_the_root_namespace_keeps_every_name():
    assert set(nbtrainer.__all__) == {*ROOT_ALL, *ADDED_ROOT_ALL}
    assert set(nbtrainer._LAZY) == {*ROOT_LAZY, *ADDED_ROOT_LAZY}


@pytest.mark.parametrize(
    ("typo", "closest"),
    [("precison", "precision"), ("grad_accumulation_steps", "grad_accum_steps"), ("callback", "callbacks")],
)
def test_an_unknown_trainer_keyword_names_the_closest(typo, closest):
    with pytest.raises(TypeError, match=rf"Trainer\(\) got an unexpected keyword argument '{typo}'.*'{closest}'"):
        Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False, **cast(Any, {typo: 1}))


def test_an_unknown_fit_keyword_names_the_closest():
    x, y = make_classification(n=32)
    trainer = Trainer(mlp(), torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, progress=False)
    with pytest.raises(TypeError, match=r"fit\(\) got an unexpected keyword argument 'epoch'.*'epochs'"):
        trainer.fit(make_loader(x, y), epoch=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"fit_more\(\) got an unexpected keyword argument 'max_step'.*'max_steps'"):
        trainer.fit_more(make_loader(x, y), epochs=1, max_step=2)  # type: ignore[call-arg]
    assert trainer.global_step == 0  # refused before anything ran
