"""The data order of a training loader: the generator its sampler shuffles with, as state a checkpoint carries.

A shuffling sampler without a generator of its own draws from the global RNG each epoch, which no checkpoint can
replay. :func:`sampler_generator` installs one (seeded once from the global, seeded RNG), so the order of an epoch
is a function of the generator's state: the loop records it at each epoch start (``LoopState.sampler_state``)
and a resumed run sets it back, for an exact resume mid-epoch and at epoch boundaries.
"""

from __future__ import annotations

from typing import Any

import torch

from nbtrainer._setup._seed import seed_worker

__all__ = ["sampler_generator"]


def sampler_generator(loader: Any, *, deterministic: bool = False) -> torch.Generator | None:
    """The generator that shuffles ``loader`` (installed if it has none); ``None`` when it has no sampler with
    a ``generator`` (a list of batches, an iterable dataset). ``deterministic``: workers are seeded too.

    Example:
        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, shuffle=True)
        >>> sampler_generator(loader) is loader.sampler.generator
        True
    """
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        gen = torch.Generator()
        gen.manual_seed(int(torch.randint(0, 2**62, (1,)).item()))  # from the (seeded) global RNG, once
        sampler.generator = gen
        if getattr(loader, "generator", "absent") is None:
            loader.generator = gen  # worker base seeds follow the same state
        workers = getattr(loader, "num_workers", 0)
        if deterministic and workers and loader.worker_init_fn is None:
            loader.worker_init_fn = seed_worker
    return sampler.generator
