"""``Trainer(memory_budget_gb=X)``: plan at the start of the first fit, apply the best row, keep the measured peak
under X (:class:`MemoryBudget`, a part the Trainer owns).

At the first ``fit`` the planner (:func:`nbtrainer.plan_memory`) gets the model, one batch of the training data and
the trainer's device, with the switches the user set held (:meth:`MemoryBudget.kept`); the best row is applied
(precision, activation checkpointing, the optimizer kind for ``optimizer="auto"``, each batch split into
micro-batches with accumulation), said in one progress line (an ``on_control`` event ``memory_plan``, so the History,
the run store and MLflow have it too) and kept on ``trainer.memory_plan``. The first optimizer steps are measured
(:class:`nbtrainer._plan._budget.PeakCheck`); above X, the next row is applied at the next step boundary
(``memory_step_down``), with the plan's predictions scaled by its miss.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from nbtrainer._options import SWITCH
from nbtrainer._plan._budget import CHECKED_STEPS, TIMED_STEPS, PeakCheck, choose, example_batch, step_down
from nbtrainer._plan._result import check_criterion
from nbtrainer._report._format import format_bytes

if TYPE_CHECKING:
    from nbtrainer._loop._control import LiveControl
    from nbtrainer._loop._host import LoopHost
    from nbtrainer._options import BudgetOptions, MemoryOptions, SetupOptions
    from nbtrainer._plan._result import MemoryPlan, PlanRow

__all__ = ["BudgetPlan", "MemoryBudget", "check_budget"]

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """What ``memory_budget_gb``'s plan needs from the Trainer's constructor: the budget's options, the model as given
    (a copy on the meta device, taken before ``quantize=`` / ``lora=`` change it or FSDP shards it; None: the
    trainer's own model is planned) and the learning rate of an optimizer built by name."""

    options: BudgetOptions
    source: Any
    lr: float | None


def check_budget(
    budget: BudgetOptions | None,
    *,
    model: Any,
    criterion: Any,
    memory: MemoryOptions,
    setup: SetupOptions,
    strategy: Any,
) -> BudgetPlan | None:
    """``memory_budget_gb`` and the options it cannot plan with, refused when the Trainer is built (None: no budget).

    ``quantize=`` / ``lora=`` (QLoRA) and DDP / FSDP are planned: the rows keep the quantized base and the adapters,
    and plan one rank. ``compile=`` and a criterion with a teacher model (``DistillationLoss``) are refused (not
    planned yet).
    """
    if budget is None:
        return None
    budget_gb = budget.budget_gb
    if isinstance(budget_gb, bool) or not isinstance(budget_gb, (int, float)) or not budget_gb > 0:
        raise ValueError(f"memory_budget_gb must be a positive number of GiB (e.g. 16), got {budget_gb!r}.")
    if setup.compile:
        raise ValueError(
            "memory_budget_gb with compile=: compile is not planned yet (the plan simulates the eager step, and "
            "compiled code allocates otherwise). Use one of the two: the budget without compile=, or compile= "
            "without memory_budget_gb."
        )
    check_criterion(criterion, "memory_budget_gb")
    source = None
    if memory.quantize is not None or memory.lora is not None or strategy.distributed:
        from nbtrainer._plan._simulate import meta_copy

        source = meta_copy(model)
    return BudgetPlan(dataclasses.replace(budget, budget_gb=float(budget_gb)), source, setup.lr)


class MemoryBudget:
    """A Trainer's memory budget (see the module docstring). ``plan``: the :class:`MemoryPlan` once made."""

    def __init__(self, trainer: LoopHost, given: BudgetPlan, live: LiveControl) -> None:
        self._trainer, self._live = trainer, live
        self.budget_gb = given.options.budget_gb
        self.auto_optimizer = given.options.choose_optimizer
        self.keep_precision = not given.options.choose_precision
        self._lr = given.lr
        self._source = given.source  # the model as given, on meta (quantize= / lora= / DDP / FSDP), else None
        self.micro_split = 1  # each loader batch as this many forward / backward passes (the applied row's split)
        self.plan: MemoryPlan | None = None
        self.row: PlanRow | None = None
        self.kept: dict[str, Any] = {}
        self._announced = False
        from nbtrainer._plan._allocator import CUDA_CONTEXT_BYTES

        self.check = PeakCheck(
            int(self.budget_gb * GiB), trainer.device, self._over, CUDA_CONTEXT_BYTES, timed=self._measured
        )

    def kept_switches(self, memory: MemoryOptions) -> dict[str, Any]:
        """The switches the user set, held by the plan: a precision, checkpointing, an optimizer given (an
        instance, or a name other than ``"auto"``), the step in backward, chunked loss, offloading, the quantized
        base and the adapters. Under FSDP the precision too (its mixed-precision policy is set when it shards)."""
        kept: dict[str, Any] = {}
        if self.keep_precision or self._strategy()[0] == "fsdp":
            kept["precision"] = memory.precision
        if memory.quantize is not None or memory.lora is not None:
            kept[SWITCH.quantize], kept[SWITCH.lora] = memory.quantize, memory.lora
        checkpointing = memory.activation_checkpointing
        if checkpointing:  # True, k blocks or a share; a list of blocks plans as all of them
            simple = isinstance(checkpointing, (bool, int, float))
            kept[SWITCH.activation_checkpointing] = checkpointing if simple else True
        # set up when the trainer was built (hooks, the loss path, the savers): kept as they are
        for name in (SWITCH.chunked_loss, SWITCH.offload_activations, SWITCH.offload_optimizer):
            kept[name] = getattr(memory, name)
        if memory.optimizer_in_backward or not self._in_backward_possible():
            kept[SWITCH.optimizer_in_backward] = memory.optimizer_in_backward
        return kept

    def _in_backward_possible(self) -> bool:
        """Whether the plan may turn on the optimizer step in backward (what the trainer already has allows it)."""
        from nbtrainer._loop._in_backward import check_in_backward

        trainer = self._trainer
        try:
            check_in_backward(
                optimizer=trainer.optimizer,
                grad_accum_steps=trainer.grad_accum_steps,
                max_grad_norm=trainer.max_grad_norm,
                precision=trainer.precision,
                distributed=False,
                offload_optimizer=trainer.options.memory.offload_optimizer,
                callbacks=trainer.callbacks.callbacks,
            )
        except (ValueError, TypeError):
            return False
        return True

    def prepare(self, train_loader: Any) -> None:
        """Plan for the first batch and apply the best row (once per trainer: later fits keep it)."""
        if self.plan is None:
            self._plan(train_loader)
        if self.check not in self._trainer.callbacks.callbacks:
            self._trainer.callbacks.append(self.check)

    def start(self) -> None:
        """Inside the fit, after ``on_fit_start``: say what was chosen (first fit) and measure the first steps."""
        trainer = self._trainer
        if not self._announced:
            self._announced = True
            self.announce()
        self.check.arm(trainer.model, trainer.optimizer)

    def finish(self) -> None:
        """The fit's loop ended (not failed): a fit shorter than the check's steps says what it measured by then."""
        self.check.finish()

    def _plan(self, train_loader: Any) -> None:
        from nbtrainer._optimizer_kinds import counted_kind
        from nbtrainer._plan._plan import plan_memory

        trainer = self._trainer
        setup = trainer.model_setup
        memory = trainer.options.memory
        self.kept = self.kept_switches(memory)
        strategy, world_size = self._strategy()
        # "auto" rebuilds the optimizer over the parameters: not over FSDP's shards (k-bit kinds are not DTensor-aware)
        kind = None if self.auto_optimizer and strategy != "fsdp" else counted_kind(trainer.optimizer)
        if kind is None and not self.auto_optimizer:
            raise ValueError(
                f"memory_budget_gb: the planner does not know the state of {type(trainer.optimizer).__name__} (SGD: "
                "only without momentum, as optimizer='sgd' builds it). Give the optimizer by name ('adamw', "
                "'adafactor', 'adamw8bit', 'sgd', ...) or optimizer='auto' (it chooses)."
            )
        batch = example_batch(train_loader)  # one rank's, under DDP / FSDP
        ckpt = memory.activation_checkpointing if self._source is None else False
        if ckpt:  # the planner applies checkpointing to its own copy of the model
            setup.set_activation_checkpointing(False)
        try:
            plan = plan_memory(
                self._source if self._source is not None else setup.model,
                batch,
                budget_gb=self.budget_gb,
                device=trainer.device,
                criterion=trainer.criterion,
                optimizer=kind,
                keep=self.kept,
                world_size=world_size,
                strategy=strategy,
            )
        finally:
            if ckpt:
                setup.set_activation_checkpointing(ckpt)
        row = choose(plan)
        self.plan = plan
        self._apply(row, first=True)

    def _strategy(self) -> tuple[str | None, int]:
        """``(strategy, world_size)`` to plan one rank with: None on one device (or a world of one)."""
        strategy = self._trainer.strategy
        if not strategy.distributed or strategy.world_size < 2:
            return None, 1
        return ("fsdp" if strategy.shards_parameters else "ddp"), strategy.world_size

    def _apply(self, row: PlanRow, *, first: bool) -> None:
        from nbtrainer._optimizer_kinds import optimizer_kind
        from nbtrainer._setup._precision import make_scaler

        trainer = self._trainer
        memory, current = row.memory, trainer.options.memory
        if memory.precision != current.precision:
            trainer.scaler = make_scaler(memory.precision, trainer.device)
        want, have = memory.activation_checkpointing, current.activation_checkpointing
        if want != have and not (want is True and have):
            trainer.model_setup.set_activation_checkpointing(want)
        else:
            want = have
        if first and self.auto_optimizer and memory.optimizer not in (None, optimizer_kind(trainer.optimizer)):
            self._rebuild_optimizer(memory.optimizer)
        self.micro_split = row.grad_accum_steps
        applied = current.replace(  # the step in backward: its hooks attach when the loop starts
            precision=memory.precision,
            activation_checkpointing=want,
            optimizer=memory.optimizer,
            optimizer_in_backward=memory.optimizer_in_backward,
        )
        trainer.options = dataclasses.replace(trainer.options, memory=applied)
        self.row = row

    def _rebuild_optimizer(self, kind: str) -> None:
        """``optimizer="auto"``: the plan's kind, built over the same parameters before any step (no state yet)."""
        from nbtrainer._setup._model_setup import build_optimizer

        trainer = self._trainer
        assert trainer.optimizer is not None  # a budget plans a trainer that trains
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        optimizer = build_optimizer(kind, params, self._lr, device=trainer.device)
        trainer.optimizer = trainer.model_setup.optimizer = optimizer

    def describe(self, row: PlanRow) -> str:
        assert self.plan is not None
        kept = sorted(k for k, v in self.kept.items() if v)
        return (
            f"{row.describe()}: predicted peak {format_bytes(row.peak_bytes)} of the {self.budget_gb:g} GiB budget "
            f"on {self.plan.device} ({row.time_factor:.2f}x the time of plain fp32"
            + (f"; kept as you set them: {', '.join(kept)}" if kept else "")
            + ")"
        )

    def announce(self) -> None:
        """The plan's choice as one ``on_control`` event (a progress line, the History, the run store)."""
        if self.row is not None:
            self._live.event("memory_plan", None, self.describe(self.row))

    def _measured(
        self, peak: int, seconds: float | None, *, peak_steps: int = CHECKED_STEPS, timed_steps: int = TIMED_STEPS
    ) -> None:
        """The measured peak and step time of the applied row, beside what the plan predicted (an ``on_control``
        event ``memory_check``: a progress line, the History, the run store). The time factor is relative to plain
        fp32, so ``seconds / time_factor`` is what plain fp32 would take if the cost model is right. A fit that
        ended before the check's steps were done says over how many steps each figure is (``seconds`` None: none
        was timed), so that a short run's figures are not read as the steady state's."""
        row = self.row
        if row is None:
            return
        on_cuda = self._trainer.device.type == "cuda"
        predicted = row.reserved_bytes if on_cuda else row.peak_bytes
        # before the optimizer's second step its state may not all be there yet: the plan predicts the steady state
        over = f" over {peak_steps} step{'s' * (peak_steps != 1)}" if peak_steps < CHECKED_STEPS else ""
        first = CHECKED_STEPS + 1
        if seconds is None:
            time = (
                f"step time not measured (the fit ended before steps {first}-{first + TIMED_STEPS - 1}, the timed ones)"
            )
        else:
            of = f" over {timed_steps} of the {TIMED_STEPS} timed steps" if timed_steps < TIMED_STEPS else ""
            time = (
                f"step time {seconds * 1000:.0f} ms{of} (predicted {row.time_factor:.2f}x the time of plain fp32: "
                f"plain fp32 would take about {seconds / max(row.time_factor, 1e-9) * 1000:.0f} ms)"
            )
        self._live.event(
            "memory_check",
            None,
            f"{row.describe()}: measured peak {format_bytes(peak)}{over} ({'reserved' if on_cuda else 'tensors'}; "
            f"predicted {format_bytes(predicted)}), {time}",
        )

    def _over(self, measured: int) -> None:
        """The measured peak went past the budget (training thread, at a step boundary)."""
        trainer, plan, current = self._trainer, self.plan, self.row
        assert plan is not None and current is not None
        kind = trainer.options.memory.optimizer
        nxt = step_down(plan, current, measured, optimizer=kind)
        if nxt is None:
            self._live.event(
                "memory_step_down",
                current.describe(),
                f"measured peak {format_bytes(measured)} is over the {self.budget_gb:g} GiB budget and no smaller "
                "row is left: stopping (a smaller batch, LoRA, or a bigger device would help)",
            )
            trainer.request_stop(f"memory_budget_gb={self.budget_gb:g}: measured peak {format_bytes(measured)}")
            return

        def apply() -> None:
            self._apply(nxt, first=False)
            self._live.event(
                "memory_step_down",
                current.describe(),
                f"{nxt.describe()} (measured peak {format_bytes(measured)} was over the {self.budget_gb:g} GiB budget)",
            )
            self.check.arm(trainer.model, trainer.optimizer)

        self._live.requests.submit(apply)  # run by the loop at this step boundary, then the precision is re-read
