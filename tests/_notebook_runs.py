"""Each demo notebook executed once per test run, by whichever pytest-xdist worker asks first (issue 57).

``tests/test_notebooks.py`` checks every demo notebook's outputs and ``tests/browser/test_quickstart.py`` exports the
quickstart's to HTML: both read the same run of the notebook (a kernel and a training run, seconds of CPU each) instead
of executing it again. The executed notebook, its wall seconds and the CPU seconds of its kernel are written to the
run's shared folder (``run_shared_dir`` in ``tests/conftest.py``) under a file lock; a worker that finds them there
reads them. The kernel is the ``python3`` kernelspec on ``JUPYTER_PATH``: ask for ``venv_kernelspec`` first.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

from _kernels import notebook_client

_MEMO: dict[str, tuple[Any, float, float]] = {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def executed(path: Path, shared: Path) -> tuple[Any, float, float]:
    """``path`` run top to bottom in a fresh kernel (cwd = its folder), once per test run: the notebook with its
    outputs and widget state, the wall seconds, and the CPU seconds of the kernel and what it started (reaped when
    the kernel is shut down: nothing else ends in the executing process meanwhile, a worker runs one test at a time).
    """
    import nbformat
    from filelock import FileLock

    key = str(path)
    if key not in _MEMO:
        done = shared / f"{path.stem}.executed.ipynb"
        facts = shared / f"{path.stem}.executed.json"
        with FileLock(str(done) + ".lock"):
            if not facts.exists():
                nb = nbformat.read(path, as_version=4)
                client = notebook_client(
                    nb,
                    timeout=None,  # no deadline per cell: the hang guard decides (tests/_guard.py)
                    kernel_name="python3",
                    store_widget_state=True,
                    resources={"metadata": {"path": str(path.parent)}},
                )
                start, cpu = time.perf_counter(), _children_cpu()
                client.execute()
                seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
                nbformat.write(nb, done)
                facts.write_text(json.dumps({"seconds": seconds, "cpu": cpu}))
        measured = json.loads(facts.read_text())
        _MEMO[key] = (nbformat.read(done, as_version=4), measured["seconds"], measured["cpu"])
    return _MEMO[key]
