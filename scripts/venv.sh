#!/usr/bin/env bash
# Create or reuse ./.venv with torch pinned and installed FIRST (so no requirement pulls a CUDA build), then the project
# in editable mode with its test/bench/demo extras, every dependency at the version locked in constraints.txt.
# Idempotent: a stamp of the inputs skips the install when nothing changed. Prints the venv's python path on stdout.
# NBT_VENV / NBT_CONSTRAINTS / NBT_UPGRADE=1 are for scripts/test-latest.sh (another venv, only torch pinned).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NBT_VENV:-$root/.venv}"
cons="${NBT_CONSTRAINTS:-$root/constraints.txt}"
py="${PYTHON:-python3}"
stamp="$venv/.nbtrainer-stamp"
want="$(cat "$root/pyproject.toml" "$cons" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pipx=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  if [ -d /opt/wheels ]; then pipx+=(--find-links /opt/wheels); fi
  if [ -n "${NBT_UPGRADE:-}" ]; then pipx+=(--upgrade --upgrade-strategy eager); fi
  "${pipx[@]}" -c "$cons" torch >&2
  "${pipx[@]}" -c "$cons" -e "$root[test,bench,demo]" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
