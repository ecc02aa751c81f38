"""First-fit allocation over a range of VRAM (partitions, the hypervisor's shadow area)."""

from __future__ import annotations

from bisect import bisect_right, insort
from typing import Callable


class PoolExhausted(Exception):
    """No free range is large enough."""


class VramPool:
    """`scrub(addr, size)`, when given, zeroes a range as it is handed out and as it comes
    back: memory the device walked (a page table, an instance block) never reaches its
    next user with the old words in it, so no guest-influenced word left there can be
    read later as a former table's address."""

    def __init__(self, base: int, size: int, name: str = "pool",
                 scrub: Callable[[int, int], None] | None = None) -> None:
        self.base, self.size, self.name = base, size, name
        self._free: list[tuple[int, int]] = [(base, size)]  # sorted (address, length)
        self._used: dict[int, int] = {}
        self._starts: list[int] = []  # sorted keys of _used (what `allocated` searches)
        self.scrub = scrub

    def alloc(self, size: int, align: int = 4096) -> int:
        size = (size + 4095) & ~4095
        for i, (addr, length) in enumerate(self._free):
            start = (addr + align - 1) & ~(align - 1)
            if start + size <= addr + length:
                del self._free[i]
                if start > addr:
                    insort(self._free, (addr, start - addr))
                if start + size < addr + length:
                    insort(self._free, (start + size, addr + length - start - size))
                self._used[start] = size
                insort(self._starts, start)
                if self.scrub is not None:
                    self.scrub(start, size)
                return start
        raise PoolExhausted(f"{self.name}: no {size:#x} bytes free (aligned {align:#x})")

    def free(self, addr: int) -> None:
        size = self._used[addr]
        self._starts.remove(addr)
        del self._used[addr]
        if self.scrub is not None:
            self.scrub(addr, size)
        insort(self._free, (addr, size))
        merged: list[tuple[int, int]] = []
        for a, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((a, n))
        self._free = merged

    def __deepcopy__(self, _memo: dict) -> "VramPool":
        """A copy for planning (what would fit): same ranges, and it scrubs nothing."""
        twin = VramPool(self.base, self.size, self.name)
        twin._free, twin._used = list(self._free), dict(self._used)
        twin._starts = list(self._starts)
        return twin

    def allocated(self, lo: int, hi: int) -> bool:
        """Whether [lo, hi) lies inside one range handed out and not yet freed."""
        starts = self._starts
        i = bisect_right(starts, lo) - 1
        if i < 0:
            return False
        start = starts[i]
        size = self._used.get(start)
        return size is not None and hi <= start + size
