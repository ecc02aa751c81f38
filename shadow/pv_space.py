"""Paravirtual address spaces: page tables the hypervisor owns and fills by hypercall.

A PV guest never writes a page-table entry itself.  It names an address space by a key
(the VRAM address its directory would have had) and sends {va, pte} batches; each entry
is validated and translated as it is written, so there is nothing to scan -- and unlike
GPUvm's prototype, nothing unvalidated gets in.
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.vram import Vram
from shadow.entries import EntryPolicy
from shadow.page_table import Count
from shadow.vram_pool import VramPool

_SMALL_MASK = regs.SMALL_PTES_PER_PT - 1


class PvSpace:
    def __init__(self, vram: Vram, policy: EntryPolicy, pool: VramPool, key: int,
                 count: Count) -> None:
        self.vram = vram
        self.policy = policy
        self.pool = pool
        self.key = key
        self.count = count
        self.pd = pool.alloc(regs.PD_BYTES)
        vram.u8[self.pd:self.pd + regs.PD_BYTES] = 0
        self.pts: dict[int, int] = {}  # PDE index -> host address of its small table

    def _pt(self, index: int) -> int:
        pt = self.pts.get(index)
        if pt is None:
            size = regs.SMALL_PTES_PER_PT * regs.PTE_SIZE
            pt = self.pts[index] = self.pool.alloc(size)
            self.vram.u8[pt:pt + size] = 0
            self.vram.u64[(self.pd >> 3) + index] = layout.pde_small(pt)
            self.count("pv.pts_allocated", 1)
        return pt

    def _write(self, vas: np.ndarray, values: np.ndarray) -> None:
        pde = vas >> np.uint64(regs.PDE_SPAN_SHIFT)
        for index in np.unique(pde).tolist():
            sel = pde == np.uint64(index)
            base = self._pt(index) >> 3
            idx = ((vas[sel] >> np.uint64(12)) & np.uint64(_SMALL_MASK)).astype(np.intp)
            self.vram.u64[base + idx] = values[sel]

    def map(self, vas: np.ndarray, ptes: np.ndarray) -> int:
        """Validate, translate and install entries; returns how many were refused."""
        vas = vas.astype(np.uint64)
        ok_va = (vas & np.uint64(0xFFF)) == 0
        ok_va &= vas < np.uint64(regs.VA_LIMIT)
        translated, refused = self.policy.translate(ptes)
        refused |= ~ok_va & ((ptes & np.uint64(1)) != 0)
        if ok_va.any():
            self._write(vas[ok_va], translated[ok_va])
        self.count("pv.ptes_written", int(ok_va.sum()))
        self.count("shadow.ptes_refused", int(refused.sum()))
        return int(refused.sum())

    def unmap(self, vas: np.ndarray) -> int:
        vas = vas.astype(np.uint64)
        ok = ((vas & np.uint64(0xFFF)) == 0) & (vas < np.uint64(regs.VA_LIMIT))
        present = np.array([(int(v) >> regs.PDE_SPAN_SHIFT) in self.pts for v in vas[ok].tolist()],
                           dtype=bool)
        targets = vas[ok][present] if present.size else vas[:0]
        if targets.size:
            self._write(targets, np.zeros(targets.size, dtype=np.uint64))
        self.count("pv.ptes_cleared", int(targets.size))
        return int((~ok).sum())

    def small_table(self, index: int) -> np.ndarray | None:
        pt = self.pts.get(index)
        if pt is None:
            return None
        return self.vram.u64[pt >> 3:(pt >> 3) + regs.SMALL_PTES_PER_PT]

    def release(self) -> None:
        for pt in self.pts.values():
            self.pool.free(pt)
        self.pool.free(self.pd)
        self.pts.clear()
