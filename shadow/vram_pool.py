"""First-fit allocation over a range of VRAM (partitions, the hypervisor's shadow area)."""

from __future__ import annotations

from bisect import insort


class PoolExhausted(Exception):
    """No free range is large enough."""


class VramPool:
    def __init__(self, base: int, size: int, name: str = "pool") -> None:
        self.base, self.size, self.name = base, size, name
        self._free: list[tuple[int, int]] = [(base, size)]  # sorted (address, length)
        self._used: dict[int, int] = {}

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
                return start
        raise PoolExhausted(f"{self.name}: no {size:#x} bytes free (aligned {align:#x})")

    def free(self, addr: int) -> None:
        size = self._used.pop(addr)
        insort(self._free, (addr, size))
        merged: list[tuple[int, int]] = []
        for a, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((a, n))
        self._free = merged

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())
