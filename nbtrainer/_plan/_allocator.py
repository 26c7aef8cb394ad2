"""The CUDA caching allocator's rules, simulated: what ``torch.cuda.max_memory_reserved`` reaches for a sequence of
allocations and frees.

PyTorch never returns device memory to CUDA while a program runs (unless an allocation fails): it asks
``cudaMalloc`` for *segments* and hands out *blocks* of them. A training step whose tensors sum to X therefore
reserves more than X. The rules, with the names of their constants in ``c10/cuda/CUDACachingAllocator.cpp``
(PyTorch 2.x; the same in the 2.13 this project runs):

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``, ``round_size``);
* requests up to 1 MiB (``kSmallSize``) come from the *small* pool, larger ones from the *large* pool; the two
  never share a segment (``get_pool``);
* a request is served by the smallest free block of its pool that is large enough, the lowest address among equal
  sizes (``get_free_block``: a set ordered by size, then address);
* with no such block a new segment is reserved (``get_allocation_size``): 2 MiB for a small request
  (``kSmallBuffer``); 20 MiB for a large request under 10 MiB (``kLargeBuffer``, ``kMinLargeAlloc``); else the
  request rounded up to a multiple of 2 MiB (``kRoundLarge``);
* the block found is split when what is left is worth keeping (``should_split``): at least 512 bytes in the small
  pool, more than 1 MiB in the large pool; otherwise the whole block is handed out (``max_memory_allocated``
  counts it whole);
* a freed block merges with free neighbours of its segment (``try_merge_blocks``) and goes back to its pool;
* expandable segments are off by default (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` turns them on),
  ``max_split_size_mb`` is unlimited, ``roundup_power2_divisions`` unset: these defaults are what is simulated.
  Segments are released only when ``cudaMalloc`` fails (then cached free segments go back and the request is
  retried): a prediction without releases is the most a step can reserve.

One stream is assumed (the default stream: forward, backward and the optimizer step all run there).

Memory the allocator hands out that no tensor of the step shows: cuBLAS's workspace, one per (thread, stream)
(``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``getChosenWorkspaceSize``, 32 MiB on compute capability 9.x / 10.x /
12.x, else ``4096 * 1024 * 2 + 16 * 1024 * 8`` bytes, or what ``CUBLAS_WORKSPACE_CONFIG`` says; cuBLASLt shares it
by default, ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``). Forward runs on the Python thread and backward on autograd's
device thread: two workspaces.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Iterable

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "CachingAllocator",
    "cublas_workspace_bytes",
    "round_size",
    "segment_size",
]

MiB = 2**20
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MiB  # kSmallSize: the largest "small" allocation
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: "small" allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: allocations between 1 and 10 MiB may use a 20 MiB segment
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: larger segments are rounded up to 2 MiB

#: What a CUDA context takes on the device outside the allocator (the driver's context, the loaded kernels, cuBLAS
#: and cuDNN handles), which ``fits`` adds on CUDA targets. It depends on the card, the driver and lazy module
#: loading (CUDA >= 11.7 loads kernels as they are first used). bench/gpu_check.py records it as device memory in use
#: minus the allocator's reserved bytes: 769 MiB on an H200 (driver 580, CUDA 13.0, torch 2.11) after training a
#: Llama, where 512 MiB had been assumed (bench/RESULTS.md, 2026-11-30).
CUDA_CONTEXT_BYTES = 770 * MiB


def round_size(nbytes: int) -> int:
    """A request as the allocator rounds it: a multiple of 512 bytes, at least 512 (``round_size``).

    Example:
        >>> round_size(1), round_size(512), round_size(513)
        (512, 512, 1024)
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return -(-nbytes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def segment_size(size: int) -> int:
    """The segment reserved for a rounded request no free block can serve (``get_allocation_size``).

    Example:
        >>> [segment_size(s) // 2**20 for s in (512, 2**20, 2**20 + 512, 10 * 2**20, 10 * 2**20 + 512)]
        [2, 2, 20, 10, 12]
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def cublas_workspace_bytes(capability: tuple[int, int] | None = None, config: str | None = None) -> int:
    """cuBLAS's workspace per (thread, stream), as PyTorch sizes it (``getChosenWorkspaceSize``).

    Args:
        capability: the card's compute capability; None (unknown: planning a CUDA target without one) takes the
            larger default, Hopper's and Blackwell's 32 MiB.
        config: ``CUBLAS_WORKSPACE_CONFIG`` (``":SIZE_KIB:COUNT"`` pairs); default: the environment's.

    Example:
        >>> cublas_workspace_bytes((8, 0), ""), cublas_workspace_bytes((9, 0), ""), cublas_workspace_bytes(None, ":4:8")
        (8519680, 33554432, 32768)
    """
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG", "") if config is None else config
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    if pairs:
        return sum(int(size) * 1024 * int(count) for size, count in pairs)
    if capability is None or capability[0] in (9, 10, 12):
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


class _Block:
    __slots__ = ("addr", "allocated", "next", "prev", "size", "small")

    def __init__(self, addr: int, size: int, small: bool, prev: _Block | None, nxt: _Block | None) -> None:
        self.addr, self.size, self.small = addr, size, small
        self.prev, self.next = prev, nxt
        self.allocated = False


class CachingAllocator:
    """The caching allocator's bookkeeping (see the module docstring), without memory.

    Attributes:
        reserved: bytes of all segments (``torch.cuda.memory_reserved``; never released here, so also its peak).
        allocated: bytes of the blocks handed out now (``torch.cuda.memory_allocated``).
        peak_allocated: the most ``allocated`` reached (``torch.cuda.max_memory_allocated``).
        segments: how many segments were reserved.

    Example:
        >>> a = CachingAllocator()
        >>> x = a.malloc(3 * 2**20)  # 1-10 MiB: a 20 MiB segment, split
        >>> y = a.malloc(3 * 2**20)  # served by the rest of it
        >>> a.reserved // 2**20, a.allocated // 2**20, a.segments
        (20, 6, 1)
    """

    def __init__(self) -> None:
        # per pool (small: True / large: False), the free blocks as a list sorted by (size, address)
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._by_addr: dict[int, _Block] = {}
        self._next_segment = 0
        self.reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self.segments = 0

    def _insert(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr))
        self._by_addr[block.addr] = block

    def _remove(self, block: _Block) -> None:
        free = self._free[block.small]
        i = bisect.bisect_left(free, (block.size, block.addr))
        del free[i]
        del self._by_addr[block.addr]

    def malloc(self, nbytes: int) -> _Block:
        """Serve a request of ``nbytes`` (a tensor's storage); returns the block to :meth:`free` later."""
        size = round_size(nbytes)
        small = size <= K_SMALL_SIZE
        free = self._free[small]
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            _, addr = free.pop(i)
            block = self._by_addr.pop(addr)
        else:
            seg = segment_size(size)
            block = _Block(self._next_segment, seg, small, None, None)
            self._next_segment += seg + K_ROUND_LARGE  # segments are never adjacent: blocks merge within one only
            self.reserved += seg
            self.segments += 1
        rest = block.size - size
        if rest >= K_MIN_BLOCK_SIZE if small else rest > K_SMALL_SIZE:
            tail = _Block(block.addr + size, rest, small, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert(tail)
        block.allocated = True
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        return block

    def free(self, block: _Block) -> None:
        """Give ``block`` back: merged with its free neighbours, it serves later requests of its pool."""
        self.allocated -= block.size
        block.allocated = False
        prev = block.prev
        if prev is not None and not prev.allocated:
            self._remove(prev)
            prev.size += block.size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._insert(block)

    def malloc_all(self, sizes: Iterable[int]) -> list[_Block]:
        return [self.malloc(n) for n in sizes]
