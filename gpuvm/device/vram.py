"""VRAM: one shared mapping of a memfd, viewed as numpy.

A shared mapping (not a numpy allocation) so that a slice of VRAM can also be a KVM
memslot -- BAR remap maps guest pages straight onto it.  It is a memfd rather than an
anonymous mapping so that another process (a VMM attached over vfio-user) can map the
same pages from the file descriptor: BAR remap keeps working across processes.  Pages are
only backed when touched, so a 6 GiB card costs what the guests actually use.
"""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

from gpuvm.device import regs

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


class Vram:
    def __init__(self, size: int) -> None:
        if size <= 0 or size % regs.SMALL_PAGE:
            raise ValueError(f"VRAM size {size:#x} is not a positive multiple of 4 KiB")
        self.size = size
        self.fd = os.memfd_create("gpuvm-vram", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | _MAP_NORESERVE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.u8 = np.frombuffer(self._map, dtype=np.uint8)
        self.u32 = self.u8.view(np.uint32)
        self.u64 = self.u8.view(np.uint64)
        self.pages = self.u8.reshape(-1, regs.SMALL_PAGE)

    @property
    def host_address(self) -> int:
        """Host virtual address of VRAM byte 0 (memslots map host address ranges)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def contains(self, addr: int, length: int) -> bool:
        return 0 <= addr and length >= 0 and addr + length <= self.size

    def zero(self, addr: int, length: int) -> None:
        """Zero [addr, addr+length).  Whole pages go back to the kernel (MADV_REMOVE on a
        shared mapping: the range reads as zeroes and stops costing memory); the rest is
        one numpy fill."""
        if length <= 0:
            return
        lo = (addr + regs.SMALL_PAGE - 1) & ~(regs.SMALL_PAGE - 1)
        hi = (addr + length) & ~(regs.SMALL_PAGE - 1)
        madv = getattr(mmap, "MADV_REMOVE", None)
        if madv is not None and hi - lo >= 16 * regs.SMALL_PAGE:
            try:
                self._map.madvise(madv, lo, hi - lo)
            except OSError:
                self.u8[lo:hi] = 0
            self.u8[addr:lo] = 0
            self.u8[hi:addr + length] = 0
            return
        self.u8[addr:addr + length] = 0

    def read_u32(self, addr: int) -> int:
        return int(self.u32[addr >> 2]) if not addr & 3 else \
            int.from_bytes(self._map[addr:addr + 4], "little")

    def write_u32(self, addr: int, value: int) -> None:
        if addr & 3:
            self._map[addr:addr + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
        else:
            self.u32[addr >> 2] = value & 0xFFFFFFFF

    def read_bytes(self, addr: int, length: int) -> int:
        """Little-endian integer of 1, 2, 4 or 8 bytes."""
        return int.from_bytes(self._map[addr:addr + length], "little")

    def write_bytes(self, addr: int, length: int, value: int) -> None:
        self._map[addr:addr + length] = (value & ((1 << (8 * length)) - 1)).to_bytes(length,
                                                                                     "little")

    def close(self) -> None:
        self.u8 = self.u32 = self.u64 = self.pages = np.empty(0, dtype=np.uint8)
        if self.fd >= 0:
            os.close(self.fd)  # the mapping (and any other process's) keeps the pages
            self.fd = -1
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive (e.g. a memslot user); freed with it
