"""nbtrainer.widgets: the notebook UI layer (ipywidgets + bqplot).

``TrainerWidget`` trains a model in a background thread behind a panel of live charts, progress and
controls; ``ProfileCard`` shows a ``profile_model`` result; ``CompareWidget`` shows a
``compare_strategies`` result (table and bar charts, or live with ``CompareWidget.run``);
``LRFinderView`` shows an ``LRFinderResult`` whose curve can be clicked to pick the learning rate. The
first three are re-exported lazily as ``nbtrainer.TrainerWidget`` / ``nbtrainer.ProfileCard`` /
``nbtrainer.CompareWidget``. This layer uses only the core's public API and event stream.

Stable CSS classes (``add_class``), for browser tests and custom styling:

===========================  ================================================================
``nbt-panel``                the root VBox (``TrainerWidget.panel``)
``nbt-header``               header row: ``nbt-title`` (run name, model, device, params) and ``nbt-status``
``nbt-status``               status: a badge (``nbt-status-badge`` and ``nbt-status-<status>``: idle,
                             running, pausing, paused, stopping, finished, stopped, interrupted,
                             failed) and a detail (``nbt-status-detail``) beside it; ``nbt-status-note``
                             where a busy kernel cannot take clicks (what works instead)
``nbt-controls``             controls: ``nbt-precision``, ``nbt-precision-note``, ``nbt-accum``,
                             ``nbt-lr`` (log slider, two decades around the current LR),
                             ``nbt-lr-exact`` (exact entry), ``nbt-lr-target`` and ``nbt-lr-readout`` (several
                             named optimizers: which one the LR control sets, each one's LR), ``nbt-epochs``,
                             ``nbt-scheduler``,
                             ``nbt-clip``, ``nbt-checkpointing``, and the collapsible ``nbt-savers``
                             (memory savers chosen before Start: optimizer, quantize, LoRA, offload;
                             ``nbt-savers-note`` says what cannot run here and why), and the collapsible
                             ``nbt-plan-view`` (memory plan: ``nbt-plan-budget``, ``nbt-plan-button``,
                             ``nbt-plan-note``, rows ``nbt-plan-row`` / ``nbt-plan-best`` over ``nbt-plan-bar``s;
                             a click sets the controls and savers)
``nbt-buttons``              ``nbt-start``, ``nbt-pause``, ``nbt-stop``, ``nbt-save`` (+ ``nbt-save-path``),
                             ``nbt-profile``, ``nbt-lrfind``
``nbt-progress``             ``nbt-progress-epoch``, ``nbt-progress-step``, ``nbt-progress-info``
``nbt-stats``                stat cards (each ``nbt-stat``): ``nbt-stat-best``, ``nbt-stat-throughput``,
                             ``nbt-stat-steptime`` (with the data share), ``nbt-stat-memory``
``nbt-health``               the health card (``nbtrainer.Health``, added unless the trainer has one):
                             ``nbt-health-lights`` (each ``nbt-health-light`` and ``nbt-health-ok|warning|problem``),
                             ``nbt-health-advice``, buttons ``nbt-health-apply`` (also ``nbt-health-apply-lr``: the
                             advised action, e.g. restore and apply LR), ``nbt-health-rollback``,
                             ``nbt-health-skip``, and the chart ``nbt-health-chart`` (block gradient norms)
``nbt-compare``              over the charts: ``nbt-compare-runs`` (earlier runs of the session's and the
                             trainer's store, drawn as muted lines on the loss and metric charts) and
                             ``nbt-compare-align`` (by step or by epoch)
``nbt-charts``               bqplot figures ``nbt-chart-loss`` (y scale menu ``nbt-loss-scale``),
                             ``nbt-chart-lr``, ``nbt-chart-metrics`` (bounded metrics, 0-1, zoomed to
                             clustered values; menu ``nbt-metrics-scale``),
                             ``nbt-chart-other`` (one other metric, menu ``nbt-other-metric``),
                             ``nbt-chart-memory``; each has an HTML legend ``nbt-legend`` above it
``nbt-samples``              the samples section (``nbtrainer.Samples``): slider ``nbt-samples-slider`` over the
                             sampled steps (the step-0 baseline first), ``nbt-samples-step``, ``nbt-samples-compare``
                             (baseline / previous / nothing), panes ``nbt-samples-left`` / ``nbt-samples-right``
                             (text differences ``nbt-diff-del`` / ``nbt-diff-ins``), ``nbt-samples-error``; a
                             click on the loss chart's points picks the nearest sample
``nbt-errors``               the errors section (``TrainerWidget(interpret=True)``): ``nbt-errors-summary``, the
                             bqplot heatmap ``nbt-errors-matrix`` (click a cell), ``nbt-errors-examples``,
                             ``nbt-errors-table``, the top-losses ``nbt-errors-gallery`` (items ``nbt-gallery-item``)
``nbt-data``                 the data section (``_data_view``): before Start the data check's report
                             ``nbt-data-report`` (lights ``nbt-data-light`` / ``nbt-data-ok|warning|problem``,
                             findings ``nbt-data-problem``) and a batch ``nbt-data-batch``; during a run the data
                             map ``nbt-data-map`` (bqplot scatter: click a point, or ``nbt-data-map-mode`` lasso),
                             ``nbt-data-map-note``, and the picked items in the cleaner ``nbt-data-selection``
``nbt-cleaner``              keep / drop / relabel per item (``_cleaner``; in the data and errors sections):
                             ``nbt-cleaner-item`` (and ``nbt-cleaner-item-<index>``), ``nbt-cleaner-choice``,
                             ``nbt-cleaner-label``, ``nbt-cleaner-summary``; errors: ``nbt-errors-cleaner``
``nbt-section``              a collapsible area (the errors section is made only with ``interpret``: each widget
                             is a comm the front end builds): header with ``nbt-section-title``,
                             ``nbt-collapse`` (and ``nbt-close``), body: ``nbt-epochs-area`` (the newest rows of
                             the live table ``nbt-epoch-table`` in ``nbt-epoch-table-box``, ``nbt-epoch-note``
                             saying how many are hidden, ``nbt-epoch-all`` to show them),
                             ``nbt-profile-area`` (a ``nbt-profile-card``), ``nbt-lrfinder-area``
                             (a ``nbt-lrfinder``), ``nbt-summary-area`` (``nbt-summary-live``;
                             ``nbt-summary-previous`` once a new run has started)
``nbt-lrfinder``             ``LRFinderView``: bqplot figure ``nbt-lrfinder-chart`` (click a point of the
                             curve) under its legend ``nbt-lrfinder-legend`` (the rules), buttons
                             ``nbt-lrfinder-use`` (one per suggestion),
                             ``nbt-lrfinder-restore``, the chosen LR ``nbt-lrfinder-choice``, a warning
                             ``nbt-lrfinder-warning`` when the model was already trained
``nbt-messages``             the last messages (``nbt-message-info|warning|error``; tracebacks in
                             ``nbt-traceback``) and ``nbt-messages-all`` (show the whole log, in the scroll box
                             ``nbt-messages-scroll``)
``nbt-summary-static``       the plain-HTML summary left in the output below the panel for front ends
                             without widgets (hidden where the panel renders); inside it
                             ``nbt-summary``, ``nbt-summary-table``, SVG charts ``nbt-summary-chart``
``nbt-launch``               ``LaunchView`` (``nbtrainer.launch(..., view=True)``): ``nbt-launch-status``,
                             ``nbt-launch-epoch``, ``nbt-launch-step``, ``nbt-launch-info``, ``nbt-launch-stop``,
                             ``nbt-launch-chart``, ``nbt-launch-epochs``
``nbt-compare``              ``CompareWidget``: ``nbt-compare-status``, the HTML table ``nbt-compare-table``,
                             bar charts (in ``nbt-compare-charts``) ``nbt-compare-chart-time``,
                             ``nbt-compare-chart-memory``, ``nbt-compare-chart-metric``
===========================  ================================================================

Colours come from JupyterLab's CSS variables, through the stylesheet each view carries (``nbt-style``; never a
colour trait: ipywidgets 7 refuses a CSS variable there), legible in light and dark themes; the ``text/html`` a
view leaves for front ends without widgets is a ``nbt-fallback`` block; numbers are formatted by
``nbtrainer.format_*``; plotting helpers (decimation, smoothing, metric classification, SVG charts) are the
core's public ``nbtrainer.plotting``.

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

from nbtrainer.plotting import MinMaxStream, decimate, minmax_indices, summary_html

from ._compare_view import CompareWidget
from ._launch_view import LaunchView
from ._lr_finder import LRFinderView
from ._panel import TrainerWidget
from ._profile_card import ProfileCard
from ._runs_view import RunsWidget, TuneView

__all__ = [
    "CompareWidget",
    "LRFinderView",
    "LaunchView",
    "MinMaxStream",
    "ProfileCard",
    "RunsWidget",
    "TrainerWidget",
    "TuneView",
    "decimate",
    "minmax_indices",
    "summary_html",
]
