"""Jupyter servers and page helpers for the real-browser tests (used by ``conftest.py``).

Servers listen on 127.0.0.1 on a free port, run with HOME / JUPYTER_* / IPYTHONDIR / XDG_* pointed at
a temp dir (so a test run leaves nothing in the user's home), log to a file that failures quote, and
are stopped by PID: the server's descendants (kernels run in their own process session) are recorded
before SIGTERM and any survivor is killed by PID afterwards. Nothing is ever killed by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # ipykernel depends on it
from _guard import tree_cpu
from _ports import HOST, free_port

_XSRF = "nbtrainer-tests"  # any value: tornado checks that the header's token is the cookie's
XSRF_HEADERS = {"X-XSRFToken": _XSRF, "Cookie": f"_xsrf={_XSRF}"}

__all__ = [
    "BAD_WIDGET_TEXTS",
    "XSRF_HEADERS",
    "Server",
    "chromium_args",
    "chromium_env",
    "free_port",
    "isolated_env",
    "lab_run_all",
    "start_classic",
    "start_lab",
    "start_notebook7",
    "start_voila",
    "wait_page",
    "wait_widgets_rendered",
    "widget_problems",
    "write_notebook",
]


def isolated_env(base: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a server (and its kernels) with every per-user dir inside ``base``."""
    dirs = {
        "HOME": base / "home",
        "JUPYTER_CONFIG_DIR": base / "jupyter-config",
        "JUPYTER_DATA_DIR": base / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": base / "jupyter-runtime",
        "IPYTHONDIR": base / "ipython",
        "XDG_CONFIG_HOME": base / "xdg-config",
        "XDG_CACHE_HOME": base / "xdg-cache",
        "XDG_DATA_HOME": base / "xdg-data",
        "MPLCONFIGDIR": base / "mpl",
    }
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "JPY_"))}
    env.update({k: str(v) for k, v in dirs.items()})
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    # the venv's scripts first, so kernels and servers are this interpreter's
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "2")
    env.update(extra or {})
    return env


@dataclass
class Server:
    """A running Jupyter server. ``url`` is its root (``http://127.0.0.1:PORT``), without a slash."""

    kind: str
    proc: subprocess.Popen
    port: int
    log_path: Path
    env: dict[str, str]
    root_dir: Path
    _known: dict[int, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no log>"

    def log_size(self) -> int:
        """Where the log ends now: ``log_since(size)`` later gives what was written from here on."""
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int, chars: int = 6000) -> str:
        """The log written since ``offset`` (its first ``chars`` characters: a kernel's traceback or its restart is
        near the start of a test's part, and a long report gets cut at its end)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return "<no log>"
        return text if len(text) <= chars else text[:chars] + f"\n[... {len(text) - chars} more characters]"

    # -- process tree --------------------------------------------------------------------------
    def descendants(self) -> dict[int, float]:
        """``{pid: create_time}`` of the server's live descendants (kernels included)."""
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return {}
        out = {}
        for k in kids:
            with contextlib.suppress(psutil.Error):
                out[k.pid] = k.create_time()
        return out

    def remember_children(self) -> None:
        """Record the current descendants (call it while kernels run; ``stop`` does it too)."""
        self._known.update(self.descendants())

    def stop(self, grace: float = 8.0) -> None:
        """SIGTERM the server, wait, then SIGKILL it and any recorded descendant still alive, by PID."""
        self.remember_children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(timeout=5)
        deadline = time.monotonic() + 3.0
        for pid, created in self._known.items():
            try:
                p = psutil.Process(pid)
                if abs(p.create_time() - created) > 0.01:
                    continue  # the PID was reused by someone else's process: not ours
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except psutil.TimeoutExpired:
                with contextlib.suppress(psutil.Error):
                    p.kill()
                    p.wait(timeout=3)
            except psutil.Error:
                continue

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.status, r.read()

    def relative(self, path: Path) -> str:
        """``path`` (a notebook inside ``root_dir``) as the server names it: ``sub/dir/name.ipynb``."""
        return Path(path).resolve().relative_to(Path(self.root_dir).resolve()).as_posix()

    def shutdown_kernels(self, timeout: float = 10.0) -> None:
        """Shut down every session and kernel of a Jupyter server (its REST API), recording their processes first
        so that ``stop`` can still find a survivor. A shared server calls this after each test: a kernel left
        training in a thread would take the CPU from the tests after it, and each idle one holds ~0.5 GB.

        A server without a token refuses a DELETE without an XSRF token ("403: '_xsrf' argument missing"): each
        request carries one in its header and the same in its ``_xsrf`` cookie, which is what tornado compares.
        Until that was sent, every test's kernel in the shared JupyterLab lived on to the end of its worker, and the
        refusals were swallowed: a refusal now fails the test's teardown; a session or kernel already gone (404)
        and a server that has gone away are fine."""
        self.remember_children()
        for listing, prefix in (("/api/sessions", "/api/sessions/"), ("/api/kernels", "/api/kernels/")):
            try:
                _, body = self.get(listing, timeout=timeout)
            except (urllib.error.URLError, OSError):
                return  # the server is gone: stop() handles what is left
            for item in json.loads(body or b"[]"):
                request = urllib.request.Request(self.url + prefix + item["id"], method="DELETE", headers=XSRF_HEADERS)
                try:
                    urllib.request.urlopen(request, timeout=timeout).close()
                except urllib.error.HTTPError as exc:
                    if exc.code != 404:  # 404: ended with its session, or by the test itself
                        raise RuntimeError(f"{self.kind} refused to shut down {prefix}{item['id']}: {exc}") from exc
                except TimeoutError:
                    continue  # a loaded server still shutting it down: the next one's request goes in meanwhile
                except (urllib.error.URLError, OSError):
                    return  # the server is gone: stop() ends what it started

    def wait_ready(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                why = PortTaken if "is not available" in tail or "already in use" in tail else RuntimeError
                raise why(f"{self.kind} exited with {self.proc.returncode} before it was ready\n{tail}")
            try:
                status, _ = self.get(path, timeout=2.0)
                if status == 200:
                    return
                last = status
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                last = exc
            time.sleep(0.2)
        raise TimeoutError(
            f"{self.kind} not ready at {self.url}{path} after {timeout:.0f}s ({last!r})\n{self.log_tail()}"
        )


class PortTaken(RuntimeError):
    """The server exited because its port was in use."""


def _spawn(
    kind: str,
    cmd_for: Callable[[int], Sequence[str]],
    workdir: Path,
    root_dir: Path,
    env: dict[str, str],
    ready_path: str,
    timeout: float,
) -> Server:
    """Start ``cmd_for(port)`` on a free port and wait until ``ready_path`` answers. A server that found its port
    taken after all (another process bound it since ``free_port`` checked) is started again on another port, twice
    at most."""
    attempts = 0
    while True:
        attempts += 1
        port = free_port()
        log_path = workdir / f"{kind}-{port}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - kept open for the child, closed with the Popen below
        try:
            proc = subprocess.Popen(
                list(cmd_for(port)),
                cwd=root_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()  # the child has its own descriptor
        server = Server(kind, proc, port, log_path, env, root_dir)
        try:
            server.wait_ready(ready_path, timeout)
            return server
        except PortTaken:
            server.stop()
            if attempts == 3:
                raise
        except BaseException:
            server.stop()
            raise


def start_voila(
    notebook: Path,
    workdir: Path,
    *,
    timeout: float = 60.0,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> Server:
    """Voila 0.5 serving ``notebook`` at ``server.url + "/"`` (GET ``/`` executes it).

    Readiness is polled on ``/voila/static/voila.js``, which does not start a kernel.
    """
    notebook = Path(notebook).resolve()
    cmd = lambda port: [  # noqa: E731
        sys.executable,
        "-m",
        "voila",
        str(notebook),
        "--no-browser",
        f"--Voila.ip={HOST}",
        f"--Voila.port={port}",
        "--Voila.port_retries=0",
        "--VoilaConfiguration.show_tracebacks=True",
        *extra_args,
    ]
    return _spawn(
        "voila", cmd, workdir, notebook.parent, env or isolated_env(workdir), "/voila/static/voila.js", timeout
    )


LAB_NOTIFICATION_SETTINGS = {"fetchNews": "false", "checkForUpdates": False}


# jupytext (a test dependency: the notebooks' sources) brings its own server and front-end extensions, which the
# browser tests do not use; in Notebook 7 its front end raised a page error ("Not same Y.Doc" / 'schema').
NO_JUPYTEXT = ('--ServerApp.jpserver_extensions={"jupyterlab_jupytext": False}',)


def _user_settings(env: dict[str, str], theme: str | None) -> None:
    """News/update pop-ups off (nothing covers the notebook), jupytext's front end off and, if given, the theme."""
    labconfig = Path(env["JUPYTER_CONFIG_DIR"]) / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": {"jupyterlab-jupytext": True}}))
    folder = Path(env["JUPYTER_CONFIG_DIR"]) / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text(json.dumps(LAB_NOTIFICATION_SETTINGS))
    if theme is not None:
        (folder / "themes.jupyterlab-settings").write_text(json.dumps({"theme": theme}))


def _jupyter_server_cmd(module: str, port: int, root_dir: Path) -> list[str]:
    """A Jupyter server application (``jupyterlab``, ``notebook``) on loopback, no auth, as root, no jupytext."""
    return [
        sys.executable,
        "-m",
        module,
        "--no-browser",
        "--allow-root",
        f"--ServerApp.ip={HOST}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--IdentityProvider.token=",
        "--PasswordIdentityProvider.hashed_password=",
        f"--ServerApp.root_dir={Path(root_dir).resolve()}",
        *NO_JUPYTEXT,
    ]


def start_lab(
    root_dir: Path,
    workdir: Path,
    *,
    timeout: float = 90.0,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
    theme: str | None = None,
) -> Server:
    """JupyterLab 4 with no token/password, serving ``root_dir``; ready when ``GET /api`` answers.

    ``window.jupyterapp`` is exposed (``--LabApp.expose_app_in_browser``) and the news / update
    notification is switched off through a user-settings file, so nothing covers the notebook;
    ``theme="JupyterLab Dark"`` starts it in the dark theme.
    """
    env = env or isolated_env(workdir)
    _user_settings(env, theme)
    cmd = lambda port: [  # noqa: E731
        *_jupyter_server_cmd("jupyterlab", port, root_dir),
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--LabApp.expose_app_in_browser=True",
        f"--LabApp.workspaces_dir={workdir / 'lab-workspaces'}",
        *extra_args,
    ]
    return _spawn("jupyterlab", cmd, workdir, Path(root_dir).resolve(), env, "/api", timeout)


def start_notebook7(
    root_dir: Path,
    workdir: Path,
    *,
    timeout: float = 90.0,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> Server:
    """Jupyter Notebook 7 serving ``root_dir`` (open ``/notebooks/NAME.ipynb``); ``window.jupyterapp`` exposed."""
    env = env or isolated_env(workdir)
    _user_settings(env, None)
    cmd = lambda port: [  # noqa: E731
        *_jupyter_server_cmd("notebook", port, root_dir),
        "--JupyterNotebookApp.expose_app_in_browser=True",
        *extra_args,
    ]
    return _spawn("notebook", cmd, workdir, Path(root_dir).resolve(), env, "/api", timeout)


def start_classic(
    root_dir: Path,
    workdir: Path,
    *,
    timeout: float = 90.0,
    extra_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
) -> Server:
    """The classic Jupyter Notebook 6.5 (its own ``NotebookApp``, the ipywidgets 7 front end through
    widgetsnbextension) serving ``root_dir``: open ``/notebooks/NAME.ipynb``; ``window.Jupyter`` is the page's API.
    Needs the colab profile's venv (notebook 6.5 there; the main venv has Notebook 7)."""
    env = env or isolated_env(workdir)
    cmd = lambda port: [  # noqa: E731
        sys.executable,
        "-m",
        "notebook",
        "--no-browser",
        "--allow-root",
        f"--NotebookApp.ip={HOST}",
        f"--NotebookApp.port={port}",
        "--NotebookApp.port_retries=0",
        "--NotebookApp.token=",
        "--NotebookApp.password=",
        f"--NotebookApp.notebook_dir={Path(root_dir).resolve()}",
        *extra_args,
    ]
    return _spawn("notebook6", cmd, workdir, Path(root_dir).resolve(), env, "/api", timeout)


def write_notebook(path: Path, cells: Sequence[str | tuple[str, str]]) -> Path:
    """Write a notebook (python3 kernelspec, no outputs). A cell is code, or ``("markdown", text)``."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for cell in cells:
        if isinstance(cell, tuple):
            kind, src = cell
            nb.cells.append(
                nbformat.v4.new_markdown_cell(src) if kind == "markdown" else nbformat.v4.new_code_cell(src)
            )
        else:
            nb.cells.append(nbformat.v4.new_code_cell(cell))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# -- Chromium --------------------------------------------------------------------------------------


def chromium_args() -> list[str]:
    """Flags for Debian's Chromium here: headless, no sandbox (root), no outside look-ups."""
    return [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        # outside names fail fast; without the two EXCLUDEs every local page fails
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    ]


def chromium_env(base: Path) -> dict[str, str | float | bool]:
    env: dict[str, str | float | bool] = dict(os.environ)
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        d = base / name.lower()
        d.mkdir(parents=True, exist_ok=True)
        env[name] = str(d)
    return env


# -- page helpers ----------------------------------------------------------------------------------

BAD_WIDGET_TEXTS = ("Loading widget", "Error displaying widget", "Error rendering")


def widget_problems(page: Any) -> list[str]:
    """What says a widget did not render: the bad texts in the page, and error-widget elements."""
    text = page.evaluate("() => document.body ? document.body.innerText : ''")
    problems = [t for t in BAD_WIDGET_TEXTS if t in text]
    n_err = page.locator(".jupyter-widgets-error-widget").count()
    if n_err:
        problems.append(f"{n_err} .jupyter-widgets-error-widget element(s)")
    return problems


def wait_widgets_rendered(page: Any, selectors: Sequence[str], cpu_s: float = 30.0) -> None:
    """Wait until every selector is visible and no widget is loading or broken; raise with the reason. The budget is
    ``cpu_s`` CPU seconds of the test's processes (``wait_page``): a kernel's imports and a page's first drawing
    are work, and on a VM 2.4x slower than usual, or beside a loaded suite, their wall time stretches."""
    start = tree_cpu()
    missing: list[str] = list(selectors)
    problems: list[str] = []
    while tree_cpu() - start < cpu_s:
        missing = [s for s in selectors if page.locator(s).count() == 0 or not page.locator(s).first.is_visible()]
        problems = widget_problems(page)
        if not missing and not problems:
            return
        if any(p.startswith("Error") or "error-widget" in p for p in problems):
            break  # a failed render does not recover
        page.wait_for_timeout(200)
    raise AssertionError(f"widgets not rendered: missing={missing} problems={problems}")


def wait_page(page: Any, predicate: str, arg: Any = None, *, cpu_s: float = 30.0, what: str = "") -> Any:
    """``page.wait_for_function(predicate, arg=arg)``: its value once truthy. The budget is ``cpu_s`` CPU seconds
    spent by the test's processes (the kernel that trains, the browser that draws, the Jupyter server, this worker:
    ``tests/_guard.tree_cpu``), not wall seconds: the work a page state waits on costs about the same CPU quiet or
    loaded, while its wall time stretched 10-20x in a loaded trial on a slower VM (loaded trial 48: "paused" not
    shown within 20 s). A page on which nothing works spends no CPU; the test's hang guard ends that wait.
    Raises ``TimeoutError`` naming ``what``."""
    start = tree_cpu()
    while True:
        try:
            return page.wait_for_function(predicate, arg=arg, timeout=1000)
        except Exception as exc:  # Playwright's TimeoutError: a one-second slice ran out
            if "Timeout" not in type(exc).__name__:
                raise
        used = tree_cpu() - start
        if used > cpu_s:
            raise TimeoutError(
                f"{what or predicate[:80]} not shown after the test's processes spent {used:.0f} CPU seconds on it "
                f"(budget {cpu_s:.0f}): they worked, the page never got there"
            )


def lab_run_all(page: Any, cpu_s: float = 60.0) -> None:
    """In JupyterLab (``expose_app_in_browser``): wait for the notebook's kernel to be idle, run all cells,
    and wait until the kernel is idle again with every code cell executed; each wait within ``cpu_s`` CPU seconds of the
    test's processes (``wait_page``)."""
    kernel_idle = """() => {
        const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        const s = w && w.sessionContext;
        return !!(s && s.session && s.session.kernel && s.session.kernel.status === 'idle'
                  && !s.pendingInput);
    }"""
    wait_page(page, kernel_idle, cpu_s=cpu_s, what="the notebook's kernel idle")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    wait_page(
        page,
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            if (!w || !w.content || !w.sessionContext.session) return false;
            const kernel = w.sessionContext.session.kernel;
            const cells = w.content.widgets.filter(c => c.model.type === 'code');
            return kernel && kernel.status === 'idle'
                && cells.every(c => c.model.executionCount !== null && !c.node.classList.contains('jp-mod-running'))
                && cells.every(c => c.promptNode === undefined || !/\\[\\*\\]/.test(c.promptNode.textContent));
        }""",
        cpu_s=cpu_s,
        what="every cell run and the kernel idle",
    )
