"""Presentation of a :class:`~nbtrainer._profile.ModelProfile`: a long pandas table, HTML and text."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from nbtrainer._profile import ModelProfile

__all__ = ["fmt_bytes", "fmt_count", "fmt_ms", "rows", "to_frame", "to_html", "to_text"]

_MEMORY_ROWS = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "total",
    "activations_checkpointed",
    "recompute_peak",
    "total_checkpointed",
    "cuda_peak",
    "cuda_peak_checkpointed",
)
_LATENCY_ROWS = ("median", "p90", "mean", "min", "throughput")


def fmt_count(n: float | None, unit: str = "") -> str:
    """``1234567`` -> ``"1.23 M"``."""
    if n is None:
        return "n/a"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {prefix}{unit}"
    return f"{n:.4g} {unit}".rstrip()


def fmt_bytes(n: float | None) -> str:
    """Bytes in B/KiB/MiB/GiB."""
    if n is None:
        return "n/a"
    for scale, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}"
    return f"{n:.0f} B"


def fmt_ms(ms: float) -> str:
    """Milliseconds, in µs below 1 ms so small models keep their digits."""
    return f"{ms * 1000:.1f} µs" if ms < 1 else f"{ms:.2f} ms"


def rows(prof: ModelProfile) -> list[dict[str, Any]]:
    """Long-format records ``{section, device, precision, metric, value, unit, source}``."""
    out: list[dict[str, Any]] = []

    def add(
        section: str, metric: str, value: Any, unit: str = "", source: str = "", device: str = "", precision: str = ""
    ) -> None:
        out.append(
            {
                "section": section,
                "device": device,
                "precision": precision,
                "metric": metric,
                "value": value,
                "unit": unit,
                "source": source,
            }
        )

    add("model", "params", prof.params, "count")
    add("model", "trainable_params", prof.trainable_params, "count")
    add("model", "size_in_memory", prof.size["parameters_bytes"] + prof.size["buffers_bytes"], "bytes")
    for dtype, nbytes in prof.size["by_dtype"].items():
        add("model", f"size_{dtype}", nbytes, "bytes")
    add("model", "serialized_size", prof.size["serialized_bytes"], "bytes", "torch.save(state_dict)")
    if prof.compute:
        src = prof.compute["counters"]
        for per in ("per_sample", "per_batch"):
            add("compute", f"forward_macs_{per}", prof.compute["ptflops_macs"]["forward"][per], "MAC", src["macs"])
            for pass_, counts in prof.compute["flop_counter_flops"].items():
                add("compute", f"{pass_}_flops_{per}", counts[per], "FLOP", src["flops"])
    for section, data, keys in (("latency", prof.latency_ms, _LATENCY_ROWS), ("memory", prof.memory, _MEMORY_ROWS)):
        for device, per in data.items():
            for precision, entry in per.items():
                if not entry.get("supported", True):
                    add(section, "supported", False, "", entry["reason"], device, precision)
                    continue
                for key in keys:
                    if entry.get(key) is not None:
                        unit = "bytes" if section == "memory" else ("samples/s" if key == "throughput" else "ms")
                        add(section, key, entry[key], unit, _source(section, key, entry), device, precision)
    return out


def _source(section: str, key: str, entry: dict[str, Any]) -> str:
    if section == "latency":
        return f"{entry['n_iters']} iterations"
    if key.startswith(("activations", "recompute", "total")):
        return entry["method"]
    if key == "optimizer_state":
        return f"{entry['optimizer']}.state after one step"
    if key.startswith("cuda_peak"):
        return "torch.cuda.max_memory_allocated"
    return ""


def to_frame(prof: ModelProfile) -> Any:
    """:func:`rows` as a ``pandas.DataFrame``."""
    import pandas as pd

    return pd.DataFrame(rows(prof), columns=["section", "device", "precision", "metric", "value", "unit", "source"])


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in header)
    lines = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body
    )
    return f"<table style='border-collapse:collapse;margin:4px 0'><tr>{head}</tr>{lines}</table>"


def _combos(data: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(d, p, e) for d, per in data.items() for p, e in per.items()]


def to_html(prof: ModelProfile) -> str:
    """The notebook view: model summary, compute, latency and memory tables."""
    parts = [f"<div class='nbtrainer-profile'><b>{html.escape(prof.model_name)}</b> (batch size {prof.batch_size})"]
    summary = [
        ["parameters", f"{fmt_count(prof.params)} ({fmt_count(prof.trainable_params)} trainable)"],
        ["size in memory", fmt_bytes(prof.size_mb * 2**20)],
        ["serialized", fmt_bytes(prof.size["serialized_bytes"])],
    ]
    if prof.compute:
        c = prof.compute
        bwd = c["flop_counter_flops"]["forward_backward"]["per_sample"]
        summary += [
            ["MACs / sample (forward)", f"{fmt_count(prof.macs, 'MAC')}  [{c['counters']['macs']}]"],
            ["FLOPs / sample (forward)", f"{fmt_count(prof.flops, 'FLOP')}  [{c['counters']['flops']}]"],
            ["FLOPs / sample (fwd+bwd)", f"{fmt_count(bwd, 'FLOP')}  [FlopCounterMode]"],
        ]
    parts.append(_table(["", ""], summary))
    if prof.compute:
        parts.append(f"<div style='font-size:smaller'>{html.escape(prof.compute['convention'])}</div>")
    if prof.latency_ms:
        body = []
        for device, precision, e in _combos(prof.latency_ms):
            if not e.get("supported", True):
                body.append([device, precision, f"not run: {e['reason']}", "", "", "", ""])
                continue
            body.append(
                [
                    device,
                    precision,
                    *(fmt_ms(e[k]) for k in ("median", "p90", "mean", "min")),
                    f"{fmt_count(e['throughput'])} samples/s",
                ]
            )
        parts.append(
            "<b>Inference latency</b>"
            + _table(["device", "precision", "median", "p90", "mean", "min", "throughput"], body)
        )
    if prof.memory:
        combos = _combos(prof.memory)
        header = ["training step (one optimizer step)"] + [f"{d} {p}" for d, p, _ in combos]
        body = []
        for key in _MEMORY_ROWS:
            values = [e.get(key) if e.get("supported", True) else None for _, _, e in combos]
            if any(v is not None for v in values):
                body.append([key.replace("_", " ")] + [fmt_bytes(v) for v in values])
        optimizers = sorted({e["optimizer"] for _, _, e in combos if e.get("supported", True)})
        parts.append(f"<b>Training memory</b> (optimizer: {html.escape(', '.join(optimizers))})" + _table(header, body))
    return "".join(parts) + "</div>"


def to_text(prof: ModelProfile) -> str:
    """A short one-screen summary (the ``repr``)."""
    lines = [
        f"ModelProfile({prof.model_name}, batch_size={prof.batch_size}, params={fmt_count(prof.params)}, "
        f"trainable={fmt_count(prof.trainable_params)}, size={fmt_bytes(prof.size_mb * 2**20)}, "
        f"macs/sample={fmt_count(prof.macs)}, flops/sample={fmt_count(prof.flops)})"
    ]
    for device, precision, e in _combos(prof.latency_ms):
        if e.get("supported", True):
            lines.append(f"  latency {device} {precision}: median {fmt_ms(e['median'])}, p90 {fmt_ms(e['p90'])}")
    for device, precision, e in _combos(prof.memory):
        if e.get("supported", True):
            lines.append(f"  memory {device} {precision}: total {fmt_bytes(e['total'])} ({e['optimizer']})")
    return "\n".join(lines)
