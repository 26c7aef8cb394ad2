"""What a model costs before training it, and whether a step fits: ``profile_model``, ``profile_training`` and the
memory planner ``plan_memory``.

Example:
    >>> import torch
    >>> from nbtrainer.profile import plan_memory
    >>> model = torch.nn.Linear(16, 4)
    >>> plan_memory(model, (torch.randn(8, 16), torch.randint(0, 4, (8,))), budget_gb=1, device="cpu").best.fits
    True
"""

from nbtrainer._plan import MemoryPlan, PlanRow, plan_memory
from nbtrainer._plan._budget import example_batch
from nbtrainer._plan._result import PART_COLORS
from nbtrainer._profile._model import profile_model
from nbtrainer._profile._report import ModelProfile
from nbtrainer._profile._trace import TrainingProfile, profile_training
from nbtrainer._setup._memory_savers import memory_saver_support

__all__ = [
    "PART_COLORS",
    "MemoryPlan",
    "ModelProfile",
    "PlanRow",
    "TrainingProfile",
    "example_batch",
    "memory_saver_support",
    "plan_memory",
    "profile_model",
    "profile_training",
]
