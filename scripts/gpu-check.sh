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

# Run as a tree on PYTHONPATH, not installed, nbtrainer.widgets would not exist: installing maps widgets/ to it
# (pyproject's package-dir). A link gives the tree that layout for this run (the first H200 run's panel step died on
# "No module named 'nbtrainer.widgets'"). Not in a dry run: the suite runs that, where nbtrainer is installed and a
# link inside nbtrainer/ would show widgets/ to the layering and lint checks running beside it.
link=""
case " $* " in
  *" --dry-run "*) ;;
  *)
    if [ ! -e nbtrainer/widgets ] && ! "$py" -c "import importlib.util as u, sys; sys.exit(u.find_spec('nbtrainer.widgets') is None)" 2>/dev/null
    then
      ln -s ../widgets nbtrainer/widgets && link=nbtrainer/widgets
    fi
    ;;
esac
if [ -n "$link" ]; then
  trap 'rm -f "$root/$link"' EXIT
  "$py" bench/gpu_check.py "$@"
else
  exec "$py" bench/gpu_check.py "$@"
fi
