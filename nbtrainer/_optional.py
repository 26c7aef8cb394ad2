"""Optional dependencies: imported when a feature needs them, with an error that says what to install."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["import_optional", "require"]


def _message(module: str, what: str, install: str) -> str:
    return f"{what} needs {module}, which is not installed here. Install it with: {install}"


def require(module: str, what: str, install: str) -> None:
    """Raise ImportError naming ``install`` now (e.g. in a constructor, before training) if ``module`` is absent."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a stub in sys.modules
        found = False
    if not found:
        raise ImportError(_message(module, what, install))


def import_optional(module: str, what: str, install: str) -> ModuleType:
    """``import module``, or an ImportError that says which feature needed it and how to install it.

    Example:
        >>> import_optional("json", "this example", "nothing").__name__
        'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(_message(module, what, install)) from exc
