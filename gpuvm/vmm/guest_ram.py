"""Guest RAM: one shared mapping of a memfd, viewed as numpy.

A memfd so that a device in another process (a vfio-user server) can map the same pages
from `fd` when the VMM DMA-maps the RAM.  The same buffer is the KVM memslot at
guest-physical 0, the in-process guest's "physical memory", and the sysram the GPU reaches through its DMA port -- so a DMA, a guest store
and a VMM read all see the same bytes without copies.

`backing` says what host memory holds it, the way a hypervisor chooses: "anon" (the
host's default policy for shared memory), "4k" (huge pages refused, MADV_NOHUGEPAGE) or
"thp" (shmem transparent huge pages asked for, MADV_HUGEPAGE).  Whether huge
pages really back it is read back from /proc/self/smaps (`huge_kib`): the host's
shmem_enabled knob may refuse them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field

import numpy as np

from gpuvm.device.host_memory import close_memfd_mapping


class GuestMemoryError(Exception):
    """A guest-supplied address or length falls outside its RAM."""


BACKINGS = ("anon", "4k", "thp")
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)


@dataclass
class GuestRam:
    size: int
    backing: str = "anon"
    _map: mmap.mmap = field(init=False, repr=False)
    fd: int = field(init=False, repr=False, default=-1)  # the memfd behind the mapping
    array: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.size <= 0 or self.size % mmap.PAGESIZE:
            raise ValueError(f"guest RAM size {self.size:#x} is not a positive page multiple")
        if self.backing not in BACKINGS:
            raise ValueError(f"guest RAM backing {self.backing!r} is not one of "
                             f"{', '.join(BACKINGS)}")
        self.fd = os.memfd_create("gpuvm-guest-ram", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self._map = mmap.mmap(self.fd, self.size, flags=mmap.MAP_SHARED,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if self.backing == "thp":
            self._map.madvise(MADV_HUGEPAGE)
        elif self.backing == "4k":
            self._map.madvise(MADV_NOHUGEPAGE)
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def huge_kib(self) -> int:
        """kB of guest RAM the host maps with huge pages now (smaps, as calibrate reads it)."""
        from pathlib import Path

        from gpuvm.calibrate.hostmem import huge_kib, smaps_kib

        start = self.host_address
        return huge_kib(smaps_kib(Path("/proc/self/smaps").read_text(), start,
                                  start + self.size))

    def advise_nohugepage(self, gpa: int, length: int) -> None:
        """MADV_NOHUGEPAGE on the host pages behind [gpa, gpa+length) (page-rounded)."""
        self.check(gpa, length)
        lo = gpa - gpa % mmap.PAGESIZE
        hi = min(self.size, -(-(gpa + length) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if hi > lo:
            self._map.madvise(MADV_NOHUGEPAGE, lo, hi - lo)

    @property
    def host_address(self) -> int:
        """Host virtual address of guest-physical 0 (for memslots and in-process guests)."""
        return ctypes.addressof(ctypes.c_char.from_buffer(self._map))

    def check(self, gpa: int, length: int) -> None:
        if gpa < 0 or length < 0 or gpa + length > self.size:
            raise GuestMemoryError(f"guest range {gpa:#x}+{length:#x} outside RAM of "
                                   f"{self.size:#x} bytes")

    def read(self, gpa: int, length: int) -> np.ndarray:
        self.check(gpa, length)
        return self.array[gpa:gpa + length]

    def write(self, gpa: int, data: bytes | np.ndarray) -> None:
        buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) \
            else data.view(np.uint8).reshape(-1)
        self.check(gpa, buf.size)
        self.array[gpa:gpa + buf.size] = buf

    def read_u32(self, gpa: int) -> int:
        self.check(gpa, 4)
        return int.from_bytes(self._map[gpa:gpa + 4], "little")

    def read_cstring(self, gpa: int, limit: int = 4096) -> str:
        """A NUL-terminated string the guest handed over, bounded so garbage cannot hang us."""
        self.check(gpa, 1)
        end = min(self.size, gpa + limit)
        raw = bytes(self._map[gpa:end])
        nul = raw.find(b"\0")
        if nul < 0:
            raise GuestMemoryError(f"string at {gpa:#x} is not terminated within {limit} bytes")
        return raw[:nul].decode("utf-8", errors="replace")

    def struct_at(self, gpa: int, ctype: type[ctypes.Structure]) -> ctypes.Structure:
        """A ctypes view of a guest record (writes go straight to guest memory)."""
        self.check(gpa, ctypes.sizeof(ctype))
        return ctype.from_buffer(self._map, gpa)

    def close(self) -> None:
        """Release the mapping; views handed out earlier must be gone first."""
        self.array = np.empty(0, dtype=np.uint8)
        close_memfd_mapping(self.fd, self._map)
        self.fd = -1
