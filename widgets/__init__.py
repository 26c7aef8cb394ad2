"""nbtrainer.widgets: the notebook UI layer (ipywidgets + bqplot).

``TrainerWidget`` trains a model in a background thread behind a panel of live charts, progress and
controls; ``ProfileCard`` shows a ``profile_model`` result; ``CompareWidget`` shows a
``compare_strategies`` result (table and bar charts, or live with ``CompareWidget.run``);
``LRFinderView`` shows an ``LRFinderResult`` whose curve can be clicked to pick the learning rate. The
first three are re-exported lazily as ``nbtrainer.TrainerWidget`` / ``nbtrainer.ProfileCard`` /
``nbtrainer.CompareWidget``. This layer uses only the core's public API and event stream.

Stable CSS classes (``add_class``), for browser tests and custom styling:

==========================  =================================================================
``nbt-panel``               the root VBox (``TrainerWidget.panel``)
``nbt-header``              header row: ``nbt-title`` (model, device, params) and ``nbt-status``
``nbt-status``              status badge; its inner span also has ``nbt-status-<status>``
``nbt-controls``            controls: ``nbt-precision``, ``nbt-precision-note``, ``nbt-accum``,
                            ``nbt-lr``, ``nbt-epochs``, ``nbt-scheduler``, ``nbt-clip``,
                            ``nbt-checkpointing``
``nbt-buttons``             ``nbt-start``, ``nbt-pause``, ``nbt-stop``, ``nbt-save`` (+ ``nbt-save-path``),
                            ``nbt-profile``, ``nbt-lrfind``
``nbt-progress``            ``nbt-progress-epoch``, ``nbt-progress-step``, ``nbt-progress-info``
``nbt-charts``              bqplot figures ``nbt-chart-loss``, ``nbt-chart-lr``, ``nbt-chart-metrics``
``nbt-stats``               stat cards (each ``nbt-stat``): best validation, peak memory, throughput, step time
``nbt-profile-area``        holds a ``nbt-profile-card`` after Profile
``nbt-lrfinder-area``       holds a ``nbt-lrfinder`` after LR finder
``nbt-lrfinder``            ``LRFinderView``: bqplot figure ``nbt-lrfinder-chart`` (click a point of the
                            curve), buttons ``nbt-lrfinder-use`` (one per suggestion), the chosen LR
                            ``nbt-lrfinder-choice``
``nbt-messages``            messages (``nbt-message-info|warning|error``; tracebacks in ``nbt-traceback``)
``nbt-summary``             the static end-of-run HTML summary (a plain output below the panel;
                            ``nbt-summary-table``, SVG charts ``nbt-summary-chart``)
``nbt-compare``             ``CompareWidget``: ``nbt-compare-status``, the HTML table ``nbt-compare-table``,
                            bar charts (in ``nbt-compare-charts``) ``nbt-compare-chart-time``,
                            ``nbt-compare-chart-memory``, ``nbt-compare-chart-metric``
==========================  =================================================================

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

from ._compare_view import CompareWidget
from ._decimate import MinMaxStream, decimate, minmax_indices
from ._lr_finder import LRFinderView
from ._panel import TrainerWidget
from ._profile_card import ProfileCard
from ._summary import summary_html

__all__ = [
    "CompareWidget",
    "LRFinderView",
    "MinMaxStream",
    "ProfileCard",
    "TrainerWidget",
    "decimate",
    "minmax_indices",
    "summary_html",
]
