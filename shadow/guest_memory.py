"""Where a VM's page tables may live, and the only way the shadow code reads them.

A guest names each table's memory with a PDE target (nouveau gf100_vmm_pgd_pde): VRAM,
coherent or non-coherent sysram.  VRAM tables are read from the VM's slice of host VRAM;
sysram tables from the VM's own RAM (guest-physical addresses), never from the device's
bus at large.  Either way the table must lie wholly inside what the VM owns, or it is
refused (None) and counted by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpuvm.device import regs
from gpuvm.device.dma import DmaPort, NoSysram
from gpuvm.device.vram import Vram
from shadow.entries import EntryPolicy

SYSRAM_TARGETS = (regs.TARGET_SYSRAM, regs.TARGET_SYSRAM_NOSNOOP)


@dataclass(frozen=True)
class GuestMemory:
    """The guest's page tables as the shadow reads them, in its VRAM slice or its RAM, refusing
    a table that is not wholly the VM's own."""

    vram: Vram
    policy: EntryPolicy
    ram: DmaPort = field(default_factory=NoSysram)  # the VM's RAM at guest-physical 0

    def table(self, target: int, addr: int, entries: int) -> np.ndarray | None:
        """A copy of `entries` 64-bit entries at guest address `addr` in `target`, or None
        when the range is not wholly the VM's own memory."""
        view = self.view(target, addr, entries)
        return None if view is None else view.copy()

    def view(self, target: int, addr: int, entries: int) -> np.ndarray | None:
        """The same entries as a live view (no copy: an incremental resync reads only the
        entries it needs), or None."""
        nbytes = entries * regs.PTE_SIZE
        if addr & (regs.PTE_SIZE - 1):
            return None
        if target == regs.TARGET_VRAM:
            if not self.policy.guest_vram_ok(addr, nbytes):
                return None
            base = self.policy.host_vram(addr) >> 3
            return self.vram.u64[base:base + entries]
        if target in SYSRAM_TARGETS:
            if not self.policy.guest_sys_ok(addr, nbytes):
                return None
            region = self.ram.region(addr, nbytes)
            return None if region is None else region.view(np.uint64)
        return None
