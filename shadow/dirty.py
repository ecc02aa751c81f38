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
# Past this share of a table, comparing it whole (a streaming numpy pass) is cheaper than
# gathering the listed entries; the resync then counts every entry it compared.
DENSE_SHARE = 8


class WriteTracker:
    def __init__(self, guest: int, entries: int, log: EngineWriteLog | None) -> None:
        self.guest = guest  # guest VRAM address of entry 0
        self.entries = entries
        self.end = guest + entries * regs.PTE_SIZE
        self.log = log
        # one byte per entry (a bytearray: a trap sets one without making a Python
        # object), how many are set, and which -- listed until the table counts as dense,
        # so taking them costs what changed, not the table's size
        self._bits = bytearray(entries)
        self._listed: list[int] = []
        self._list_max = entries // DENSE_SHARE
        self.marked = 0
        self.seen = log.now if log is not None else 0

    def note(self, addr: int, size: int) -> None:
        """A trapped store of `size` bytes at guest address `addr` (may straddle ends)."""
        guest = self.guest
        lo = addr if addr > guest else guest
        hi = addr + size
        if hi > self.end:
            hi = self.end
        if lo < hi:
            bits = self._bits
            for i in range((lo - guest) >> 3, ((hi - 1 - guest) >> 3) + 1):
                if not bits[i]:
                    bits[i] = 1
                    self.marked += 1
                    if self.marked <= self._list_max:
                        self._listed.append(i)

    def stored(self) -> np.ndarray:
        """Entries named by trapped stores since the last take() (sorted)."""
        if not self.marked:
            return np.zeros(0, dtype=np.intp)
        if self.marked <= self._list_max:
            return np.sort(np.array(self._listed, dtype=np.intp))
        return np.flatnonzero(np.frombuffer(self._bits, dtype=np.uint8))

    def engine_written(self, host: int) -> bool:
        """Whether an engine wrote any page of the table (at host VRAM `host`) since the
        last take()."""
        return self.log is not None and self.log.now > self.seen and \
            self.log.pages_written_since(host, self.entries * regs.PTE_SIZE, self.seen).size > 0

    def pending(self, host: int) -> bool:
        return self.marked > 0 or self.engine_written(host)

    def take(self, host: int) -> np.ndarray | None:
        """The sorted entry indices to resync, forgetting them; None when so many changed
        that the caller should compare the whole table instead."""
        now = self.log.now if self.log is not None else 0
        parts = []
        dense = self.marked * DENSE_SHARE > self.entries
        if self.marked:
            bits = np.frombuffer(self._bits, dtype=np.uint8)
            if dense:
                bits[:] = 0
            else:
                idx = np.array(self._listed, dtype=np.intp)
                idx.sort()
                bits[idx] = 0
                parts.append(idx)
            self._listed = []
            self.marked = 0
        if self.log is not None and now > self.seen and not dense:
            base_page = host >> regs.SMALL_PAGE_SHIFT
            for p in self.log.pages_written_since(host, self.entries * regs.PTE_SIZE,
                                                  self.seen).tolist():
                page_addr = (base_page + p) << regs.SMALL_PAGE_SHIFT
                lo = max(0, (page_addr - host) >> 3)
                hi = min(self.entries, (page_addr + regs.SMALL_PAGE - host) >> 3)
                parts.append(np.arange(lo, hi, dtype=np.intp))
        self.seen = now
        if dense or sum(p.size for p in parts) * DENSE_SHARE > self.entries:
            return None
        if not parts:
            return np.zeros(0, dtype=np.intp)
        if len(parts) == 1:
            return parts[0]  # sorted and without duplicates already
        return np.unique(np.concatenate(parts))
