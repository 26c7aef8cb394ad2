#!/usr/bin/env bash
# The suite against the newest releases of every dependency (not part of CI): a separate venv, .venv-latest, with
# torch still pinned (the CPU build; a newer torch from the index would be a CUDA build) and nothing else locked.
# When it passes, `bash scripts/lock.sh .venv-latest` writes those versions into constraints.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-latest"
cons="$(mktemp)"
trap 'rm -f "$cons"' EXIT
grep -E '^torch==' "$root/constraints.txt" > "$cons"
py="$(NBT_VENV="$venv" NBT_CONSTRAINTS="$cons" NBT_UPGRADE=1 bash "$root/scripts/venv.sh")"
"$(dirname "$py")/python" -m pip list --disable-pip-version-check --outdated 2>/dev/null | head -20 || true
cd "$root"
NBT_PYTHON="$py" bash scripts/lint.sh
exec "$py" -m pytest -q -rs -n "${NBT_WORKERS:-2}" "$@"
