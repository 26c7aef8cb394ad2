#!/usr/bin/env bash
# Rewrite constraints.txt (the test environment's lock) from a venv whose suite passed: `bash scripts/lock.sh` (./.venv)
# or `bash scripts/lock.sh .venv-latest` after scripts/test-latest.sh. Keeps the header and the torch pin first.
# A second argument names another lock: `bash scripts/lock.sh .venv-colab constraints-colab.txt` (the colab profile).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"
out="$root/${2:-constraints.txt}"
tmp="$(mktemp "$out.XXXX")"
grep -E '^#' "$out" > "$tmp"
grep -E '^torch==' "$out" >> "$tmp"
"$venv/bin/python" -m pip freeze --disable-pip-version-check --exclude-editable \
  | grep -vE '^(-e |torch( @|==)|nbtrainer[ =@])' >> "$tmp"
mv "$tmp" "$out"
echo "$(basename "$out"): $(grep -cvE '^#' "$out") pins"
