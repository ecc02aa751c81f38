"""Which entries of one guest table in VRAM changed since its last sync.

Every CPU store into a shadowed table is trapped (PRAMIN always; BAR1/BAR3 because the
mediator never remaps a page holding a known table), and the trap names the entries it
touched: they go into `dirty`.  Engine writes are not trapped; the device's engine write
log says which pages they touched, and the entries of those pages are compared with the
snapshot.  Together they give the entries an incremental resync must look at, so its
cost follows what changed, not the table's size.

Tables in the guest's RAM are written by its vCPUs without any trap: they have no
tracker and are compared whole (see shadow.page_table).
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs
from gpuvm.device.write_log import EngineWriteLog

_PER_PAGE = regs.SMALL_PAGE // regs.PTE_SIZE


class WriteTracker:
    def __init__(self, guest: int, entries: int, log: EngineWriteLog | None) -> None:
        self.guest = guest  # guest VRAM address of entry 0
        self.entries = entries
        self.end = guest + entries * regs.PTE_SIZE
        self.log = log
        self.dirty: set[int] = set()
        self.seen = log.now if log is not None else 0

    def note(self, addr: int, size: int) -> None:
        """A trapped store of `size` bytes at guest address `addr` (may straddle ends)."""
        lo = max(addr, self.guest)
        hi = min(addr + size, self.end)
        if lo < hi:
            first = (lo - self.guest) >> 3
            last = (hi - 1 - self.guest) >> 3
            if first == last:
                self.dirty.add(first)
            else:
                self.dirty.update(range(first, last + 1))

    def engine_written(self, host: int) -> bool:
        """Whether an engine wrote any page of the table (at host VRAM `host`) since the
        last take()."""
        return self.log is not None and self.log.now > self.seen and \
            self.log.pages_written_since(host, self.entries * regs.PTE_SIZE, self.seen).size > 0

    def pending(self, host: int) -> bool:
        return bool(self.dirty) or self.engine_written(host)

    def take(self, host: int) -> tuple[np.ndarray, int]:
        """(sorted candidate entry indices, how many of them are whole engine-written
        pages), forgetting them: the caller resyncs exactly these."""
        now = self.log.now if self.log is not None else 0
        parts = []
        if self.dirty:
            parts.append(np.fromiter(self.dirty, dtype=np.intp, count=len(self.dirty)))
            self.dirty = set()
        from_engines = 0
        if self.log is not None and now > self.seen:
            base_page = host >> regs.SMALL_PAGE_SHIFT
            for p in self.log.pages_written_since(host, self.entries * regs.PTE_SIZE,
                                                  self.seen).tolist():
                page_addr = (base_page + p) << regs.SMALL_PAGE_SHIFT
                lo = max(0, (page_addr - host) >> 3)
                hi = min(self.entries, lo + _PER_PAGE if page_addr >= host
                         else (page_addr + regs.SMALL_PAGE - host) >> 3)
                parts.append(np.arange(lo, hi, dtype=np.intp))
                from_engines += hi - lo
        self.seen = now
        if not parts:
            return np.zeros(0, dtype=np.intp), 0
        if len(parts) == 1:
            parts[0].sort()  # a set's or a range's: no duplicates
            return parts[0], from_engines
        return np.unique(np.concatenate(parts)), from_engines
