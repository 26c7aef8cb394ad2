"""The caching allocator's model (nbtrainer._plan._allocator) against hand-computed cases from the documented rules of
c10/cuda/CUDACachingAllocator.cpp: 512-byte rounding, the small (<= 1 MiB) and large pools, 2 MiB small segments, a
20 MiB segment for a 1-10 MiB request, 2 MiB rounding above, best fit, the split rules, merging on free; and the
replay of a step built on it (nbtrainer._plan._reserved.replay)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nbtrainer._plan._allocator import (
    CachingAllocator,
    cublas_workspace_bytes,
    round_size,
    segment_size,
)
from nbtrainer._plan._reserved import replay
from nbtrainer._plan._timeline import Trace

KiB, MiB = 2**10, 2**20


@pytest.mark.parametrize(
    ("request_bytes", "rounded"),
    [(0, 512), (1, 512), (511, 512), (512, 512), (513, 1024), (MiB + 1, MiB + 512), (10 * MiB, 10 * MiB)],
)
def test_requests_round_up_to_512_bytes(request_bytes: int, rounded: int) -> None:
    assert round_size(request_bytes) == rounded


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MiB),  # small pool: 2 MiB segments (kSmallBuffer)
        (MiB, 2 * MiB),  # 1 MiB is still small (kSmallSize)
        (MiB + 512, 20 * MiB),  # 1-10 MiB: a 20 MiB segment (kLargeBuffer)
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # from kMinLargeAlloc: rounded to 2 MiB (kRoundLarge)
        (10 * MiB + 512, 12 * MiB),
        (33 * MiB, 34 * MiB),
    ],
)
def test_segment_sizes(size: int, segment: int) -> None:
    assert segment_size(size) == segment


def test_small_requests_share_a_2_mib_segment_until_it_is_full() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(256 * KiB) for _ in range(8)]  # 8 x 256 KiB = 2 MiB: one segment, split each time
    assert (a.reserved, a.segments, a.allocated) == (2 * MiB, 1, 2 * MiB)
    a.malloc(1)  # the segment is full: a second one, of which 512 bytes are handed out
    assert (a.reserved, a.segments, a.allocated) == (4 * MiB, 2, 2 * MiB + 512)
    for b in blocks:
        a.free(b)
    a.malloc(2 * MiB - 512)  # too large for the small pool (> 1 MiB): a large segment of its own
    assert (a.reserved, a.segments) == (4 * MiB + 20 * MiB, 3)


def test_a_large_block_is_split_only_when_more_than_1_mib_is_left() -> None:
    a = CachingAllocator()
    x = a.malloc(12 * MiB)  # a 12 MiB segment, used whole
    a.free(x)
    y = a.malloc(11 * MiB + 512)  # fits in the free 12 MiB block; 1 MiB - 512 left: not split, handed out whole
    assert a.allocated == 12 * MiB and a.reserved == 12 * MiB
    a.free(y)
    z = a.malloc(10 * MiB)  # 2 MiB left > 1 MiB: split
    assert a.allocated == 10 * MiB
    w = a.malloc(2 * MiB)  # the 2 MiB remainder serves it
    assert (a.reserved, a.segments, a.allocated) == (12 * MiB, 1, 12 * MiB)
    a.free(z)
    a.free(w)
    assert a.allocated == 0


def test_best_fit_takes_the_smallest_free_block_that_is_large_enough() -> None:
    a = CachingAllocator()
    big, mid = a.malloc(40 * MiB), a.malloc(24 * MiB)  # two segments: 40 and 24 MiB
    a.free(big)
    a.free(mid)
    a.malloc(22 * MiB)  # best fit: the 24 MiB block (2 MiB left, split), not the 40 MiB one
    a.malloc(40 * MiB)  # so the 40 MiB block is still whole for this one
    assert (a.reserved, a.segments) == (64 * MiB, 2)


def test_a_freed_block_merges_with_its_free_neighbours() -> None:
    a = CachingAllocator()
    parts = [a.malloc(5 * MiB) for _ in range(4)]  # one 20 MiB segment cut in four
    assert (a.reserved, a.segments) == (20 * MiB, 1)
    for p in parts:
        a.free(p)  # merged back into one 20 MiB block
    a.malloc(20 * MiB)  # served by the merged block: no new segment
    assert (a.reserved, a.segments) == (20 * MiB, 1)


def test_fragmentation_reserves_more_than_what_is_allocated() -> None:
    # the step pattern a planner must see: 1-10 MiB blocks leave holes a larger request cannot use
    a = CachingAllocator()
    held = [a.malloc(6 * MiB) for _ in range(6)]  # two 20 MiB segments: 3 blocks each, 2 MiB left in each
    for b in held[::2]:
        a.free(b)  # frees 3 x 6 MiB, none of them adjacent to another free block but the tails
    a.malloc(14 * MiB)  # 18 MiB is free in all, but no free block is 14 MiB: a new segment
    assert a.reserved == 40 * MiB + 14 * MiB
    assert a.allocated == 3 * 6 * MiB + 14 * MiB


def test_peak_allocated_counts_blocks_as_handed_out() -> None:
    a = CachingAllocator()
    x = a.malloc(100)  # a 512-byte block
    y = a.malloc(MiB + 1)  # MiB + 512
    a.free(x)
    assert a.peak_allocated == 512 + MiB + 512
    a.free(y)
    assert a.allocated == 0


def test_cublas_workspace_by_capability_and_config() -> None:
    assert cublas_workspace_bytes((9, 0), "") == 32 * MiB  # Hopper
    assert cublas_workspace_bytes((10, 0), "") == 32 * MiB  # Blackwell
    assert cublas_workspace_bytes((8, 0), "") == 4096 * KiB * 2 + 16 * KiB * 8  # ":4096:2:16:8"
    assert cublas_workspace_bytes(None, "") == 32 * MiB  # unknown card: the larger default
    assert cublas_workspace_bytes((8, 0), ":4096:8") == 32 * MiB
    assert cublas_workspace_bytes((8, 0), ":4096:2:16:8") == 4096 * KiB * 2 + 16 * KiB * 8


def _trace(events: list[tuple[int, int, int]]) -> Trace:
    return Trace.of(events)


def test_a_replayed_step_reuses_its_first_steps_segments() -> None:
    # one micro-batch: an activation of 30 MiB kept for backward, a 6 MiB temporary, a 12 MiB gradient
    step = _trace([(0, 1, 30 * MiB), (0, 2, 6 * MiB), (1, 2, 0), (0, 3, 12 * MiB), (2, 3, 0), (1, 1, 0)])
    one = replay(params=[12 * MiB], batch=[4 * KiB], first=step, state=[[512, 12 * MiB, 12 * MiB]], steps=1)
    two = replay(params=[12 * MiB], batch=[4 * KiB], first=step, state=[[512, 12 * MiB, 12 * MiB]], steps=2)
    three = replay(params=[12 * MiB], batch=[4 * KiB], first=step, state=[[512, 12 * MiB, 12 * MiB]], steps=3)
    # by hand, in MiB: params: a 12 segment | batch: a 2 (small) segment | activation: a 30 segment | temporary: a 20
    # segment (14 left, split), freed: 20 free again | gradient: 12 of it (8 left, split) | activation freed: 30 free
    # | step 1's state: 512 B in the small segment, the moments: 12 of the free 30 (18 left), 12 of those (6 left)
    assert one.reserved == (12 + 2 + 30 + 20) * MiB
    # step 2: the activation finds no free 30 any more (the moments took it): a new segment; the temporary takes
    # the 6 left behind them, the gradient 12 of the 20 again; step 3 finds everything it needs free
    assert two.reserved == one.reserved + 30 * MiB
    assert three.reserved == two.reserved  # the steady state: two steps are enough


def test_in_backward_drops_each_gradient_once_its_parameter_is_stepped() -> None:
    # two parameters of 12 MiB: an activation, the first gradient (complete), the second, the activation freed
    step = _trace([(0, 1, 30 * MiB), (0, 2, 12 * MiB), (2, 2, 0), (0, 3, 12 * MiB), (2, 3, 1), (1, 1, 0)])
    params, state = [12 * MiB, 12 * MiB], [[24 * MiB], [24 * MiB]]
    kept = replay(params=params, batch=[], first=step, state=state)
    dropped = replay(params=params, batch=[], first=step, state=state, in_backward=True)
    # second step: parameters 24, state 48, the activation 30 and both gradients 24 at once; in backward the first
    # gradient is gone before the second exists
    assert kept.peak_allocated == (24 + 48 + 30 + 24) * MiB
    assert dropped.peak_allocated == (24 + 48 + 30 + 12) * MiB


def test_a_later_micro_batch_adds_into_the_gradients_of_the_first() -> None:
    first = _trace([(0, 1, 30 * MiB), (0, 2, 12 * MiB), (2, 2, 0), (1, 1, 0)])
    later = _trace([(0, 1, 30 * MiB), (0, 2, 12 * MiB), (1, 2, 0), (1, 1, 0)])  # the incoming gradient, added, freed
    window = replay(params=[12 * MiB], batch=[], first=first, rest=later, micro_batches=2, state=[[24 * MiB]])
    # second step, second micro-batch: parameters 12, state 24, the window's gradient 12, activation 30, incoming 12
    assert window.peak_allocated == (12 + 24 + 12 + 30 + 12) * MiB


# Four fits on an H200 (torch 2.11, the GPU command's planner step, 2026-11-30), recorded by
# torch.cuda.memory._record_memory_history with no stacks: each event (0 alloc, 1 free completed, 2 segment
# reserved, with an id for the address and the bytes). The 106M-parameter Llama, batch 8 x 512, 4 optimizer steps:
TRACES = Path(__file__).parent / "data" / "h200_allocator_traces.npz"
ROWS = {
    "row0": "bf16-mixed",
    "row2": "bf16-mixed + adafactor + chunked loss",
    "row5": "bf16-mixed + checkpointing 0.5 of the blocks + adafactor + chunked loss",
    "row9": "bf16-mixed + checkpointing 0.75 of the blocks + adafactor + chunked loss",
}


@pytest.mark.parametrize("row", sorted(ROWS))
def test_the_rules_replay_a_real_h200_fit_to_the_segments_it_reserved(row: str) -> None:
    """The allocator's rules, fed the real allocations and frees of a fit on an H200, reserve what CUDA's caching
    allocator reserved for them: to within 2 MiB on three of the rows, 14 MiB (0.7%) on the checkpointed one, whose
    recording began with segments an earlier row left partly in use (empty_cache keeps those, and the trace does
    not show them). So where a plan's reserved bytes miss the measured ones by 5-12% (bench/RESULTS.md), the
    difference is in the predicted allocations, not in these rules."""
    events = np.load(TRACES)[row]
    a = CachingAllocator()
    live: dict[int, object] = {}
    for action, ident, size in events.tolist():
        if action == 0:
            live[ident] = a.malloc(size)
        elif action == 1 and ident in live:
            a.free(live.pop(ident))  # type: ignore[arg-type]
    reserved = int(events[events[:, 0] == 2, 2].sum())
    assert len(events) > 5_000 and reserved > 1_000 * 2**20  # a whole fit, not a fragment
    assert abs(a.reserved - reserved) <= 0.01 * reserved, (ROWS[row], a.reserved / 2**20, reserved / 2**20)
