"""Optional dependencies: pandas is not a dependency of nbtrainer; what needs it says what to install."""

from __future__ import annotations

import sys

import pytest

from nbtrainer import History


def _history() -> History:
    h = History()
    h.add_epoch({"epoch": 1, "loss": 0.5, "val_loss": 0.6})
    h.add_epoch({"epoch": 2, "loss": 0.4, "val_loss": 0.55})
    h.add_steps([(1, 0.7, 1e-3), (2, 0.6, 1e-3)], epoch=1)
    return h


def test_to_pandas_without_pandas_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    with pytest.raises(ImportError, match=r"History.to_pandas\(\) needs pandas.*pip install pandas"):
        _history().to_pandas()
    assert _history().to_csv().startswith("epoch,loss,val_loss")  # the plain exports need nothing


def test_to_pandas_with_pandas():
    pd = pytest.importorskip("pandas")
    h = _history()
    frame = h.to_pandas()
    assert isinstance(frame, pd.DataFrame) and list(frame.index) == [1, 2] and list(frame["loss"]) == [0.5, 0.4]
    assert list(h.to_pandas("steps")["loss"]) == [0.7, 0.6]
    with pytest.raises(ValueError, match="'epochs', 'steps', 'events' or 'samples'"):
        h.to_pandas("rows")


def test_pandas_is_not_a_dependency():
    from importlib.metadata import requires

    deps = [r for r in requires("nbtrainer") or [] if "extra ==" not in r]
    assert not [r for r in deps if r.split()[0].lower().startswith("pandas")], deps
