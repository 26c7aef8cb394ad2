"""Every Python snippet in README.md and docs/ runs as written, on the CPU (issue 58).

Each page's ``python`` blocks run top to bottom in one temporary folder, each in a fresh namespace: no snippet may
lean on a name it does not define or import. A snippet may carry one mark, in its first line, where the reader sees
it too:

- ``# GPU only ...``: skipped where CUDA is missing (and the page says so);
- ``# ... after the script above`` / ``# ... after the snippet above``: runs in the namespace the previous snippet
  left (the panel "in three lines" continues the digits script);
- ``# run from the repository's folder``: runs with the repository as its working folder (it imports ``examples/``).

A snippet that reads a file names, in a comment, the snippet above that writes it (the page's folder is shared).
Each page is its own test, so pytest-xdist spreads the pages over its workers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
_GPU = re.compile(r"^#\s*GPU only\b")
_AFTER = re.compile(r"^#.*\bafter the (script|snippet) above\b")
_REPO = re.compile(r"#.*\brun from the repository's folder\b")


def snippets(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text(encoding="utf-8"))


def run_page(page: Path, folder: Path, monkeypatch: Any) -> int:
    """Run the page's snippets in order; returns how many ran."""
    import torch

    from nbtrainer._dist._ddp import destroy_process_group

    ran = 0
    namespace: dict[str, Any] = {}
    for index, code in enumerate(snippets(page)):
        first = code.splitlines()[0] if code.strip() else ""
        name = f"{page.relative_to(ROOT)}[{index}]"
        if _GPU.match(first) and not torch.cuda.is_available():
            continue
        if not _AFTER.match(first):
            namespace = {"__name__": "__main__"}
        monkeypatch.chdir(ROOT if _REPO.search(code) else folder)
        torch.manual_seed(0)
        try:
            exec(compile(code, name, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{name} fails as written:\n{code}") from exc
        finally:
            # a snippet that made a world of one (strategy="ddp" outside a launcher) leaves it to the next one in a
            # reader's fresh process, not in this one: nbtrainer.launch refuses to fork beside a live group
            destroy_process_group()
        ran += 1
    return ran


def _page_test(page: Path) -> Any:
    @pytest.mark.slow
    def test(tmp_path: Any, monkeypatch: Any) -> None:
        monkeypatch.setattr(sys, "path", list(sys.path))  # a snippet's sys.path.insert(0, "examples") stays there
        run_page(page, tmp_path, monkeypatch)

    test.__doc__ = f"The Python snippets of {page.relative_to(ROOT)} run as written."
    return test


for _page in PAGES:
    if snippets(_page):
        _slug = re.sub(r"\W+", "_", str(_page.relative_to(ROOT)).removesuffix(".md")).lower()
        globals()[f"test_snippets_of_{_slug}"] = _page_test(_page)


def test_the_marks_are_few_and_said_on_the_page() -> None:
    """A skipped snippet is rare and explained: every GPU-only snippet's page tells the reader it is skipped."""
    total = gpu = 0
    for page in PAGES:
        for code in snippets(page):
            total += 1
            if _GPU.match(code.splitlines()[0] if code.strip() else ""):
                gpu += 1
                assert "skipped" in code.splitlines()[0], f"{page.name}: say in the mark that it is skipped on a CPU"
    assert total >= 25 and gpu <= 3, (total, gpu)
