"""The examples in public docstrings run (Google-style docstrings with a short runnable example)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "nbtrainer",
    "nbtrainer._trainer",
    "nbtrainer._trainer_eval",
    "nbtrainer._batch",
    "nbtrainer._predict_collect",
    "nbtrainer._history",
    "nbtrainer._callbacks",
    "nbtrainer._checkpoint_cb",
    "nbtrainer._checkpoint_io",
    "nbtrainer._seed",
    "nbtrainer._precision",
    "nbtrainer._events",
    "nbtrainer._format",
    "nbtrainer._arrays",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


def test_public_names_have_docstrings():
    import nbtrainer

    core = [n for n in nbtrainer.__all__ if n not in ("TrainerWidget", "ProfileCard", "__version__", "EVENTS")]
    missing = [n for n in core if not (getattr(nbtrainer, n).__doc__ or "").strip()]
    assert not missing, missing
