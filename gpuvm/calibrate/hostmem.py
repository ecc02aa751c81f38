"""Host memory the way a hypervisor backs guest RAM: 4 KiB pages or a huge-page memfd.

The regions are plain mmaps whose addresses can be handed to cudaHostRegister and
cudaMemcpy.  Whether transparent huge pages actually backed a region is read back from
/proc/self/smaps (the kernel may refuse: shmem THP off, no free 2 MiB blocks), so every
measurement says what memory it really ran on.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuvm.host_pages import huge_kib, smaps_kib

PAGE = 4096

# region kind -> (file-backed?, madvise to apply before the first touch)
REGION_KINDS: dict[str, tuple[bool, int | None]] = {
    # anonymous memory split into 4 KiB pages: the classic guest RAM backing
    "anon-4k": (False, getattr(mmap, "MADV_NOHUGEPAGE", 15)),
    # anonymous memory as a program gets it (THP as the system default says)
    "anon": (False, None),
    # anonymous memory with huge pages asked for (anon THP `madvise` grants them)
    "anon-thp": (False, getattr(mmap, "MADV_HUGEPAGE", 14)),
    # one memfd holding guest RAM, shmem THP asked for
    "memfd-thp": (True, getattr(mmap, "MADV_HUGEPAGE", 14)),
    # the same memfd with huge pages refused on the range (the recovery in the field report)
    "memfd-4k": (True, getattr(mmap, "MADV_NOHUGEPAGE", 15)),
}


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))


@dataclass
class HostRegion:
    """An mmap of `size` bytes of one kind, with its address for the CUDA runtime."""

    kind: str
    size: int
    _map: mmap.mmap
    _fd: int | None
    _anchor: ctypes.c_char = field(repr=False)

    @classmethod
    def open(cls, kind: str, size: int) -> "HostRegion":
        if kind not in REGION_KINDS:
            raise ValueError(f"unknown host memory kind {kind!r} (one of {', '.join(REGION_KINDS)})")
        if size <= 0 or size % PAGE:
            raise ValueError(f"region size {size} is not a positive multiple of {PAGE}")
        file_backed, advice = REGION_KINDS[kind]
        fd = None
        if file_backed:
            fd = os.memfd_create(f"gpuvm-{kind}", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
            region = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
        else:
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if advice is not None:
            region.madvise(advice)
        return cls(kind, size, region, fd, ctypes.c_char.from_buffer(region))

    @property
    def address(self) -> int:
        return ctypes.addressof(self._anchor)

    def populate(self) -> None:
        """Touch every page so later timings measure pinning and copying, not faults."""
        view = np.frombuffer(self._map, dtype=np.uint8)
        view[::PAGE] = 1
        del view

    def resident_bytes(self) -> int:
        """Bytes of this region in memory now, page by page (mincore(2)): its own pages
        only, where smaps counts the whole VMA -- and the kernel may have merged the
        region with a neighbouring mapping that other threads fill and free meanwhile."""
        pages = self.size // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if _LIBC.mincore(ctypes.c_void_p(self.address), ctypes.c_size_t(self.size), vec):
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}")
        return PAGE * int(np.count_nonzero(np.frombuffer(vec, dtype=np.uint8) & 1))

    def smaps(self) -> dict[str, int]:
        return smaps_kib(Path("/proc/self/smaps").read_text(), self.address,
                         self.address + self.size)

    def thp_kib(self) -> int:
        return huge_kib(self.smaps())

    def close(self) -> None:
        del self._anchor
        self._map.close()
        if self._fd is not None:
            os.close(self._fd)
