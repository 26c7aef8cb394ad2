"""Helpers for drawing runs, shared by the report (``History.plot``) and the notebook panel.

Public and cheap to import (NumPy only, no torch):

* :func:`decimate`, :func:`minmax_indices`, :class:`MinMaxStream`: keep at most ``max_points`` points of a
  long series while every spike survives (each bucket keeps its min and max);
* :class:`Ema`: debiased exponential smoothing (TensorBoard style);
* :func:`classify_metrics`, :func:`higher_is_better`, :func:`use_log_scale`, ``METRIC_SKIP``: which log
  keys are bounded metrics (accuracy-like, 0-1), which are other metrics, and which are bookkeeping;
* :func:`svg_chart`, :func:`epoch_table_html`, :func:`summary_html`, ``PALETTE``: theme-aware static charts
  and tables (text in ``currentColor``), and :class:`HistoryPlot`;
* :func:`change_label`: how an LR or accumulation change reads (report, panel chart, panel messages);
* :func:`png_img`, :func:`data_uri`, :func:`png_width`, :func:`encode_png`: a picture (a sample, an input) in HTML.

Example:
    >>> import numpy as np
    >>> from nbtrainer.plotting import decimate
    >>> x = np.arange(100_000.0); y = np.zeros_like(x); y[4242] = 9.0
    >>> dx, dy = decimate(x, y, 200)
    >>> len(dx) <= 200, 9.0 in dy
    (True, True)
"""

from nbtrainer._report._decimate import Ema, MinMaxStream, decimate, minmax_indices
from nbtrainer._report._html import (
    METRIC_SKIP,
    HistoryPlot,
    change_label,
    classify_metrics,
    epoch_columns,
    epoch_table_html,
    format_cell,
    higher_is_better,
    history_charts,
    summary_html,
    use_log_scale,
)
from nbtrainer._report._png import data_uri, encode_png, png_img, png_width
from nbtrainer._report._svg import PALETTE, log_ticks, nice_ticks, svg_chart

__all__ = [
    "METRIC_SKIP",
    "PALETTE",
    "Ema",
    "HistoryPlot",
    "MinMaxStream",
    "change_label",
    "classify_metrics",
    "data_uri",
    "decimate",
    "encode_png",
    "epoch_columns",
    "epoch_table_html",
    "format_cell",
    "higher_is_better",
    "history_charts",
    "log_ticks",
    "minmax_indices",
    "nice_ticks",
    "png_img",
    "png_width",
    "summary_html",
    "svg_chart",
    "use_log_scale",
]
