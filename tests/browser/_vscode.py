"""The VS Code widget harness's Python side (used by ``test_panel_vscode.py``).

VS Code draws widgets with its own bundle (npm ``@vscode/jupyter-ipywidgets8``). For a local kernel, vscode-jupyter
finds third-party widget JS (bqplot, bqscales...) in the kernel environment's ``share/jupyter/nbextensions``: it
copies those folders next to its webview and maps module names to scripts by reading each ``extension.js``'s
``require.config({map: ...})`` call. :func:`copy_nbextensions` and :func:`widget_script_sources` do the same, after
vscode-jupyter's ``src/notebooks/controllers/ipywidgets/scriptSourceProvider/``:

* ``localIPyWidgetScriptManager.node.ts``: copy ``<data dir>/nbextensions`` of every Jupyter data dir, lowest
  priority first (higher ones overwrite), into ``<base>/nbextensions``; entry points are ``**/extension.js`` there;
* ``baseIPyWidgetScriptManager.ts`` (``extractRequireConfigFromWidgetEntry``, ``getWidgetModuleMappingsImpl``): the
  parsing, mirrored step by step in :func:`require_config` (quirks included), and the merge that drops the modules
  the bundle carries itself;
* ``localWidgetScriptSourceProvider.node.ts``: module name -> script URL under the webview's base URL.

The page (``tests/browser/vscode/``) and its npm parts (``scripts/vscode-harness.sh``) are served by
:class:`StaticServer`; the kernel runs under a plain Jupyter server (:func:`start_kernel_server`) that lets the page's
origin in.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ._servers import HOST, Server, _jupyter_server_cmd, _spawn

__all__ = [
    "BUNDLED_MODULES",
    "REQUIRE_PATTERNS",
    "StaticServer",
    "build_harness",
    "copy_nbextensions",
    "jupyter_data_dirs",
    "require_config",
    "start_kernel",
    "start_kernel_server",
    "strip_js_comments",
    "widget_script_sources",
]

REPO = Path(__file__).resolve().parents[2]

# The order matters: vscode-jupyter pops from the end and keeps the first pattern found.
REQUIRE_PATTERNS = (
    "require.config({",
    "requirejs?.config({",
    "window.requirejs?.config({",
    "requirejs.config({",
    '["require"].config({',
    "['require'].config({",
    '["requirejs"].config({',
    "['requirejs'].config({",
    '["require"]["config"]({',
    "['require']['config']({",
    '["requirejs"]["config"]({',
    "['requirejs']['config']({",
)
# what the bundle defines in requirejs itself: never taken from nbextensions
BUNDLED_MODULES = (
    "jupyter-js-widgets",
    "@jupyter-widgets/base",
    "@jupyter-widgets/controls",
    "@jupyter-widgets/output",
)

_JS_TOKENS = re.compile(
    r"""(?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)"""
    r"""|(?P<block>/\*[\s\S]*?(?:\*/|$))|(?P<line>//[^\n]*)"""
)


def strip_js_comments(code: str) -> str:
    """``code`` without its ``//`` and ``/* */`` comments; string literals are kept whole (VS Code uses the npm
    package strip-comments here)."""
    return _JS_TOKENS.sub(lambda m: m.group("str") or "", code)


def _trim_quotes(value: str) -> str:
    # vscode-jupyter helpers.trimQuotes: one quote off each end
    return re.sub(r"(^['\"])|(['\"]$)", "", value)


def _last_found(contents: str, patterns: list[str]) -> tuple[int, str | None]:
    index, used = 0, None
    while index <= 0 and patterns:  # as written there: a match at offset 0 counts as none
        used = patterns.pop()
        index = contents.find(used)
    return index, used


def require_config(contents: str, base_url: str) -> dict[str, str] | None:
    """The module -> script URL mapping VS Code reads from one ``extension.js``, or None where it finds none
    (``extractRequireConfigFromWidgetEntry``). Relative paths are joined to ``base_url``, the folder that holds
    ``nbextensions/``."""
    index, used = _last_found(contents, list(REQUIRE_PATTERNS))
    if index < 0:  # the same patterns without their "({"
        index, used = _last_found(contents, [p[:-2] for p in REQUIRE_PATTERNS])
    if index < 0:
        return None
    end = contents.find(")", index)
    if end <= 0 or used is None:
        return None
    start = contents.find("{", index)
    config = strip_js_comments(contents[start:end])
    config = "".join(line.strip() for line in re.split(r"\r?\n", config) if line.strip())
    # the entries between the last "{" and the "}" after it
    entries = [e.strip() for e in config.split("{")[-1].split("}")[0].split(",")]
    mapping: dict[str, str] = {}
    for entry in entries:
        if not entry or ":" not in entry:
            continue
        key = _trim_quotes(entry.split(":")[0].replace("\\r", "").replace("\\n", "").strip()).strip()
        value = _trim_quotes(entry[entry.index(":") + 1 :].replace("\\r", "").replace("\\n", "").strip()).strip()
        mapping[key] = value if value.startswith("http") else base_url.rstrip("/") + "/" + value
    return mapping or None


def copy_nbextensions(data_dirs: Iterable[Path], base: Path) -> Path:
    """Copy each ``<data dir>/nbextensions`` into ``base/nbextensions``, lowest priority first (``data_dirs`` comes
    highest first, as ``jupyter_core.paths.jupyter_path()`` gives it, and VS Code's ``JupyterPaths.getDataDirs``)."""
    target = base / "nbextensions"
    target.mkdir(parents=True, exist_ok=True)
    for folder in reversed([Path(d) / "nbextensions" for d in data_dirs]):
        if folder.is_dir():
            shutil.copytree(folder, target, dirs_exist_ok=True)
    return target


def widget_script_sources(base: Path, base_url: str) -> dict[str, str]:
    """Module name -> script URL for every ``extension.js`` under ``base/nbextensions`` (``getWidgetModuleMappings``):
    the configs merged in file order, the bundle's own modules dropped."""
    merged: dict[str, str] = {}
    folder = base / "nbextensions"
    for entry in sorted(folder.rglob("extension.js")):
        merged.update(require_config(entry.read_text(encoding="utf-8", errors="replace"), base_url) or {})
    for name in BUNDLED_MODULES:
        merged.pop(name, None)
    return merged


def build_harness() -> Path:
    """The npm parts (``scripts/vscode-harness.sh``, cached in ``.vscode-harness/``): the folder holding ``lib/``."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "vscode-harness.sh")], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/vscode-harness.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[tuple[str, int]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are recorded above; nothing on stderr

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


class StaticServer:
    """Files under ``root`` on ``http://127.0.0.1:PORT/`` from a thread of the test process; ``requests`` lists
    ``(path, status)`` of every request answered."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.requests: list[tuple[str, int]] = []
        handler = type("Handler", (_Handler,), {"requests": self.requests})
        self._httpd = http.server.ThreadingHTTPServer((HOST, 0), functools.partial(handler, directory=str(root)))
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="vscode-harness-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def served(self, path_part: str) -> list[tuple[str, int]]:
        return [r for r in self.requests if path_part in r[0]]

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_kernel_server(root_dir: Path, workdir: Path, env: dict[str, str], *, allow_origin: str) -> Server:
    """A plain Jupyter server (no front end) for the harness's kernel: no auth, on loopback, and ``allow_origin``
    (the harness page's origin) may open its REST API and kernel websockets."""
    cmd = lambda port: [  # noqa: E731
        *_jupyter_server_cmd("jupyter_server", port, root_dir),
        f"--ServerApp.allow_origin={allow_origin}",
        "--ServerApp.disable_check_xsrf=True",
    ]
    return _spawn("jupyter_server", cmd, workdir, Path(root_dir).resolve(), env, "/api", 90.0)


def start_kernel(server: Server, name: str = "python3") -> str:
    """Start a kernel through the server's REST API; its id."""
    req = urllib.request.Request(
        server.url + "/api/kernels",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        kernel_id: str = json.loads(r.read())["id"]
    server.remember_children()
    return kernel_id


def jupyter_data_dirs(env: dict[str, str]) -> list[Path]:
    """The kernel environment's Jupyter data dirs, highest priority first (what ``jupyter --paths`` lists under
    data for that environment)."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, jupyter_core.paths as p; print(json.dumps(p.jupyter_path()))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [Path(p) for p in json.loads(out)]
