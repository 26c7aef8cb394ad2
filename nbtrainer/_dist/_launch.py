"""``nbtrainer.launch``: run a training function on N processes from a notebook (or a script).

Each process gets what ``torchrun`` would give it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``), so a ``Trainer`` built inside ``fn`` picks DDP by
itself (``strategy="auto"``). Processes are forked by default: a function defined in a notebook cell
works as is, but CUDA must not have been initialised in the kernel before (a forked child cannot use
a CUDA context inherited from its parent), which is checked up front.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

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


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nprocs: int | None = None,
    start_method: str | None = None,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    threads_per_process: int | None = None,
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
    result_dir = tempfile.mkdtemp(prefix="nbtrainer-launch-")
    try:
        context = mp.start_processes(
            _worker,
            args=(fn, args, nprocs, master_addr, master_port, result_dir, threads_per_process),
            nprocs=nprocs,
            join=False,
            start_method=start_method,
        )
        try:
            while not context.join():
                pass
        except BaseException:
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
