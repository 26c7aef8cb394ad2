#!/usr/bin/env bash
# The npm parts of the VS Code widget harness (tests/browser/test_panel_vscode.py), built into .vscode-harness/
# (gitignored) and printed as that folder's path on stdout. .ci/run calls it before the suite; the test's fixture
# calls it too (a no-op once built: a stamp of the inputs).
#   lib/ipywidgets.js  VS Code's own widget bundle, npm @vscode/jupyter-ipywidgets8 (the version VS Code's "Jupyter
#                      Notebook Renderers" extension ships): a self-contained webpack build, so `npm pack` and
#                      unpack it, integrity checked; never `npm install` it (that pulls its whole build-time tree)
#   lib/require.js, lib/jquery.min.js   what that extension's preload puts on the page before the bundle
#   lib/services.js    @jupyterlab/services' KernelConnection + ServerConnection (esbuild, from tests/browser/vscode/)
# Needs node and npm and the npm registry; nothing else from the network. One short line per phase on stderr.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/tests/browser/vscode"
out="${NBT_VSCODE_HARNESS:-$root/.vscode-harness}"
BUNDLE="@vscode/jupyter-ipywidgets8"
BUNDLE_VERSION="1.0.9"
# the integrity the registry published (also in microsoft/vscode-notebook-renderers' package-lock.json)
BUNDLE_INTEGRITY="sha512-bocCThfa4JDIDd7qCFAfW3HpzHfTLYxOTpTbiDfw4DXOUjKHnr6ObkMBiIkuzYPRybh5bY4FhYLemuDuTvIbpQ=="

say() { printf 'vscode-harness: %s\n' "$*" >&2; }
command -v npm >/dev/null 2>&1 || { say "npm not found (apt-get install -y nodejs npm)"; exit 3; }

want="$(cat "$src/package.json" "$src/package-lock.json" "$src/services-entry.js" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
stamp="$out/.stamp"
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9  # two pytest processes on one checkout build once
if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
  echo "$out"
  exit 0
fi
t0=$SECONDS
rm -rf "$out/lib" "$out/build" "$stamp"
mkdir -p "$out/lib" "$out/build"
log="$out/build.log"
: >"$log"
phase() {  # phase "what" cmd...: one line when done, the command's output in the log (shown on failure)
  local what="$1" t=$SECONDS
  shift
  echo "== $what: $*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    say "$what FAILED; its output:"
    tail -n 30 "$log" >&2
    exit 1
  fi
  say "$what ($((SECONDS - t)) s)"
}

cd "$out/build"
phase "npm pack $BUNDLE@$BUNDLE_VERSION" npm pack --json "$BUNDLE@$BUNDLE_VERSION" --pack-destination "$out/build"
tgz="$out/build/vscode-jupyter-ipywidgets8-$BUNDLE_VERSION.tgz"
got="$(node -e 'const c = require("crypto"), fs = require("fs");
  process.stdout.write("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$tgz")"
if [ "$got" != "$BUNDLE_INTEGRITY" ]; then
  say "$tgz: integrity $got, expected $BUNDLE_INTEGRITY"
  exit 1
fi
tar -xzf "$tgz" -C "$out/build" package/dist/ipywidgets.js package/LICENSE
cp "$out/build/package/dist/ipywidgets.js" "$out/lib/ipywidgets.js"
cp "$out/build/package/LICENSE" "$out/lib/ipywidgets.LICENSE"

cp "$src/package.json" "$src/package-lock.json" "$src/services-entry.js" "$out/build/"
# --ignore-scripts: no install scripts run (esbuild's binary comes as its optional platform package all the same)
phase "npm ci (services, esbuild, requirejs, jquery)" npm ci --no-audit --no-fund --ignore-scripts
phase "esbuild services.js" node_modules/.bin/esbuild services-entry.js --bundle --format=iife --platform=browser \
  --minify --log-level=warning --outfile="$out/lib/services.js"
cp node_modules/requirejs/require.js "$out/lib/require.js"
cp node_modules/jquery/dist/jquery.min.js "$out/lib/jquery.min.js"
rm -rf "$out/build"
echo "$want" >"$stamp"
say "ready in $((SECONDS - t0)) s: $out"
echo "$out"
