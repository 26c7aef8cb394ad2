"""A side computation on the model between optimizer steps, that leaves no trace on the run.

Samples and ``interpret`` look at the model in the middle of a fit: they must not change what the fit does next.
Inside :func:`side_pass` the model is in eval mode under ``torch.no_grad()`` and the run's autocast; afterwards each
module's training flag is put back as it was (a frozen BatchNorm in eval stays so) and so are the random generators
(Python's ``random``, NumPy's global one, torch's CPU generator and, once CUDA is in use, every CUDA device's), so a
fit with a sample or an interpretation in it has the weights and the data order of a fit without, bit for bit.
A loader built with its own ``generator=`` draws its order (and its workers' seed) from that one instead, so
:func:`kept_rng` given the loader puts it back too (and its samplers' own generators).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from nbtrainer._data._predict_collect import eval_mode

__all__ = ["kept_rng", "side_pass"]


def _loader_generators(loader: Any) -> list[torch.Generator]:
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
    own = [(g, g.get_state()) for g in _loader_generators(loader)] if loader is not None else []
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


@contextlib.contextmanager
def side_pass(
    model: torch.nn.Module, autocast: contextlib.AbstractContextManager[Any], *, grad: Any = torch.no_grad
) -> Iterator[None]:
    """``model`` in eval mode under ``grad()`` (``torch.no_grad`` by default) and ``autocast``; the modules'
    training flags and the random generators restored on exit (see the module docstring)."""
    with kept_rng(), eval_mode(model), grad(), autocast:
        yield
