"""VRAM: one contiguous range of host memory, viewed as numpy, made of memfd pieces.

A shared mapping (not a numpy allocation) so that a slice of VRAM can also be a KVM
memslot -- BAR remap maps guest pages straight onto it.  Memfds rather than anonymous
memory so that another process (a VMM attached over vfio-user) can map the same pages
from a file descriptor: BAR remap keeps working across processes.  Pages are only backed
when touched, so a 6 GiB card costs what the guests actually use.

Several memfds, not one, because whoever receives an fd can map all of it: a VMM must get
its own partition's VRAM and nothing else.  The range is reserved once (no access, no
memory) and covered by pieces mapped over it at fixed addresses, so the device still sees
ONE array:

- the reserved piece: a memfd the size of all of VRAM, at offset = VRAM address.  It backs
  whatever is not carved out -- the mediator's own VRAM, shadow reserves, free space --
  and is never handed to anyone.
- carved pieces: `carve(base, size)` gives [base, base + size) a memfd of its own, mapped
  over the range (the reserved piece's pages there are freed).  The mediator carves a
  partition's slice when it creates the partition and gives it back with `merge(base)`
  when it releases it; partitions come and go while the GPU runs, so the split follows
  them rather than being fixed when the GPU is made.  A carved piece starts zeroed, as a
  new tenant's slice must; a merged range reads zero again.  A VMM that kept a mapping of
  an old piece keeps only that piece's (freed) pages, never the next tenant's.

Every memfd is sealed against shrinking and growing, so a process that was handed one
cannot ftruncate it and make the device's accesses fault (SIGBUS).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

import numpy as np

from gpuvm.device import host_memory, regs


@dataclass(frozen=True)
class VramPiece:
    """Bytes [base, base + size) of VRAM are bytes [offset, offset + size) of `fd`, and
    this process sees them at `host_address`."""

    base: int
    size: int
    fd: int
    offset: int
    host_address: int


def _reservation_type(size: int) -> type:
    """A ctypes byte array over the reserved range that unmaps it when the last view of it
    (numpy arrays hold it as their base) goes away."""

    class Reservation(ctypes.c_uint8 * size):  # type: ignore[misc]
        def __del__(self) -> None:
            try:
                host_memory.unmap(ctypes.addressof(self), size)
            except Exception:  # interpreter shutdown: the process's end unmaps it
                pass
    return Reservation


class Vram:
    """The GPU's VRAM: one sealed memfd mapped once, viewed as a numpy array, so BAR pages can
    be mapped into guests and engines copy with array operations."""

    def __init__(self, size: int) -> None:
        if size <= 0 or size % regs.SMALL_PAGE:
            raise ValueError(f"VRAM size {size:#x} is not a positive multiple of 4 KiB")
        self.size = size
        self.reserved_fd = host_memory.sealed_memfd("gpuvm-vram", size)
        address = host_memory.reserve(size)
        try:
            host_memory.map_fixed(address, size, self.reserved_fd, 0)
        except OSError:
            host_memory.unmap(address, size)
            os.close(self.reserved_fd)
            raise
        self._address = address
        self._pieces: dict[int, VramPiece] = {}  # carved pieces by VRAM base
        self.u8 = np.frombuffer(_reservation_type(size).from_address(address),
                                dtype=np.uint8)
        self._bytes = memoryview(self.u8)
        # aligned 32- and 64-bit accesses without numpy or a bytes object (BAR stores,
        # the PRAMIN window)
        self._words = self._bytes.cast("I")
        self._quads = self._bytes.cast("Q")
        self.u32 = self.u8.view(np.uint32)
        self.u64 = self.u8.view(np.uint64)
        self.pages = self.u8.reshape(-1, regs.SMALL_PAGE)

    @property
    def host_address(self) -> int:
        """Host virtual address of VRAM byte 0 (memslots map host address ranges)."""
        return self._address

    # ------------------------------------------------------------------ pieces
    def carve(self, base: int, size: int, name: str = "gpuvm-vram-part") -> VramPiece:
        """Give [base, base + size) a sealed memfd of its own (zeroed; see the docstring)."""
        if base % regs.SMALL_PAGE or size <= 0 or size % regs.SMALL_PAGE or \
                not self.contains(base, size):
            raise ValueError(f"cannot carve [{base:#x}, +{size:#x}) out of {self.size:#x} "
                             f"bytes of VRAM in whole pages")
        for p in self._pieces.values():
            if base < p.base + p.size and p.base < base + size:
                raise ValueError(f"[{base:#x}, +{size:#x}) overlaps the piece at {p.base:#x}")
        fd = host_memory.sealed_memfd(name, size)
        address = self._address + base
        try:
            host_memory.punch(address, size)  # the reserved piece's pages there
            host_memory.map_fixed(address, size, fd, 0)
        except OSError:
            os.close(fd)
            raise
        piece = self._pieces[base] = VramPiece(base, size, fd, 0, address)
        return piece

    def merge(self, base: int) -> None:
        """Give a carved range back to the reserved piece (it reads zero) and close its fd."""
        piece = self._pieces.pop(base)
        host_memory.punch(piece.host_address, piece.size)
        host_memory.map_fixed(piece.host_address, piece.size, self.reserved_fd, base)
        os.close(piece.fd)

    def piece(self, base: int) -> VramPiece | None:
        """The carved piece that starts at VRAM address `base`, if there is one."""
        return self._pieces.get(base)

    def backing(self, addr: int) -> tuple[int, int]:
        """(memfd, offset in it) of the page at VRAM address `addr`: what another mapping of
        that page (an oversubscribed vGPU's overlay view) must map."""
        for p in self._pieces.values():
            if p.base <= addr < p.base + p.size:
                return p.fd, p.offset + addr - p.base
        return self.reserved_fd, addr

    def map_onto(self, address: int) -> None:
        """Map all of VRAM, piece by piece, at another (reserved) host address: a second
        view of the same pages.  Pieces carved later are not followed."""
        host_memory.map_fixed(address, self.size, self.reserved_fd, 0)
        for p in self._pieces.values():
            host_memory.map_fixed(address + p.base, p.size, p.fd, p.offset)

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
        if hi - lo >= 16 * regs.SMALL_PAGE:
            try:
                host_memory.punch(self._address + lo, hi - lo)
            except OSError:
                self.u8[lo:hi] = 0
            self.u8[addr:lo] = 0
            self.u8[hi:addr + length] = 0
            return
        self.u8[addr:addr + length] = 0

    def read_u32(self, addr: int) -> int:
        return self._words[addr >> 2] if not addr & 3 else \
            int.from_bytes(self._bytes[addr:addr + 4], "little")

    def write_u32(self, addr: int, value: int) -> None:
        if addr & 3:
            self._bytes[addr:addr + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
        else:
            self._words[addr >> 2] = value & 0xFFFFFFFF

    def read_bytes(self, addr: int, length: int) -> int:
        """Little-endian integer of 1, 2, 4 or 8 bytes."""
        return int.from_bytes(self._bytes[addr:addr + length], "little")

    def write_bytes(self, addr: int, length: int, value: int) -> None:
        if length == 8 and not addr & 7:  # most BAR stores: a page-table entry
            self._quads[addr >> 3] = value & 0xFFFFFFFFFFFFFFFF
            return
        if length == 4 and not addr & 3:
            self._words[addr >> 2] = value & 0xFFFFFFFF
            return
        self._bytes[addr:addr + length] = (value & ((1 << (8 * length)) - 1)).to_bytes(length,
                                                                                     "little")

    def write_run(self, addr: int, size: int, values: np.ndarray) -> None:
        """Aligned stores of `size` (4 or 8) bytes, one each of `values` (already masked
        to that size), at `addr` and on: the same bytes as that many `write_bytes`."""
        view = self.u64 if size == 8 else self.u32
        first = addr // size
        view[first:first + len(values)] = values

    def close(self) -> None:
        """Close every memfd (a mapping, here or in another process, keeps its pages) and
        drop this object's views; the range is unmapped when the last view of it goes
        (a memslot user may still hold one)."""
        self.u8 = self.u32 = self.u64 = self.pages = np.empty(0, dtype=np.uint8)
        self._words.release()
        self._quads.release()
        self._bytes.release()
        for piece in self._pieces.values():
            os.close(piece.fd)
        self._pieces.clear()
        if self.reserved_fd >= 0:
            os.close(self.reserved_fd)
            self.reserved_fd = -1
