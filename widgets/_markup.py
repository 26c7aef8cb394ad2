"""The core's messages as the panel shows them: plain text whose `code spans` (Markdown's backticks, as in
"at most 41% dead (`10`)") become ``<code>`` in HTML, and plain text (no backticks) where HTML cannot go (a
``title`` tooltip). Every message, light, advice, status detail and section detail of the panel goes through here,
so no Markdown is left in the panel's HTML.
"""

from __future__ import annotations

import html
import re

__all__ = ["CODE_STYLE", "plain_text", "text_html"]

_SPAN = re.compile(r"`([^`\n]+)`")
# the theme's text, a faint box: legible in light and dark (no colour of its own)
CODE_STYLE = "font-family:var(--jp-code-font-family, monospace);font-size:0.95em;padding:0 2px;border-radius:3px;" + (
    "background:rgba(127,127,127,0.15)"
)


def text_html(text: str) -> str:
    """``text`` escaped for HTML, each `code span` a ``<code>``.

    Example:
        >>> text_html("at most 41% dead (`10`) <b>")
        "at most 41% dead (<code class='nbt-code' style='...'>10</code>) &lt;b&gt;"
    """
    out, at = [], 0
    for m in _SPAN.finditer(text):
        out.append(html.escape(text[at : m.start()]))
        out.append(f"<code class='nbt-code' style='{CODE_STYLE}'>{html.escape(m.group(1))}</code>")
        at = m.end()
    out.append(html.escape(text[at:]))
    return "".join(out)


def plain_text(text: str) -> str:
    """``text`` without its code spans' backticks (for a ``title`` tooltip or a ``text/plain`` line).

    Example:
        >>> plain_text("at most 41% dead (`10`)")
        'at most 41% dead (10)'
    """
    return _SPAN.sub(r"\1", text)
