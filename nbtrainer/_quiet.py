"""Known import noise of optional libraries, silenced only while they are imported, and only those messages.

A CPU build of torchao logs one "Failed to load .../torchao/_C_....so" line per CUDA kernel library it ships, and
torch logs "<enum ...> is an Enum subclass ... register_constant() ... deprecated" for each Enum torchao registers.
In a notebook both show as red stderr blocks, about nothing the user can act on. transformers imports torchao
whenever it is installed (its quantizer registry), so importing a model class prints them too.

:func:`quiet_imports` drops exactly those records (a filter on the two loggers, matched by message) while its
block runs; any other message of those loggers still shows, and outside the block nothing is filtered.
nbtrainer wraps its own imports of torchao in it; a notebook can wrap ``from transformers import ...``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator

__all__ = ["KNOWN_IMPORT_NOISE", "quiet_imports"]

#: logger name -> the messages of that logger dropped inside :func:`quiet_imports` (regular expressions)
KNOWN_IMPORT_NOISE: dict[str, tuple[str, ...]] = {
    "torchao": (r"^Failed to load .*torchao[/\\]_C\w*\.[\w.-]*so",),
    "torch.utils._pytree": (
        r"^<enum '\w+'> is an Enum subclass and is now natively supported by torch\.compile.*register_constant\(\)",
    ),
}


class _KnownNoise(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self._patterns = [re.compile(p, re.S) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self._patterns)


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Import optional libraries without their known CPU-build noise (torchao's kernel-library lines, torch's
    Enum ``register_constant`` deprecation); every other message still shows.

    Example:
        >>> from nbtrainer import quiet_imports
        >>> with quiet_imports():
        ...     import json  # e.g. ``from transformers import LlamaForCausalLM``
    """
    added = []
    for name, patterns in KNOWN_IMPORT_NOISE.items():
        logger, quiet = logging.getLogger(name), _KnownNoise(patterns)
        logger.addFilter(quiet)
        added.append((logger, quiet))
    try:
        yield
    finally:
        for logger, quiet in added:
            logger.removeFilter(quiet)
