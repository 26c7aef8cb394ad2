"""Metrics without per-step host syncs.

Two kinds, one dict: callables ``fn(outputs, targets) -> tensor`` (a batch mean) and torchmetrics
``Metric`` / ``MetricCollection`` objects (moved to the device, ``update`` per batch, ``compute`` at
epoch end, then ``reset``). Callable values stay on the device in a pending list until the trainer's
throttled refresh reads them in one transfer together with the losses; epoch values are
sample-weighted.

Model outputs that are not a tensor (a Hugging Face ``ModelOutput``, a dict, a tuple such as an LSTM's
``(out, (h, c))``) are given to each metric whole when it takes them (``lambda out, y: out.logits...``);
a metric that fails on them gets their tensor instead: ``.logits`` (key or attribute), else the first
tensor (the ``loss`` entry and 0-d tensors skipped), see :func:`metric_input`. Which of the two a metric
gets is decided once, on the first outputs it sees, and kept.
"""

from __future__ import annotations

import copy
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nbtrainer._data._batch import as_mapping, iter_tensors

__all__ = [
    "LOOP_KEYS",
    "VAL_PREFIX",
    "MetricSet",
    "check_log_names",
    "collection_names",
    "exact_add",
    "is_collection",
    "is_torchmetric",
    "metric_input",
]

#: The keys the loop writes in every epoch row besides the metrics' (``nbtrainer._loop._epoch_end.end_epoch``), and the
#: prefix of validation's keys (its loss and each metric's value): a metric may not take one (:func:`check_log_names`).
LOOP_KEYS = ("epoch", "lr", "loss", "time", "samples_per_s", "steps", "skipped_steps")
VAL_PREFIX = "val_"


def exact_add(parts: list[float], values: Any) -> float:
    """Add ``values`` to the running sum kept in ``parts`` (in place) and return the sum.

    The result is the correctly rounded sum of every value ever added, whatever the chunking, so an
    epoch's loss does not depend on when the throttled refresh happened to read the device: a resumed
    run reproduces it bit for bit. ``parts[0]`` holds the non-finite part (inf/nan); the rest is the
    exact finite sum as non-overlapping floats ``s1 + s2 + ...`` with ``s1`` the correctly rounded sum.
    Plain floats, so it travels in checkpoints.

    Example:
        >>> parts = []
        >>> exact_add(parts, [1e16, 1.0]), exact_add(parts, [-1e16])  # plain float adds would give 0.0
        (1e+16, 1.0)
    """
    if not parts:
        parts.append(0.0)
    special = parts[0]
    values = list(values)
    if not math.isfinite(sum(values)):  # rare: split off inf/nan (or a finite overflow, kept below)
        special += sum(v for v in values if not math.isfinite(v))
        values = [v for v in values if math.isfinite(v)]
    terms = parts[1:] + values
    exact: list[float] = []
    try:
        # 1. math.fsum is exact inside and correctly rounded: s1 = round(E); 2. s2 = round(E - s1), ...
        # until nothing is left. Usually 1-3 C-speed passes, where a Python partials loop costs ~1 us/value.
        for _ in range(64):
            s = math.fsum(terms)
            if s == 0.0:
                break
            exact.append(s)
            terms.append(-s)
        total = exact[0] if exact else 0.0
    except OverflowError:  # finite values whose sum overflows
        total = math.inf if sum(terms) > 0 else -math.inf
        special += total
        exact, total = [], 0.0
    parts[:] = [special, *exact]
    return total + special if special else total


def is_torchmetric(obj: Any) -> bool:
    # sys.modules, not an import: no Metric exists unless torchmetrics is imported, and importing it costs ~3 s
    # (it pulls in scipy and transformers) in a run that uses none of it
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(obj, (torchmetrics.Metric, torchmetrics.MetricCollection))


def is_collection(obj: Any) -> bool:
    """A torchmetrics ``MetricCollection`` (``Trainer(metrics=collection)`` takes one: its keys name the values)."""
    torchmetrics = sys.modules.get("torchmetrics")  # no collection exists unless torchmetrics is imported
    return torchmetrics is not None and isinstance(obj, torchmetrics.MetricCollection)


def metric_input(outputs: Any) -> torch.Tensor | None:
    """The tensor a metric gets from structured model outputs: ``.logits`` when there is one, else the
    first tensor with a dimension (a ``loss`` entry skipped), else the first tensor; None if none.

    Example:
        >>> import torch
        >>> out, state = torch.zeros(4, 3), (torch.ones(1, 4, 2), torch.ones(1, 4, 2))
        >>> metric_input((out, state)) is out, metric_input({"loss": torch.tensor(1.0), "y": out}) is out
        (True, True)
    """
    if isinstance(outputs, torch.Tensor):
        return outputs
    mapping = as_mapping(outputs)
    if mapping is not None:
        logits = mapping.get("logits")
        if isinstance(logits, torch.Tensor):
            return logits
        outputs = [v for k, v in mapping.items() if k != "loss"]
    first = None
    for t in iter_tensors(outputs):
        if t.ndim:
            return t
        first = t if first is None else first
    return first


def _note(exc: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    elif exc.args and isinstance(exc.args[0], str):  # Python 3.10 has no notes
        exc.args = (f"{exc.args[0]}\n{note}", *exc.args[1:])


class MetricSet:
    """The metrics of one stage (train or validation)."""

    def __init__(self, metrics: Mapping[str, Any] | None, device: torch.device) -> None:
        self.callables: list[tuple[str, Callable]] = []
        self.torchmetrics: list[tuple[str, Any]] = []
        for name, metric in (metrics or {}).items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"Metric names must be non-empty strings, got {name!r}.")
            if is_torchmetric(metric):
                self.torchmetrics.append((name, metric.to(device)))
            elif callable(metric):
                self.callables.append((name, metric))
            else:
                raise TypeError(
                    f"Metric {name!r} is a {type(metric).__name__}; pass a torchmetrics Metric or a "
                    "callable(outputs, targets) -> scalar tensor."
                )
        self.pending: dict[str, list[torch.Tensor]] = {n: [] for n, _ in self.callables}
        self.sums: dict[str, float] = {n: 0.0 for n, _ in self.callables}
        self._parts: dict[str, list[float]] = {n: [] for n, _ in self.callables}  # exact sums (see exact_add)
        self._unwrap: dict[str, bool] = {}  # name -> gets metric_input(outputs), decided on its first outputs
        self.values: list[str] = []  # names of values given by add_values (a manual training_step's)
        check_log_names(self.names)

    def clone(self, device: torch.device) -> MetricSet:
        """An independent copy for another stage (validation keeps its own torchmetrics state)."""
        new = MetricSet(None, device)
        new.callables = list(self.callables)
        new.torchmetrics = [(n, copy.deepcopy(m).to(device)) for n, m in self.torchmetrics]
        new.pending = {n: [] for n, _ in self.callables}
        new.sums = {n: 0.0 for n, _ in self.callables}
        new._parts = {n: [] for n, _ in self.callables}
        new._unwrap = {}
        return new

    @property
    def names(self) -> list[str]:
        """The names of the values this set logs (a ``MetricCollection`` logs under its own keys)."""
        names = [n for n, _ in self.callables] + list(self.values)
        for name, metric in self.torchmetrics:
            names += [str(k) for k in metric.keys()] if is_collection(metric) else [name]
        return names

    def __bool__(self) -> bool:
        return bool(self.callables or self.torchmetrics or self.values)

    @staticmethod
    def probe(metric: Any) -> Any:
        """A reset copy of a torchmetrics metric to try inputs on (the real one keeps its state)."""
        return _probe(metric)

    @staticmethod
    def scalar(name: str, value: Any) -> float:
        """A computed value as a float; a tensor of several values is refused naming the fix."""
        return _scalar(name, value)

    def inputs(self, name: str, metric: Any, outputs: Any, targets: Any) -> Any:
        """What the metric ``name`` is given of the model's ``outputs`` (module docstring): the outputs
        whole, or :func:`metric_input` of them. The first time, a trial call decides (a callable is called,
        a torchmetrics metric is updated on a copy, so its state is untouched); if the metric fails on
        both, the first error is raised with a note on the second."""
        if isinstance(outputs, torch.Tensor):
            return outputs
        unwrap = self._unwrap.get(name)
        if unwrap is None:

            def trial(candidate: Any) -> Any:
                if is_torchmetric(metric):
                    return _probe(metric).update(candidate, targets)
                return metric(candidate, targets)

            tensor = metric_input(outputs)
            try:
                trial(outputs)
                unwrap = False
            except Exception as whole_exc:
                if tensor is None:
                    raise
                try:
                    trial(tensor)
                except Exception as exc:
                    _note(
                        whole_exc,
                        f"Given the outputs' tensor instead ({'.logits' if _has_logits(outputs) else 'the first'}, "
                        f"shape {list(tensor.shape)}), metric {name!r} raised too: {type(exc).__name__}: {exc}",
                    )
                    raise whole_exc from None
                unwrap = True
            self._unwrap[name] = unwrap
        return metric_input(outputs) if unwrap else outputs

    def update(self, outputs: Any, targets: Any) -> None:
        for name, fn in self.callables:
            value = fn(self.inputs(name, fn, outputs, targets), targets)
            if not isinstance(value, torch.Tensor):
                value = torch.as_tensor(value, dtype=torch.float32)
            self.pending[name].append(value.detach())
        for name, metric in self.torchmetrics:
            metric.update(self.inputs(name, metric, outputs, targets), targets)

    def add_values(self, values: Mapping[str, torch.Tensor]) -> None:
        """Per-batch values computed elsewhere (a manual ``training_step``'s dict): logged like a callable metric's,
        read at the throttled refresh (no sync here). A name seen for the first time is added."""
        for name, value in values.items():
            if name not in self.pending:
                self._add_value_name(name)
            self.pending[name].append(value.detach())

    def _add_value_name(self, name: str) -> None:
        self.pending[name] = []
        self.sums.setdefault(name, 0.0)  # a resumed run's sums were loaded before the first value came
        self._parts.setdefault(name, [])
        self.values.append(name)

    def check_first(self) -> None:
        """Validate the first batch's callable values (cheap attribute reads, no sync)."""
        for name, values in self.pending.items():
            if values and values[-1].numel() != 1:
                raise ValueError(
                    f"Metric {name!r} returned a tensor of shape {tuple(values[-1].shape)}; a metric "
                    "must return one number per batch (e.g. reduce with .mean())."
                )

    def drain(self) -> list[torch.Tensor]:
        """Stack each callable's pending values (one device op each) and clear the lists."""
        stacked = []
        for name in self.pending:  # callables, then add_values' names: the order the loop reads them back in
            vals = self.pending[name]
            stacked.append(torch.stack([v.reshape(()) for v in vals]).float() if vals else torch.empty(0))
            self.pending[name] = []
        return stacked

    def absorb(self, host_values: dict[str, list[float]], batch_sizes: list[int]) -> None:
        for name, values in host_values.items():
            self.sums[name] = exact_add(
                self._parts.setdefault(name, []), [v * n for v, n in zip(values, batch_sizes, strict=True)]
            )

    def running(self, count: int) -> dict[str, float]:
        return {n: self.sums[n] / count for n in self.sums} if count else {}

    def compute(self, count: int) -> dict[str, float]:
        """Epoch values (host floats). torchmetrics' compute syncs: call at epoch end only."""
        out = self.running(count)
        for name, metric in self.torchmetrics:
            value = metric.compute()
            if isinstance(value, dict):  # MetricCollection
                for k, v in value.items():
                    out[k] = _scalar(k, v)
            else:
                out[name] = _scalar(name, value)
        return out

    def reset(self) -> None:
        for name in self.sums:
            self.sums[name] = 0.0
            self._parts[name] = []
            self.pending[name] = []
        for _, metric in self.torchmetrics:
            metric.reset()

    # -- exact resume --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Running sums (exact partials) and torchmetrics states (``Metric`` or ``MetricCollection``),
        as tensors and plain data."""
        return {
            "sums": dict(self.sums),
            "parts": {k: list(v) for k, v in self._parts.items()},
            "torchmetrics": {n: _cpu_state(m.metric_state) for n, m in self.torchmetrics if hasattr(m, "metric_state")},
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        for name in state.get("sums", {}):
            if name not in self.pending:  # a manual training_step's value
                self._add_value_name(name)
        self.sums.update(state.get("sums", {}))
        for name, parts in state.get("parts", {}).items():
            self._parts[name] = [float(v) for v in parts]
        tm_states = state.get("torchmetrics", {})
        for name, metric in self.torchmetrics:
            if name in tm_states:
                _load_tm_state(metric, tm_states[name], device)


def check_log_names(names: list[str]) -> None:
    """Refuse metric names whose values would land on a key already written in the epoch row: a key the loop writes
    itself (``loss``, ``lr``, ``epoch``...: :data:`LOOP_KEYS`), the validation loss, another metric's name or its
    validation key (``val_acc`` beside ``acc``), or the same name twice (two collections with a key in common).
    The row is one dict: the later value would silently replace the earlier one, and what ``EarlyStopping`` or
    ``ModelCheckpoint`` watches with it."""
    written = {key: f"the trainer's own {key!r}" for key in LOOP_KEYS}
    written[f"{VAL_PREFIX}loss"] = "the validation loss"
    for name in names:
        val_key = f"{VAL_PREFIX}{name}"
        for key, what in ((name, f"metric {name!r}"), (val_key, f"the validation value of metric {name!r}")):
            if key in written:
                raise ValueError(
                    f"{what[0].upper()}{what[1:]} would be logged as {key!r}, which is already {written[key]}: one "
                    "would overwrite the other in the epoch logs. Rename the metric, e.g. "
                    f"metrics={{'my_{name}': ...}} (a MetricCollection: its prefix= or postfix=)."
                )
            written[key] = what


def _has_logits(outputs: Any) -> bool:
    mapping = as_mapping(outputs)
    return mapping is not None and isinstance(mapping.get("logits"), torch.Tensor)


def _probe(metric: Any) -> Any:
    """A copy of a torchmetrics metric to try inputs on (the real one keeps its state)."""
    probe = copy.deepcopy(metric)
    probe.reset()
    # computed on one rank's first batch only (a rank whose share is empty has none): its compute() must not
    # gather across ranks, or that rank's peers never join and the job hangs (torchmetrics' own constructor option)
    for part in probe.modules() if isinstance(probe, torch.nn.Module) else ():
        if hasattr(part, "distributed_available_fn"):
            setattr(part, "distributed_available_fn", _nowhere)  # noqa: B010 (nn.Module's typed __setattr__)
    return probe


def _nowhere() -> bool:
    return False


def _cpu_state(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):  # a MetricCollection: {member: {attr: state}}
        return {k: _cpu_state(v) for k, v in state.items()}
    return [_cpu_state(t) for t in state]  # list states ("cat" reductions)


def _load_tm_state(metric: Any, state: dict[str, Any], device: torch.device) -> None:
    import torchmetrics

    if isinstance(metric, torchmetrics.MetricCollection):
        members = dict(metric.items(keep_base=False, copy_state=False))
        for key, sub in state.items():
            if key in members:
                _load_tm_state(members[key], sub, device)
        if getattr(metric, "_groups_checked", False):
            metric._state_is_copy = True  # compute groups re-link their shared state on the next update
        return
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            setattr(metric, key, value.to(device))
        else:
            setattr(metric, key, [t.to(device) for t in value])
    metric._update_count = max(getattr(metric, "_update_count", 0), 1)
    metric._computed = None


def _scalar(name: str, value: Any) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"Metric {name!r} computed a tensor of shape {tuple(value.shape)}; configure it to "
                "return a scalar (e.g. average='macro')."
            )
        return float(value)
    return float(value)


def collection_names(spec: Mapping[str, Any]) -> set[str]:
    """The names a torchmetrics ``MetricCollection`` among ``spec``'s values logs under (none without torchmetrics)."""
    names: set[str] = set()
    torchmetrics = sys.modules.get("torchmetrics")  # no collection exists unless torchmetrics is imported
    if torchmetrics is None:
        return names
    for value in spec.values():
        if isinstance(value, torchmetrics.MetricCollection):
            names |= {str(k) for k in value.keys()}  # its metric names (typed as Hashable by torchmetrics)
    return names
