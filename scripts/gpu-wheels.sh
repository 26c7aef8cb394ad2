#!/usr/bin/env bash
# Fills .whl/ with the wheels that the GPU machine's python3 lacks (Python 3.12, manylinux x86_64), at the versions
# constraints.txt locks, for scripts/gpu-check.sh to install there with --no-index: that machine has no network.
# Run it here, where pip can reach the index; .whl/ is git-ignored, so name it in what the GPU machine is sent.
# That machine already has torch, transformers, peft, accelerate, lightning, pytest, torchmetrics, numpy, pandas,
# pygments and psutil. The panel step (9) drives a TrainerWidget with no front end, so the widget stack's Python side
# comes too (ipywidgets needs IPython at import); its front-end packages (widgetsnbextension, jupyterlab_widgets:
# 3 MiB of JavaScript no headless panel loads), jupyter-ui-poll (only a waiting notebook cell uses it) and jedi (5 MiB;
# IPython completes without it) stay out.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${NBT_PYTHON:-python3}"
packages=(ptflops bitsandbytes torchao
  ipywidgets comm traitlets bqplot bqscales traittypes
  ipython ipython_pygments_lexers matplotlib-inline pexpect ptyprocess prompt_toolkit wcwidth stack-data
  executing asttokens pure_eval)

pins=()
for name in "${packages[@]}"; do
  # the lock spells some names with '_', others with '-'
  pin="$(grep -iE "^${name//[-_]/[-_]}==" constraints.txt || true)"
  [ -n "$pin" ] || { echo "gpu-wheels: constraints.txt has no pin for $name" >&2; exit 1; }
  pins+=("$pin")
done

mkdir -p .whl
# another version of the same package left here would be installed beside this one
for name in "${packages[@]}"; do rm -f ".whl/${name//-/_}-"*.whl ".whl/${name}-"*.whl; done
# manylinux_2_24: the only tag of bitsandbytes 0.50.2's wheel (torchao 0.18.0 has it beside 2_28)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
for pin in "${pins[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$pin"
done
ls -l .whl/*.whl
total_kib="$(du -ck .whl/*.whl | tail -n 1 | cut -f 1)"
echo "gpu-wheels: $(( (total_kib + 1023) / 1024 )) MiB in .whl/"
if [ "$total_kib" -gt $((56 * 1024)) ]; then
  # the device tool carries 64 MiB in all, the working tree (about 8 MiB) beside these
  echo "gpu-wheels: over the ~56 MiB the GPU machine can be sent beside the tree" >&2
fi
