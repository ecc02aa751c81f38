"""How often one thread lets the interpreter lock go: a kernel uprobe on
PyEval_SaveThread, counted for that thread alone through perf_event_open.

VMs run as threads of one process share one interpreter lock.  An exit's handler takes
it, and gives it back when the vCPU enters KVM_RUN again -- but many handlers also let it
go inside: an ioctl besides KVM_RUN, numpy over more than a few hundred elements (its
loops run without the lock), a device lock the engine thread holds.  Alone, the thread
takes it straight back; beside other VMs that want it, each such release hands it over,
and the thread sleeps until it comes round again (eight pv VMs' vCPU threads sleep about
3.3 times per exit, the number of releases per exit one pv VM makes alone).  So the model
needs the releases per exit, and only the interpreter knows them: every one goes
through PyEval_SaveThread (Py_BEGIN_ALLOW_THREADS), in CPython itself and in extension
modules alike.  A uprobe on that function's first instruction, counted by the kernel for
one thread, gives the number exactly at the price of a trap per release (~1 us), and
nothing on other threads.

Where uprobes are not there or not permitted (not root, no uprobe PMU, a Python without
the symbol), `ReleaseCounter.for_this_thread()` returns None and the trace simply has no
count.  Each `read()` lets the lock go once itself (the read system call): a caller that
subtracts its own reads gets the code's releases exactly.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from pathlib import Path

# <linux/perf_event.h>: the attribute's fields up to config2 (PERF_ATTR_SIZE_VER1);
# the kernel takes a larger size when the bytes it does not know are zero
PERF_FLAG_FD_CLOEXEC = 1 << 3
ATTR_EXCLUDE_KERNEL = 1 << 5
ATTR_EXCLUDE_HV = 1 << 6
UPROBE_PMU_TYPE = Path("/sys/bus/event_source/devices/uprobe/type")
SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
RELEASE_FUNCTION = "PyEval_SaveThread"


class PerfEventAttr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_period", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64),  # uprobe_path: a char * to the file
                ("config2", ctypes.c_uint64)]  # probe_offset: the offset in that file


assert ctypes.sizeof(PerfEventAttr) == 72  # PERF_ATTR_SIZE_VER1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def mapped_file_offset(address: int, maps: str = "/proc/self/maps") -> tuple[str, int] | None:
    """(file, offset in it) of the code at `address` in this process, from its mappings
    (a uprobe names code by file and offset, as the ELF file holds it)."""
    with open(maps) as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= address < hi:
                if len(parts) < 6 or not parts[5].startswith("/"):
                    return None
                return parts[5], address - lo + int(parts[2], 16)
    return None


class ReleaseCounter:
    """The interpreter lock's releases by one thread since the counter was opened."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    @classmethod
    def for_this_thread(cls) -> "ReleaseCounter | None":
        """A counter of the calling thread's releases, or None where it cannot be had."""
        number = SYS_PERF_EVENT_OPEN.get(platform.machine())
        try:
            pmu = int(UPROBE_PMU_TYPE.read_text())
            address = ctypes.cast(getattr(ctypes.pythonapi, RELEASE_FUNCTION),
                                  ctypes.c_void_p).value
        except (OSError, ValueError, AttributeError):
            return None
        where = mapped_file_offset(address) if address else None
        if number is None or where is None:
            return None
        path = ctypes.create_string_buffer(os.fsencode(where[0]))
        attr = PerfEventAttr(type=pmu, size=ctypes.sizeof(PerfEventAttr),
                             flags=ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
                             config1=ctypes.addressof(path), config2=where[1])
        # pid 0, cpu -1: this thread, on whichever core it runs
        fd = _libc.syscall(number, ctypes.byref(attr), 0, -1, -1, PERF_FLAG_FD_CLOEXEC)
        return cls(fd) if fd >= 0 else None

    def read(self) -> int:
        """Releases so far -- this read's own among them when the counted thread reads."""
        return struct.unpack("=Q", os.read(self._fd, 8))[0]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
