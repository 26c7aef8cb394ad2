#!/usr/bin/env bash
# The main job (README's first command): a small CNN on scikit-learn's bundled digits, headless.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/venv.sh" demo)"
cd "$root"
exec "$py" examples/train_digits.py "$@"
