"""Colours for the panel's HTML, from JupyterLab's CSS variables (with fallbacks for other front ends).

Text never uses a fixed grey: it takes the theme's font colours, so the panel is legible in JupyterLab
light and dark, Notebook 7 and Voila. Status badges carry their own background, so white text on them
reads in every theme. Chart colours come from ``nbtrainer.plotting.PALETTE`` (mid-tones).
"""

from __future__ import annotations

__all__ = ["BORDER", "ERROR", "FG", "FG2", "STATUS_COLORS", "WARN", "card_style"]

FG = "var(--jp-ui-font-color1, #1f2328)"
FG2 = "var(--jp-ui-font-color2, #59636e)"
BORDER = "var(--jp-border-color2, #d1d9e0)"
ERROR = "var(--jp-error-color1, #cf222e)"
WARN = "var(--jp-warn-color1, #9a6700)"

#: badge backgrounds (white text on each has a contrast ratio of at least 4.5)
STATUS_COLORS = {
    "idle": "#59636e",
    "starting": "#1a7f37",
    "running": "#1a7f37",
    "pausing": "#9a6700",
    "paused": "#9a6700",
    "stopping": "#9a6700",
    "finished": "#0969da",
    "stopped": "#6e40c9",
    "interrupted": "#6e40c9",
    "failed": "#cf222e",
}


def card_style() -> str:
    """The inline style of a stat card: same height, aligned on one baseline, themed border."""
    return (
        f"display:flex;flex-direction:column;justify-content:flex-start;min-width:150px;box-sizing:border-box;"
        f"height:58px;margin:0 6px 4px 0;padding:4px 8px;border:1px solid {BORDER};border-radius:4px;color:{FG}"
    )
