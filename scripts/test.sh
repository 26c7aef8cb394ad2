#!/usr/bin/env bash
# The whole test suite (README's second command): lint and types (scripts/lint.sh), then pytest on 3 workers
# (pytest-xdist). The two run side by side; the command fails when either fails. Three workers on two cores: the
# browser and kernel tests spend part of their time waiting on a page or a kernel, which a third worker fills
# (quiet, 2 cores: 6 min 2 s against 6 min 27 s on two). With arguments (a subset) it runs 2. NBT_WORKERS sets
# another count.
# Extra arguments go to pytest alone (no lint), e.g. `bash scripts/test.sh -k accumulation` or the inner loop
# `bash scripts/test.sh -m "not slow and not browser"`; NBT_PROFILE=colab runs them in the colab profile's venv.
# Then a second pass on Google Colab's widget stack (issue 45): the colab profile's venv (./.venv-colab, built beside
# the first pass) runs the widget and kernel tests, the classic Notebook 6.5 browser test and the install check.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/venv.sh")"
cd "$root"
# the second pass's tests: the runs views, all of tests/widgets but two slow ones that draw no widget (a console fit
# in a subprocess, CompareWidget.run measuring strategies), and the browser test only that venv can run
colab_tests=(tests/widgets tests/runs/test_runs_widget.py tests/browser/test_panel_classic.py
  --deselect tests/widgets/test_widget_fallback.py::test_fit_without_a_frontend_trains_in_the_foreground_with_console_bars
  --deselect tests/widgets/test_widget_compare.py::test_run_adds_each_row_as_it_is_measured)
if [ "${NBT_PROFILE:-}" = colab ]; then
  py="$(bash "$root/scripts/venv.sh" colab)"
  [ "$#" -gt 0 ] || set -- "${colab_tests[@]}"
fi
if [ "$#" -gt 0 ]; then
  # a subset such as the inner loop is mostly CPU-bound unit tests: a third worker only adds contention (57 s
  # against 51 s for -m "not slow and not browser")
  exec "$py" -m pytest -q -rs -n "${NBT_WORKERS:-2}" "$@"
fi
workers="${NBT_WORKERS:-3}"
log="$(mktemp)"
colab_log="$(mktemp)"
trap 'rm -f "$log" "$colab_log"' EXIT
NBT_PYTHON="$py" bash scripts/lint.sh >"$log" 2>&1 &
lint_pid=$!
bash scripts/venv.sh colab >"$colab_log" 2>&1 &
colab_pid=$!
rc=0
"$py" -m pytest -q -rs -n "$workers" || rc=$?
if wait "$colab_pid"; then
  echo "== the colab profile (ipywidgets 7.7.1, ipykernel 6.17.1, bqplot 0.12, Notebook 6.5; venv $(grep -o 'ready in [0-9]* s' "$colab_log" || echo 'up to date'))"
  "$(tail -n 1 "$colab_log")" -m pytest -q -rs -n "${NBT_COLAB_WORKERS:-2}" "${colab_tests[@]}" || rc=$?
else
  echo "the colab profile's venv FAILED (bash scripts/venv.sh colab):" >&2
  cat "$colab_log" >&2
  rc=1
fi
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
