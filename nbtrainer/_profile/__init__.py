"""Profiling: what a model costs before training it, and where a training step spends its time.

One concept per module:

=================  ==================================================================================
``_model``         :func:`profile_model`: size, MACs/FLOPs, latency and training memory on copies
``_report``        :class:`ModelProfile` (the result) and its table / HTML / text views
``_fit``           :class:`FitResult`: does a step fit a memory budget, which micro-batch split does
``_switches``      what quantize / lora / k-bit optimizers / offloading do to a measured step (for ``fits``)
``_flops``         MACs (ptflops, aten backend) cross-checked with ``FlopCounterMode``
``_latency``       inference latency per device and precision
``_trace``         :func:`profile_training`: ``torch.profiler`` over a few real training steps
=================  ==================================================================================

Memory is measured in one place, ``nbtrainer._memory`` (below the loop): the peak of live tensor storage over a
block (:func:`track_peak`), the breakdown of one optimizer step (:func:`measure_training_memory`) and the memory
per refresh window; the loop, the comparisons and the memory planner use it too. Example inputs (batch size,
device moves, calling the model) are the data path's, ``nbtrainer._data._inputs``.

The public names are re-exported by ``nbtrainer`` (lazily); the rest of the core imports from here.
"""

from nbtrainer._memory._breakdown import measure_training_memory, optimizer_factory
from nbtrainer._memory._peak import PeakTracker, track_peak
from nbtrainer._profile._fit import FitResult, plan_fit
from nbtrainer._profile._flops import count_flops
from nbtrainer._profile._model import profile_model
from nbtrainer._profile._report import ModelProfile
from nbtrainer._profile._trace import PHASES, TrainingProfile, profile_training

__all__ = [
    "PHASES",
    "FitResult",
    "ModelProfile",
    "PeakTracker",
    "TrainingProfile",
    "count_flops",
    "measure_training_memory",
    "optimizer_factory",
    "plan_fit",
    "profile_model",
    "profile_training",
    "track_peak",
]
