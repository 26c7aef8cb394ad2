"""One training step run on fake tensors: what it allocates beyond the parameters, on the target device, at peak.

The model may live on the meta device (an 8B decoder built from its config under ``torch.device("meta")``): it is
copied structurally onto the meta device (no storage), its parameters and the batch become ``FakeTensor``s that
claim the *target* device (``"cuda"`` need not be present), and the Trainer's own step runs on them: forward and
loss under the precision's autocast (fake CUDA tensors take the CUDA autocast rules), activation checkpointing
applied by the Trainer's own code, the chunked causal-LM loss, activations saved to host RAM for
``offload_activations``, then backward. :class:`~nbtrainer._memory._peak.PeakTracker` follows every storage an operator
creates on the target device (its reads are left out: the parameters and the batch are counted by arithmetic), so
the result is the peak of activations, temporaries, the loss head's logits and their gradients, and the gradients
as backward creates them, all at the moment they coexist. Nothing of the model's size is allocated: fake tensors
carry shapes and dtypes only, and the cost grows with the number of operators, not their size.

What fake tensors cannot run (bitsandbytes' 4-bit parameters, k-bit optimizer states) is arithmetic in
:mod:`nbtrainer._plan._arithmetic`; the planner adds the two.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nbtrainer._data._batch import BatchSpec, iter_tensors, loss_attribute, loss_from_outputs
from nbtrainer._memory._peak import PeakTracker
from nbtrainer._plan._timeline import BACKWARD_STARTS, FORWARD_STARTS, GRAD, MARK, PACK, UNPACK, Trace

__all__ = ["SimulatedStep", "empty_batch", "meta_copy", "simulate_step"]


@dataclass(frozen=True)
class SimulatedStep:
    """What one simulated step allocated on the target device, beyond the parameters and the batch.

    Attributes:
        peak: the largest total of live bytes (activations, temporaries, logits, gradients so far).
        at_peak: that total split into ``activations`` (everything but gradients) and ``gradients``.
        gradients: the gradients alive once backward ends.
        batch: the batch's bytes on the device.
        largest_activations: the largest total of everything but gradients (the peak when each gradient is
            applied and dropped at once, ``optimizer_in_backward``).
        logits_loss: what the model returns (the loss head's logits), alive until after backward.
    """

    peak: int
    at_peak: dict[str, int]
    gradients: int
    batch: int
    largest_activations: int = 0
    logits_loss: int = 0
    #: the allocations in order (:mod:`nbtrainer._plan._timeline`): what the caching allocator is replayed with
    trace: Trace | None = None
    #: the trained parameters' ``(numel, element_size, shape)``, in the order the trace's gradient events number them
    trained: tuple[tuple[int, int, tuple[int, ...]], ...] = ()


def meta_copy(model: nn.Module) -> nn.Module:
    """A structural copy of ``model`` with every parameter and buffer on the meta device (ties kept, no storage).

    The user's model is not touched; a model on a real device is not copied in memory either.
    """
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) in memo:
            continue
        empty = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
    return copy.deepcopy(model, memo)


def _to_fake(model: nn.Module, device: torch.device) -> None:
    """Replace ``model``'s parameters and buffers in place with fake tensors on ``device`` (inside a FakeTensorMode);
    a tensor shared by two modules (tied weights) stays shared."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for table in tables:
            for name, t in list(table.items()):
                if t is None:
                    continue
                new = done.get(id(t))
                if new is None:
                    fake = torch.empty(t.shape, dtype=t.dtype, device=device)
                    new = nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else fake
                    done[id(t)] = new
                table[name] = new


def empty_batch(obj: Any, device: torch.device, rows: tuple[int, int] | None = None) -> Any:
    """The batch with each tensor replaced by one of its shape and dtype on ``device`` (fake under a FakeTensorMode,
    storage-free on ``meta``; integer tensors such as token ids are zeros: only shapes matter for memory).
    ``rows=(old, new)``: tensors whose first dimension is ``old`` get ``new`` rows (another micro-batch size)."""
    if isinstance(obj, torch.Tensor):
        shape = tuple(obj.shape)
        if rows is not None and obj.dim() > 0 and shape[0] == rows[0]:
            shape = (rows[1], *shape[1:])
        return torch.zeros(shape, dtype=obj.dtype, device=device)
    if isinstance(obj, Mapping):
        return {k: empty_batch(v, device, rows) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
        return type(obj)(empty_batch(v, device, rows) for v in obj)
    if isinstance(obj, tuple):  # a namedtuple
        return type(obj)(*(empty_batch(v, device, rows) for v in obj))
    return obj


def surrogate_loss(outputs: Any, targets: Any) -> torch.Tensor:
    """The loss a plan assumes without a criterion: cross-entropy for class targets, MSE for float targets shaped
    like the outputs, else the sum of the outputs' means (what each keeps for backward is what matters)."""
    out = next((t for t in iter_tensors(outputs) if t.is_floating_point()), None)
    if out is None:
        raise ValueError("The model's output has no floating-point tensor: nothing to backpropagate.")
    if isinstance(targets, torch.Tensor):
        if not targets.is_floating_point() and out.dim() >= 2 and targets.dim() == out.dim() - 1:
            return nn.functional.cross_entropy(out.float(), targets)
        if targets.is_floating_point() and targets.shape == out.shape:
            return nn.functional.mse_loss(out.float(), targets.float())
    return torch.stack([t.float().mean() for t in iter_tensors(outputs) if t.is_floating_point()]).sum()


def simulate_step(
    model: nn.Module,
    batch: Any,
    *,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    checkpointing: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None,
    criterion: Callable | None,
    offload_activations: bool,
    accumulating: bool = False,
    prepare: Callable[[nn.Module], Any] | None = None,
    blocks: str | None = None,
) -> SimulatedStep:
    """Run one forward, loss and backward of a meta copy of ``model`` on fake tensors claiming ``device``.

    Args:
        model: the model (any device, meta included); a meta copy is made, the model is not changed.
        batch: one example batch of the size to simulate (real or meta tensors).
        device: the device the fake tensors claim. A CUDA target on a build without CUDA is simulated on the CPU
            (autograd needs the device's runtime even for fake tensors): the caller passes ``cpu`` then.
        autocast_dtype: the mixed precision's dtype, or None for fp32.
        checkpointing: apply activation checkpointing as ``Trainer(activation_checkpointing=...)`` does (``True``,
            ``k`` blocks or a share of them).
        loss_fn: ``fn(model, batch) -> loss`` (the chunked causal-LM loss), else the batch protocol with
            ``criterion`` (or the model's ``.loss``, else :func:`surrogate_loss`).
        offload_activations: saved tensors go to host RAM (as ``Trainer(offload_activations=True)``).
        accumulating: a later micro-batch of an accumulation window: every gradient exists already (counted by the
            caller) and backward adds each new one into it, so only the incoming gradients are transient here (the
            planner derives this from the plain step's trace: :func:`nbtrainer._plan._timeline.accumulating`).
        prepare: called with the meta copy before anything runs (freezing, adapters).
        blocks: the qualified name of the ``nn.ModuleList`` of repeated blocks: the trace marks where each block's
            forward and backward begin (:data:`nbtrainer._plan._timeline.MARK`), so a deeper stack's trace can be put
            together from it (:func:`nbtrainer._plan._timeline.synthesize`).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from nbtrainer._setup._activation_checkpointing import enable_activation_checkpointing

    clone = meta_copy(model)
    clone.train()
    if prepare is not None:
        prepare(clone)
    if checkpointing:
        enable_activation_checkpointing(clone, checkpointing)
    spec = BatchSpec(pass_targets_to_model=criterion is None)
    with FakeTensorMode(allow_non_fake_inputs=False):
        _to_fake(clone, device)
        fake = empty_batch(batch, device)
        # the parameters and the batch are counted by arithmetic: not them, nor their views (a transposed weight)
        if accumulating:
            for p in clone.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        grads = [p.grad for p in clone.parameters() if p.grad is not None]
        fixed = [*clone.parameters(), *clone.buffers(), *iter_tensors(fake), *grads]
        tracker = PeakTracker(count_reads=False, device_type=device.type, exclude=fixed)
        events: list[tuple[int, int, int]] = []
        tracker.trace = events
        batch_bytes = sum(t.numel() * t.element_size() for t in iter_tensors(fake))
        trained = [p for p in clone.parameters() if p.requires_grad]

        def grad_ready(p: torch.Tensor, index: int) -> None:
            # complete: counted apart from the rest, so the largest total of the rest is the peak of a step that
            # applies and drops each gradient at once (optimizer_in_backward)
            tracker.label(p.grad, "gradients")  # type: ignore[arg-type]  # set: the hook runs after accumulation
            events.append((GRAD, tracker.birth(p.grad), index))  # type: ignore[arg-type]

        hooks = [
            p.register_post_accumulate_grad_hook(functools.partial(grad_ready, index=i)) for i, p in enumerate(trained)
        ]
        if blocks is not None:
            hooks += _mark_blocks(clone.get_submodule(blocks), events)
        with tracker, _one_sequence_per_row(batch), contextlib.ExitStack() as stack:
            if autocast_dtype is not None:
                stack.enter_context(torch.autocast(device.type, dtype=autocast_dtype))
            if offload_activations:  # as save_on_cpu: what backward keeps waits off the device, and comes back
                offloaded = _Offloaded(tracker, events)
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(offloaded.pack, offloaded.unpack))
            outputs = targets = None
            if loss_fn is not None:
                loss = loss_fn(clone, fake)
            else:
                args, kwargs, targets = spec.split(fake)
                outputs = clone(*args, **kwargs)
                if criterion is None and isinstance(loss_attribute(outputs), torch.Tensor):
                    loss = loss_from_outputs(None, outputs, targets)
                elif criterion is not None:
                    loss = criterion(outputs, targets)
                else:
                    loss = surrogate_loss(outputs, targets)
            stack.close()  # autocast covers forward and loss; backward runs outside it, as in the Trainer
            returned = {
                id(t.untyped_storage()): t.untyped_storage().nbytes()
                for t in iter_tensors(outputs)
                if t.is_floating_point() and t.device.type == device.type and t.dim() > 0
            }
            # the Trainer holds the outputs (for metrics) until after backward: so does the simulation
            loss.backward()
            del outputs, targets, loss
        for h in hooks:
            h.remove()
        gradients = sum(p.grad.numel() * p.grad.element_size() for p in clone.parameters() if p.grad is not None)
    grads_at_peak = tracker.breakdown.get("gradients", 0)
    return SimulatedStep(
        peak=tracker.peak_bytes,
        at_peak={"activations": tracker.peak_bytes - grads_at_peak, "gradients": grads_at_peak},
        gradients=gradients,
        batch=batch_bytes,
        largest_activations=tracker.largest.get("activations", 0),
        logits_loss=sum(returned.values()),
        trace=Trace.of(events),
        trained=tuple((p.numel(), p.element_size(), tuple(p.shape)) for p in trained),
    )


@contextlib.contextmanager
def _one_sequence_per_row(batch: Any) -> Any:
    """Hugging Face decoders called without a cache and without an attention mask (the chunked loss calls the
    decoder with ``use_cache=False``) look in the position ids for several sequences packed into one row, a check
    on values that ``transformers`` skips for fake tensors, assuming packed rows: it then builds a 4-D mask and runs
    attention through the masked path (grouped keys and values repeated, a float mask saved per layer) where the
    real step runs the causal kernel without a mask. Without ``position_ids`` in the batch the model makes them
    itself (``arange``: one sequence per row), so the real check finds no packing: the simulation answers the
    same. A batch that brings its own position ids keeps transformers' assumption (their values are not
    simulated)."""
    import sys

    masking = sys.modules.get("transformers.masking_utils")
    given = isinstance(batch, Mapping) and "position_ids" in batch
    if masking is None or given or not hasattr(masking, "find_packed_sequence_indices"):
        yield
        return
    original = getattr(masking, "find_packed_sequence_indices")  # noqa: B009 (a module typed as ModuleType)
    setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)  # noqa: B010
    try:
        yield
    finally:
        setattr(masking, "find_packed_sequence_indices", original)  # noqa: B010


class _Offloaded:
    """``save_on_cpu`` for the simulation: what backward keeps waits off the device and comes back when used. A meta
    copy stands for the host copy (not on the target device, so not counted there, whatever the device the
    simulation runs on); a parameter stays where it is, as ``save_on_cpu`` leaves it too. The trace marks each
    saved storage (PACK, its id, the pack's number) and each copy brought back (UNPACK, the copy's id, the pack's
    number): the same step without offloading follows from it (:func:`nbtrainer._plan._timeline.kept_on_device`)."""

    def __init__(self, tracker: PeakTracker, events: list[tuple[int, int, int]]) -> None:
        self.tracker, self.events = tracker, events
        self.packs = 0

    def pack(self, t: torch.Tensor) -> tuple[torch.device, torch.Tensor, int]:
        if isinstance(t, nn.Parameter):
            return t.device, t, -1
        self.packs += 1
        self.events.append((PACK, self.tracker.birth(t), self.packs))
        return t.device, torch.empty_like(t, device="meta"), self.packs

    def unpack(self, packed: tuple[torch.device, torch.Tensor, int]) -> torch.Tensor:
        device, t, number = packed
        if t.device == device:
            return t
        back = torch.empty_like(t, device=device)
        self.events.append((UNPACK, self.tracker.birth(back), number))
        return back


def _mark_blocks(stack: nn.Module, events: list[tuple[int, int, int]]) -> list[Any]:
    """Hooks that mark, in ``events``, where each block of ``stack`` begins its forward (a forward pre-hook) and its
    backward (a hook on the gradient of its output). A recomputation under checkpointing calls the block's forward
    function, not the module: no mark."""
    handles = []

    def output_grad(_grad: torch.Tensor, index: int) -> None:
        events.append((MARK, BACKWARD_STARTS, index))

    def forward_start(_module: nn.Module, _args: Any, index: int) -> None:
        events.append((MARK, FORWARD_STARTS, index))

    def forward_end(_module: nn.Module, _args: Any, output: Any, index: int) -> None:
        out = next((t for t in iter_tensors(output) if t.requires_grad), None)
        if out is not None and torch.is_grad_enabled():
            out.register_hook(functools.partial(output_grad, index=index))

    for i, block in enumerate(stack.children()):
        handles.append(block.register_forward_pre_hook(functools.partial(forward_start, index=i)))
        handles.append(block.register_forward_hook(functools.partial(forward_end, index=i)))
    return handles
