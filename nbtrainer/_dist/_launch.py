"""``nbtrainer.launch``: run a training function on N processes from a notebook (or a script).

Each process gets what ``torchrun`` would give it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``), so a ``Trainer`` built inside ``fn`` picks DDP by
itself (``strategy="auto"``). Processes are forked by default: a function defined in a notebook cell
works as is, but CUDA must not have been initialised in the kernel before (a forked child cannot use
a CUDA context inherited from its parent), which is checked up front.

``view=`` (a :class:`~nbtrainer._dist._launch_monitor.LaunchMonitor`, or True for the notebook panel
``nbtrainer.widgets.LaunchView``) shows rank 0's progress in the launching process while the ranks train,
and its stop ends every rank after the same optimizer step (:mod:`._launch_monitor`).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nbtrainer._threads import release_openmp_pool

if TYPE_CHECKING:
    from nbtrainer._dist._launch_monitor import LaunchMonitor

__all__ = ["launch"]


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def _worker(
    local_rank: int,
    fn: Callable[..., Any],
    args: tuple,
    nprocs: int,
    addr: str,
    port: int,
    result_dir: str,
    threads: int | None,
    channel: tuple[Any, Any] | None = None,
) -> None:
    os.environ.update(
        {
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_RANK": "0",
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
        }
    )
    import torch

    if threads:
        torch.set_num_threads(threads)
    if channel is not None:
        from nbtrainer._dist._launch_monitor import install

        install(local_rank, nprocs, *channel)
    try:
        result = fn(*args)
        try:
            payload = pickle.dumps(result)
        except Exception as exc:
            raise TypeError(
                f"nbtrainer.launch: rank {local_rank}'s return value ({type(result).__name__}) cannot "
                f"be pickled back to the notebook: {exc}. Return plain data (numbers, dicts, "
                "state_dicts, History) instead."
            ) from exc
        with open(os.path.join(result_dir, f"{local_rank}.pkl"), "wb") as fh:
            fh.write(payload)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _monitor(view: Any) -> LaunchMonitor | None:
    from nbtrainer._dist._launch_monitor import LaunchMonitor

    if view is False or view is None:
        return None
    if view is True:
        import nbtrainer

        made: LaunchMonitor = nbtrainer.LaunchView()
        return made  # the widget layer, resolved lazily; it shows itself when the launch starts
    if not isinstance(view, LaunchMonitor):
        raise TypeError(
            f"launch(view=...) takes True (the notebook panel), False, or a nbtrainer.LaunchMonitor, got "
            f"{type(view).__name__}."
        )
    return view


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int | None = None,
    start_method: str | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    threads_per_process: int | None = None,
    view: bool | LaunchMonitor = False,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` processes as a torchrun-like world; return each rank's result.

    Build the model, data and ``Trainer`` inside ``fn``: with ``strategy="auto"`` (the default) the
    trainer sees ``WORLD_SIZE > 1`` and trains with DDP (NCCL on GPUs, gloo on CPU).

    Args:
        fn: the training function (may be defined in a notebook cell with the default ``"fork"``).
        *args: positional arguments for ``fn`` (the same on every rank).
        nprocs: number of processes (default: the number of visible GPUs).
        start_method: ``"fork"`` (default where available: notebook-defined functions work) or
            ``"spawn"`` (``fn`` must be importable from a ``.py`` module; works after CUDA was used).
        master_addr / master_port: the rendezvous address (default: loopback and a free port).
        threads_per_process: CPU threads per process (default: this process's threads / ``nprocs``).
        view: ``False`` (default: nothing is shown but what the ranks print), ``True`` (a
            ``nbtrainer.widgets.LaunchView`` panel: rank 0's progress, loss chart and a Stop that stops every
            rank after the same step; needs ipywidgets), or a ``LaunchMonitor`` (subclass it to show or act
            on rank 0's snapshots headless). Every ``Trainer`` built in ``fn`` reports to it by itself.

    Returns:
        ``[result of rank 0, result of rank 1, ...]`` (results travel by pickle).

    Raises:
        RuntimeError: with ``"fork"``, if CUDA was already initialised in this kernel (restart it and
            launch before any CUDA call, or use ``start_method="spawn"`` with ``fn`` in a module).

    Example:
        >>> def train():
        ...     import torch
        ...     from nbtrainer import Trainer
        ...     model = torch.nn.Linear(4, 1)
        ...     trainer = Trainer(model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1),
        ...                       progress=False)
        ...     data = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
        ...     return trainer.fit(data, epochs=1).status
        >>> # nbtrainer.launch(train, nprocs=2)  ->  ['finished', 'finished']
    """
    import torch
    import torch.multiprocessing as mp

    if not callable(fn):
        raise TypeError(
            f"nbtrainer.launch runs a function on each process; got {type(fn).__name__} {fn!r}. Pass the function "
            "itself: launch(train, nprocs=2), not its name or its result."
        )
    bad_threads = isinstance(threads_per_process, bool) or not isinstance(threads_per_process, int)
    if threads_per_process is not None and (bad_threads or threads_per_process < 1):
        raise ValueError(
            f"threads_per_process must be an int >= 1 (torch's intra-op threads in each process) or None (torch's "
            f"default), got {threads_per_process!r}."
        )
    if nprocs is None:
        nprocs = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nprocs < 1:
            raise ValueError("nbtrainer.launch: no GPU is visible; pass nprocs= (e.g. nprocs=2 for CPU processes).")
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1, got {nprocs!r}.")
    methods = multiprocessing.get_all_start_methods()
    if start_method is None:
        start_method = "fork" if "fork" in methods else "spawn"
    if start_method not in methods:
        raise ValueError(f"start_method {start_method!r} is not available here; use one of {methods}.")
    if start_method == "fork":
        if _cuda_initialized():
            raise RuntimeError(
                "nbtrainer.launch: CUDA has already been initialised in this kernel (a tensor or model was put on "
                "the GPU, or torch.cuda was queried), and forked processes cannot use CUDA after that. Restart the "
                "kernel and call nbtrainer.launch before any CUDA work (create models and data inside the launched "
                "function), or use start_method='spawn' with the function defined in an importable .py module."
            )
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            raise RuntimeError(
                "nbtrainer.launch: a process group is already initialised in this process; forked "
                "children cannot share it. Destroy it first "
                "(torch.distributed.destroy_process_group())."
            )
    elif getattr(fn, "__module__", None) == "__main__" and not hasattr(sys.modules.get("__main__"), "__file__"):
        raise RuntimeError(
            "nbtrainer.launch: with start_method='spawn' the function must be importable by the new "
            "processes, and functions defined in a notebook are not. Move it to a .py module and "
            "import it, or use start_method='fork' (before any CUDA work in the kernel)."
        )
    if master_port is None:
        from nbtrainer._dist._ddp import _free_port

        master_port = _free_port()
    if threads_per_process is None:
        threads_per_process = max(1, torch.get_num_threads() // nprocs)
    monitor = _monitor(view)
    channel = monitor.attach(multiprocessing.get_context(start_method), nprocs) if monitor is not None else None
    result_dir = tempfile.mkdtemp(prefix="nbtrainer-launch-")
    if start_method == "fork":
        # A forked rank inherits this thread's OpenMP pool record but not its worker threads: its first parallel
        # region would wait for them forever (issue 49, nbtrainer._threads). Give the pool back before forking.
        release_openmp_pool()
    try:
        context = mp.start_processes(
            _worker,
            args=(fn, args, nprocs, master_addr, master_port, result_dir, threads_per_process, channel),
            nprocs=nprocs,
            join=False,
            start_method=start_method,
        )
        try:
            if monitor is None:
                while not context.join():
                    pass
            else:  # drained while waiting: a rank blocks at exit until what it queued has been read
                active = monitor

                def done(timeout: float) -> bool:
                    active.drain()
                    return bool(context.join(timeout))

                monitor.wait(done)
                monitor.close()
        except BaseException as exc:
            if monitor is not None:
                monitor.close(exc)
            # A failure on one rank (or Ctrl-C / interrupt in the notebook) ends every rank: none is left
            # waiting forever in a collective.
            for proc in context.processes:
                if proc.is_alive():
                    proc.terminate()
            for proc in context.processes:
                proc.join(timeout=10)
            raise
        results = []
        for rank in range(nprocs):
            with open(os.path.join(result_dir, f"{rank}.pkl"), "rb") as fh:
                results.append(pickle.load(fh))
        return results
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
