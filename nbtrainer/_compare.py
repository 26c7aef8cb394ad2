"""Measure training strategies on your own model: one call, one table.

``compare_strategies`` trains a fresh copy of the model once per strategy (mixed precision, gradient
accumulation, activation checkpointing, a lighter optimizer, freezing, compile... any Trainer option),
each from the same initial weights and over the same data order, and reports per strategy:

* step time: the median time of an optimizer step after ``warmup`` steps (CUDA: synchronized);
* samples/s: the median over those steps of samples / step time;
* peak memory: on CUDA the peak allocated bytes during the fit (``torch.cuda.max_memory_allocated``);
  elsewhere the *measured* bytes of parameters + buffers + gradients + optimizer state + inputs +
  activations saved for backward of one step (``nbtrainer._profile_memory``, saved-tensor hooks): not
  an allocator peak, and labelled so;
* the final training loss (mean over the last 10% of optimizer steps) and a validation metric;
* ratios to the baseline row (the first strategy unless ``baseline=`` says otherwise).

A strategy that fails (out of memory, a precision the device can't run, a bad option) gets a row with
the reason; the others still run.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import html
import math
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["PRESETS", "StrategyComparison", "compare_strategies", "resolve_strategies"]

#: Strategy presets by name (``compare_strategies(strategies=["fp32", "bf16", "ckpt", "accum4"])``).
PRESETS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "fp16": {"precision": "fp16-mixed"},
    "bf16": {"precision": "bf16-mixed"},
    "ckpt": {"activation_checkpointing": True},
    "accum4": {"grad_accum_steps": 4},
    "adafactor": {"optimizer": "adafactor"},
    "all": {
        "precision": "bf16-mixed",
        "activation_checkpointing": True,
        "grad_accum_steps": 4,
        "optimizer": "adafactor",
    },
}

_COMPARE_KEYS = {"split_batches"}  # strategy keys for the comparison itself, not for the Trainer


def resolve_strategies(strategies: Mapping[str, Mapping[str, Any]] | Sequence[str] | None) -> dict[str, dict]:
    """``{name: trainer options}`` from a dict, or from preset names (``"accumN"`` for any N).

    Example:
        >>> resolve_strategies(["fp32", "accum8"])
        {'fp32': {}, 'accum8': {'grad_accum_steps': 8}}
    """
    if strategies is None:
        strategies = ["fp32", "bf16", "ckpt", "accum4", "adafactor"]
    if isinstance(strategies, str):
        strategies = [s for s in re.split(r"[,\s]+", strategies) if s]
    if isinstance(strategies, Mapping):
        out = {}
        for name, options in strategies.items():
            if not isinstance(options, Mapping):
                raise TypeError(f"strategy {name!r}: options must be a dict of Trainer options, got {options!r}")
            out[str(name)] = dict(options)
    else:
        out = {}
        for name in strategies:
            m = re.fullmatch(r"accum(\d+)", str(name))
            if name in PRESETS:
                out[name] = dict(PRESETS[name])
            elif m:
                out[name] = {"grad_accum_steps": int(m.group(1))}
            else:
                raise ValueError(
                    f"Unknown strategy preset {name!r}: use one of {sorted(PRESETS)} or 'accumN', "
                    "or pass a dict {name: {trainer options}}."
                )
    if not out:
        raise ValueError("No strategies to compare.")
    return out


# =============================================================================================
# data: same order for every strategy, batches split for accumulation
# =============================================================================================


def _split(obj: Any, k: int, size: int) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        if obj.dim() > 0 and obj.shape[0] == size:
            return list(obj.tensor_split(k))
        return [obj] * k
    if isinstance(obj, Mapping):
        parts = {key: _split(value, k, size) for key, value in obj.items()}
        return [type(obj)((key, parts[key][i]) for key in obj) for i in range(k)]
    if isinstance(obj, (tuple, list)):
        parts = [_split(value, k, size) for value in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return [type(obj)(*(p[i] for p in parts)) for i in range(k)]
        return [type(obj)(p[i] for p in parts) for i in range(k)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # dataclass batches (nbtrainer._batch)
        fields = {f.name: _split(getattr(obj, f.name), k, size) for f in dataclasses.fields(obj) if f.init}
        return [dataclasses.replace(obj, **{name: p[i] for name, p in fields.items()}) for i in range(k)]
    return [obj] * k


def split_batch(batch: Any, k: int) -> list[Any]:
    """``batch`` cut into ``k`` micro-batches along the first dimension (fewer if it has fewer rows).

    Example:
        >>> [tuple(t.shape[0] for t in part) for part in split_batch((torch.zeros(10, 3), torch.zeros(10)), 4)]
        [(3, 3), (3, 3), (2, 2), (2, 2)]
    """
    from nbtrainer._batch import _first_tensor

    first = _first_tensor(batch)
    if k <= 1 or first is None or first.dim() == 0:
        return [batch]
    size = int(first.shape[0])
    return _split(batch, min(k, size), size)


class _SplitLoader:
    """Each batch of ``loader`` as ``k`` micro-batches (same samples per optimizer step as the baseline)."""

    def __init__(self, loader: Iterable, k: int) -> None:
        self.loader, self.k = loader, k

    @property
    def sampler(self) -> Any:  # the Trainer seeds / saves the inner loader's shuffling through this
        return getattr(self.loader, "sampler", None)

    @property
    def generator(self) -> Any:  # a DataLoader draws its workers' base seed from this one
        return getattr(self.loader, "generator", None)

    @generator.setter
    def generator(self, value: Any) -> None:
        self.loader.generator = value

    def __len__(self) -> int:
        return len(self.loader) * self.k  # type: ignore[arg-type]  (TypeError: no len, like the loader)

    def __iter__(self):
        for batch in self.loader:
            yield from split_batch(batch, self.k)


class _DataOrder:
    """Puts every loader's shuffling generators back as they were, before each strategy."""

    def __init__(self, loaders: Iterable[Any]) -> None:
        self.saved: list[tuple[Any, str, Any, Any]] = []
        for loader in loaders:
            if loader is None:
                continue
            for owner in (getattr(loader, "sampler", None), loader):
                if owner is None or not hasattr(owner, "generator"):
                    continue
                gen = owner.generator
                state = gen.get_state() if isinstance(gen, torch.Generator) else None
                self.saved.append((owner, "generator", gen, state))

    def reset(self) -> None:
        for owner, attr, gen, state in self.saved:
            try:
                setattr(owner, attr, gen)  # drop a generator a Trainer installed
            except (AttributeError, ValueError):  # pragma: no cover - read-only attribute
                pass
            if state is not None:
                gen.set_state(state)


# =============================================================================================
# measuring one strategy
# =============================================================================================


class _StepTimer:
    """Callback: wall time and samples of every optimizer step (CUDA: synchronized at each step)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.times: list[float] = []
        self.samples: list[int] = []
        self._mark = 0.0
        self._samples = 0

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def on_epoch_start(self, trainer: Any, epoch: int) -> None:
        self._mark, self._samples = self._now(), trainer._state.samples

    def on_optimizer_step(self, trainer: Any, step: int, skipped: bool) -> None:
        now = self._now()
        samples = trainer._state.samples
        self.times.append(now - self._mark)
        self.samples.append(samples - self._samples)
        self._mark, self._samples = now, samples


def _accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).float().mean()


def _measure_cpu_memory(trainer: Any, batch: Any, ckpt: Any) -> tuple[int, dict[str, Any]]:
    """Measured training-memory bytes of one step of ``trainer``'s setup on ``batch`` (a private copy)."""
    from nbtrainer._batch import move_to_device
    from nbtrainer._checkpointing import strip_activation_checkpointing
    from nbtrainer._profile_memory import measure_training_memory, optimizer_factory
    from nbtrainer._strategies import has_own_checkpointing
    from nbtrainer._strategy import unwrap_model

    base = unwrap_model(trainer.model)
    work = copy.deepcopy(base).to(trainer.device)
    own = bool(ckpt) and has_own_checkpointing(base)
    note = ""
    if ckpt is True and not own:
        strip_activation_checkpointing(work)  # measure_training_memory checkpoints the same blocks itself
    elif ckpt:
        note = "checkpointing applied; recompute peak of backward not included"
    batch = move_to_device(batch, trainer.device)
    args, kwargs, targets = trainer.batch_spec.split(batch)
    if args and kwargs:
        raise ValueError("memory measurement needs positional or keyword inputs, not both")
    inputs = kwargs if kwargs else (args if len(args) != 1 else args[0])
    from nbtrainer._batch import batch_size_of

    bs = batch_size_of(targets, batch)
    with torch.random.fork_rng(devices=[trainer.device] if trainer.device.type == "cuda" else []):
        mem = measure_training_memory(
            work,
            inputs,
            device=trainer.device,
            precision=trainer.precision,
            batch_size=bs,
            make_optimizer=optimizer_factory(base, trainer.optimizer),
            criterion=trainer.criterion,
            targets=targets,
            checkpointing=ckpt is True and not own,
        )
    del work
    use_ckpt = ckpt is True and not own and mem["total_checkpointed"] is not None
    total = mem["total_checkpointed"] if use_ckpt else mem["total"]
    detail = {k: mem[k] for k in ("parameters", "buffers", "gradients", "optimizer_state", "inputs")}
    # checkpointed: what the blocks keep + the largest block's activations re-materialised in backward
    detail["activations"] = (
        mem["activations_checkpointed"] + (mem["recompute_peak"] or 0) if use_ckpt else mem["activations"]
    )
    if note:
        detail["note"] = note
    return int(total), detail


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower():
        text = "out of memory: " + text
    return text if len(text) <= 300 else text[:297] + "..."


def _final_loss(history: Any) -> float | None:
    losses = [v for v in history.steps.get("loss", []) if v is not None]
    if losses:
        tail = losses[-max(1, math.ceil(len(losses) / 10)) :]
        return float(sum(tail) / len(tail))
    if history.epochs:
        return history.epochs[-1].get("loss")
    return None


# =============================================================================================
# the table
# =============================================================================================


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.3g} ms"


def _pct(r: float | None) -> str:
    return "" if r is None else f" ({r:.0%})"


@dataclass
class StrategyComparison:
    """The result of :func:`compare_strategies`: one row per strategy.

    Attributes:
        rows: dicts with ``name, status ("ok" | "failed"), reason, options, steps, step_time_s,
            samples_per_s, train_time_s, peak_memory_bytes, memory_detail, final_loss, metric`` and the ratios
            ``step_time_ratio, samples_per_s_ratio, peak_memory_ratio`` (baseline = 1.0).
        baseline: name of the baseline row.
        metric: the validation metric's key (e.g. ``"val_acc"``).
        memory_kind: what ``peak_memory_bytes`` is (CUDA peak allocated, or measured bytes).
        environment: device, torch version, threads.
    """

    rows: list[dict[str, Any]]
    baseline: str
    metric: str | None
    memory_kind: str
    environment: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> dict[str, Any]:
        for row in self.rows:
            if row["name"] == name:
                return row
        raise KeyError(f"No strategy {name!r}; have {[r['name'] for r in self.rows]}")

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def names(self) -> list[str]:
        return [r["name"] for r in self.rows]

    def to_pandas(self):
        """One row per strategy (index: name); numbers as numbers, ratios as fractions of the baseline."""
        import pandas as pd

        cols = [
            "status",
            "step_time_s",
            "step_time_ratio",
            "samples_per_s",
            "samples_per_s_ratio",
            "peak_memory_bytes",
            "peak_memory_ratio",
            "final_loss",
            "metric",
            "steps",
            "train_time_s",
            "reason",
        ]
        frame = pd.DataFrame([{c: r.get(c) for c in cols} for r in self.rows], index=self.names, columns=cols)
        frame.index.name = "strategy"
        if self.metric:
            frame = frame.rename(columns={"metric": self.metric})
        frame.attrs.update(memory_kind=self.memory_kind, baseline=self.baseline, **self.environment)
        return frame

    def _metric_text(self, v: Any) -> str:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-" if v is None else str(v)
        if self.metric and "acc" in self.metric and 0 <= v <= 1:
            return f"{v:.1%}"
        return f"{v:.4g}"

    def _cells(self, row: dict[str, Any]) -> list[str]:
        if row["status"] != "ok":
            return [row["name"], "failed", "", "", "", "", row.get("reason") or ""]  # full reason: to_pandas()
        loss = row.get("final_loss")
        return [
            row["name"],
            _fmt_time(row["step_time_s"]) + _pct(row.get("step_time_ratio")),
            (f"{row['samples_per_s']:.1f}" if row.get("samples_per_s") else "-") + _pct(row.get("samples_per_s_ratio")),
            _fmt_bytes(row.get("peak_memory_bytes")) + _pct(row.get("peak_memory_ratio")),
            "-" if loss is None else f"{loss:.4g}",
            self._metric_text(row.get("metric")),
            row.get("note", ""),
        ]

    @property
    def _header(self) -> list[str]:
        return [
            "strategy",
            "step time (median)",
            "samples/s",
            "peak memory*",
            "final loss",
            self.metric or "metric",
            "note",
        ]

    def to_markdown(self) -> str:
        """A Markdown table (for RESULTS files)."""
        lines = ["| " + " | ".join(self._header) + " |", "|" + "---|" * len(self._header)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in self._cells(r)) + " |" for r in self.rows]
        return "\n".join(lines)

    def __str__(self) -> str:
        table = [self._header] + [self._cells(r) for r in self.rows]
        widths = [max(len(row[i]) for row in table) for i in range(len(self._header))]
        table = [[c if len(c) <= 90 else c[:87] + "..." for c in row] for row in table]
        widths = [max(len(row[i]) for row in table) for i in range(len(self._header))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
        out.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(out) + f"\n(ratios to {self.baseline!r}; {self._where()})"

    def __repr__(self) -> str:
        return f"StrategyComparison({len(self.rows)} strategies, baseline={self.baseline!r})\n{self}"

    def _where(self) -> str:
        env = self.environment
        return f"{env.get('device', '?')}, torch {env.get('torch', '?')}; *peak memory: {self.memory_kind}"

    def _repr_html_(self) -> str:
        def bar(ratio: float | None, color: str) -> str:
            if ratio is None:
                return ""
            width = max(1.0, min(ratio, 2.0) * 50)
            return (
                f"<div style='background:{color};height:4px;width:{width:.0f}px;margin-top:2px' "
                f"title='{ratio:.0%} of baseline'></div>"
            )

        head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in self._header)
        body = []
        for row in self.rows:
            cells = self._cells(row)
            if row["status"] == "ok":
                cells_html = [
                    html.escape(cells[0]),
                    html.escape(cells[1]) + bar(row.get("step_time_ratio"), "#1f77b4"),
                    html.escape(cells[2]) + bar(row.get("samples_per_s_ratio"), "#2ca02c"),
                    html.escape(cells[3]) + bar(row.get("peak_memory_ratio"), "#ff7f0e"),
                    html.escape(cells[4]),
                    html.escape(cells[5]),
                    html.escape(cells[6]),
                ]
            else:
                cells_html = [
                    html.escape(cells[0]),
                    "<b style='color:#c00'>failed</b>",
                    f"<td colspan='5' style='color:#c00'>{html.escape(cells[6])}</td>",
                ]
                body.append("<tr><td>" + "</td><td>".join(cells_html[:2]) + "</td>" + cells_html[2] + "</tr>")
                continue
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells_html) + "</tr>")
        return (
            f"<div class='nbt-compare'><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
            f"</table><small>Ratios to {html.escape(self.baseline)!s} (bars: 100% = 50 px). "
            f"{html.escape(self._where())}.</small></div>"
        )


def _environment(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device.type} ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {"device": name, "torch": torch.__version__, "python": platform.python_version()}


# =============================================================================================
# the comparison
# =============================================================================================


def compare_strategies(
    make_model: Callable[[], nn.Module],
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None,
    criterion: Callable | None,
    train_loader: Iterable,
    val_loader: Iterable | None = None,
    strategies: Mapping[str, Mapping[str, Any]] | Sequence[str] | None = None,
    *,
    epochs: int | None = None,
    steps: int | None = None,
    metric: str | None = "val_acc",
    metrics: Mapping[str, Any] | None = None,
    baseline: str | None = None,
    warmup: int = 2,
    seed: int = 0,
    device: str | torch.device = "auto",
    split_batches: bool = True,
    measure_memory: bool = True,
    repeats: int = 1,
    trainer_kwargs: Mapping[str, Any] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> StrategyComparison:
    """Train once per strategy from the same weights and data order, and tabulate time, memory, quality.

    Args:
        make_model: ``() -> model``; called once per strategy (weights are then set to the first
            model's, so every strategy starts identical).
        make_optimizer: ``model -> optimizer`` (``None``: AdamW, fused where possible). A strategy's
            ``optimizer="adafactor"`` (any name of :func:`nbtrainer._strategies.build_optimizer`) replaces it,
            with the strategy's ``lr`` or else the learning rate ``make_optimizer`` would use; a strategy's
            ``optimizer`` may also be its own ``model -> optimizer`` function.
        criterion: the loss, as for :class:`~nbtrainer.Trainer`.
        train_loader, val_loader: the data (the loader's shuffling generator is reset before each strategy).
        strategies: ``{name: {trainer options}}`` (``precision``, ``grad_accum_steps``,
            ``activation_checkpointing``, ``optimizer``, ``lr``, ``trainable``, ``freeze``, ``compile``,
            ``channels_last``, ``max_grad_norm``...), or preset names (:data:`PRESETS`, ``"accumN"``).
        epochs / steps: how long each strategy trains (``steps``: optimizer steps; default 1 epoch).
        metric: the validation key to report (``"val_acc"``: an argmax accuracy is added when ``metrics``
            has no ``acc``); ``None`` for none.
        metrics: trainer metrics (``{"acc": torchmetrics.Accuracy(...)}``).
        baseline: the row ratios refer to (default: the first strategy).
        warmup: optimizer steps left out of the step-time median and samples/s.
        seed: seeds every strategy's fit (dropout, shuffling).
        device: ``"auto"``, ``"cuda"``, ``"cpu"``...
        split_batches: a strategy with ``grad_accum_steps=k`` gets each loader batch as ``k`` micro-batches,
            so every strategy makes the same optimizer steps on the same samples (``False``: whole batches,
            k of them per step). A strategy may set ``split_batches`` itself.
        measure_memory: off CUDA, measure one step's training memory per strategy (a few extra passes).
        repeats: train every strategy this many times, round-robin, and pool the timed steps (timings on a
            busy machine); loss, metric and memory come from the first run.
        trainer_kwargs: options for every strategy's Trainer (a strategy's own options win).
        on_row: called with each row as soon as it is measured (progress display).

    Returns:
        :class:`StrategyComparison` (``to_pandas()``, HTML in notebooks, ``str()`` as text).

    Example:
        >>> # table = compare_strategies(make_model, lambda m: torch.optim.AdamW(m.parameters()), nn.CrossEntropyLoss(),
        >>> #                            train_loader, val_loader, ["fp32", "bf16", "ckpt", "accum4"], steps=50)
    """
    from nbtrainer._precision import resolve_device
    from nbtrainer._seed import seed_everything
    from nbtrainer._trainer import Trainer

    plan = resolve_strategies(strategies)
    if epochs is not None and steps is not None:
        raise ValueError("Pass epochs= or steps=, not both.")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}.")
    if epochs is None:
        epochs = 1 if steps is None else 10**9  # steps: as many (re-)passes over the data as needed
    baseline = baseline if baseline is not None else next(iter(plan))
    if baseline not in plan:
        raise ValueError(f"baseline {baseline!r} is not one of the strategies {list(plan)}.")
    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    metrics = dict(metrics or {})
    if metric and metric.startswith("val_") and metric[4:] == "acc" and "acc" not in metrics:
        metrics["acc"] = _accuracy
    if metric and val_loader is None:
        metric = None
    memory_kind = (
        "CUDA peak allocated"
        if cuda
        else "measured bytes of one step: params+buffers+grads+optimizer state+inputs+saved activations"
    )
    order = _DataOrder([train_loader, val_loader])
    seed_everything(seed)
    first_model = make_model()
    initial = {k: v.detach().to("cpu", copy=True) for k, v in first_model.state_dict().items()}
    del first_model
    first_batch: Any = None
    if measure_memory and not cuda:
        first_batch = next(iter(train_loader))
        order.reset()

    def run(name: str, options: dict[str, Any], measure: bool) -> dict[str, Any]:
        options = dict(options)
        split = options.pop("split_batches", split_batches)
        row: dict[str, Any] = {
            "name": name,
            "status": "ok",
            "reason": None,
            "options": dict(options),
            "note": "",
            **dict.fromkeys(
                (
                    "steps",
                    "step_time_s",
                    "samples_per_s",
                    "samples_per_step",
                    "train_time_s",
                    "peak_memory_bytes",
                    "memory_detail",
                    "final_loss",
                    "metric",
                )
            ),
        }
        trainer = model = None
        try:
            if "device" in options:
                raise ValueError("device is chosen for the whole comparison: compare_strategies(device=...)")
            order.reset()
            seed_everything(seed)
            model = make_model()
            model.load_state_dict(initial)
            kwargs = {**dict(trainer_kwargs or {}), **options}
            opt = kwargs.pop("optimizer", None)
            if isinstance(opt, str) or (opt is None and make_optimizer is None):
                if "lr" not in kwargs and make_optimizer is not None:
                    kwargs["lr"] = float(make_optimizer(model).param_groups[0]["lr"])
                opt = opt or "adamw"
            elif opt is None or (callable(opt) and not isinstance(opt, torch.optim.Optimizer)):
                opt = (opt or make_optimizer)(model)  # a strategy may bring its own model -> optimizer
                if "lr" in kwargs:  # a strategy's lr= with the usual optimizer: set it on every group
                    lr = float(kwargs.pop("lr"))
                    for group in opt.param_groups:
                        group["lr"] = lr
            accum = int(kwargs.get("grad_accum_steps", 1))
            loader = _SplitLoader(train_loader, accum) if split and accum > 1 else train_loader
            timer = _StepTimer(dev)
            options_kw = {k: v for k, v in kwargs.items() if k != "callbacks"}  # a strategy's seed=, metrics= win
            trainer = Trainer(
                model,
                criterion,
                opt,
                callbacks=[*kwargs.get("callbacks", ()), timer],
                **{"metrics": metrics, "seed": seed, "device": dev, "progress": False, **options_kw},
            )
            if measure:
                micro = split_batch(first_batch, accum)[0] if split and accum > 1 else first_batch
                try:
                    row["peak_memory_bytes"], row["memory_detail"] = _measure_cpu_memory(
                        trainer, micro, kwargs.get("activation_checkpointing", False)
                    )
                    if row["memory_detail"].get("note"):
                        row["note"] = row["memory_detail"]["note"]
                except Exception as exc:
                    row["peak_memory_bytes"], row["note"] = None, f"memory not measured: {_reason(exc)}"
            if cuda:
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(dev)
            start = time.perf_counter()
            # steps=: validate once at the end, not at every pass over a short loader
            history = trainer.fit(loader, val_loader if steps is None else None, epochs=epochs, max_steps=steps)
            row["train_time_s"] = time.perf_counter() - start
            if cuda:
                row["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(dev))
            times, samples = timer.times, timer.samples
            skip = warmup if len(times) > warmup else (1 if len(times) > 1 else 0)
            if skip < warmup:
                row["note"] = (row["note"] + "; " if row["note"] else "") + f"only {len(times)} steps: warm-up {skip}"
            row["_timed"] = list(zip(times[skip:], samples[skip:], strict=True))
            row["steps"] = len(times)
            row["final_loss"] = _final_loss(history)
            if metric:
                value = history.last.get(metric) if history.epochs else None
                if value is None:
                    value = trainer.evaluate(val_loader).get(metric)
                if value is None:
                    row["note"] = (row["note"] + "; " if row["note"] else "") + f"{metric} not logged"
                row["metric"] = value
            row["setup"] = trainer._setup.describe()
        except Exception as exc:
            row.update(status="failed", reason=_reason(exc))
        finally:
            del trainer, model
            if cuda:  # give the next strategy the memory back (and a clean peak)
                gc.collect()
                torch.cuda.empty_cache()
            order.reset()
        return row

    def finish(row: dict[str, Any]) -> None:
        timed = row.pop("_timed", [])
        if row["status"] == "ok":
            row["train_time_s"] /= repeats
            # medians, not sums: on a shared machine one stalled step must not move the row
            row["step_time_s"] = statistics.median(t for t, _ in timed) if timed else None
            rates = [n / t for t, n in timed if t > 0]
            row["samples_per_s"] = statistics.median(rates) if rates else None
            row["samples_per_step"] = statistics.median(n for _, n in timed) if timed else None
            row["repeats"] = repeats
        if on_row is not None:
            on_row(row)

    rows: dict[str, dict[str, Any]] = {}
    for rep in range(repeats):  # round-robin: a slow spell of a shared machine hits every strategy alike
        for name, options in plan.items():
            if rep and rows[name]["status"] != "ok":
                continue  # failed before: already finished
            row = run(name, options, measure=measure_memory and not cuda and rep == 0)
            if rep == 0:
                rows[name] = row
            elif row["status"] != "ok":
                rows[name].update(status="failed", reason=f"repeat {rep + 1}: {row['reason']}")
            else:
                rows[name]["_timed"] += row["_timed"]
                rows[name]["train_time_s"] += row["train_time_s"]
                if cuda:
                    rows[name]["peak_memory_bytes"] = max(rows[name]["peak_memory_bytes"], row["peak_memory_bytes"])
            if rep == repeats - 1 or rows[name]["status"] != "ok":
                finish(rows[name])
    rows = list(rows.values())  # type: ignore[assignment]

    base = next(r for r in rows if r["name"] == baseline)
    for row in rows:
        for key, ratio_key in (
            ("step_time_s", "step_time_ratio"),
            ("samples_per_s", "samples_per_s_ratio"),
            ("peak_memory_bytes", "peak_memory_ratio"),
        ):
            b, v = base.get(key), row.get(key)
            ok = base["status"] == "ok" and row["status"] == "ok" and b and v is not None
            row[ratio_key] = v / b if ok else None
    return StrategyComparison(
        rows=rows,
        baseline=baseline,
        metric=metric,
        memory_kind=memory_kind,
        environment=_environment(dev),
        settings={
            "epochs": None if steps is not None else epochs,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "split_batches": split_batches,
            "repeats": repeats,
        },
    )
