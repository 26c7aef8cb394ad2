#!/usr/bin/env bash
# GPU truth in one prepared command (issue 37): the eight checks of bench/gpu_check.py, each a subprocess with its
# own time budget (9 minutes in all), appended as a dated section to bench/RESULTS.md. Options go to gpu_check.py:
#   bash scripts/gpu-check.sh                      # a CUDA machine (exit 2 without one)
#   bash scripts/gpu-check.sh --only 2,6           # a subset of the steps
#   bash scripts/gpu-check.sh --dry-run [--out F]  # no GPU: the same steps on the CPU at tiny sizes, into a temp file
# The GPU machine runs this tree as it is, not installed: the repository goes on PYTHONPATH, and the wheels its
# python lacks come from .whl/ (scripts/gpu-wheels.sh fills it where there is a network).
set -euo pipefail
# the 9-minute budget counts from here (gpu_check.py reads it): the wheel install below is part of the run
GPU_CHECK_STARTED="$(date +%s)"
export GPU_CHECK_STARTED
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ -n "${NBT_PYTHON:-}" ]; then
  py="$NBT_PYTHON"
  # a relative path is the caller's (not resolved through links: a venv's python is a link to the base one)
  case "$py" in /*) ;; */*) py="$PWD/$py" ;; esac
elif [ -x "$root/.venv/bin/python" ]; then
  py="$root/.venv/bin/python"
else
  py=python3
fi
cd "$root"

pythonpath="$root"
if compgen -G ".whl/*.whl" >/dev/null; then
  # --target: the machine's site-packages stay as they are; --no-deps: everything else is there already
  if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  then
    pythonpath="/tmp/site:$pythonpath"
  else
    echo "gpu-check: installing .whl/ failed; the steps that import those packages will fail or skip" >&2
  fi
fi
export PYTHONPATH="$pythonpath${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" bench/gpu_check.py "$@"
