"""Validation and translation of guest page-table entries, vectorized.

This is where GPUvm's holes are closed: a VRAM entry must point inside the VM's slice and
a sysram entry inside the VM's DMA mappings (what its VMM mapped with VFIO_IOMMU_MAP_DMA:
its RAM, nothing else); anything else becomes not-present and is counted.  The same
policy serves shadow scans and paravirtual map hypercalls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from gpuvm.device import layout, regs



@dataclass(frozen=True)
class EntryPolicy:
    vram_base: int  # host VRAM address of the VM's guest VRAM address 0
    vram_size: int  # the slice's size: guest VRAM addresses must stay below it
    sys_base: int  # device bus address of the VM's iova 0
    # the VM's DMA mappings now, as sorted (start, end) iova ranges (read at each use, so
    # a later map or unmap is seen by every table already built with this policy)
    sys_ranges: Callable[[], list[tuple[int, int]]]
    # physical VRAM address at which the device's engines reach guest VRAM address 0, when
    # it is not vram_base: an oversubscribed vGPU's tables are read through its overlay
    # view, but its engines write the pool frames (direct-mapped), and the engine write
    # log names physical pages
    engine_base: int | None = None

    def guest_vram_ok(self, addr: int, length: int) -> bool:
        return 0 <= addr and addr + length <= self.vram_size

    def guest_sys_ok(self, addr: int, length: int) -> bool:
        """A guest-physical range wholly inside one of the VM's DMA mappings."""
        return 0 <= addr and length >= 0 and \
            any(start <= addr and addr + length <= end for start, end in self.sys_ranges())

    def host_vram(self, addr: int) -> int:
        return self.vram_base + addr

    def engine_vram(self, addr: int) -> int:
        """Where the device's engine write log records an engine store to guest VRAM
        address `addr` (what write trackers ask it about)."""
        return (self.vram_base if self.engine_base is None else self.engine_base) + addr

    def translate(self, ptes: np.ndarray, page: int = regs.SMALL_PAGE) -> tuple[np.ndarray, np.ndarray]:
        """(shadow entries, refused mask) for guest entries describing pages of `page` bytes."""
        ptes = ptes.astype(np.uint64, copy=False)
        present = layout.ptes_present(ptes)
        if ptes.size > 64:
            # Guest tables are mostly empty: translate the present entries only (what is
            # not present becomes 0, never refused, either way).
            idx = np.flatnonzero(present)
            if idx.size * 4 < ptes.size:
                out = np.zeros(ptes.shape, dtype=np.uint64)
                refused = np.zeros(ptes.shape, dtype=bool)
                if idx.size:
                    out[idx], refused[idx] = self.translate(ptes[idx], page)
                return out, refused
        target = layout.ptes_target(ptes)
        addr = layout.ptes_addr(ptes)
        end = addr + np.uint64(page)
        is_vram = target == np.uint64(regs.TARGET_VRAM)
        is_sys = (target == np.uint64(regs.TARGET_SYSRAM)) | \
            (target == np.uint64(regs.TARGET_SYSRAM_NOSNOOP))
        in_dma = np.zeros(ptes.shape, dtype=bool)
        for start, stop in self.sys_ranges():
            in_dma |= (addr >= np.uint64(start)) & (end <= np.uint64(stop))
        ok = present & ((is_vram & (end <= np.uint64(self.vram_size))) | (is_sys & in_dma))
        host = np.where(is_vram, addr + np.uint64(self.vram_base), addr + np.uint64(self.sys_base))
        shadow = layout.ptes_with_addr(ptes, host)
        return np.where(ok, shadow, np.uint64(0)), present & ~ok
