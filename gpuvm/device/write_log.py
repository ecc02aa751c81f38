"""Which VRAM pages the GPU's own engines wrote, and when (a dirty-page log).

A CPU store into a guest page table reaches VRAM only through a trapped BAR or PRAMIN
access (or a remapped BAR page, which the mediator never grants over a shadowed table),
so the mediator learns of it at trap time.  An engine (a copy, a kernel, a semaphore
release) can write the same memory without any trap; this log is how such writes stay
visible to an incremental shadow resync without comparing whole tables.  It is the
device-side counterpart of IOMMU dirty tracking: per 4 KiB page, the sequence number of
the last engine write.  Readers keep the sequence they last looked at, so any number of
them can ask independently and nobody clears anything.

Engines run on the device's thread while the mediator syncs on a vCPU's: a write is
logged after its data is in place, and the page's sequence number is set before `now`
moves on, so a reader that notes `now` before it reads never skips a write it did not
see (at worst it looks at a page twice).
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs

_SHIFT = regs.SMALL_PAGE_SHIFT


class EngineWriteLog:
    """Which VRAM pages the engines wrote and when: engine writes are not trapped, and this is
    how an incremental shadow resync still sees them."""

    def __init__(self, vram_size: int) -> None:
        # zero-filled pages cost nothing until an engine writes there
        self._seq = np.zeros((vram_size + regs.SMALL_PAGE - 1) >> _SHIFT, dtype=np.int64)
        self.now = 0  # the sequence number of the latest write (0: none yet)

    def mark_frames(self, frames: np.ndarray) -> None:
        """Engine writes to these page-aligned VRAM addresses."""
        seq = self.now + 1
        self._seq[(frames >> np.uint64(_SHIFT)).astype(np.intp)] = seq
        self.now = seq

    def mark_range(self, addr: int, length: int) -> None:
        if length <= 0:
            return
        seq = self.now + 1
        self._seq[addr >> _SHIFT:((addr + length - 1) >> _SHIFT) + 1] = seq
        self.now = seq

    def pages_written_since(self, addr: int, length: int, seen: int) -> np.ndarray:
        """Indices (0 = the page holding `addr`) of the pages of [addr, addr + length)
        that an engine wrote after sequence number `seen`."""
        if self.now <= seen or length <= 0:
            return np.zeros(0, dtype=np.intp)
        first = addr >> _SHIFT
        return np.flatnonzero(self._seq[first:((addr + length - 1) >> _SHIFT) + 1] > seen)
