#!/usr/bin/env bash
# Lint and types (part of scripts/test.sh; runs alone too): ruff rules, ruff format, mypy. Exits non-zero on any finding.
# mypy keeps its cache in .mypy_cache: a cold run takes about 2 minutes on 2 cores, a warm one a few seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${NBT_PYTHON:-$(bash "$root/scripts/venv.sh")}"
bin="$(dirname "$py")"
cd "$root"
paths=(nbtrainer widgets tests bench examples notebooks scripts docs/_hooks.py docs/_griffe.py)
"$bin/ruff" check --output-format concise "${paths[@]}"
"$bin/ruff" format --check "${paths[@]}" >/dev/null || { "$bin/ruff" format --check "${paths[@]}"; echo "run: ruff format" >&2; exit 1; }
# tests/_mypy.py is mypy with widgets/ under its installed name, nbtrainer.widgets (see its docstring)
"$py" tests/_mypy.py nbtrainer widgets tests
