"""Every interpreter the suite starts (kernels, servers, scripts, ranks, the GPU command's steps) runs this first:
``tests/conftest.py`` puts this folder on ``PYTHONPATH`` and the children inherit it.

Full garbage collections are left to the code that asks for one. Python's collector runs a full collection each time
the objects that survived the young generations grow by a quarter; while an interpreter imports torch, transformers
and the widget stack that happens four to six times, and each one walks every object imported so far. Measured: 0.25 s
of the 1.8 CPU seconds such an interpreter spends importing, and more in a kernel that trains and draws afterwards. The
suite starts about 140 of them: a kernel-heavy subset (the demo notebooks, the kernel and exit checks, the CLI) went
from 108 to 89.6 CPU seconds. The young generations are collected as before, so a cycle that dies young is freed;
``gc.collect()`` (the OOM path's release, the reference checks) collects everything as before. The pytest workers
themselves freeze what survives each test instead (``tests/conftest.py``)."""

import gc
import importlib.machinery
import importlib.util
import os
import sys

# threshold2: how many young collections come before a full one is even considered (Python's default is 10)
gc.set_threshold(gc.get_threshold()[0], gc.get_threshold()[1], 1000)

# a sitecustomize of the interpreter itself (Debian's, a distribution's) still runs: this one only shadows it
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)

# ZeroMQ's queues without a limit in the kernels and servers the suite starts, and NBT_SLOW_COMM (_nbt_zmq.py)
import _nbt_zmq  # noqa: E402, F401  (this folder is on sys.path: PYTHONPATH)
