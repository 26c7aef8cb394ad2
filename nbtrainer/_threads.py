"""Training off the main thread at the main thread's speed: torch's OpenMP thread pools (issue 49).

Why a thread trained slower, measured on a 2-CPU VM (``bench/RESULTS.md``, "Training off the main thread"):
torch's Linux wheels run their intra-op parallelism (ATen kernels, MKL, oneDNN) on GNU OpenMP, the ``libgomp``
shipped in ``torch/lib``. libgomp keeps **one pool of worker threads per master thread**: the first parallel
region a thread runs creates its pool (``torch.get_num_threads() - 1`` workers), and the pool lives until that
thread exits. libgomp also counts the workers of every pool (``gomp_managed_threads``); while that count is above
the CPUs it may use, a thread waiting for work or at a barrier spins 100 times instead of about 300,000 before it
sleeps on a futex (``gomp_throttled_spin_count_var``, ``libgomp/config/linux/wait.h``). A notebook's main thread
has a pool as soon as it ran one op big enough for a parallel region (a larger tensor, a ``log_softmax`` over a
batch...). A second thread that trains (the panel's Start and ``w.fit()``, its LR finder and Profile, a search)
then makes a second pool: 1 + 1 + 1 = 3 managed threads on 2 CPUs, so every parallel region of the training
thread pays a futex sleep and a wake-up on both sides. A tiny MLP's step runs 3 regions (``log_softmax``,
``nll_loss`` backward, ``log_softmax`` backward): 6 voluntary context switches per step instead of 0, and
0.58-0.68 ms per step instead of 0.27-0.29 ms; a small CNN (34 regions per step) 1.36x; a medium MLP 1.2-1.5x.
Setting the thread's intra-op count does not help: 2 threads stay throttled, 1 thread loses the parallel speed
(small CNN 1.75x, medium MLP 1.4-2x) and changes the results (other reduction order).

The fix, at that depth: before a training thread starts, the thread that starts it (in a notebook, the kernel's
main thread, idle while the run trains) gives its idle pool back with ``omp_pause_resource_all`` (OpenMP 5.0;
torch's libgomp has it). The training thread's pool is then the only one, its regions spin like the main
thread's did, at the same thread count, so the results equal a main-thread fit bit for bit. The main thread
gets a new pool at its next parallel region (one thread start, tens of microseconds); while a training thread
started here lives, its pool is given back again after each notebook cell (IPython's ``post_run_cell``), so a
cell that ran a big op on the main thread does not slow the rest of the run.

The same pool also made ``nbtrainer.launch`` hang: a forked rank inherits the launching thread's pool record
but not its threads, and its first parallel region waits forever for workers that do not exist; the launch
gives the pool back before it forks.

Other OpenMP runtimes (LLVM ``libomp`` on macOS, ``vcomp`` on Windows) and torch builds without OpenMP are left
as they are: nothing here touches them.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["release_openmp_pool", "start_training_thread"]

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft
_HANDLES: dict[str, Any] = {}  # path of a loaded libgomp -> its ctypes handle (None: no omp_pause_resource_all)
# the training threads started here (alive ones keep the post-cell release), each with how to stop it early at
# interpreter exit (None: it is waited for)
_LIVE: dict[threading.Thread, tuple[Callable[[], None] | None, threading.Event]] = {}  # each: its stop, its end
_LOCK = threading.Lock()
_HOOKED: set[int] = set()  # id() of the IPython shells whose post_run_cell gives the main thread's pool back


_SCANNED: tuple[int, list[str]] = (-1, [])  # (len(sys.modules) at the scan, the libgomps found)


def _loaded_libgomps() -> list[str]:
    """Paths of the GNU OpenMP runtimes loaded in this process (torch's, and any other copy); [] off Linux.

    The process's maps are read again only when modules were imported since the last read (a runtime comes with
    an extension module: torch's, scikit-learn's bundled copy): with torch loaded they are thousands of lines,
    a few milliseconds at every Start of a panel and after every notebook cell while a run trains."""
    global _SCANNED
    if _SCANNED[0] == len(sys.modules):
        return _SCANNED[1]
    found = _scan_libgomps()
    _SCANNED = (len(sys.modules), found)
    return found


def _scan_libgomps() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "libgomp" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libgomp") and os.path.isabs(p))


def _pause(path: str) -> Any:
    if path not in _HANDLES:
        try:  # RTLD_NOLOAD: the copy already in the process, never a new load
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
            fn = lib.omp_pause_resource_all
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        except (OSError, AttributeError):  # an older libgomp (before OpenMP 5.0): nothing to call
            fn = None
        _HANDLES[path] = fn
    return _HANDLES[path]


# glibc's malloc, tuned once before the first training thread starts (keep_freed_memory): a fixed mmap threshold and
# trim threshold instead of the dynamic ones, and a top pad of one whole thread heap
_MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
_TRIM_THRESHOLD = 256 << 20
# A thread's arena is a chain of 64 MiB heaps (HEAP_MAX_SIZE on 64-bit), and glibc deletes a heap as soon as its top
# chunk spans all of it, whatever the trim threshold (heap_trim in arena.c), unless the heap below lacks room for the
# top pad. A pad of a whole heap keeps every heap, and each heap grows by the pad at once instead of page by page.
_TOP_PAD = 64 << 20
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # mallopt's parameter numbers (malloc.h)


@functools.cache  # once a process (two threads starting at once may both set the same values: harmless)
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a training step frees for the next step (once a process, Linux glibc only).

    A thread other than the main one allocates from an arena of its own, whose heaps glibc hands back to the system
    as soon as their top is free, and large blocks go to ``mmap`` under a threshold that moves: every step of a
    small CNN then faulted its activations in afresh, 222-602 minor page faults a step on a training thread against
    0-3 on the main thread (1.056x its time per step; the panel 1.147x). With a fixed mmap threshold (32 MiB) and trim
    threshold (256 MiB), as torch's users get from jemalloc or tcmalloc, it was 21-22 faults a step and 0.990x. A
    thread's heaps (64 MiB each) were still deleted whenever one came free, which no threshold prevents: a medium MLP
    with AdamW trained at 1.017-1.083x its main-thread time, with 3,560-7,987 faults a fit against 1,001-1,850 on the
    main thread; a top pad of 64 MiB keeps them (0.995-1.022x, 1,070-3,339 faults). The cost: up to the trim
    threshold of freed memory stays with the process, and each heap grows by the pad's address space (only the pages
    used become memory). Each setting is left alone where the user set it (``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_`` leave both thresholds, ``MALLOC_TOP_PAD_`` the pad), and all of them with
    ``NBT_KEEP_FREED_MEMORY=0``.

    Returns:
        Whether the thresholds are set (by this call or an earlier one).
    """
    env = os.environ
    if env.get("NBT_KEEP_FREED_MEMORY") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if "MALLOC_TOP_PAD_" not in env:
        mallopt(_M_TOP_PAD, _TOP_PAD)
    if "MALLOC_MMAP_THRESHOLD_" in env or "MALLOC_TRIM_THRESHOLD_" in env:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


def release_openmp_pool() -> bool:
    """Give back the calling thread's idle OpenMP worker threads (GNU libgomp; elsewhere nothing happens).

    A thread that runs torch ops on the CPU keeps a pool of OpenMP workers after its first parallel region; a
    second thread that then trains gets its own pool, and with both on the machine libgomp throttles its spin
    waits, so every parallel region of the training thread sleeps and wakes (a tiny model trains 2x slower). Call
    this on the thread that will sit idle (the notebook's main thread) before another thread trains;
    :func:`start_training_thread` does it for you. The pool is re-created at the thread's next parallel region.

    Returns:
        True if a runtime gave a pool back (or had none to give), False where nothing could be done (no libgomp
        loaded, an older one, or the calling thread is inside a parallel region).

    Example:
        >>> import nbtrainer
        >>> nbtrainer.release_openmp_pool() in (True, False)
        True
    """
    released = False
    for path in _loaded_libgomps():
        fn = _pause(path)
        if fn is not None and fn(_OMP_PAUSE_SOFT) == 0:
            released = True
    return released


def _release_after_cell(*_: Any) -> None:
    """IPython ``post_run_cell``: a cell ran on the main thread while a training thread trains; give back the pool
    that cell may have made, so the training thread keeps the only one."""
    with _LOCK:
        training = bool(_alive())
    if training and threading.current_thread() is threading.main_thread():
        release_openmp_pool()


def _hook_cells() -> None:
    """Register :func:`_release_after_cell` with the running IPython shell (once per shell; no IPython import)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    events = getattr(shell, "events", None)
    if events is None or id(shell) in _HOOKED:
        return
    try:
        events.register("post_run_cell", _release_after_cell)
    except Exception:  # an IPython without that event: the release at start still holds
        log.debug(
            "this IPython has no post_run_cell event: the release at the thread's start still holds", exc_info=True
        )
        return
    _HOOKED.add(id(shell))


def start_training_thread(
    target: Callable[..., Any],
    *,
    name: str | None = None,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    daemon: bool = True,
    stop: Callable[[], None] | None = None,
) -> threading.Thread:
    """Start ``target(*args, **kwargs)`` in a new thread that trains at the speed of the calling thread.

    The calling thread's idle OpenMP pool is given back first (:func:`release_openmp_pool`), so the new thread's
    pool is the only one and its parallel regions are not throttled, and glibc's malloc keeps what a step frees for
    the next one (:func:`keep_freed_memory`); in a notebook, it is given back again after
    each cell while the thread lives. Use it for any thread that runs a fit, a sweep or a profile while the
    calling thread waits or returns to the notebook (the panel's Start, ``w.fit()``, LR finder and Profile do).

    Args:
        target: what the thread runs (e.g. ``trainer.fit``).
        name: the thread's name.
        args, kwargs: the arguments of ``target``.
        daemon: a daemon thread (default), so a notebook kernel can exit while it runs.
        stop: how to end the thread's work early; default: the ``request_stop`` of the object ``target`` is a
            method of (``trainer.fit``: the trainer's). When the interpreter exits (a script returns, a kernel shuts
            down) while the thread lives, ``stop`` is called and the thread joined (up to a minute; without any
            ``stop``, the thread is waited for as long). A daemon thread still inside a torch op while the
            interpreter's C++ state is torn down aborts the process ("terminate called without an active
            exception").

    Returns:
        The started thread.

    Example:
        >>> import torch
        >>> from nbtrainer import Trainer, start_training_thread
        >>> model = torch.nn.Linear(4, 2)
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "adamw", progress=False)
        >>> data = [(torch.randn(8, 4), torch.randint(0, 2, (8,)))] * 3
        >>> thread = start_training_thread(trainer.fit, args=(data,), kwargs={"epochs": 2})
        >>> thread.join(); trainer.status
        'finished'
    """
    done = threading.Event()

    def run(*a: Any, **kw: Any) -> Any:
        try:
            return target(*a, **kw)
        finally:
            done.set()

    thread = threading.Thread(target=run, name=name, args=tuple(args), kwargs=dict(kwargs or {}), daemon=daemon)
    release_openmp_pool()
    keep_freed_memory()
    if threading.current_thread() is threading.main_thread():
        _hook_cells()
    # trainer.fit -> the trainer's request_stop (a paused run wakes up to stop)
    request_stop = getattr(getattr(target, "__self__", None), "request_stop", None)
    if stop is None and callable(request_stop):
        stop = lambda: request_stop("the interpreter is exiting")  # noqa: E731
    with _LOCK:
        _alive()
        _LIVE[thread] = (stop, done)
    thread.start()
    return thread


def _alive() -> dict[threading.Thread, tuple[Callable[[], None] | None, threading.Event]]:
    """``_LIVE`` without the threads whose target has returned (under ``_LOCK``). Not ``Thread.is_alive()``: on
    Python 3.11 a ``join()`` interrupted by Ctrl-C marks a thread that still runs as stopped (bpo-45274), and the
    exit would then neither stop nor wait for it (measured: "terminate called without an active exception", 134)."""
    for gone in [t for t, (_, done) in _LIVE.items() if done.is_set()]:
        del _LIVE[gone]
    return _LIVE


@atexit.register
def _finish_at_exit() -> None:
    """The interpreter is exiting: end the threads started here before its C++ state goes. Measured without this:
    a script that called the panel's ``start()`` and returned aborted with exit status 134 ("terminate called
    without an active exception") 4 times in 4, and one that built a panel and returned while its data check ran,
    once in 3."""
    with _LOCK:
        live = {t: entry for t, entry in _alive().items() if t is not threading.current_thread()}
    for thread, (stop, _) in live.items():
        if stop is None:
            continue
        print(f"nbtrainer: the interpreter is exiting: stopping {thread.name!r} at its next step", file=sys.stderr)
        try:
            stop()
        except Exception:
            log.debug("stopping %s at exit failed; waiting for it instead", thread.name, exc_info=True)
    for thread, (_, done) in live.items():  # bounded: a thread that never ends must not hang the exit (a paused run)
        if not done.wait(2.0):
            print(
                f"nbtrainer: waiting up to a minute for {thread.name!r} before the interpreter exits", file=sys.stderr
            )
            done.wait(60.0)
