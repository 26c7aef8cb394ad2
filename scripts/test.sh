#!/usr/bin/env bash
# The whole test suite (README's second command). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/venv.sh")"
cd "$root"
exec "$py" -m pytest -q -rs "$@"
