"""Seeding, determinism, and RNG state capture as tensors (so checkpoints load with weights_only=True)."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = [
    "capture_rng",
    "kept_rng",
    "loader_generators",
    "restore_rng",
    "rng_untouched",
    "seed_everything",
    "seed_worker",
    "set_deterministic",
]


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed python, numpy and torch (CPU and every CUDA device); optionally force determinism.

    Args:
        seed: the seed.
        deterministic: also call :func:`set_deterministic`.

    Returns:
        The seed, for logging.

    Example:
        >>> seed_everything(0)
        0
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device (lazily)
    os.environ["PYTHONHASHSEED"] = str(seed)
    if deterministic:
        set_deterministic(True)
    return seed


def set_deterministic(enabled: bool = True) -> None:
    """``torch.use_deterministic_algorithms``, the cuDNN flags and ``CUBLAS_WORKSPACE_CONFIG``."""
    if enabled:
        # cuBLAS needs a fixed workspace for reproducible GEMMs; must be set before the first cuBLAS call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = False if enabled else torch.backends.cudnn.benchmark


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed numpy and python from the worker's torch seed."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


@contextlib.contextmanager
def rng_untouched(device: torch.device) -> Iterator[None]:
    """Run a side computation (a capability probe) without advancing torch's CPU generator or ``device``'s.

    A probe that is cached runs once per process: drawing from the global generator there would make the
    next random draws (e.g. LoRA's adapter init) depend on whether an earlier Trainer already probed.
    """
    if device.type in ("cpu", "meta"):
        # no accelerator to fork: devices=[] forks the CPU generator alone (device_type=None, which torch 2.13
        # takes, is a TypeError in torch 2.11 on a machine with CUDA)
        with torch.random.fork_rng(devices=[]):
            yield
        return
    with torch.random.fork_rng(devices=[device], device_type=device.type):
        yield


def capture_rng() -> dict[str, Any]:
    """All RNG states as tensors and ints (no pickled objects)."""
    version, mt, gauss = random.getstate()
    _kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": torch.tensor(mt, dtype=torch.int64),
            "gauss": None if gauss is None else float(gauss),
        },
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    # A checkpoint loaded with map_location="cuda" brings these tensors onto the GPU; the generators take CPU
    # byte tensors (and numpy cannot read device memory).
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].cpu().tolist()), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, npy["pos"], npy["has_gauss"], npy["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = [t.cpu() for t in state.get("cuda") or []]
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(
                f"The checkpoint holds RNG states for {len(cuda)} CUDA devices but "
                f"{torch.cuda.device_count()} are visible; set CUDA_VISIBLE_DEVICES to match."
            )
        torch.cuda.set_rng_state_all(cuda)


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators a DataLoader and its samplers draw from, each once (a DataLoader passes its ``generator=``
    to the sampler it builds; a sampler given its own keeps that)."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    owners = (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None))
    found: dict[int, torch.Generator] = {}
    for owner in owners:
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator):
            found.setdefault(id(g), g)
    return list(found.values())


@contextlib.contextmanager
def kept_rng(loader: Any = None) -> Iterator[None]:
    """Every global random generator as it was on entry, whatever ran inside (also when it raised); with
    ``loader``, also the generators that loader and its samplers own."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    own = [(g, g.get_state()) for g in loader_generators(loader)] if loader is not None else []
    try:
        yield
    finally:
        for g, state in own:
            g.set_state(state)
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
