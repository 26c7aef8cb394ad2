#!/usr/bin/env bash
# The whole test suite (README's second command): lint and types (scripts/lint.sh), then pytest on 3 workers
# (pytest-xdist). The two run side by side; the command fails when either fails. Three workers on two cores: the
# browser and kernel tests spend part of their time waiting on a page or a kernel, which a third worker fills
# (quiet, 2 cores: 6 min 2 s against 6 min 27 s on two). With arguments (a subset) it runs 2. NBT_WORKERS sets
# another count.
# Extra arguments go to pytest alone (no lint), e.g. `bash scripts/test.sh -k accumulation` or the inner loop
# `bash scripts/test.sh -m "not slow and not browser"`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/venv.sh")"
cd "$root"
if [ "$#" -gt 0 ]; then
  # a subset such as the inner loop is mostly CPU-bound unit tests: a third worker only adds contention (57 s
  # against 51 s for -m "not slow and not browser")
  exec "$py" -m pytest -q -rs -n "${NBT_WORKERS:-2}" "$@"
fi
workers="${NBT_WORKERS:-3}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
NBT_PYTHON="$py" bash scripts/lint.sh >"$log" 2>&1 &
lint_pid=$!
rc=0
"$py" -m pytest -q -rs -n "$workers" || rc=$?
lint_rc=0
wait "$lint_pid" || lint_rc=$?
if [ "$lint_rc" -ne 0 ]; then
  echo "lint/types FAILED (bash scripts/lint.sh):" >&2
  cat "$log" >&2
  [ "$rc" -ne 0 ] || rc="$lint_rc"
else
  echo "lint/types: clean (ruff check, ruff format, mypy)"
fi
exit "$rc"
