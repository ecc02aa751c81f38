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
    """Where the device reaches system memory (the VM's RAM through its IOMMU mappings): a view
    of a range when one buffer holds it all, so copies are array operations."""

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


class DmaMappings:
    """The IOMMU table of one device (or one vGPU): which host memory its DMA may reach,
    and at which bus addresses (iova).  A VMM fills it with VFIO_IOMMU_MAP_DMA (guest RAM at
    iova = guest-physical); every access the device makes to system memory is looked up
    here, so it is the reference monitor for sysram: nothing unmapped is reachable."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._arrays: list[np.ndarray] = []
        self._writable: list[bool] = []

    def map(self, iova: int, array: np.ndarray, writable: bool = True) -> None:
        if iova < 0 or array.size == 0 or iova % 4096 or array.size % 4096:
            raise ValueError(f"DMA map at {iova:#x} of {array.size:#x} bytes: iova and size "
                             f"must be non-empty multiples of 4 KiB")
        i = bisect_right(self._starts, iova)
        if i and self._starts[i - 1] + self._arrays[i - 1].size > iova or \
                i < len(self._starts) and iova + array.size > self._starts[i]:
            raise ValueError(f"DMA map at {iova:#x} overlaps an existing mapping")
        self._starts.insert(i, iova)
        self._arrays.insert(i, array.reshape(-1).view(np.uint8))
        self._writable.insert(i, writable)

    def unmap(self, iova: int, size: int) -> int:
        """Remove every mapping inside [iova, iova+size); returns the bytes unmapped.  A
        mapping only partly inside is an error (type1 refuses to split one too)."""
        gone = 0
        for i in reversed(range(len(self._starts))):
            start, end = self._starts[i], self._starts[i] + self._arrays[i].size
            if iova <= start and end <= iova + size:
                gone += end - start
                del self._starts[i], self._arrays[i], self._writable[i]
            elif start < iova + size and iova < end:
                raise ValueError(f"DMA unmap of [{iova:#x}, {iova + size:#x}) would split "
                                 f"the mapping at {start:#x}")
        return gone

    def ranges(self) -> list[tuple[int, int]]:
        """(start, end) of each mapping, sorted."""
        return [(s, s + a.size) for s, a in zip(self._starts, self._arrays)]

    def region(self, addr: int, length: int) -> np.ndarray | None:
        i = bisect_right(self._starts, addr) - 1
        if i < 0 or length < 0:
            return None
        off = addr - self._starts[i]
        arr = self._arrays[i]
        if off + length > arr.size:
            return None
        return arr[off:off + length]


@dataclass
class BusMap:
    """Several DMA ports at distinct bus windows (the mediator lays out every vGPU's DMA
    mappings at its partition's window), each window `size` bytes."""

    _starts: list[int] = field(default_factory=list)
    _ports: list[tuple[int, DmaPort]] = field(default_factory=list)

    def add(self, base: int, size: int, port: DmaPort) -> None:
        i = bisect_right(self._starts, base)
        if i and self._starts[i - 1] + self._ports[i - 1][0] > base or \
                i < len(self._starts) and base + size > self._starts[i]:
            raise ValueError(f"bus range at {base:#x} overlaps another")
        self._starts.insert(i, base)
        self._ports.insert(i, (size, port))

    def remove(self, base: int) -> None:
        i = self._starts.index(base)
        del self._starts[i]
        del self._ports[i]

    def region(self, addr: int, length: int) -> np.ndarray | None:
        i = bisect_right(self._starts, addr) - 1
        if i < 0 or length < 0:
            return None
        off = addr - self._starts[i]
        size, port = self._ports[i]
        if off + length > size:
            return None
        return port.region(off, length)
