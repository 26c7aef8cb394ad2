"""Training on several processes: ``DDP`` and ``FSDP`` (FSDP2) strategies under torchrun, ``launch`` (torchrun from
a notebook) and ``LaunchMonitor`` (its progress). The notebook view is ``nbtrainer.widgets.LaunchView``."""

from nbtrainer._dist._ddp import DDP
from nbtrainer._dist._fsdp import FSDP
from nbtrainer._dist._launch import launch
from nbtrainer._dist._launch_monitor import LaunchMonitor

__all__ = ["DDP", "FSDP", "LaunchMonitor", "launch"]
