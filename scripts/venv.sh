#!/usr/bin/env bash
# Create or reuse ./.venv with torch pinned and installed FIRST (so no requirement pulls a CUDA build),
# then the project in editable mode with its test/bench/demo extras. Idempotent: a stamp of the
# inputs skips the install when nothing changed. Prints the venv's python path on stdout.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${NBT_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
stamp="$venv/.nbtrainer-stamp"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv" >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  pipx=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  if [ -d /opt/wheels ]; then pipx+=(--find-links /opt/wheels); fi
  "${pipx[@]}" -c "$root/constraints.txt" torch >&2
  "${pipx[@]}" -c "$root/constraints.txt" -e "$root[test,bench,demo]" >&2
  echo "$want" > "$stamp"
fi
echo "$venv/bin/python"
