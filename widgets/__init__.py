"""nbtrainer.widgets: the notebook UI layer (ipywidgets + bqplot).

This folder lives at the top of the repository as ``widgets/`` but is installed as
``nbtrainer.widgets`` (setuptools ``package-dir``). Importing it as a top-level ``widgets``
package would shadow other packages and break relative imports, so it is refused.
"""

if __name__ != "nbtrainer.widgets":  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        f"nbtrainer's widget layer was imported as {__name__!r}. Import it as 'nbtrainer.widgets' "
        "(install the project with `pip install -e .` and do not put the repository's top folder "
        "ahead of site-packages on sys.path)."
    )

__all__: list[str] = []
