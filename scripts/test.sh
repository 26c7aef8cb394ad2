#!/usr/bin/env bash
# The whole test suite (README's second command; docs/testing.md is the reference): lint and types (scripts/lint.sh),
# pytest on 3 workers (pytest-xdist) and, beside them, the second pass on Google Colab's widget stack (issue 45): the
# colab profile's venv (./.venv-colab, built while the first pass starts) runs the widget and kernel tests, the runs
# views, the classic Notebook 6.5 browser test and the install check on one worker of its own. The three run side by
# side (2 cores: the browser and kernel tests wait on pages and kernels part of the time, which the others fill); the
# command fails when any fails, and prints each one's report in turn. NBT_WORKERS / NBT_COLAB_WORKERS set the counts.
#
#   bash scripts/test.sh                 # everything (what CI runs through .ci/run)
#   bash scripts/test.sh --quick         # the inner loop: the unit tests (-m "not slow and not browser"), no lint
#   bash scripts/test.sh -k accumulation # extra arguments go to pytest alone (no lint, 2 workers)
#   NBT_PROFILE=colab bash scripts/test.sh [args]   # only the colab pass (or args in that venv)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# the second pass's tests: the runs views, all of tests/widgets but three slow ones that draw no widget (a console fit
# in a subprocess, CompareWidget.run measuring strategies, the OpenMP pools of the panel's training thread), and the
# browser test only that venv can run
colab_tests=(tests/widgets tests/runs/test_runs_widget.py tests/browser/test_panel_classic.py
  --deselect tests/widgets/test_widget_fallback.py::test_fit_without_a_frontend_trains_in_the_foreground_with_console_bars
  --deselect tests/widgets/test_widget_compare.py::test_run_adds_each_row_as_it_is_measured
  --deselect tests/widgets/test_widget_threads.py::test_the_panels_thread_trains_as_fast_as_a_fit_on_the_main_thread)
# Python writes each module's bytecode when it first imports it (the venvs are installed without it: scripts/venv.sh);
# under PYTHONDONTWRITEBYTECODE every one of the suite's interpreters would compile torch and Jupyter again
unset PYTHONDONTWRITEBYTECODE
if [ "${1:-}" = "--quick" ]; then
  shift
  set -- -m "not slow and not browser" "$@"
fi
if [ "${NBT_PROFILE:-}" = colab ]; then
  py="$(bash "$root/scripts/venv.sh" colab)"
  [ "$#" -gt 0 ] || set -- "${colab_tests[@]}"
else
  py="$(bash "$root/scripts/venv.sh")"
fi
if [ "$#" -gt 0 ]; then
  # a subset such as the inner loop is mostly CPU-bound unit tests: a third worker only adds contention
  exec "$py" -m pytest -q -rs -n "${NBT_WORKERS:-2}" "$@"
fi
# how fast this machine's cores are, read before the suite loads them (1 s): the same 2-core VM type has run this
# suite in 7 to 18 minutes, and a log's times compare only beside this line (bench/_machine.py, docs/testing.md)
"$py" "$root/bench/_machine.py" --loop-only || true
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
NBT_PYTHON="$py" bash scripts/lint.sh >"$logs/lint" 2>&1 &
lint_pid=$!
colab_pass() {  # the colab profile's venv, then its tests (their report is printed after the first pass's)
  if ! bash scripts/venv.sh colab >"$logs/colab-venv" 2>&1; then
    echo "the colab profile's venv FAILED (bash scripts/venv.sh colab):"
    cat "$logs/colab-venv"
    return 1
  fi
  local colab_py
  colab_py="$(tail -n 1 "$logs/colab-venv")"
  echo "== the colab profile (ipywidgets 7.7.1, ipykernel 6.17.1, bqplot 0.12, Notebook 6.5; venv $(grep -o 'ready in [0-9]* s' "$logs/colab-venv" || echo 'up to date'))"
  "$colab_py" -m pytest -q -rs -n "${NBT_COLAB_WORKERS:-1}" "${colab_tests[@]}"
}
colab_pass >"$logs/colab" 2>&1 &
colab_pid=$!
rc=0
# the 15 slowest tests in every report: where the time goes, run after run (docs/testing.md, Time)
"$py" -m pytest -q -rs -n "${NBT_WORKERS:-3}" --durations=15 || rc=$?
colab_rc=0
wait "$colab_pid" || colab_rc=$?
cat "$logs/colab"
[ "$colab_rc" -eq 0 ] || { echo "the colab pass FAILED" >&2; [ "$rc" -ne 0 ] || rc="$colab_rc"; }
lint_rc=0
wait "$lint_pid" || lint_rc=$?
if [ "$lint_rc" -ne 0 ]; then
  echo "lint/types FAILED (bash scripts/lint.sh):" >&2
  cat "$logs/lint" >&2
  [ "$rc" -ne 0 ] || rc="$lint_rc"
else
  echo "lint/types: clean (ruff check, ruff format, mypy)"
fi
exit "$rc"
