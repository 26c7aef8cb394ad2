"""mypy on the repository, with ``widgets/`` checked under the name it is installed as: ``nbtrainer.widgets``.

``pyproject.toml`` maps the top-level ``widgets/`` folder to the package ``nbtrainer.widgets`` (setuptools
``package-dir``), and the editable install resolves it with an import hook that mypy does not run. mypy's command line
names a file after the folders above it, so ``mypy widgets`` checks a package called ``widgets`` that nothing imports,
and every ``from nbtrainer.widgets import ...`` (the core's lazy names, the magics, ``tests/widgets``) is "module not
found". This runner lists the sources the way ``mypy`` would (its config, its arguments), renames ``widgets.*`` to
``nbtrainer.widgets.*``, and runs the same build: one check of the widget layer, under its real name, with real paths
in the messages.

Usage (what ``scripts/lint.sh`` runs)::

    .venv/bin/python tests/_mypy.py                 # the config's files: nbtrainer widgets tests
    .venv/bin/python tests/_mypy.py nbtrainer/_loop/_fit_loop.py

It takes mypy's own options and prints mypy's output; the exit status is mypy's (0 clean, 1 errors, 2 bad usage).
The widget layer is always among the sources, as mypy would follow the core's imports of it in an ordinary layout.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.find_sources import create_source_list
from mypy.main import process_options
from mypy.modulefinder import BuildSource

REPO = Path(__file__).resolve().parents[1]
INSTALLED_AS = {REPO / "widgets": "nbtrainer.widgets"}  # folder -> the package it installs as (package-dir)


def installed_name(path: str) -> str | None:
    """The module a file of a mapped folder is once installed (``widgets/_panel.py`` -> ``nbtrainer.widgets._panel``);
    None for any other file."""
    file = Path(path).resolve()
    for folder, package in INSTALLED_AS.items():
        if file.is_relative_to(folder):
            parts = file.relative_to(folder).with_suffix("").parts
            return ".".join([package, *parts[: -1 if parts[-1] == "__init__" else None]])
    return None


def main(args: list[str]) -> int:
    sources, options = process_options(args, stdout=sys.stdout, stderr=sys.stderr)
    listed = {Path(s.path).resolve() for s in sources if s.path}
    for folder in INSTALLED_AS:  # the whole package, whichever of its files (if any) were named
        sources += [s for s in create_source_list([str(folder)], options) if Path(str(s.path)).resolve() not in listed]
    renamed = []
    for s in sources:
        name = installed_name(s.path) if s.path else None
        renamed.append(s if name is None else BuildSource(s.path, name, s.text))
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
