"""``DataMap``: every training item mapped by how training treats it, from the forward pass the step already makes.

Per item and per visit (once an epoch, for a sampler without replacement) it adds up, on the device, the probability
the model gave the item's label, whether the label was the model's top class, and the margin: the label's logit less
the largest other logit (the area under the margin, Pleiss et al. 2020). Dataset cartography's coordinates
(Swayamdipta et al. 2020) follow: ``confidence`` is the mean probability, ``variability`` its spread across visits,
``correctness`` the share of visits predicted right. Running sums, so memory is eight numbers per item whatever the
number of epochs; the class the model predicted the last time it got the item wrong (else the one it ranked after the
given one at the last visit) is kept as a suggestion.

Cost per step: one call, keeping references to the step's outputs, targets and index list (no device op, nothing
read; the logits and labels are picked out at the reduction); at the refresh (and when more than ``flush_rows`` rows
wait) the waiting rows are reduced in one batched pass on the device, still without a read. The host reads happen
when someone reads the map (``confidence``, ``label_issues()``...).

Targets that are not class labels (a regression, multi-label, a language model's tokens) are followed by their loss:
``mode`` is then ``"loss"``, ``confidence`` is ``exp(-loss)`` (the likelihood the loss gives the target) and ``note``
says so; ``correctness`` and ``aum`` are not defined there (NaN).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from nbtrainer._data._cleaned import CleanedDataset, DataEdits
from nbtrainer._data._fetch import index_tensor
from nbtrainer._know._batch_rows import order_check, same_data
from nbtrainer._know._issues import LabelIssues, issue_count, map_gallery, map_html, rank_issues
from nbtrainer._know._map_rows import classify, last_visits, map_mode, may_repeat
from nbtrainer._know._map_state import load_map_state, map_state, move_map
from nbtrainer._know._stats import label_part
from nbtrainer._look._interpretation import Gallery
from nbtrainer._look._per_item import PerItem
from nbtrainer._loop._metrics import metric_input
from nbtrainer._report._format import format_count

if TYPE_CHECKING:
    from nbtrainer._events._trainer_view import TrainerView
    from nbtrainer._loop._host import LoopHost

__all__ = ["DataMap"]

Tensor = torch.Tensor
# rows of the running sums: visits, probability, its square, right, margin (loss mode: the loss)
_VISITS, _P, _P2, _RIGHT, _MARGIN = range(5)


class DataMap:
    """A data map of the training set, recorded during ``fit`` (a callback; the panel adds one).

    Attributes (tensors indexed by dataset index, on the CPU, read when asked; NaN for items not seen yet):
        confidence: mean probability given to the item's label over its visits.
        variability: the spread (standard deviation) of that probability.
        correctness: the share of visits where the label was the model's top class.
        aum: the area under the margin: mean of (the label's logit - the largest other logit).
        visits: how many times each item was trained on.
        mode: ``"classification"``, ``"binary"``, ``"loss"`` (targets that are not class labels), or None before
            the first batch.
        note: a plain sentence when the map is partial or empty (indices unknown, loss mode), else None.
        updates: moves when the map is brought up to date for its readers (an epoch's end, the end of a fit stopped
            mid-epoch, a new note, a checkpoint loaded): a view redraws when it moves, without reading the map.
        edits: the decisions made in the panel's cleaner (:class:`~nbtrainer._data._cleaned.DataEdits`).

    Args:
        classes: class names, for display.
        flush_rows: reduce the waiting rows on the device once about this many are kept (bounds the logits held;
            counted in batches of the size of the fit's first).
        loss_per_item: ``fn(outputs, targets) -> one loss per item``, for targets that are not class labels where the
            criterion cannot give its loss per item (one with no ``reduction='none'``, a ``compute_loss=``).

    Example:
        >>> import torch
        >>> from nbtrainer import DataMap, Trainer
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
        >>> dm = DataMap()
        >>> model = torch.nn.Linear(4, 3)
        >>> trainer = Trainer(model, torch.nn.CrossEntropyLoss(), "sgd", lr=0.1, callbacks=[dm], progress=False)
        >>> _ = trainer.fit((x, y), batch_size=16, epochs=3)
        >>> dm.confidence.shape, int(dm.visits.min()), len(dm.label_issues(5))
        (torch.Size([64]), 3, 5)
    """

    def __init__(
        self, *, classes: Sequence[Any] | None = None, flush_rows: int = 1 << 16, loss_per_item: PerItem | None = None
    ) -> None:
        if loss_per_item is not None and not callable(loss_per_item):
            raise TypeError(f"loss_per_item must be a function fn(outputs, targets) -> losses, got {loss_per_item!r}.")
        self.loss_per_item = loss_per_item
        self.classes = [str(c) for c in classes] if classes is not None else None
        self.flush_rows = int(flush_rows)
        self.mode: str | None = None
        self.note: str | None = None
        self.edits = DataEdits()
        self.epochs = 0
        self.updates = 0
        self._unpublished = False  # rows reduced (or a note) since updates last moved
        self._lock = threading.RLock()  # _off from inside a reduction
        self._stats: Tensor | None = None  # (5, N) float32 on the run's device
        self._given: Tensor | None = None  # (N,) the label last seen (-1: never)
        # (2, N): the strongest other class at the last visit; the class predicted at the last visit predicted wrong
        self._suggest: Tensor | None = None
        self._pending: list[tuple[Any, Any, Any]] = []
        self._rows = 0
        self._direct = 0  # while fewer steps than this wait, a step's rows are kept as they come (on_train_forward)
        self._loss_fn: Any = None
        self._probabilities = False
        self._outputs: int | None = None  # the model's classes (binary: 2), which a relabel must stay within
        self._size: int | None = None
        self._extent = 0  # a list of batches: the items numbered so far
        self._device = torch.device("cpu")
        self._dataset: Any = None
        self._layout: tuple[Any, bool] = (None, False)  # where an item's label is (cleaned(relabel=))
        self._handed: Any = None  # the last view cleaned() returned: its fit has the edits built in
        # a custom collate_fn may reorder or drop a batch's items: the first batch's labels are compared, on the
        # device, with the dataset's at the batch's indices (read with the map: no sync in the fit)
        self._verify = False
        self._misordered: Tensor | None = None
        self._through = 0  # the optimizer steps the map covers as of its last fit's end (or checkpoint, then 0)
        self._repeats = True  # an item may have several rows in one reduction (may_repeat; set at each fit)
        self._per_rank = False  # under DDP: a rank's share, left out of checkpoints (_map_state)

    # -- the event stream --------------------------------------------------------------------------
    def on_fit_start(self, trainer: LoopHost) -> None:
        loop = trainer.run_state.loop
        data = getattr(loop, "train_data", None)
        track = getattr(data, "track", None)
        fresh = trainer.global_step == 0
        if track is None:  # added after the loop was built (add_callback mid-fit): the next fit records
            self.note = "added during a fit: the data map records from the next fit on"
            return
        size = track.size
        if fresh or size != self._size:
            self._reset(size, trainer.device)
        elif trainer.global_step < self._through:  # resumed before steps it recorded, from a checkpoint without it
            at, self._through = trainer.global_step, 0
            self._reset(size, trainer.device)
            self.note = f"resumed at step {at} from a checkpoint without this map: it records again from there"
        elif trainer.device != self._device:  # another device (or loaded on the CPU): the sums go along
            move_map(self, trainer.device)
        dataset = getattr(track.loader, "dataset", None)
        self._repeats = may_repeat(track.loader)
        if len(self.edits) and (dataset is self._handed or not same_data(dataset, self._dataset)):
            # the decisions were indices of the data trained before: built into this view, or about other data
            self.edits.clear()
        self._dataset, self._handed = dataset, None
        self._direct = 0  # the fit's first step takes the slow way: its mode, its order check
        self._layout = (trainer.batch_spec, trainer.batch_steps.custom_loss)
        collate = getattr(track.loader, "collate_fn", None)
        self._verify = dataset is not None and collate not in (None, torch.utils.data.default_collate)
        self.note = f"no data map: {track.note}" if track.note is not None else self.note
        if self.mode is None or fresh:
            self.mode, self._loss_fn = None, None
        self._per_rank = trainer.strategy.distributed
        if self._per_rank:
            self.note = "under DDP each rank maps its own share of the items; this is this rank's"

    def on_train_forward(self, trainer: LoopHost, outputs: Any, targets: Any, indices: Any) -> None:
        # Once the mode is known, a step keeps its references and nothing else: on a tiny model's step, between its
        # forward and its backward, each Python line runs with cold caches (this hook measured 4 us a step in a fit
        # against 0.9 us alone). The labels and logits are picked out at the reduction, a window's rows at a time.
        pending = self._pending
        if len(pending) < self._direct and indices is not None:
            pending.append((outputs, targets, indices))
        else:
            self._forward(trainer, outputs, targets, indices)

    def _forward(self, trainer: LoopHost, outputs: Any, targets: Any, indices: Any) -> None:
        """A step's rows the slow way: the first of a fit (the mode, the order check), the loss mode, a flush."""
        if indices is None:
            return
        labels = label_part(targets)  # (y, weight): the map follows y
        targets = labels if labels is not None else targets
        if self.mode is None:
            self._choose_mode(trainer, outputs, targets)
            if labels is not None and self.mode in ("classification", "binary"):
                self.note = "the targets are a tuple: the map reads its first part as the class labels"
        if self.mode == "off":
            return
        if self._verify:  # once a fit, on the first batch (the labels compared on the device)
            self._verify = False
            if isinstance(targets, Tensor) and (self.mode == "binary" or not targets.is_floating_point()):
                self._misordered = order_check(self._dataset, self._layout, targets, indices)
        if self.mode == "loss":
            with torch.no_grad():
                values = self._loss_fn(outputs, targets).detach().float()
            self._pending.append((values, None, indices))
        else:  # kept as they are (detached when reduced, under no_grad): a detach per step costs a dispatch
            self._pending.append((metric_input(outputs), targets, indices))
            # plain tensors (the common case): the next steps' go straight in (above), up to about flush_rows counted
            # in batches of this size; of structured outputs only the logits are kept (not a model's hidden states)
            plain = labels is None and type(outputs) is Tensor and type(targets) is Tensor
            self._direct = max(1, self.flush_rows // max(1, len(indices))) if plain else 0
        self._rows += len(indices)
        if self._rows >= self.flush_rows or 0 < self._direct < len(self._pending):
            self._reduce()

    def on_refresh(self, trainer: TrainerView, progress: Any) -> None:
        if self._pending:
            self._reduce()

    def on_epoch_end(self, trainer: TrainerView, epoch: int, logs: dict[str, Any]) -> None:
        self._reduce()
        self.epochs += 1
        self.updates, self._unpublished = self.updates + 1, False

    def on_fit_end(self, trainer: TrainerView, history: Any) -> None:
        self._reduce()
        self._through = trainer.global_step
        self._settle_order()
        if self._stats is None and self.note is None:
            self.note = (
                "nothing recorded: this fit's steps make their own forward pass (training_step=, LBFGS or a "
                "memory plan's split), which the loop does not see"
            )
            self._unpublished = True
        if self._unpublished:  # rows since the last epoch's end (a fit stopped mid-epoch), or a note
            self.updates, self._unpublished = self.updates + 1, False

    # a checkpoint holds the map (_map_state): a run resumed from it counts each step once
    state_dict, load_state_dict = map_state, load_map_state

    # -- recording ---------------------------------------------------------------------------------
    def _reset(self, size: int | None, device: torch.device) -> None:
        with self._lock:
            self._size, self._device = size, device
            self._stats = self._given = self._suggest = self._misordered = None
            self._pending, self._rows, self._direct, self.epochs, self.note, self._extent = [], 0, 0, 0, None, 0
            if size is not None:
                self._allocate(size)

    def _off(self, why: str) -> None:
        """Stop recording and forget what was recorded: rows that may belong to other items mislead."""
        with self._lock:
            self.mode, self.note = "off", f"no data map: {why}"
            self._stats = self._given = self._suggest = None
            self._pending, self._rows, self._direct, self._unpublished = [], 0, 0, True

    def _allocate(self, n: int) -> None:
        """Room for ``n`` items and one more column where rows that do not count (an ignored label, a NaN) land."""
        device = self._device
        stats = torch.zeros(5, n + 1, device=device)
        given = torch.full((n + 1,), -1, dtype=torch.int64, device=device)
        suggest = torch.full((2, n + 1), -1, dtype=torch.int64, device=device)
        if self._stats is not None and self._given is not None and self._suggest is not None:
            old = self._stats.shape[1] - 1  # a list of batches grows as it is numbered
            stats[:, :old], given[:old], suggest[:, :old] = (
                self._stats[:, :old],
                self._given[:old],
                self._suggest[:, :old],
            )
        self._stats, self._given, self._suggest = stats, given, suggest

    def _choose_mode(self, trainer: LoopHost, outputs: Any, targets: Any) -> None:
        mode = map_mode(trainer, metric_input(outputs), targets, self.loss_per_item)
        self.mode, self._loss_fn, self._outputs = mode.mode, mode.loss_fn, mode.outputs
        self.note = mode.note if mode.note is not None else self.note
        self._probabilities = isinstance(trainer.criterion, torch.nn.BCELoss)

    def _index(self, parts: list[Any]) -> Tensor:
        kinds = {type(p) for p in parts}  # a set, not all(): a generator's resumption per part is a call per step
        if kinds == {Tensor} and {p.ndim for p in parts} == {1}:  # the batched fetch's
            return torch.cat(parts).to(self._device, torch.int64, non_blocking=True)
        if kinds == {range}:
            stop = max(p.stop for p in parts)
            self._extent = max(self._extent, stop)
            # the last column is the one where rows that do not count land: an item there is lost at the next growth
            if self._stats is None or stop > self._stats.shape[1] - 1:
                self._allocate(max(stop, 2 * (self._stats.shape[1] if self._stats is not None else 0)))
            return torch.cat([torch.arange(p.start, p.stop, device=self._device) for p in parts])
        flat = list(itertools.chain.from_iterable(p.tolist() if isinstance(p, Tensor) else p for p in parts))
        return index_tensor(flat).to(self._device, non_blocking=True)

    def _reduce(self) -> None:
        """The waiting rows into the running sums, on the device: a few batched ops over all of them, nothing read.
        (Per row, not per step: a CPU runs each op over a refresh's rows for about the price of one small op.)"""
        pending, self._pending, self._rows = self._pending, [], 0
        if not pending:
            return
        self._unpublished = True
        with self._lock, torch.no_grad():
            idx = self._index([p[2] for p in pending])
            if self._stats is None:
                self._allocate(int(self._size or 0))
            assert self._stats is not None and self._given is not None and self._suggest is not None
            trash = self._stats.shape[1] - 1
            if self.mode == "loss":
                loss = torch.cat([p[0].reshape(-1) for p in pending])
                if self._misaligned(len(loss), len(idx)):
                    return
                like = torch.exp(-loss.clamp(min=0))
                idx = torch.where(torch.isfinite(loss), idx, trash)
                rows = torch.stack([torch.ones_like(loss), like, like * like, torch.zeros_like(loss), loss])
                self._stats.index_add_(1, idx, rows)
                return
            # the steps kept as they came (on_train_forward): logits and labels picked out of structured outputs and
            # targets now (plain tensors, the common case, are checked for their types, not passed through calls)
            if {(type(o), type(t)) for o, t, _ in pending} != {(Tensor, Tensor)}:
                pending = [(metric_input(o), t if (y := label_part(t)) is None else y, i) for o, t, i in pending]
            logits = torch.cat([p[0] for p in pending]).detach().float()
            if self._misaligned(len(logits), len(idx)):
                return
            if pending[0][1].ndim > 1:  # class probabilities (or (B, 1) labels)
                targets = torch.cat([p[1].reshape(len(p[0]), -1) for p in pending])
            else:
                targets = torch.cat([p[1] for p in pending])
            label, valid, p, margin, other = classify(self.mode, self._probabilities, logits, targets)
            idx = torch.where(valid, idx, trash)  # an ignored label (-100), one past the outputs, a NaN: not counted
            rows = torch.stack([torch.ones_like(p), p, p * p, (margin > 0).float(), margin])
            self._stats.index_add_(1, idx, rows)
            # scatter_, not index_put_ (a CPU index_put_ of int64 values is ~50x slower), of each item's last row
            repeats = self._repeats
            last = last_visits(idx, trash) if repeats else idx
            self._suggest[0].scatter_(0, last, other)  # the strongest other class at the last visit
            # ... and at the last visit the model got wrong: a memorized mislabeled item's true class is there
            wrong = torch.where(margin < 0, idx, trash)
            self._suggest[1].scatter_(0, last_visits(wrong, trash) if repeats else wrong, other)
            self._given.scatter_(0, last, label)

    def _misaligned(self, rows: int, items: int) -> bool:
        """A collate_fn that drops or adds items: which row is which item cannot be told (shapes: nothing read)."""
        if rows != items:
            self._off(
                f"the training batches had {rows:,} rows for {items:,} dataset items (a collate_fn that drops or "
                "adds items), so the map cannot tell which row is which item"
            )
        return rows != items

    # -- reading (host copies, consistent across the columns) ----------------------------------------
    def _settle_order(self) -> None:
        flag, self._misordered = self._misordered, None
        if flag is not None and bool(flag):  # SYNC: once a fit, when the map is read or the fit ends
            self._off(
                "the first batch's labels are not the dataset's at its indices: the collate_fn reorders (or changes) "
                "a batch's items, so the map cannot tell which row is which item"
            )

    def _columns(self) -> dict[str, Tensor]:
        self._settle_order()
        with self._lock:
            if self._stats is None:  # nothing recorded (or forgotten): every item unseen
                n = self._size or 0
                return {"stats": torch.zeros(5, n), "given": torch.full((n,), -1), "suggest": torch.full((n,), -1)}
            assert self._given is not None and self._suggest is not None
            n = self._size if self._size is not None else self._extent  # a list's numbering grows in doublings
            return {
                "stats": self._stats[:, :n].cpu().clone(),
                "given": self._given[:n].cpu().clone(),
                "suggest": torch.where(self._suggest[1, :n] >= 0, self._suggest[1, :n], self._suggest[0, :n]).cpu(),
            }

    @staticmethod
    def _mean(stats: Tensor, row: int) -> Tensor:
        visits = stats[_VISITS]
        return torch.where(visits > 0, stats[row] / visits.clamp(min=1), math.nan)

    @property
    def visits(self) -> Tensor:
        return self._columns()["stats"][_VISITS].long()

    @property
    def confidence(self) -> Tensor:
        return self._mean(self._columns()["stats"], _P)

    @property
    def variability(self) -> Tensor:
        stats = self._columns()["stats"]
        mean = self._mean(stats, _P)
        return (self._mean(stats, _P2) - mean * mean).clamp(min=0).sqrt()

    @property
    def correctness(self) -> Tensor:
        stats = self._columns()["stats"]
        if self.mode == "loss":
            return torch.full_like(stats[_P], math.nan)
        return self._mean(stats, _RIGHT)

    @property
    def aum(self) -> Tensor:
        stats = self._columns()["stats"]
        if self.mode == "loss":
            return torch.full_like(stats[_P], math.nan)
        return self._mean(stats, _MARGIN)

    @property
    def losses(self) -> Tensor | None:
        """Loss mode: each item's mean loss over its visits; else None."""
        return self._mean(self._columns()["stats"], _MARGIN) if self.mode == "loss" else None

    @property
    def given(self) -> Tensor:
        """The label each item was last trained with (-1: not seen, or not a class label)."""
        return self._columns()["given"]

    def table(self) -> dict[str, Tensor]:
        """Every column at once, from one consistent read: ``index``, ``visits``, ``confidence``, ``variability``,
        ``correctness``, ``aum``, ``given``, ``suggested``, ``score``."""
        cols = self._columns()
        stats = cols["stats"]
        confidence, loss_mode = self._mean(stats, _P), self.mode == "loss"
        nan = torch.full_like(confidence, math.nan)
        table = {
            "index": torch.arange(stats.shape[1]),
            "visits": stats[_VISITS].long(),
            "confidence": confidence,
            "variability": (self._mean(stats, _P2) - confidence**2).clamp(min=0).sqrt(),
            "correctness": nan if loss_mode else self._mean(stats, _RIGHT),
            "aum": nan if loss_mode else self._mean(stats, _MARGIN),
            "given": cols["given"],
            "suggested": cols["suggest"],
        }
        table["score"] = self._mean(stats, _MARGIN) if loss_mode else 1 - confidence
        return table

    def label_issues(self, k: int | None = None) -> LabelIssues:
        """The items whose labels training disagreed with most, most suspicious first.

        ``score`` is ``1 - confidence`` (the mean probability the model gave the label while it trained; in loss mode
        the mean loss). ``k=None``: the items the model predicted right in fewer than half of their visits (loss mode:
        the top 1%); ``k``: the ``k`` highest scores. Each :class:`LabelIssue` has ``index``, ``given``, ``suggested``
        (the class the model predicted the last time it got the item wrong, else the one it ranked after the given one;
        None in loss mode) and ``score``.
        """
        return rank_issues(self.table(), self.mode, k, self.classes)

    def label_issue_count(self, *, table: Mapping[str, Tensor] | None = None) -> int:
        """How many items ``label_issues()`` (``k=None``) lists, without building the list: what a panel shows at
        each refresh (on a dataset of 100,000 items built per refresh, the list took the panel's thread seconds).
        ``table``: one already read with :meth:`table`, so that the map is not read again (about 6 ms on 96,000
        items)."""
        return issue_count(table if table is not None else self.table(), self.mode)

    def cleaned(
        self,
        dataset: Any = None,
        *,
        drop: Iterable[Any] | None = None,
        relabel: Mapping[Any, Any] | None = None,
        target: int | str | None = None,
    ) -> CleanedDataset:
        """``dataset`` (default: the training set of the last fit) without the items dropped and with the ones
        relabeled, in the panel's cleaner (:attr:`edits`) and here (``drop``: indices or a boolean mask such as
        ``dm.confidence < 0.2``, ``relabel``: ``{index: label}``), as a view for the next fit: nothing is copied.
        The new labels go where the Trainer read each item's label (its ``num_inputs=`` / ``target_keys=``), or at
        ``target=`` (a position in each item, or a key) where it cannot tell (a ``compute_loss=``). A new label
        the model has no output for is refused here. A fit on the view clears :attr:`edits` (they are in it; the
        map's indices are then the view's).

        Example:
            >>> # clean = dm.cleaned(train_ds, relabel={i.index: i.suggested for i in dm.label_issues(20)})
        """
        dataset = dataset if dataset is not None else self._dataset
        if dataset is None:
            raise ValueError("cleaned(dataset): pass the training dataset (this map has not seen a DataLoader's).")
        spec, custom = self._layout
        view = self.edits.cleaned(
            dataset, drop=drop, relabel=relabel, target=target, spec=spec, custom=custom, classes=self._outputs
        )
        self._handed = view
        return view

    def show(self, items: Sequence[int] | None = None, k: int = 9, *, decode: Any = None) -> Gallery:
        """A gallery of training items (dataset indices, at most ``k``; default: the ``k`` most suspicious labels),
        each fetched again from the training set, captioned with its label, the suggestion and its confidence."""
        if items is None:
            items = self.label_issues(k).indices
        picked = [int(i) for i in items][: max(int(k), 0)]
        return map_gallery(self.table(), picked, self._dataset, self.classes, self.note, decode=decode)

    # -- display -----------------------------------------------------------------------------------
    def summary(self, *, table: Mapping[str, Tensor] | None = None) -> str:
        """One line: the items seen, the epochs, the mode and the likely label issues. ``table``: as in
        :meth:`label_issue_count`."""
        t = table if table is not None else self.table()
        seen = int((t["visits"] > 0).sum())
        if not seen:
            return self.note or "empty: nothing recorded yet"
        parts = [f"{format_count(seen)} items", f"{self.epochs} epochs", self.mode or "?"]
        issues = [f"{issue_count(t, self.mode)} likely label issues"] if self.mode != "loss" else []
        return " · ".join(parts + issues)

    def __repr__(self) -> str:
        return f"DataMap({self.summary()})"

    def __str__(self) -> str:
        lines = [repr(self), *([f"note: {self.note}"] if self.note else [])]
        lines += [str(issue) for issue in self.label_issues(10)] if self._stats is not None else []
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return map_html(self.table(), self.summary(), self.note, self.label_issues(10), classes=self.classes)
