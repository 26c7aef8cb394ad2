"""A ``DataMap`` in a checkpoint: its running tensors are saved with the run (the callbacks' ``state_dict``) and
loaded when a run resumes from that checkpoint or rolls back to it.

A run resumed from an earlier checkpoint trains the steps after it again. Without the map's state in the checkpoint,
a map reused for the resumed run counted those steps twice, and a new map (a new process) had only the steps after
the checkpoint. With it, the map is what it was at the checkpoint, and each step trained counts once. A checkpoint
without a map's state (written by a run without the map) cannot take back what the map recorded after it: the map
then starts again from the checkpoint, and says so (``DataMap.on_fit_start``).

Under DDP each rank maps its own share of the items and the checkpoint holds one rank's callbacks: no map is saved,
and a resumed map starts from the checkpoint.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_map_state", "map_state", "move_map"]

_TENSORS = ("stats", "given", "suggest")


def map_state(dm: Any) -> dict[str, Any]:
    """What ``dm`` (a ``DataMap``) has recorded, its waiting rows reduced first, on the CPU: plain values and
    tensors (a checkpoint loads with ``weights_only=True``). ``DataMap.state_dict``."""
    dm._reduce()
    with dm._lock:
        state: dict[str, Any] = {"size": dm._size, "extent": dm._extent, "epochs": dm.epochs}
        if dm._stats is not None and dm.mode != "off" and not dm._per_rank:
            state.update({name: getattr(dm, f"_{name}").cpu().clone() for name in _TENSORS})
        return state


def load_map_state(dm: Any, state: dict[str, Any]) -> None:
    """``dm`` back to ``state`` (a checkpoint's), on its device; the rows still waiting are of steps after the
    checkpoint, trained again: they go. ``DataMap.load_state_dict``."""
    with dm._lock:
        dm._pending, dm._rows, dm._misordered = [], 0, None
        dm._size, dm._extent, dm.epochs = state.get("size"), int(state.get("extent", 0)), int(state.get("epochs", 0))
        dm._through = 0  # it holds the checkpoint's steps: a resume from it takes nothing back
        dm.updates += 1
        stats, given, suggest = (state.get(name) for name in _TENSORS)
        if stats is None or given is None or suggest is None:  # none saved (under DDP, or nothing recorded yet)
            dm._stats = dm._given = dm._suggest = None
        else:
            dm._stats, dm._given, dm._suggest = stats.to(dm._device), given.to(dm._device), suggest.to(dm._device)


def move_map(dm: Any, device: Any) -> None:
    """``dm``'s running tensors to ``device``: a map carried on by a fit on another device, or loaded from a
    checkpoint before its fit started."""
    with dm._lock:
        dm._device, held = device, (dm._stats, dm._given, dm._suggest)
        dm._stats, dm._given, dm._suggest = (t.to(device) if t is not None else None for t in held)
