"""Real-browser tests (a package, so its conftest is imported as ``browser.conftest`` and never shadows
``tests/conftest.py``, which other test modules import as ``conftest``)."""
