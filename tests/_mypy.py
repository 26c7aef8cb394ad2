"""mypy on the repository, with ``widgets/`` checked under the name it is installed as: ``nbtrainer.widgets``.

``pyproject.toml`` maps the top-level ``widgets/`` folder to the package ``nbtrainer.widgets`` (setuptools
``package-dir``), and the editable install resolves it with an import hook that mypy does not run. mypy's command line
names a file after the folders above it, so ``mypy widgets`` checks a package called ``widgets`` that nothing imports,
and every ``from nbtrainer.widgets import ...`` (the core's lazy names, the magics, ``tests/widgets``) is "module not
found". This runner lists the sources the way ``mypy`` would (its config, its arguments), renames ``widgets.*`` to
``nbtrainer.widgets.*``, and runs the same build: one check of the widget layer, under its real name, with real paths
in the messages.

Usage (what ``tests/test_lint.py`` runs)::

    .venv/bin/python tests/_mypy.py                 # the config's files: nbtrainer widgets tests
    .venv/bin/python tests/_mypy.py nbtrainer/_loop.py widgets

It takes mypy's own options and prints mypy's output; the exit status is mypy's (0 clean, 1 errors, 2 bad usage).
"""

from __future__ import annotations

import sys

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

INSTALLED_AS = {"widgets": "nbtrainer.widgets"}  # folder's module name -> the name it is installed under


def installed_name(module: str) -> str:
    """The module name a source has once installed (``widgets._panel`` -> ``nbtrainer.widgets._panel``)."""
    head, dot, rest = module.partition(".")
    if head in INSTALLED_AS:
        return INSTALLED_AS[head] + dot + rest
    return module


def main(args: list[str]) -> int:
    sources, options = process_options(args, stdout=sys.stdout, stderr=sys.stderr)
    renamed = [
        s if installed_name(s.module) == s.module else BuildSource(s.path, installed_name(s.module), s.text)
        for s in sources
    ]
    try:
        messages = build.build(renamed, options).errors
    except CompileError as err:  # a blocking error (syntax, duplicate module): mypy stops there, exit status 2
        print("\n".join(err.messages))
        return 2
    for line in messages:
        print(line)
    n_errors = sum(1 for line in messages if ": error:" in line)
    files = {line.split(":", 1)[0] for line in messages if ": error:" in line}
    if n_errors:
        print(f"Found {n_errors} error{'s' * (n_errors != 1)} in {len(files)} file{'s' * (len(files) != 1)}")
        return 1
    print(f"Success: no issues found in {len(renamed)} source file{'s' * (len(renamed) != 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
