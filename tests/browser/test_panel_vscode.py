"""The training panel drawn by VS Code's own widget bundle, in a real Chromium, on a real kernel.

VS Code renders widget outputs with the npm package ``@vscode/jupyter-ipywidgets8`` (1.0.9, what its "Jupyter
Notebook Renderers" extension ships). The harness page (``tests/browser/vscode/``, npm parts built by
``scripts/vscode-harness.sh``) loads it as VS Code's notebook webview does (require.js and jQuery first, then the
bundle's ``activate()`` and ``vscIPyWidgets8.load()``), builds the bundle's ``WidgetManager`` on a
``@jupyterlab/services`` ``KernelConnection``, and renders each ``application/vnd.jupyter.widget-view+json`` output
the way vscode-jupyter's ``renderWidget`` does. Third-party widget JS (bqplot, bqscales) comes from a copy of the
kernel environment's ``share/jupyter/nbextensions``, module names mapped by parsing each ``extension.js`` as
vscode-jupyter's local widget script manager does (``_vscode.py``). The kernel runs with ``VSCODE_PID`` set, as
kernels that VS Code starts do.

What it reproduces: VS Code's widget code (the bundle: the JupyterLab widget manager, the controls, the output
widget, its class loading through requirejs) drawing the panel and its bqplot charts, with VS Code's way of finding
third-party widget scripts for a local kernel.

What it does not: VS Code relays every widget message through its extension host (the webview's ProxyKernel posts
each one and waits for an acknowledgement), so fast updates lag there; this page's websocket goes straight to the
kernel. Clicks sent while a cell runs may not reach the kernel in VS Code (vscode-jupyter#17360); here they would, so
no test clicks during a blocking ``w.fit()``. Nor VS Code's theme variables, its notebook UI or its CDN fallback.

* ``test_panel_renders_and_trains_in_vscode_bundle``: Run All of the browser tests' panel notebook, the panel and its
  four charts render, then the controls scenario (Start, chart and step counter grow, Pause holds, Resume, Stop
  holds); bqplot's script came from the nbextensions copy.
* ``test_updates_arrive_while_fit_blocks``: a cell running ``w.fit()``; the page sees the step counter advance twice
  while that cell still runs, and the final step once it returns.
* ``test_harness_detects_bqplot_that_cannot_load`` (negative control): the same panel with bqplot left out of the
  mapping (as when VS Code finds no local source and may not use a CDN): the render check fails on the charts.

One Jupyter server, one kernel and one static server for the module; a fresh page per test.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ._panel import PANEL_SELECTORS, badge, global_step, wait_page
from ._scenario import STEP_ABOVE, run_controls_scenario
from ._servers import Server, isolated_env, wait_widgets_rendered, widget_problems
from ._vscode import (
    StaticServer,
    build_harness,
    copy_nbextensions,
    jupyter_data_dirs,
    require_config,
    start_kernel,
    start_kernel_server,
    widget_script_sources,
)
from .conftest import _failed, _in_ci

pytestmark = pytest.mark.browser  # the three page tests are slow too

HERE = Path(__file__).resolve().parent
PANEL_NB = HERE / "notebooks" / "panel_live.ipynb"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CHART_SELECTORS = [s for s in PANEL_SELECTORS if "svg.svg-figure" in s]
OTHER_SELECTORS = [s for s in PANEL_SELECTORS if s not in CHART_SELECTORS]
# the panel's other parts are drawn and n error widgets stand in the page
REST_DRAWN_CHARTS_FAILED = """([selectors, n]) => selectors.every(s => document.querySelector(s))
    && document.querySelectorAll('.jupyter-widgets-error-widget').length >= n"""


@dataclass
class Harness:
    site: StaticServer
    server: Server
    kernel_id: str
    sources: dict[str, str]


@pytest.fixture(scope="module")
def vscode_harness(_jupyter_servers_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    try:
        if shutil.which("npm") is None:
            raise RuntimeError("the VS Code harness needs node and npm (apt-get install -y nodejs npm)")
        lib = build_harness() / "lib"
    except RuntimeError as exc:  # no npm, or no npm registry: skipped here, an error where CI is set
        if _in_ci():
            pytest.fail(f"{exc} (CI is set; .ci/run installs them)", pytrace=False)
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("vscode")
    site_dir = root / "site"
    shutil.copytree(HERE / "vscode", site_dir, ignore=shutil.ignore_patterns("package*.json", "*-entry.js"))
    shutil.copytree(lib, site_dir / "lib")
    site = StaticServer(site_dir)
    # VS Code starts kernels from its extension host, whose environment has VSCODE_PID
    env = isolated_env(root / "env", {"VSCODE_PID": str(os.getpid())})
    base = site_dir / "scripts" / "jupyter"  # VS Code: <extension>/temp/scripts/<kernel hash>/jupyter
    copy_nbextensions(jupyter_data_dirs(env), base)
    sources = widget_script_sources(base, f"{site.url}/scripts/jupyter")
    (root / "nb").mkdir()
    server = None
    try:
        server = start_kernel_server(root / "nb", root, env, allow_origin=site.url)
        kernel_id = start_kernel(server)
        common = {
            "serverUrl": server.url + "/",
            "wsUrl": server.url.replace("http://", "ws://") + "/",
            "kernelId": kernel_id,
            "kernelName": "python3",
            "baseUrl": f"{site.url}/scripts/jupyter/",
        }
        for name, mapping in (
            ("config.json", sources),
            ("config-no-bqplot.json", {k: v for k, v in sources.items() if k != "bqplot"}),
        ):
            listed = [{"moduleName": k, "scriptUri": v} for k, v in mapping.items()]
            (site_dir / name).write_text(json.dumps({**common, "widgetSources": listed}))
        yield Harness(site, server, kernel_id, sources)
    finally:
        if server is not None:
            server.stop()
        site.stop()


@pytest.fixture
def harness_page(vscode_harness: Harness, page: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield page
    if _failed(request):
        print(f"\n[jupyter_server log, pid {vscode_harness.server.pid}]\n{vscode_harness.server.log_tail()}")
        print("[harness log]\n" + "\n".join(_js(page, "() => window.harness ? window.harness.log.slice(-40) : []")))
        print(f"[static requests] {vscode_harness.site.requests[-40:]}")


def _js(page: Any, script: str, arg: Any = None) -> Any:
    try:
        return page.evaluate(script, arg)
    except Exception as exc:  # a closed page while reporting a failure
        return [f"<{exc}>"]


def open_harness(page: Any, harness: Harness, config: str = "config.json") -> None:
    page.goto(f"{harness.site.url}/index.html?config={config}", wait_until="domcontentloaded")
    wait_page(page, "() => window.harness && window.harness.state !== 'loading'", cpu_s=60, what="the harness")
    state = page.evaluate("() => window.harness.state")
    assert state == "ready", state


def run_cell(page: Any, code: str) -> int:
    """Send ``code`` to the kernel as VS Code runs a cell; returns at once with the cell's index."""
    index: int = page.evaluate("(code) => window.harness.run(code)", code)
    return index


def cell(page: Any, index: int) -> dict[str, Any]:
    info: dict[str, Any] = page.evaluate("(i) => window.harness.cells[i]", index)
    return info


def wait_cell(page: Any, index: int, cpu_s: float = 120.0) -> dict[str, Any]:
    """Until the cell has run, within ``cpu_s`` CPU seconds of the test's processes (``_servers.wait_page``)."""
    wait_page(page, "(i) => window.harness.cells[i].done", index, cpu_s=cpu_s, what=f"cell {index} done")
    info = cell(page, index)
    assert info["status"] == "ok", (index, info)
    return info


def notebook_code(path: Path) -> list[str]:
    import nbformat

    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def harness_list(page: Any, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = page.evaluate(f"() => window.harness.{name}")
    return items


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_panel_renders_and_trains_in_vscode_bundle(vscode_harness, harness_page, screenshot, console_log) -> None:
    page = harness_page
    assert {"bqplot", "bqscales"} <= set(vscode_harness.sources), vscode_harness.sources
    open_harness(page, vscode_harness)
    cells = [run_cell(page, code) for code in notebook_code(PANEL_NB)]  # Run All: queued, run in order
    last = wait_cell(page, cells[-1], cpu_s=120)
    assert any(WIDGET_VIEW in o.get("mimetypes", ()) for o in last["outputs"]), last
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    assert badge(page) == "idle"
    # bqplot's classes came through VS Code's route: the first third-party module asked of the script loader
    # registered every local source in requirejs, which loaded bqplot from the nbextensions copy
    assert {r["moduleName"] for r in harness_list(page, "sourceRequests")} <= {"bqplot", "bqscales"}
    assert {"bqplot", "bqscales"} <= {r["moduleName"] for r in harness_list(page, "loadSuccess")}
    assert harness_list(page, "loadErrors") == []
    assert (("/scripts/jupyter/nbextensions/bqplot/index.js", 200)) in vscode_harness.site.requests
    screenshot(page, "panel-vscode-idle", selector=".nbt-panel")
    run_controls_scenario(page, screenshot, "panel-vscode", console_log)
    assert not [m for m in console_log if m.startswith("error")], console_log


BLOCKING_CELL = (
    "import time, torch\n"
    "from torch import nn\n"
    "from torch.utils.data import DataLoader, TensorDataset\n"
    "from nbtrainer import TrainerWidget\n"
    "\n"
    "class Slow:  # at most 50 optimizer steps per second: 160 steps last 3 s or more\n"
    "    def on_optimizer_step(self, trainer, step, skipped):\n"
    "        time.sleep(0.02)\n"
    "\n"
    "_ = torch.manual_seed(0)\n"
    "x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))\n"
    "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))\n"
    "wb = TrainerWidget(model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.05),\n"
    "                   DataLoader(TensorDataset(x, y), batch_size=16), epochs=5, callbacks=[Slow()])\n"
    "wb"
)
TOTAL_STEPS = 5 * 512 // 16

# Once the step shown has passed n, or the cell has returned: [step, cell returned], read at the same instant.
STEP_PAST_OR_DONE = """([n, i]) => {
    const el = document.querySelector('.nbt-progress-info');
    const m = el ? el.innerText.match(/step ([\\d,]+)/) : null;
    const step = m ? parseInt(m[1].replace(/,/g, ''), 10) : 0;
    const done = window.harness.cells[i].done;
    return step > n || done ? [step, done] : false;
}"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_updates_arrive_while_fit_blocks(vscode_harness, harness_page, screenshot, console_log) -> None:
    page = harness_page
    open_harness(page, vscode_harness)
    wait_cell(page, run_cell(page, BLOCKING_CELL), cpu_s=60)
    wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=60)
    fit = run_cell(page, "h = wb.fit()  # blocks until the run ends\nprint('RESULT', h.status, len(h.epochs))")

    seen = [0]
    for _ in range(2):  # the counter moves twice while the cell still runs
        step, done = wait_page(page, STEP_PAST_OR_DONE, [seen[-1], fit], cpu_s=60, what="a step").json_value()
        assert not done, f"the cell returned before the page saw progress during it (steps seen: {seen})"
        assert step > seen[-1], (step, seen)
        seen.append(step)
    assert badge(page) == "running"
    screenshot(page, "panel-vscode-blocking-fit", selector=".nbt-panel")

    info = wait_cell(page, fit, cpu_s=120)
    assert any(o.get("text", "").startswith("RESULT finished 5") for o in info["outputs"]), info["outputs"]
    wait_page(page, STEP_ABOVE, [TOTAL_STEPS - 1], cpu_s=30, what="the last step")
    assert global_step(page) == TOTAL_STEPS
    assert 0 < seen[1] < seen[2] < TOTAL_STEPS, seen
    assert widget_problems(page) == []
    assert not [m for m in console_log if m.startswith(("error", "pageerror"))], console_log


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_harness_detects_bqplot_that_cannot_load(vscode_harness, harness_page, screenshot) -> None:
    """The negative control: what the positive tests check fails when bqplot's JS cannot load."""
    page = harness_page
    open_harness(page, vscode_harness, "config-no-bqplot.json")
    wait_cell(page, run_cell(page, BLOCKING_CELL.replace("wb", "wn")), cpu_s=60)
    with pytest.raises(AssertionError) as failed:
        wait_widgets_rendered(page, PANEL_SELECTORS, cpu_s=30)
    assert "error-widget" in str(failed.value) or any(c in str(failed.value) for c in CHART_SELECTORS), failed.value
    # what failed is the four charts, each an error widget in its place, and nothing else
    wait_page(page, REST_DRAWN_CHARTS_FAILED, [OTHER_SELECTORS, len(CHART_SELECTORS)], cpu_s=30)
    assert [c for c in CHART_SELECTORS if page.locator(c).count()] == []
    assert page.locator(".jupyter-widgets-error-widget").count() == len(CHART_SELECTORS)
    screenshot(page, "panel-vscode-no-bqplot", selector=".nbt-panel")
    # it failed for that reason: the bundle's loader could not get bqplot, and requirejs's guess was not served
    assert "bqplot" in {e["moduleName"] for e in harness_list(page, "loadErrors")}
    assert ("/scripts/jupyter/bqplot.js", 404) in vscode_harness.site.requests


def test_require_config_is_read_as_vscode_reads_it(tmp_path) -> None:
    """The module mapping, on the shapes vscode-jupyter's own comments and tests name (minified bqplot, bqscales'
    ``window['requirejs']``, the cookiecutter's commented config, a CDN URL, none at all), and the merge."""
    base = "http://h/scripts/jupyter"
    minified = 'define(()=>{window.require&&window.require.config({map:{"*":{bqplot:"nbextensions/bqplot/index"}}})});'
    assert require_config(minified, base) == {"bqplot": f"{base}/nbextensions/bqplot/index"}
    cookiecutter = """// Configure requirejs
    if (window['requirejs'] !== undefined) {
        window['requirejs'].config({
            map: {
                "*" : {
                    "ipysheet": "nbextensions/ipysheet/index", // the widget's bundle
                    /* the base widgets, from the notebook */
                    "jupyter-js-widgets": "nbextensions/jupyter-js-widgets/extension"
                }
            }
        });
    }"""
    assert require_config(cookiecutter, base) == {
        "ipysheet": f"{base}/nbextensions/ipysheet/index",
        "jupyter-js-widgets": f"{base}/nbextensions/jupyter-js-widgets/extension",
    }
    cdn = "require.config({ map: { '*': { 'k3d': 'https://unpkg.com/k3d@2/dist/index' } } });"
    assert require_config(cdn, base) == {"k3d": "https://unpkg.com/k3d@2/dist/index"}
    assert require_config("define(function () { return {}; });", base) is None

    folder = tmp_path / "nbextensions"
    for name, text in (("bqplot", minified), ("ipysheet", cookiecutter), ("plain", "define([], () => ({}));")):
        (folder / name).mkdir(parents=True)
        (folder / name / "extension.js").write_text(text)
    assert widget_script_sources(tmp_path, base) == {  # the bundle's own modules are never taken from here
        "bqplot": f"{base}/nbextensions/bqplot/index",
        "ipysheet": f"{base}/nbextensions/ipysheet/index",
    }
