#!/usr/bin/env bash
# Create or reuse ./.venv and print its python's path on stdout. One argument, the profile:
#   demo  the core and its `demo` extra (what `bash scripts/demo.sh` needs: a fresh clone trains within 2 minutes)
#   test  (default) the core with its test, bench and demo extras: the whole lock
#   colab ./.venv-colab: Google Colab's widget stack (ipywidgets 7.7.1, ipykernel 6.17.1, IPython 7.34, bqplot 0.12,
#         classic Notebook 6.5) from constraints-colab.txt, the core and the few tools its tests need (issue 45)
# torch is installed FIRST, from this machine's CPU wheel when one lies in /opt/wheels (so no requirement pulls a CUDA
# build), then the project in editable mode, every dependency at the version locked in constraints.txt.
# Installer: uv (`uv pip install`, installed with pip when missing), or plain pip where uv cannot be had; NBT_INSTALLER
# forces one (uv|pip). One short line per phase on stderr; the installers' own output goes to $venv/install.log.
# Idempotent: a stamp of the inputs skips the install when nothing changed; a `test` venv serves `demo` as it is.
# NBT_VENV / NBT_CONSTRAINTS / NBT_UPGRADE=1 are for scripts/test-latest.sh (another venv, only torch pinned).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
profile="${1:-test}"
tools=()
case "$profile" in
  demo) extras="demo" ;;
  test) extras="test,bench,demo" ;;
  colab)
    extras=""
    # what tests/widgets, the kernel tests, the runs views (optuna) and the classic-Notebook browser test run with
    # (not the test extra: it needs JupyterLab 4 and Notebook 7, which need what Colab pins older)
    tools=(pytest pytest-xdist pytest-timeout nbclient nbformat playwright notebook optuna)
    NBT_VENV="${NBT_VENV:-$root/.venv-colab}"
    NBT_CONSTRAINTS="${NBT_CONSTRAINTS:-$root/constraints-colab.txt}"
    ;;
  *) echo "venv.sh: unknown profile '$profile' (demo, test or colab)" >&2; exit 2 ;;
esac
venv="${NBT_VENV:-$root/.venv}"
cons="${NBT_CONSTRAINTS:-$root/constraints.txt}"
py="${PYTHON:-python3}"
stamp="$venv/.nbtrainer-stamp"
log="$venv/install.log"
spec="$root${extras:+[$extras]}"
want="$( (cat "$root/pyproject.toml" "$cons"; printf '%s' "${tools[*]-}") | sha256sum | cut -d' ' -f1)"
have="$(cat "$stamp" 2>/dev/null || true)"
# a stamp is "<hash> <profile>"; the test profile holds everything the demo profile needs
if [ "$have" = "$want $profile" ] || [ "$have" = "$want test" ]; then
  echo "$venv/bin/python"
  exit 0
fi

say() { printf 'setup: %s\n' "$*" >&2; }
t0=$SECONDS
phase() {  # phase "what" cmd...: one line when done; the command's output goes to the log, shown on failure
  local what="$1" t=$SECONDS
  shift
  echo "== $what: $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    say "$what FAILED; the installer's output:"
    tail -n 40 "$log" >&2
    exit 1
  fi
  say "$what ($((SECONDS - t)) s)"
}

installer="${NBT_INSTALLER:-}"
if [ -z "$installer" ]; then
  if command -v uv >/dev/null 2>&1 || "$py" -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1; then
    installer=uv
  else
    installer=pip
  fi
fi
uv_bin="$(command -v uv || true)"
if [ "$installer" = uv ] && [ -z "$uv_bin" ]; then
  # pip put it beside the interpreter that installed it, which is not always on PATH
  uv_bin="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/uv"
  [ -x "$uv_bin" ] || { say "uv not found after installing it; using pip"; installer=pip; }
fi

mkdir -p "$venv"
: >"$log"
if [ ! -x "$venv/bin/python" ]; then
  if [ "$installer" = uv ]; then
    # --seed: pip inside the venv too, for scripts/lock.sh and the packaging tests (`python -m pip`)
    phase "venv $venv (uv)" "$uv_bin" venv --seed --allow-existing --python "$py" "$venv"
  else
    phase "venv $venv (pip)" "$py" -m venv "$venv"
  fi
fi

# torch: the CPU wheel on this machine's disk when there is one (uv does not look in pip's find-links by itself)
torch_spec="$(grep -E '^torch==' "$cons")"
wheel="$(ls /opt/wheels/torch-"${torch_spec#torch==}"+cpu-*.whl 2>/dev/null | head -n 1 || true)"
if [ "$installer" = uv ]; then
  inst=("$uv_bin" pip install --python "$venv/bin/python")
  [ -z "${NBT_UPGRADE:-}" ] || inst+=(--upgrade)
  # No bytecode compiled at install (uv's --compile-bytecode): it compiled all 19,500 modules of the test venv, 19 s
  # of a fresh clone's set-up on two cores, most of them never imported. scripts/test.sh lets Python write each
  # module's bytecode the first time an interpreter imports it instead (where PYTHONDONTWRITEBYTECODE is set, as on
  # this machine and in CI, none would ever be written and each of the suite's ~100 interpreters would compile torch
  # again: 7.4 s of CPU for `import torch, nbtrainer, torchmetrics` against 3.6 s).
  phase "torch ${torch_spec#torch==}" "${inst[@]}" -c "$cons" "${wheel:-$torch_spec}"
  phase "nbtrainer${extras:+[$extras]} from $(basename "$cons")" "${inst[@]}" -c "$cons" -e "$spec" ${tools[@]+"${tools[@]}"}
else
  inst=("$venv/bin/python" -m pip install --disable-pip-version-check)
  [ ! -d /opt/wheels ] || inst+=(--find-links /opt/wheels)
  [ -z "${NBT_UPGRADE:-}" ] || inst+=(--upgrade --upgrade-strategy eager)
  phase "torch ${torch_spec#torch==}" "${inst[@]}" -c "$cons" "${wheel:-$torch_spec}"
  phase "nbtrainer${extras:+[$extras]} from $(basename "$cons")" "${inst[@]}" -c "$cons" -e "$spec" ${tools[@]+"${tools[@]}"}
fi
if [ "$profile" != demo ]; then
  # the repository's own modules (quick: read by every worker and kernel from the start; stale ones are ignored)
  phase "bytecode of nbtrainer, widgets, tests" "$venv/bin/python" -m compileall -q -j 0 "$root/nbtrainer" "$root/widgets" "$root/tests" "$root/bench"
fi
echo "$want $profile" >"$stamp"
say "ready in $((SECONDS - t0)) s with $installer (log: ${log#"$root"/})"
echo "$venv/bin/python"
