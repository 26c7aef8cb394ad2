"""A side computation on the model between optimizer steps, that leaves no trace on the run.

Samples and ``interpret`` look at the model in the middle of a fit: they must not change what the fit does next.
Inside :func:`side_pass` the model is in eval mode under ``torch.no_grad()`` and the run's autocast; afterwards each
module's training flag is put back as it was (a frozen BatchNorm in eval stays so) and so are the random generators
(Python's ``random``, NumPy's global one, torch's CPU generator and, once CUDA is in use, every CUDA device's), so a
fit with a sample or an interpretation in it has the weights and the data order of a fit without, bit for bit.
A loader built with its own ``generator=`` draws its order (and its workers' seed) from that one instead, so
:func:`~nbtrainer._setup._seed.kept_rng` given the loader puts it back too (and its samplers' own generators).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from nbtrainer._data._predict_collect import eval_mode
from nbtrainer._setup._seed import kept_rng

__all__ = ["side_pass"]


@contextlib.contextmanager
def side_pass(
    model: torch.nn.Module, autocast: contextlib.AbstractContextManager[Any], *, grad: Any = torch.no_grad
) -> Iterator[None]:
    """``model`` in eval mode under ``grad()`` (``torch.no_grad`` by default) and ``autocast``; the modules'
    training flags and the random generators restored on exit (see the module docstring)."""
    with kept_rng(), eval_mode(model), grad(), autocast:
        yield
