"""Memory per refresh window, for the progress stream (the panel's memory chart, loggers).

Read only at the throttled refresh and only from host-side counters, so it adds no device sync:

* CUDA: ``torch.cuda.max_memory_allocated`` (the caching allocator's own bookkeeping), then
  ``reset_peak_memory_stats`` so the next reading is the peak of the next window. A user who reads
  ``max_memory_allocated`` after ``fit`` sees the last window's peak; ``Progress.memory_peak`` keeps the
  whole fit's.
* CPU: the process's resident set size now (``/proc/self/statm``; the lifetime peak from ``getrusage``
  where /proc is missing).

Capacity: the card's total memory on CUDA; on CPU the machine's RAM, or the cgroup limit when lower
(containers, CI runners).
"""

from __future__ import annotations

import logging
import os
from typing import Any

__all__ = ["MemoryProbe", "host_capacity"]

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux
    except Exception:
        log.debug("no peak resident size on this platform", exc_info=True)
        return None


def host_capacity() -> int | None:
    """The machine's RAM in bytes, or the cgroup memory limit when that is lower (None where unknown)."""
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as fh:
                limit = int(fh.read().strip())
        except (OSError, ValueError):  # "max" (no limit), or no cgroup file
            continue
        if limit > 0 and (total is None or limit < total):
            total = limit
    return total


class MemoryProbe:
    """Peak memory of each refresh window and the device's capacity, from host-side counters only."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.kind = "cuda" if getattr(device, "type", "cpu") == "cuda" else "rss"
        self.peak = 0
        self.capacity: int | None = None
        try:
            if self.kind == "cuda":
                import torch

                self.capacity = int(torch.cuda.get_device_properties(device).total_memory)
                torch.cuda.reset_peak_memory_stats(device)
            else:
                self.capacity = host_capacity()
        except Exception:
            log.debug("the device's capacity is unknown here", exc_info=True)
            self.capacity = None

    def window(self) -> int | None:
        """The peak since the previous call (CUDA) or the resident size now (CPU), in bytes."""
        value: int | None
        try:
            if self.kind == "cuda":
                import torch

                value = int(torch.cuda.max_memory_allocated(self.device))
                torch.cuda.reset_peak_memory_stats(self.device)
            else:
                value = _rss_bytes()
        except Exception:
            log.debug("the memory could not be read now: this window has no value", exc_info=True)
            return None
        if value is not None:
            self.peak = max(self.peak, value)
        return value
