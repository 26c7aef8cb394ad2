"""Shared fixtures: small real models and synthetic data (fast on 2 CPU cores)."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import resource
import shutil
import sys
import time
from typing import Any

import pytest
import torch

# Tests are tiny and share 2 cores with their own subprocesses (DDP ranks, kernels, servers): intra-op
# threads only add contention (spinning OpenMP workers made tiny ops orders of magnitude slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)
# torch._dynamo whole, before any test's timeout is armed. The first optimizer a worker builds imports it (torch's
# _disable_dynamo), and so does torch.use_deterministic_algorithms; when pytest-timeout fired in the middle of that
# first import (a loaded trial, 2026-12-01: a browser test's 240 s ran out while its teardown imported it), the
# package was left half-imported in that worker for good ("partially initialized module 'torch._dynamo' has no
# attribute 'decorators'": its submodules stay in sys.modules, the package is never rebuilt) and the worker's next
# 500 tests failed. Imported here, it is frozen out of the collector's sight with the rest (_freeze_survivors).
import torch._dynamo  # noqa: E402

# pytest-timeout's timeouts end a test that has stopped moving, not one still at work on a loaded machine
from _guard import pytest_timeout_cancel_timer, pytest_timeout_set_timer  # noqa: E402, F401

# every interpreter the tests start defers full garbage collections to the code that asks (tests/_site/sitecustomize.py)
_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
if _SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_SITE, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(autouse=True)
def _cpu_unless_marked_gpu(request: Any, monkeypatch: Any) -> None:
    """Trainer(device="auto") picks CUDA where there is one. The tests not marked ``gpu`` are written for the
    CPU (they compare with tensors on it, expect CPU figures), so on a GPU machine "auto" means the CPU for
    them; the ``gpu`` tests name their device."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("NBTRAINER_DEVICE", "cpu")


def make_classification(n: int = 256, d: int = 10, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return x, y


def make_loader(x, y, batch_size: int = 32, shuffle: bool = False, seed: int = 0, **kw):
    ds = torch.utils.data.TensorDataset(x, y)
    gen = torch.Generator().manual_seed(seed) if shuffle else None
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, generator=gen, **kw)


def needs(*packages: str) -> pytest.MarkDecorator:
    """A module's ``pytestmark``: skip its tests when an optional package is missing, found without importing it.
    ``pytest.importorskip`` at module level imported mlflow, torchao, bitsandbytes, peft and nbformat (about 8 s of
    CPU) in every worker that collects the module, which is every worker, whether or not it runs those tests."""
    missing = [name for name in packages if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


class LazyModule:
    """A module imported at its first attribute read (``mlflow = LazyModule("mlflow")`` beside ``needs("mlflow")``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # pytest's collection probes every module global (__test__, fixture markers): those must not import it
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


def mlp(d: int = 10, hidden: int = 16, out: int = 3, seed: int = 0, dtype=torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out)).to(dtype)


# -- training health (tests/health, tests/widgets): a module that turns one batch into NaN ----------------
class Fragile(torch.nn.Module):
    """NaN wherever its input is far out of range: finite for every batch but the one with the poisoned sample."""

    def forward(self, x):
        return torch.where(x.abs() > 1e3, torch.full_like(x, float("nan")), x)


class PoisonNet(torch.nn.Module):
    """Blocks ``embed``, ``layers.0-2`` (each ``Linear, Fragile, ReLU``), ``head``: ``layers.0.1`` makes the NaN."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU())
        self.layers = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(32, 32), Fragile(), torch.nn.ReLU()) for _ in range(3)]
        )
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def poisoned_loader(batch: int = 17, row: int = 5):
    """64 batches of 16 (not shuffled); one sample of ``batch`` is far out of range."""
    x, y = make_classification(n=64 * 16, d=10)
    x[batch * 16 + row] = 1e5  # finite; only the first Fragile (layers.0.1) turns it into NaN
    return make_loader(x, y, batch_size=16)


# Tests that share work (one Chromium and Jupyter server; one kernel run per notebook; one torchrun launch per
# strategy): each group runs on one worker, and the groups go first, in this order (the longest first). A module
# whose tests share a module-scoped fixture that is costly to build belongs here (its path and "::").
_SHARED = (
    "tests/browser/",
    "tests/test_notebooks.py::",
    "tests/plan/test_plan_ranks.py::",
    "tests/test_packaging.py::",  # one sdist and wheel build (about 40 s), not one per worker
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest first, so the tail of an xdist run is short tests on both workers: the browser tests (one worker runs
    # them in a row), then the notebooks (one kernel run per notebook, shared by that module's tests), then the
    # tests marked slow. Stable sort: within each group, tests keep their order.
    items.sort(
        key=lambda item: (
            *(not item.nodeid.startswith(group) for group in _SHARED),
            item.get_closest_marker("slow") is None,
        )
    )


def _freeze_survivors() -> None:
    """The garbage collector sees only what the test now running made. After collection, and again after each test
    (its own garbage collected first), what is alive is moved out of its sight (``gc.freeze``): the imports (torch,
    transformers, mlflow, the test modules: millions of objects), the caches and the module fixtures. Before, every
    full collection walked all of it, 0.4-0.9 s each in a worker, and they came from the checks that collect on
    purpose (the OOM path's release, the reference checks, the strategy comparison) and from the heap's own growth:
    24 s of the inner loop's 110 CPU seconds (56.6 s to 36 s). Refcounting frees frozen objects as before; only a
    reference cycle that outlives its test is left to the end (the workers' peak memory stayed at ~1.05 GB)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_survivors()


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _freeze_survivors()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """``NBT_TIMELINE=FILE``: each test's worker, start and end (wall clock), node id, and the CPU seconds it took in
    the worker (all its threads) and in the child processes it waited for (interpreters, kernels nbclient started),
    appended as a line to FILE: when each worker fell idle at a suite's end, which test it waited for, and what each
    test costs the two cores whatever the load beside it (docs/testing.md, Time)."""
    path = os.environ.get("NBT_TIMELINE")
    start, cpu, children = time.time(), time.process_time(), _children_cpu()
    yield
    if path:
        worker = f"{os.path.basename(sys.prefix)}:{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"  # pass:worker
        used, waited = time.process_time() - cpu, _children_cpu() - children
        with open(path, "a") as f:
            f.write(f"{worker}\t{start:.3f}\t{time.time():.3f}\t{item.nodeid}\t{used:.2f}\t{waited:.2f}\n")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (scripts/test.sh runs 3 workers) the browser tests share one worker: one Chromium and one
    Jupyter server at a time, started first (they are the longest), while the other worker takes the rest. Work
    that tests share stays on one worker, or each worker would do it again: the notebooks' tests share one kernel
    run per notebook (tests/test_notebooks.py caches it per process), the planner's rank tests share one torchrun
    launch per strategy, and the cases of a parametrized test share its module-scoped fixture
    (tests/resume/test_resume.py's SIGKILL runs). Everything else goes test by test.
    (xdist's own ``--dist loadgroup`` does not group under pytest 9.2, which dropped ``Item._nodeid``.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for group in _SHARED:
                if nodeid.startswith(group):
                    return group
            return nodeid.split("[", 1)[0]  # a parametrized test's cases together

    # scopes in collection order (longest first, see pytest_collection_modifyitems), not xdist's default of most
    # tests first: a parametrized check of 136 cheap cases would otherwise go before the browser tests
    config.option.loadscopereorder = False
    return SharedWorkOnOneWorker(config, log)


@pytest.fixture(scope="session")
def run_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A folder every pytest-xdist worker of this test run shares (the parent of the workers' temp folders; the
    run's own temp folder without xdist): work done once per run goes there, under a file lock
    (``tests/_notebook_runs.py``)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An empty MLflow SQLite store at its schema's head, made once per worker. A fresh store runs MLflow's alembic
    migrations when it is first opened (0.8-1.6 s of CPU); a copy of this one opens in 0.03 s."""
    import mlflow

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_uri(tmp_path: Any, mlflow_template: Any) -> str:
    """A fresh, empty MLflow store of this test's own (``tmp_path / "mlflow.db"``, a copy of ``mlflow_template``)."""
    dest = tmp_path / "mlflow.db"
    shutil.copyfile(mlflow_template, dest)
    return f"sqlite:///{dest}"


@pytest.fixture
def classification():
    x, y = make_classification()
    return x, y


@pytest.fixture(autouse=True)
def _no_determinism_leak() -> Any:
    """Trainer(deterministic=True) switches torch's global flags on; every test starts with them off."""
    yield
    if torch.are_deterministic_algorithms_enabled():  # switching it off imports torch._inductor's config: not per test
        torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False


def accuracy(outputs, targets):
    return (outputs.argmax(dim=1) == targets).float().mean()


@pytest.fixture(scope="module")
def _shell_instance(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The IPython InteractiveShell singleton, created with a temp IPYTHONDIR and in-memory history; when this
    module created it, it is cleared afterwards and the interpreter hooks it replaced are restored."""
    pytest.importorskip("IPython")
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    existed = InteractiveShell.initialized()
    hooks = (sys.displayhook, sys.excepthook)
    mp = pytest.MonkeyPatch()
    mp.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
    cfg = Config()
    cfg.HistoryManager.hist_file = ":memory:"
    try:
        yield InteractiveShell.instance(config=cfg)
    finally:
        if not existed:
            InteractiveShell.clear_instance()
            sys.displayhook, sys.excepthook = hooks
        mp.undo()


@pytest.fixture
def shell(_shell_instance: Any) -> Any:
    """A real InteractiveShell with ``%load_ext nbtrainer`` done; unloaded and the namespace cleaned after."""
    sh = _shell_instance
    before = set(sh.user_ns)
    sh.run_line_magic("load_ext", "nbtrainer")
    yield sh
    sh.run_line_magic("unload_ext", "nbtrainer")
    for name in set(sh.user_ns) - before:
        sh.user_ns.pop(name, None)


@pytest.fixture(scope="module")
def venv_kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A ``python3`` kernelspec that runs this interpreter, first on JUPYTER_PATH; per-user dirs in a temp dir."""
    import json

    base = tmp_path_factory.mktemp("jupyter")
    spec_dir = base / "share" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "Python 3 (nbtrainer venv)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps({**spec, "metadata": {"debugger": False}}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(base / "share"))
    for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        (base / sub).mkdir()
        mp.setenv(name, str(base / sub))
    mp.setenv("JUPYTER_PLATFORM_DIRS", "1")
    mp.setenv("OMP_NUM_THREADS", "1")
    mp.delenv("NBTRAINER_FRONTEND", raising=False)
    try:
        yield base
    finally:
        mp.undo()
