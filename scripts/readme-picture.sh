#!/usr/bin/env bash
# The README's picture of the panel (docs/images/panel.png), from the browser tests' own screenshot: the panel in
# Voila, stopped after a short run (tests/browser/test_panel_voila.py, the controls scenario of
# tests/browser/_scenario.py), in a viewport tall enough for the whole panel (bqplot paints only what is in view). Rerun it when the panel's look changes; commit the PNG (kept well under 200 KB:
# 256 colours, at most 1,100 pixels wide). Needs the test venv and Debian's chromium, like the browser tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(bash "$root/scripts/venv.sh")"
cd "$root"
shots="$(mktemp -d)"
trap 'rm -rf "$shots"' EXIT
NBT_ARTIFACTS="$shots" NBT_VIEWPORT_HEIGHT=1400 "$py" -m pytest -q -p no:cacheprovider \
  tests/browser/test_panel_voila.py::test_panel_in_voila_start_pause_resume_stop >"$shots/pytest.log" 2>&1 \
  || { tail -n 40 "$shots/pytest.log" >&2; echo "readme-picture: the browser test failed" >&2; exit 1; }
out="docs/images/panel.png"
"$py" - "$shots/panel-voila-stopped.png" "$out" <<'PY'
import sys

from PIL import Image

src, out = sys.argv[1], sys.argv[2]
image = Image.open(src).convert("RGB")
if image.width > 1100:
    image = image.resize((1100, round(image.height * 1100 / image.width)), Image.LANCZOS)
image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, optimize=True)
PY
echo "$out: $(($(stat -c %s "$out") / 1024)) KB"
