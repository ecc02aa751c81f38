"""Guest RAM: one shared mapping of a memfd, viewed as numpy.

A memfd so that a device in another process (a vfio-user server) can map the same pages
from `fd` when the VMM DMA-maps the RAM.  The same buffer is the KVM memslot at
guest-physical 0, the in-process guest's "physical memory", and the sysram the GPU reaches through its DMA port -- so a DMA, a guest store
and a VMM read all see the same bytes without copies.

`backing` says what host memory holds it, the way a hypervisor chooses: "anon" (the
host's default policy for shared memory), "4k" (huge pages refused, MADV_NOHUGEPAGE) or
"thp" (transparent huge pages asked for, MADV_HUGEPAGE).  A memfd gets huge pages only
where the host's shmem_enabled knob allows them; where it says [never] (or [deny]) "thp"
RAM is a private anonymous mapping instead, which anonymous THP ([madvise], the usual
default) does give huge pages -- at the price that no other process can map it
(`share_fd` refuses, naming the knob).  Whether huge pages really back it is read back
from /proc/self/smaps (`huge_kib`).

`prealloc` says when: up front, as the VM is built (libvirt's <allocation
mode="immediate"/>, QEMU's -mem-prealloc; a Xen domain, the paper's platform, gets all its
memory when it is built, and a VFIO-attached guest's RAM is pinned, so populated, before
it runs), or as the guest first touches each page ("ondemand").  Up front is the
default ($GPUVM_RAM_ALLOC names another): on demand, every first touch is a host page
fault taken inside KVM_RUN (a 10 ms stretch of a 40 ms pv run, measured 2026-11-26),
and VMs that are threads of one VMM process take those faults on one address space --
four pv VMs took 3.3x one VM's time with faults on demand, 2.5x without (on 2 cores) --
a cost that belongs to neither the guest nor the mediator and that no trace of one VM
shows.  RAM populated up front outlives its VM: its pages are kept and zeroed for the
next VM of the same size (gpuvm.vmm.ram_pool), so an experiment of hundreds of short
runs does not populate and free 256 MiB for each.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuvm.host_pages import SHMEM_THP_KNOB, huge_kib, read_knob, smaps_kib
from gpuvm.device.host_memory import close_memfd_mapping
from gpuvm.errors import UserError
from gpuvm.vmm.ram_pool import POOL, RamPool


class GuestMemoryError(Exception):
    """A guest-supplied address or length falls outside its RAM."""


class GuestRamAllocError(UserError):
    """The host could not give a guest its RAM up front."""


BACKINGS = ("anon", "4k", "thp")
ALLOCATIONS = ("immediate", "ondemand")  # libvirt's <allocation mode=...> names
# the allocation a VM gets where none is named (unset: "immediate"); the test suite sets
# "ondemand" (tests/conftest.py): populating 256 MiB takes 0.1 s a VM on 2 cores
ALLOC_ENV = "GPUVM_RAM_ALLOC"
MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)
MADV_NOHUGEPAGE = getattr(mmap, "MADV_NOHUGEPAGE", 15)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14
MADV_DONTFORK = getattr(mmap, "MADV_DONTFORK", 10)


def default_allocation() -> str:
    """The allocation where a VM names none: $GPUVM_RAM_ALLOC, else "immediate"."""
    value = os.environ.get(ALLOC_ENV, ALLOCATIONS[0])
    if value not in ALLOCATIONS:
        raise GuestRamAllocError(f"{ALLOC_ENV}={value!r} is not one of "
                                 f"{', '.join(ALLOCATIONS)}")
    return value


def prealloc_for(allocation: str | None) -> bool | None:
    """GuestRam's `prealloc` for an allocation's name (libvirt's mode; None: the
    default's, decided when the RAM is made)."""
    if allocation is None:
        return None
    if allocation not in ALLOCATIONS:
        raise GuestRamAllocError(f"guest RAM allocation {allocation!r} is not one of "
                                 f"{', '.join(ALLOCATIONS)}")
    return allocation == "immediate"


_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


@dataclass
class GuestRam:
    """A VM's RAM: one memfd mapping shared by the vCPUs, the device's DMA and (isolated) the
    VMM process."""

    size: int
    backing: str = "anon"
    # every page allocated and mapped now (see the module); None: default_allocation()
    prealloc: bool | None = None
    _map: mmap.mmap = field(init=False, repr=False)
    _fd: int = field(init=False, repr=False, default=-1)  # the memfd behind the mapping
    array: np.ndarray = field(init=False, repr=False)
    # whether close may keep the pages for another VM (ram_pool): not once the memfd was
    # handed out (`share_fd`: another process may map it), a range was advised 4 KiB
    # pages (the memfd keeps the split pages, which the next VM's backing does not
    # promise) or the pages could not all be allocated
    _keepable: bool = field(init=False, repr=False, default=True)
    pool: RamPool = field(default=POOL, repr=False)  # where populated RAM is kept (ram_pool)
    # private anonymous memory, not a memfd: "thp" where shmem THP is off (see the module)
    anonymous: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.size <= 0 or self.size % mmap.PAGESIZE:
            raise ValueError(f"guest RAM size {self.size:#x} is not a positive page multiple")
        if self.backing not in BACKINGS:
            raise ValueError(f"guest RAM backing {self.backing!r} is not one of "
                             f"{', '.join(BACKINGS)}")
        if self.prealloc is None:
            self.prealloc = default_allocation() == "immediate"
        self.anonymous = self.backing == "thp" and \
            read_knob(SHMEM_THP_KNOB) in ("never", "deny")
        kept = self.pool.take(self.size, self.backing) \
            if self.prealloc and not self.anonymous else None
        if self.anonymous:
            self._keepable = False
            self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
            # a child forked meanwhile (a compiler, a VM process) would share the pages
            # copy-on-write, and the guest's next store would split the huge page under it
            self._map.madvise(MADV_DONTFORK)
        else:
            if kept is None:
                self._fd = os.memfd_create("gpuvm-guest-ram", os.MFD_CLOEXEC)
                os.ftruncate(self._fd, self.size)
            else:
                self._fd = kept
            self._map = mmap.mmap(self._fd, self.size, flags=mmap.MAP_SHARED,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE)
        if self.backing == "thp":
            self._map.madvise(MADV_HUGEPAGE)
        elif self.backing == "4k":
            self._map.madvise(MADV_NOHUGEPAGE)
        self.array = np.frombuffer(self._map, dtype=np.uint8)
        if self.prealloc:
            self._populate()
        if kept is not None:  # the last VM's bytes, scrubbed before this one sees them
            ctypes.memset(self.host_address, 0, self.size)  # the interpreter lock let go

    def share_fd(self) -> int:
        """The memfd behind the RAM, for a device in another process to map (-1: closed).
        Once handed out the RAM is freed at close, never kept for another VM."""
        if self._fd < 0 and self.anonymous:
            raise GuestRamAllocError(
                f"guest RAM backing \"thp\" is anonymous memory here ({SHMEM_THP_KNOB} "
                f"is [{read_knob(SHMEM_THP_KNOB)}]), which another process cannot map: set "
                "it to advise, or run the VM in-process")
        self._keepable = False
        return self._fd

    def _populate(self) -> None:
        """Allocate and map every page now, after the backing's advice (so "thp" is
        populated with huge pages where the host allows them).  Through libc, not
        mmap.madvise: ctypes lets the interpreter lock go, so a VM built while others
        run (a later start_s) does not stall their handlers for the 0.1 s it takes."""
        if _libc.madvise(self.host_address, self.size, MADV_POPULATE_WRITE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EINVAL:  # a kernel before 5.14: allocate the memfd's pages
            try:
                os.posix_fallocate(self._fd, 0, self.size)
                return
            except OSError as exc:
                err = exc.errno or err
        self._keepable = False
        self.close()
        raise GuestRamAllocError(
            f"guest RAM: the host cannot allocate {self.size >> 20} MiB up front "
            f"({errno.errorcode.get(err, err)}: {os.strerror(err)}); a smaller ram_mib, "
            f"or ram_alloc = \"ondemand\", defers or shrinks it")

    def huge_kib(self) -> int:
        """kB of guest RAM the host maps with huge pages now (smaps, as calibrate reads it)."""
        start = self.host_address
        return huge_kib(smaps_kib(Path("/proc/self/smaps").read_text(), start,
                                  start + self.size))

    def advise_nohugepage(self, gpa: int, length: int) -> None:
        """MADV_NOHUGEPAGE on the host pages behind [gpa, gpa+length) (page-rounded)."""
        self.check(gpa, length)
        lo = gpa - gpa % mmap.PAGESIZE
        hi = min(self.size, -(-(gpa + length) // mmap.PAGESIZE) * mmap.PAGESIZE)
        if hi > lo:
            self._keepable = False
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
        """Release the mapping; views handed out earlier must be gone first.  RAM that
        was populated up front goes back to the pool (ram_pool) when nothing else can
        still reach its pages -- its mapping closed with no view left, its fd never
        handed out -- and no range of it was advised 4 KiB pages; else it is freed."""
        self.array = np.empty(0, dtype=np.uint8)
        fd, self._fd = self._fd, -1
        if fd >= 0 and self.prealloc and self._keepable and self._unmapped() \
                and self.pool.give(self.size, self.backing, fd):
            return
        close_memfd_mapping(fd, self._map)  # a view left keeps the pages till it goes

    def _unmapped(self) -> bool:
        """Close the mapping; False where a view of it is left."""
        try:
            self._map.close()
        except BufferError:
            return False
        return True
