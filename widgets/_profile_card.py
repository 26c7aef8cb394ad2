"""``ProfileCard``: a widget showing what ``nbtrainer.profile_model`` measured.

Built only from ``ModelProfile.to_dict()`` (or that dict itself), read defensively: a field the
profile did not measure is left out, never an error.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from nbtrainer import ModelProfile, format_bytes, format_count, format_duration

from ._fallback import html_view
from ._theme import FG, WARN

__all__ = ["ProfileCard", "profile_html"]

_CELL = "padding:1px 8px;text-align:left"


def _count(n: Any, unit: str = "") -> str:
    return format_count(n, unit) if isinstance(n, (int, float)) else "n/a"


def _bytes(n: Any) -> str:
    return format_bytes(n) if isinstance(n, (int, float)) else "n/a"


def _ms(ms: Any) -> str:
    return format_duration(ms / 1e3) if isinstance(ms, (int, float)) else "n/a"


def _table(header: list[str], body: list[list[str]], css: str) -> str:
    head = "".join(f"<th style='{_CELL}'>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table class='{css}' style='border-collapse:collapse;margin:2px 0 6px'><tr>{head}</tr>{rows}</table>"


def _combos(data: Any) -> list[tuple[str, str, dict[str, Any]]]:
    if not isinstance(data, dict):
        return []
    return [
        (d, p, e) for d, per in data.items() if isinstance(per, dict) for p, e in per.items() if isinstance(e, dict)
    ]


def profile_html(data: dict[str, Any]) -> str:
    """The card's HTML from a ``ModelProfile.to_dict()`` dict."""
    esc = html.escape
    name = data.get("model_name", "model")
    parts = [f"<div><b>{esc(str(name))}</b> · profile at batch size {esc(str(data.get('batch_size', '?')))}</div>"]
    size = data.get("size") or {}
    summary = [["parameters", f"{_count(data.get('params'))} ({_count(data.get('trainable_params'))} trainable)"]]
    if isinstance(data.get("size_mb"), (int, float)):
        summary.append(["size in memory", _bytes(data["size_mb"] * 2**20)])
    if "serialized_bytes" in size:
        summary.append(["checkpoint size", _bytes(size["serialized_bytes"])])
    compute = data.get("compute") or {}
    counters = compute.get("counters") or {}
    if data.get("macs") is not None:
        summary.append(["MACs / sample (fwd)", f"{_count(data['macs'], 'MACs')} [{counters.get('macs', '?')}]"])
    if data.get("flops") is not None:
        summary.append(["FLOPs / sample (fwd)", f"{_count(data['flops'], 'FLOPs')} [{counters.get('flops', '?')}]"])
    fb = ((compute.get("flop_counter_flops") or {}).get("forward_backward") or {}).get("per_sample")
    if fb is not None:
        summary.append(["FLOPs / sample (fwd+bwd)", _count(fb, "FLOPs")])
    parts.append(_table(["", ""], summary, "nbt-profile-summary"))
    latency = _combos(data.get("latency_ms"))
    if latency:
        body = []
        for dev, prec, e in latency:
            if not e.get("supported", True):
                body.append([dev, prec, f"not run: {e.get('reason', '')}", "", ""])
            else:
                body.append([dev, prec, _ms(e.get("median")), _ms(e.get("p90")), f"{_count(e.get('throughput'))}/s"])
        parts.append(
            "<b>Inference latency per precision</b>"
            + _table(["device", "precision", "median", "p90", "samples"], body, "nbt-profile-latency")
        )
    memory = _combos(data.get("memory"))
    if memory:
        header = ["training step"] + [f"{d} {p}" for d, p, _ in memory]
        body = []
        for key in ModelProfile.MEMORY_ROWS:
            vals = [e.get(key) if e.get("supported", True) else None for _, _, e in memory]
            if any(v is not None for v in vals):
                body.append([key.replace("_", " ")] + [_bytes(v) if v is not None else "" for v in vals])
        skipped = [f"{d} {p}: {e.get('reason', '')}" for d, p, e in memory if not e.get("supported", True)]
        parts.append("<b>Training memory breakdown</b>" + _table(header, body, "nbt-profile-memory"))
        parts += [f"<div style='color:{WARN}'>{esc(s)}</div>" for s in skipped]
    return f"<div style='font-family:sans-serif;font-size:12px;color:{FG}'>" + "".join(parts) + "</div>"


class ProfileCard(W.VBox):
    """A card with params, size, MACs, FLOPs, latency per precision and the training-memory breakdown.

    Args:
        profile: a ``ModelProfile`` (from ``nbtrainer.profile_model``) or its ``to_dict()``.

    Example:
        >>> import torch
        >>> from nbtrainer import profile_model
        >>> card = ProfileCard(profile_model(torch.nn.Linear(8, 2), torch.randn(4, 8), n_iters=10))
        >>> "nbt-profile-card" in card._dom_classes
        True
    """

    def __init__(self, profile: Any, **kwargs: Any) -> None:
        data = profile.to_dict() if hasattr(profile, "to_dict") else dict(profile)
        self.profile = profile
        self.data = data
        self.html = W.HTML(profile_html(data))
        super().__init__([self.html], **kwargs)
        self.add_class("nbt-profile-card")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:  # with text/plain and text/html where widgets cannot render
        return html_view(self, "model profile", self.html)._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:  # a VBox's own repr is its children's HTML source
        return f"ProfileCard({self.data.get('model_name', '?')}, batch size {self.data.get('batch_size', '?')})"

    def _ipython_display_(self) -> None:  # ipywidgets 7's own would publish the widget view alone
        html_view(self, "model profile", self.html)._ipython_display_()
