"""Fixtures for real-browser tests: Voila / JupyterLab on loopback, driven by Debian's Chromium.

Every test in ``tests/browser/`` is marked ``browser`` automatically (deselect with ``-m "not browser"``).
When Chromium (``/usr/bin/chromium``, or ``$NBT_CHROMIUM``), Playwright, Voila or JupyterLab is missing
these tests are skipped -- except when ``CI`` is set, where they fail: CI installs them (``.ci/run``).
Playwright drives the system Chromium through ``executable_path``; ``playwright install`` is never needed.

Fixtures
--------
``browser``  (session)  a ``playwright.sync_api.Browser`` (headless Chromium, flags from
                        ``_servers.chromium_args()``: no sandbox, no outside DNS, loopback only).
``page``     (function) a fresh context + ``Page`` (1280x900, 30 s default timeout). If the test fails, a
                        full-page screenshot goes to ``test-artifacts/<test>-failure.png`` and the
                        browser console and the server logs are printed with the report.
``console_log`` (function) ``list[str]`` of the page's console messages and page errors (``"error: ..."``).
``voila_server`` (function) factory ``voila_server(notebook: Path, *, timeout=60, extra_args=()) -> Server``:
                        Voila 0.5 on ``server.url`` (``page.goto(server.url + "/")`` executes the notebook;
                        its kernel runs with cwd = the notebook's folder and stays alive, so widget
                        callbacks work). Stopped by PID at teardown.
``lab_server``   (function) factory ``lab_server(root_dir: Path, *, timeout=90, extra_args=()) -> Server``:
                        JupyterLab 4, no token, ``window.jupyterapp`` exposed, news/update pop-up off.
                        Open ``f"{server.url}/lab/tree/{name}.ipynb"`` then ``lab_run_all(page)``.
``shared_lab``    (function) the worker's one JupyterLab, started at the first test that asks and shared by
                        every test that does (a server start is seconds of waiting); ``page.goto(shared_lab.url(nb))``
                        opens ``nb`` (under ``tmp_path``, e.g. ``make_notebook``'s, or copied there) in a fresh
                        workspace. Every kernel the test started is shut down when it ends. Prefer it to
                        ``lab_server`` unless the test needs its own server (a theme, extra options, a reload of
                        the server itself).
``make_notebook`` (function) ``make_notebook(name: str, cells: list[str | ("markdown", str)]) -> Path``
                        writes ``<tmp>/nb/<name>.ipynb`` (python3 kernelspec, no outputs).
``screenshot``   (function) ``screenshot(page, name, *, selector=None) -> Path`` saves
                        ``test-artifacts/<name>.png`` (a selector is scrolled into view and shot alone).
``artifacts_dir`` (session) ``Path`` of ``test-artifacts/`` (gitignored; ``$NBT_ARTIFACTS`` overrides).

``Server`` has ``url``, ``pid``, ``port``, ``root_dir``, ``log_tail()``, ``get(path)``, ``stop()``.
Page helpers live in ``_servers`` (import them: ``from _servers import wait_widgets_rendered, lab_run_all``):
``wait_widgets_rendered(page, selectors, cpu_s=30)`` waits until every selector is visible and no
"Loading widget" / "Error displaying widget" / "Error rendering" / error-widget remains;
``widget_problems(page)`` lists those problems now; ``lab_run_all(page, cpu_s=60)`` waits for the kernel,
runs all cells through ``window.jupyterapp.commands`` and waits until every code cell has executed.

Example::

    def test_panel(voila_server, make_notebook, page, screenshot):
        nb = make_notebook("panel", ["from nbtrainer import TrainerWidget", "...", "w"])
        server = voila_server(nb)
        page.goto(server.url + "/")
        wait_widgets_rendered(page, [".nbt-panel", "svg.svg-figure"])
        page.locator(".nbt-start").click()
        screenshot(page, "panel-running")

Voila streams the page while it executes the cells, so ``page.goto`` returns only after the last cell ran:
give it a ``timeout=`` (ms) above the notebook's run time (the default is 30 s). Select on stable ``nbt-...``
classes (``widget.add_class``), not on Lab internals. bqplot draws marks in
several steps: poll until every property you check agrees (``page.wait_for_function``). A button clicked
while a cell is busy is only delivered when the cell ends: training must run in a thread.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from . import _servers, _wstrace
from ._servers import Server

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing_or_skip(what: str) -> None:
    msg = f"browser tests need {what}"
    if _in_ci():
        pytest.fail(f"{msg} (CI is set: browser tests must run here; .ci/run installs chromium)", pytrace=False)
    pytest.skip(msg)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield  # pluggy sends the call's result object into an old-style hook wrapper
    rep = outcome.get_result()
    setattr(item, f"_nbt_rep_{rep.when}", rep)


def _failed(request: pytest.FixtureRequest) -> bool:
    rep = getattr(request.node, "_nbt_rep_call", None)
    return rep is None or rep.failed  # no call report: setup failed


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_")[:120] or "shot"


# -- requirements ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = os.environ.get("NBT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        _missing_or_skip("Debian's chromium (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="session")
def _jupyter_servers_available() -> None:
    for mod, what in (
        ("voila", "voila"),
        ("jupyterlab", "jupyterlab"),
        ("notebook", "notebook"),
        ("nbformat", "nbformat"),
    ):
        try:
            __import__(mod)
        except ImportError:
            _missing_or_skip(f"{what} (pip install -e .[test])")


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    d = Path(os.environ.get("NBT_ARTIFACTS") or REPO / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- browser ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser(chromium_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing_or_skip("playwright (pip install -e .[test]; never `playwright install`)")
    home = tmp_path_factory.mktemp("chromium")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(
            executable_path=chromium_path,
            headless=True,
            args=_servers.chromium_args(),
            env=_servers.chromium_env(home),
            timeout=60_000,
        )
    except Exception as exc:
        pw.stop()
        if _in_ci():
            raise
        pytest.skip(f"chromium at {chromium_path} did not start: {exc}")
    try:
        yield b
    finally:
        b.close()
        pw.stop()


@pytest.fixture
def console_log() -> list[str]:
    return []


@pytest.fixture
def page(browser: Any, console_log: list[str], request: pytest.FixtureRequest, artifacts_dir: Path) -> Iterator[Any]:
    # NBT_VIEWPORT_HEIGHT: scripts/readme-picture.sh takes the whole panel (bqplot paints only what is in view)
    height = int(os.environ.get("NBT_VIEWPORT_HEIGHT") or 900)
    context = browser.new_context(viewport={"width": 1280, "height": height})
    pg = context.new_page()
    pg.set_default_timeout(30_000)
    if os.environ.get("NBT_SLOW_PAGE"):  # the renderer N times slower: a page that draws behind the kernel (testing.md)
        context.new_cdp_session(pg).send("Emulation.setCPUThrottlingRate", {"rate": float(os.environ["NBT_SLOW_PAGE"])})
    pg.on("console", lambda m: console_log.append(f"{m.type}: {m.text}"))
    # the kernel messages (_wstrace.py): with NBT_WS_TRACE, or for a test marked ws_trace (its restore is printed)
    marked = request.node.get_closest_marker("ws_trace") is not None
    trace = _wstrace.Trace() if os.environ.get("NBT_WS_TRACE") or marked else None
    if trace is not None:
        pg.on("websocket", trace.attach)
    pg.on("pageerror", lambda e: console_log.append(f"pageerror: {e}"))
    try:
        yield pg
    finally:
        if _failed(request):
            try:
                shot = artifacts_dir / f"{_safe(request.node.name)}-failure.png"
                pg.screenshot(path=str(shot), full_page=True, timeout=10_000)
                print(f"\n[screenshot] {shot}")
            except Exception as exc:
                print(f"\n[screenshot failed] {exc}")
            whole = artifacts_dir / f"{_safe(request.node.name)}-console.log"
            whole.write_text("\n".join(console_log) + "\n")
            print(f"[browser console] the last 80 of {len(console_log)} lines (all in {whole})")
            print("\n".join(console_log[-80:]))
        if trace is not None and (_failed(request) or os.environ.get("NBT_WS_TRACE") == "all"):
            print(f"[kernel messages] {trace.write(artifacts_dir / f'{_safe(request.node.name)}-ws.log')}")
            if marked and _failed(request):
                print(trace.page_connections(pg))
                print(trace.summary())
        context.close()


@pytest.fixture
def screenshot(artifacts_dir: Path) -> Callable[..., Path]:
    def take(page: Any, name: str, *, selector: str | None = None) -> Path:
        path = artifacts_dir / f"{_safe(name)}.png"
        if selector:
            loc = page.locator(selector).first
            loc.scroll_into_view_if_needed()
            loc.screenshot(path=str(path))
        else:
            page.screenshot(path=str(path), full_page=True)
        return path

    return take


# -- servers and notebooks -------------------------------------------------------------------------


@pytest.fixture
def make_notebook(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str, cells: list[Any]) -> Path:
        return _servers.write_notebook(tmp_path / "nb" / f"{_safe(name)}.ipynb", cells)

    return make


def _server_factory(
    start: Callable[..., Server], request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def factory(target: Path, **kw: Any) -> Server:
        workdir = tmp_path_factory.mktemp(start.__name__.removeprefix("start_"))
        server = start(Path(target), workdir, **kw)
        started.append(server)
        return server

    try:
        yield factory
    finally:
        failed = _failed(request)
        for server in reversed(started):
            if failed:
                print(f"\n[{server.kind} log, pid {server.pid}]\n{server.log_tail()}")
            server.stop()


@pytest.fixture
def voila_server(
    _jupyter_servers_available: None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    yield from _server_factory(_servers.start_voila, request, tmp_path_factory)


@pytest.fixture
def notebook7_server(
    _jupyter_servers_available: None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    yield from _server_factory(_servers.start_notebook7, request, tmp_path_factory)


@pytest.fixture
def lab_server(
    _jupyter_servers_available: None, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Server]]:
    yield from _server_factory(_servers.start_lab, request, tmp_path_factory)


class SharedLab:
    """This worker's JupyterLab (light theme, no extra options), shared by the tests that ask for ``shared_lab``.

    ``url(notebook)``: the page that opens ``notebook`` (a path under the test's ``tmp_path``, e.g. from
    ``make_notebook``; any other path is copied there first) in a fresh workspace (``?reset``). ``server``: the
    :class:`Server` (its log is printed when the test fails).
    """

    def __init__(self, server: Server, tmp_path: Path) -> None:
        self.server, self._tmp = server, tmp_path

    def url(self, notebook: Path) -> str:
        notebook = Path(notebook).resolve()
        root = Path(self.server.root_dir).resolve()
        if root not in notebook.parents:
            dest = self._tmp / "nb" / notebook.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(notebook, dest)
            notebook = dest.resolve()
        return f"{self.server.url}/lab/tree/{self.server.relative(notebook)}?reset"


@pytest.fixture(scope="session")
def _lab_for_the_session(
    _jupyter_servers_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Server]]:
    started: list[Server] = []

    def get() -> Server:
        if not started:  # at the first test that asks: a worker that runs none starts none
            base = tmp_path_factory.getbasetemp()  # every tmp_path of this worker is under it
            started.append(_servers.start_lab(base, tmp_path_factory.mktemp("lab-shared")))
        return started[0]

    try:
        yield get
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def shared_lab(
    _lab_for_the_session: Callable[[], Server], request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[SharedLab]:
    server = _lab_for_the_session()
    start = server.log_size()
    try:
        yield SharedLab(server, tmp_path)
    finally:
        if _failed(request):  # this test's part of the log: earlier tests' lines would crowd out its kernel's
            print(f"\n[shared {server.kind} log, pid {server.pid}, since this test began]\n{server.log_since(start)}")
        server.shutdown_kernels()  # nothing this test started runs on into the next
