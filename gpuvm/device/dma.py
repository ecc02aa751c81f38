"""The DMA port: how the device reaches system memory.

The VMM decides which host memory the GPU may touch by giving the device a port; the
device never addresses host memory itself.  A port serves an address space of "bus
addresses" (guest-physical for a device owned by one VM; host-side addresses laid out by
the mediator when several VMs share the GPU) and answers with numpy views of the backing
buffers, so DMA is a vectorized copy with no intermediate bytes objects.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class DmaPort(Protocol):
    def region(self, addr: int, length: int) -> np.ndarray | None:
        """A writable uint8 view of [addr, addr+length) if one backing buffer holds it all."""
        ...


class NoSysram:
    """The port of a device nobody gave system memory to: every DMA fails."""

    def region(self, addr: int, length: int) -> np.ndarray | None:
        return None


@dataclass
class RamPort:
    """One buffer at bus address `base` (a single VM's RAM seen at guest-physical 0)."""

    array: np.ndarray
    base: int = 0

    def region(self, addr: int, length: int) -> np.ndarray | None:
        off = addr - self.base
        if off < 0 or length < 0 or off + length > self.array.size:
            return None
        return self.array[off:off + length]


@dataclass
class BusMap:
    """Several buffers at distinct bus addresses (the mediator lays out all VMs' RAM)."""

    _starts: list[int] = field(default_factory=list)
    _arrays: list[np.ndarray] = field(default_factory=list)

    def add(self, base: int, array: np.ndarray) -> None:
        i = bisect_right(self._starts, base)
        if i and self._starts[i - 1] + self._arrays[i - 1].size > base or \
                i < len(self._starts) and base + array.size > self._starts[i]:
            raise ValueError(f"bus range at {base:#x} overlaps another")
        self._starts.insert(i, base)
        self._arrays.insert(i, array)

    def remove(self, base: int) -> None:
        i = self._starts.index(base)
        del self._starts[i]
        del self._arrays[i]

    def region(self, addr: int, length: int) -> np.ndarray | None:
        i = bisect_right(self._starts, addr) - 1
        if i < 0 or length < 0:
            return None
        off = addr - self._starts[i]
        arr = self._arrays[i]
        if off + length > arr.size:
            return None
        return arr[off:off + length]
