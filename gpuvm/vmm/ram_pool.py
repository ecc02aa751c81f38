"""Populated guest-RAM memfds kept after their VM ends, to be scrubbed and given to the
next VM of the same size and backing.

Why: a VM whose RAM is allocated up front (gpuvm.vmm.guest_ram, the default) pays for
populating it as it is built -- 256 MiB took 150-200 ms a VM on the 2-core development
host, and freeing it 50 ms more -- and one experiment builds hundreds: `make paper`
builds about 740 VMs, most of them in the lock's rounds of short runs.  A memfd's pages
outlive its mapping, so the next VM maps the same pages again and zeroes them, 70-80 ms
for 256 MiB there (`GuestRam`).  A hypervisor does the same with a finished domain's
memory: Xen scrubs freed pages and hands them to the next domain it builds.

Only memory nothing else can still reach is kept (GuestRam.close decides): its mapping
closed cleanly, no numpy or ctypes view of it left, and its fd never handed to another
process (a vfio-user server maps a VM's RAM from it).  A forked child starts with an
empty pool -- it must not hand out pages its parent may give to another VM.  The pool
holds at most POOL_BYTES, eight 256 MiB VMs: the most one scenario runs at once in the
shipped experiments; what does not fit is freed as before.
"""

from __future__ import annotations

import os
import threading

POOL_BYTES = 2 << 30


class RamPool:
    """Kept memfds by (size, backing).  Thread-safe: VMs are built and closed by the
    runner's thread, but tests and experiments may run several runners."""

    def __init__(self, limit_bytes: int = POOL_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, str], list[int]] = {}
        self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def take(self, size: int, backing: str) -> int | None:
        """A kept memfd of `size` bytes populated under `backing` (its pages still hold
        what the last VM left: the caller zeroes them), or None."""
        with self._lock:
            fds = self._kept.get((size, backing))
            if not fds:
                return None
            self._bytes -= size
            return fds.pop()

    def give(self, size: int, backing: str, fd: int) -> bool:
        """Keep `fd` for a later VM; False (the caller frees it) where it does not fit."""
        with self._lock:
            if self._bytes + size > self.limit_bytes:
                return False
            self._kept.setdefault((size, backing), []).append(fd)
            self._bytes += size
            return True

    def drain(self) -> None:
        """Free everything kept."""
        with self._lock:
            fds = [fd for kept in self._kept.values() for fd in kept]
            self._kept.clear()
            self._bytes = 0
        for fd in fds:
            os.close(fd)


POOL = RamPool()
# a forked child closes its copies of the kept fds: the pages stay the parent's
os.register_at_fork(after_in_child=POOL.drain)
