"""The documentation site (mkdocs.yml): ``mkdocs build --strict`` succeeds, and the API reference names every public
name. Strict mode turns every warning into a failure: a link to a page that does not exist, a page left out of the
nav, a docstring mkdocstrings cannot read, a ``::: name`` it cannot find."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import needs

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"


def _lazy_names() -> dict[str, str]:
    tree = ast.parse((ROOT / "nbtrainer" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_LAZY":
            assert node.value is not None
            return dict(ast.literal_eval(node.value))
    raise AssertionError("no _LAZY table in nbtrainer/__init__.py")


def test_the_api_reference_names_every_public_name() -> None:
    """A name added to the root namespace gets a ``::: nbtrainer.Name`` entry in docs/api/ (docs/_hooks.py resolves
    it to the module that defines it)."""
    documented = {
        m for page in API.glob("*.md") for m in re.findall(r"^:::\s+nbtrainer\.(\w+)\s*$", page.read_text(), re.M)
    }
    public = set(_lazy_names()) - {"EVENTS"}  # a tuple of event names, listed on the Callbacks page's text
    assert not public - documented, f"add to a page of docs/api/: {sorted(public - documented)}"
    assert not documented - public, f"docs/api/ names what nbtrainer does not export: {sorted(documented - public)}"


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert not [p for p in pages if p not in nav], "a page of docs/ missing from mkdocs.yml's nav"


@pytest.mark.slow
@needs("mkdocs", "material", "mkdocstrings_handlers")
def test_the_site_builds_strict(tmp_path: Any) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice about its successor
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    site = tmp_path / "site"
    trainer_page = re.sub(r"<[^>]+>", "", (site / "api" / "trainer" / "index.html").read_text(encoding="utf-8"))
    # the reference is generated from the docstrings: the Trainer's own example is on its page
    assert "Trainer" in trainer_page and "history.status, len(history.epochs)" in trainer_page
    assert (site / "index.html").exists() and (site / "testing" / "index.html").exists()


def test_the_readme_starts_where_a_newcomer_starts() -> None:
    """At most 20 KB; the two commands first (CI runs its test command), then the pitch, the panel's picture,
    install, a script, the panel, the docs' table, the contributors' set-up; every page of docs/ in the table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 20_000
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block and text.index("```bash") < 20
    assert [line.split("#")[0].strip() for line in first_block.group(1).splitlines()] == [
        "bash scripts/demo.sh",
        "bash scripts/test.sh",
    ]
    order = [
        "](docs/images/panel.png)",
        "## Install",
        "pip install nbtrainer",
        "load_digits",
        "## The panel in three lines",
        "## Documentation",
        "## Contributing",
    ]
    positions = [text.find(marker) for marker in order]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), dict(zip(order, positions, strict=True))
    assert re.search(r"Python 3\.\d+ or newer", text)
    linked = set(re.findall(r"\]\(docs/([\w/.-]+\.md)\)", text))
    guides = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert guides <= linked, f"pages missing from the README's table: {sorted(guides - linked)}"


def test_the_readme_picture_is_the_browser_tests_screenshot_and_small() -> None:
    picture = ROOT / "docs" / "images" / "panel.png"
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 200_000
    script = (ROOT / "scripts" / "readme-picture.sh").read_text(encoding="utf-8")
    test = re.search(r"(tests/browser/\S+\.py)::(\w+)", script)
    assert test, "scripts/readme-picture.sh names the browser test whose screenshot it takes"
    source = (ROOT / test.group(1)).read_text(encoding="utf-8")
    assert f"def {test.group(2)}(" in source
    shot = re.search(r'"\$shots/([\w-]+)\.png"', script)
    assert shot and shot.group(1).startswith("panel-voila")  # run_controls_scenario(..., "panel-voila", ...)
