"""GPU virtual memory: the page-table walker, its TLB, and translated access.

Every engine access and every BAR1/BAR3 access goes through here, so every byte the GPU
touches is translated and checked.  Translation works on whole ranges at once with numpy
(one array of PTEs per page table, not a Python loop per page), which is what makes a
64 MiB copy scattered over 4 KiB pages affordable.

The TLB caches page-directory entries and page-table contents per address space until a
flush names that space.  It is deliberately generous (nothing is evicted) so that a
driver that forgets to flush observably keeps using the old translation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Hashable

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.counters import Counters
from gpuvm.device.dma import DmaPort, NoSysram
from gpuvm.device.vram import Vram
from gpuvm.device.write_log import EngineWriteLog

FAULT_NAMES = {
    regs.FAULT_PDE_NOT_PRESENT: "PDE not present",
    regs.FAULT_PT_TOO_SHORT: "page table too short",
    regs.FAULT_PAGE_NOT_PRESENT: "page not present",
    regs.FAULT_VM_LIMIT: "VM limit exceeded",
    regs.FAULT_NO_CHANNEL: "no channel",
    regs.FAULT_SUPERVISOR_ONLY: "supervisor-only page",
    regs.FAULT_READ_ONLY: "read-only page",
}

_PAGE = regs.SMALL_PAGE
_PAGE_MASK = _PAGE - 1


class VmFault(Exception):
    """A translation failed the way hardware would report it."""

    def __init__(self, reason: int, va: int, write: bool) -> None:
        super().__init__(f"{FAULT_NAMES.get(reason, reason)} at {va:#x}")
        self.reason = reason
        self.va = va
        self.write = write


class DmaFault(Exception):
    """A translated address names memory the device was not given."""

    def __init__(self, target: int, addr: int, length: int) -> None:
        kind = "VRAM" if target == regs.TARGET_VRAM else "sysram"
        super().__init__(f"{kind} {addr:#x}+{length:#x} is outside the memory the device reaches")
        self.target = target
        self.addr = addr
        self.length = length


# What a physical access is for, as the reference monitor sees it: a page-table walk, a
# context fetch (instance block, USERD, runlist) or data the access's page tables named.
WALK, CONTEXT, DATA = "walk", "context", "data"
# A physical-access observer: (actor, kind, target, first byte, end byte, write).  The
# actor says on whose behalf the device works now (("channel", chid), ("bar", bar,
# offset), ("pfifo",)); the device knows nothing of VMs, whoever installs the observer
# maps actors and ranges to owners.
AccessMonitor = Callable[[Hashable, str, int, int, int, bool], None]


@dataclass(frozen=True)
class Space:
    """One GPU virtual address space: a page directory, its target, its limit."""

    pd: int
    pd_target: int = regs.TARGET_VRAM
    limit: int = regs.VA_LIMIT - 1  # last valid byte
    inst: int = 0  # the instance block naming it (for fault records)


def space_from_words(pd_lo: int, pd_hi: int, limit_lo: int, limit_hi: int,
                     inst: int) -> Space:
    """The address space an instance block's RAMIN page-directory words name."""
    return Space(layout.ramin_ptr(pd_lo, pd_hi), layout.ramin_ptr_target(pd_lo),
                 min(layout.ramin_limit(limit_lo, limit_hi), regs.VA_LIMIT - 1), inst)


@dataclass
class _Pde:
    small: tuple[int, int] | None  # (PT address, target)
    large: tuple[int, int, int] | None  # (PT address, target, entries)


@dataclass
class _SpaceTlb:
    pdes: dict[int, _Pde] = field(default_factory=dict)
    pts: dict[tuple[int, int, int], np.ndarray] = field(default_factory=dict)
    # translate_one's walks, per 4 KiB page number: (PTE, target, frame).  A walk that
    # found a present PTE reads only the cached pdes and pts above, which never change
    # until a flush drops this whole object, so it answers the same each time; keeping
    # it spares a BAR's run of stores to one page the walk (fv's page-table zeroing).
    pages: dict[int, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class Pages:
    """A translated range: per 4 KiB page, its memory target and physical frame address."""

    va: int
    length: int
    targets: np.ndarray  # uint8
    frames: np.ndarray  # uint64, page-aligned physical addresses


class Mmu:
    """The GPU's page-table walker and TLB: every engine and BAR1/BAR3 access is translated and
    checked here, over whole ranges at once."""

    def __init__(self, vram: Vram, counters: Counters) -> None:
        self.vram = vram
        self.counters = counters
        self.dma: DmaPort = NoSysram()
        self.large_page_shift = regs.LARGE_PAGE_SHIFT
        self.pde_shift = regs.PDE_SPAN_SHIFT
        self._tlb: dict[tuple[int, int], _SpaceTlb] = {}
        self.monitor: AccessMonitor | None = None
        self.actor: Hashable = None  # set (device lock held) by whoever acts next
        # every engine write to VRAM passes view() or write(): logged per page, so the
        # mediator's incremental shadow resync sees writes no trap announced
        self.engine_writes = EngineWriteLog(vram.size)

    def set_large_pages_64k(self, on: bool) -> None:
        """PFFB_VM_CFG bit 0: 64 KiB large pages, and with them 64 MiB per PDE (the large
        table keeps its 1024 entries, so the directory doubles to 16384 entries)."""
        shift = regs.LARGE_PAGE_SHIFT_64K if on else regs.LARGE_PAGE_SHIFT
        if shift != self.large_page_shift:
            self.large_page_shift = shift
            self.pde_shift = regs.PDE_SPAN_SHIFT_64K if on else regs.PDE_SPAN_SHIFT
            self.flush()

    def space_from_instance(self, inst: int, target: int) -> Space | None:
        """The address space of the instance block at `inst` (None: outside memory)."""
        try:
            w = self.view(target, inst + regs.RAMIN_PD_LO, 16, CONTEXT).view("<u4").tolist()
        except DmaFault:
            return None
        return space_from_words(w[0], w[1], w[2], w[3], inst)

    # ------------------------------------------------------------------ physical memory
    def check(self, kind: str, target: int, addr: int, length: int, write: bool) -> None:
        """Show one physical access to the monitor, if one is installed."""
        if self.monitor is not None:
            self.monitor(self.actor, kind, target, addr, addr + length, write)

    def view(self, target: int, addr: int, length: int, kind: str = DATA,
             write: bool = False) -> np.ndarray:
        """A writable uint8 view of physical memory, or DmaFault."""
        if self.monitor is not None:
            self.monitor(self.actor, kind, target, addr, addr + length, write)
        if target == regs.TARGET_VRAM:
            if 0 <= addr and addr + length <= self.vram.size:
                return self.vram.u8[addr:addr + length]
        elif target in (regs.TARGET_SYSRAM, regs.TARGET_SYSRAM_NOSNOOP):
            region = self.dma.region(addr, length)
            if region is not None:
                return region
        raise DmaFault(target, addr, length)

    def touch(self, target: int, addr: int, length: int, kind: str = DATA,
              write: bool = False) -> None:
        """`view`'s monitor call and checks, for an access its caller makes by other
        means: a VRAM range builds no view (a BAR store's cost is mostly overhead)."""
        if target == regs.TARGET_VRAM and 0 <= addr and addr + length <= self.vram.size:
            if self.monitor is not None:
                self.monitor(self.actor, kind, target, addr, addr + length, write)
            return
        self.view(target, addr, length, kind, write)

    def phys_read_u64(self, target: int, addr: int, kind: str = DATA) -> int:
        if target == regs.TARGET_VRAM and not addr & 7 and 0 <= addr < self.vram.size:
            if self.monitor is not None:
                self.monitor(self.actor, kind, target, addr, addr + 8, False)
            return int(self.vram.u64[addr >> 3])
        return int.from_bytes(self.view(target, addr, 8, kind).tobytes(), "little")

    def phys_read_u32(self, target: int, addr: int, kind: str = DATA) -> int:
        if target == regs.TARGET_VRAM and not addr & 3 and 0 <= addr < self.vram.size:
            if self.monitor is not None:
                self.monitor(self.actor, kind, target, addr, addr + 4, False)
            return int(self.vram.u32[addr >> 2])
        return int.from_bytes(self.view(target, addr, 4, kind).tobytes(), "little")

    def phys_write(self, target: int, addr: int, data: bytes, kind: str = DATA) -> None:
        self.view(target, addr, len(data), kind, True)[:] = np.frombuffer(data, dtype=np.uint8)
        if target == regs.TARGET_VRAM:
            self.engine_writes.mark_range(addr, len(data))  # after the data: see write_log

    # ------------------------------------------------------------------ TLB
    def flush(self, pd: int | None = None, pd_target: int | None = None) -> None:
        """Forget cached translations of one address space (or all of them).

        A sysram target matches both kinds of sysram: the flush register has one bit for
        "sysram" (envytools gf100_pffb.xml), so a targeted flush naming sysram drops the
        space whether its directory was given as snooped or non-snooped.
        """
        self.counters.inc("tlb.flushes")
        if pd is None:
            self._tlb.clear()
        elif pd_target is None:
            for key in [k for k in self._tlb if k[1] == pd]:
                del self._tlb[key]
        elif pd_target == regs.TARGET_VRAM:
            self._tlb.pop((pd_target, pd), None)
        else:
            for target in (regs.TARGET_SYSRAM, regs.TARGET_SYSRAM_NOSNOOP):
                self._tlb.pop((target, pd), None)

    def _space_tlb(self, space: Space) -> _SpaceTlb:
        key = (space.pd_target, space.pd)
        tlb = self._tlb.get(key)
        if tlb is None:
            tlb = self._tlb[key] = _SpaceTlb()
        return tlb

    def _pde(self, space: Space, tlb: _SpaceTlb, index: int, va: int, write: bool) -> _Pde:
        pde = tlb.pdes.get(index)
        if pde is not None:
            return pde
        try:
            raw = self.phys_read_u64(space.pd_target, space.pd + index * regs.PDE_SIZE, WALK)
        except DmaFault:
            raise VmFault(regs.FAULT_PDE_NOT_PRESENT, va, write) from None
        small, large_raw = layout.pde_tables(raw)
        large = None
        if large_raw is not None:
            full = 1 << (self.pde_shift - self.large_page_shift)  # 1024 in either mode
            large = (large_raw[0], large_raw[1], full >> large_raw[2])
        pde = tlb.pdes[index] = _Pde(small, large)
        return pde

    def _pt(self, tlb: _SpaceTlb, addr: int, target: int, entries: int, va: int,
            write: bool) -> np.ndarray:
        key = (target, addr, entries)
        pt = tlb.pts.get(key)
        if pt is None:
            try:
                pt = self.view(target, addr, entries * regs.PTE_SIZE, WALK).view(np.uint64).copy()
            except DmaFault:
                raise VmFault(regs.FAULT_PDE_NOT_PRESENT, va, write) from None
            tlb.pts[key] = pt
            self.counters.inc("tlb.pt_loads")
        return pt

    # ------------------------------------------------------------------ translation
    def translate(self, space: Space, va: int, length: int, write: bool,
                  user: bool = True) -> Pages:
        """Translate [va, va+length) page by page, or raise the fault hardware would."""
        if length <= 0:
            raise ValueError("empty translation")
        end = va + length - 1
        if va < 0 or end > space.limit or end >= regs.VA_LIMIT:
            raise VmFault(regs.FAULT_VM_LIMIT, max(va, min(space.limit + 1, regs.VA_LIMIT)),
                          write)
        first, last = va >> 12, end >> 12
        per_pde_shift = self.pde_shift - regs.SMALL_PAGE_SHIFT
        n_small = 1 << per_pde_shift
        tlb = self._space_tlb(space)
        targets = np.empty(last - first + 1, dtype=np.uint8)
        frames = np.empty(last - first + 1, dtype=np.uint64)
        pos = 0
        for pde_index in range(first >> per_pde_shift, (last >> per_pde_shift) + 1):
            lo = max(first, pde_index << per_pde_shift)
            hi = min(last, ((pde_index + 1) << per_pde_shift) - 1)
            page_va = max(va, lo << 12)
            pde = self._pde(space, tlb, pde_index, page_va, write)
            n = hi - lo + 1
            ptes = np.zeros(n, dtype=np.uint64)
            from_large = None
            if pde.small is not None:
                spt = self._pt(tlb, pde.small[0], pde.small[1], n_small, page_va, write)
                ptes = spt[(lo & (n_small - 1)):(hi & (n_small - 1)) + 1]
            if pde.large is not None:
                present = (ptes & np.uint64(regs.PTE_PRESENT)).astype(bool)
                if not present.all():
                    shift = self.large_page_shift - regs.SMALL_PAGE_SHIFT
                    lidx = (np.arange(lo, hi + 1, dtype=np.int64) & (n_small - 1)) >> shift
                    short = (lidx >= pde.large[2]) & ~present
                    if short.any():
                        bad = int(np.flatnonzero(short)[0])
                        raise VmFault(regs.FAULT_PT_TOO_SHORT, max(va, (lo + bad) << 12), write)
                    lpt = self._pt(tlb, pde.large[0], pde.large[1], pde.large[2], page_va, write)
                    lptes = lpt[np.minimum(lidx, pde.large[2] - 1)]
                    from_large = ~present
                    ptes = np.where(present, ptes, lptes)
            elif pde.small is None:
                raise VmFault(regs.FAULT_PDE_NOT_PRESENT, page_va, write)
            ok = (ptes & np.uint64(regs.PTE_PRESENT)).astype(bool)
            if not ok.all():
                bad = int(np.flatnonzero(~ok)[0])
                raise VmFault(regs.FAULT_PAGE_NOT_PRESENT, max(va, (lo + bad) << 12), write)
            if write and (ptes & np.uint64(regs.PTE_READ_ONLY)).any():
                bad = int(np.flatnonzero(ptes & np.uint64(regs.PTE_READ_ONLY))[0])
                raise VmFault(regs.FAULT_READ_ONLY, max(va, (lo + bad) << 12), write)
            if user and (ptes & np.uint64(regs.PTE_SUPERVISOR)).any():
                bad = int(np.flatnonzero(ptes & np.uint64(regs.PTE_SUPERVISOR))[0])
                raise VmFault(regs.FAULT_SUPERVISOR_ONLY, max(va, (lo + bad) << 12), write)
            base = layout.ptes_addr(ptes)
            if from_large is not None and from_large.any():
                in_large = (np.arange(lo, hi + 1, dtype=np.uint64) << np.uint64(12)) & \
                    np.uint64((1 << self.large_page_shift) - 1)
                base = np.where(from_large, base + in_large, base)
            frames[pos:pos + n] = base
            targets[pos:pos + n] = layout.ptes_target(ptes).astype(np.uint8)
            pos += n
        self.counters.inc("vm.translations", len(frames))
        return Pages(va, length, targets, frames)

    def translate_one(self, space: Space, va: int, write: bool, user: bool = False) -> tuple[int, int]:
        """(target, physical address) of one byte: the scalar path BAR accesses take.

        Same tables, same TLB and same faults as `translate`, without numpy's per-call
        overhead (a BAR access translates one page at a time).
        """
        if va < 0 or va > space.limit or va >= regs.VA_LIMIT:
            raise VmFault(regs.FAULT_VM_LIMIT, va, write)
        tlb = self._space_tlb(space)
        page = tlb.pages.get(va >> regs.SMALL_PAGE_SHIFT)
        if page is None:
            page = self._walk_one(space, tlb, va, write)
        raw, target, frame = page
        if write and raw & regs.PTE_READ_ONLY:
            raise VmFault(regs.FAULT_READ_ONLY, va, write)
        if user and raw & regs.PTE_SUPERVISOR:
            raise VmFault(regs.FAULT_SUPERVISOR_ONLY, va, write)
        self.counters.total["vm.translations"] += 1
        return target, frame + (va & _PAGE_MASK)

    def _walk_one(self, space: Space, tlb: _SpaceTlb, va: int,
                  write: bool) -> tuple[int, int, int]:
        """translate_one's walk of va's page through the TLB: (present PTE, target,
        frame), kept in tlb.pages; or the fault."""
        pde = self._pde(space, tlb, va >> self.pde_shift, va, write)
        raw = 0
        n_small = 1 << (self.pde_shift - regs.SMALL_PAGE_SHIFT)
        if pde.small is not None:
            spt = self._pt(tlb, pde.small[0], pde.small[1], n_small, va, write)
            raw = int(spt[(va >> 12) & (n_small - 1)])
        large_offset = 0
        if not raw & regs.PTE_PRESENT:
            if pde.large is not None:
                lidx = (va & ((1 << self.pde_shift) - 1)) >> self.large_page_shift
                if lidx >= pde.large[2]:
                    raise VmFault(regs.FAULT_PT_TOO_SHORT, va, write)
                raw = int(self._pt(tlb, pde.large[0], pde.large[1], pde.large[2], va, write)[lidx])
                large_offset = va & ((1 << self.large_page_shift) - 1) & ~_PAGE_MASK
            elif pde.small is None:
                raise VmFault(regs.FAULT_PDE_NOT_PRESENT, va, write)
        if not raw & regs.PTE_PRESENT:
            raise VmFault(regs.FAULT_PAGE_NOT_PRESENT, va, write)
        page = tlb.pages[va >> regs.SMALL_PAGE_SHIFT] = \
            (raw, layout.pte_target(raw), layout.pte_addr(raw) + large_offset)
        return page

    # ------------------------------------------------------------------ translated access
    def _runs(self, pages: Pages) -> list[tuple[int, int, int]]:
        """Coalesced (target, physical address, length) runs covering the range."""
        frames, targets = pages.frames, pages.targets
        offset = pages.va & _PAGE_MASK
        if len(frames) == 1:
            return [(int(targets[0]), int(frames[0]) + offset, pages.length)]
        brk = np.flatnonzero((np.diff(frames) != np.uint64(_PAGE)) |
                             (np.diff(targets) != 0)) + 1
        starts = np.concatenate(([0], brk))
        ends = np.concatenate((brk, [len(frames)]))
        runs = []
        end_byte = offset + pages.length
        for s, e in zip(starts.tolist(), ends.tolist()):
            lo = max(s * _PAGE, offset)
            hi = min(e * _PAGE, end_byte)
            runs.append((int(targets[s]), int(frames[s]) + lo - s * _PAGE, hi - lo))
        return runs

    def _page_array(self, pages: Pages, write: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """For a page-aligned range in one memory: (pages view [N, 4096], row indices)."""
        if pages.va & _PAGE_MASK or pages.length & _PAGE_MASK:
            return None
        t = int(pages.targets[0])
        if (pages.targets != t).any():
            return None
        if self.monitor is not None:
            # owners' ranges are intervals: the lowest and highest page decide for all
            lo, hi = int(pages.frames.min()), int(pages.frames.max()) + _PAGE
            self.monitor(self.actor, DATA, t, lo, hi, write)
        if t == regs.TARGET_VRAM:
            if int(pages.frames.max()) + _PAGE > self.vram.size:
                raise DmaFault(t, int(pages.frames.max()), _PAGE)
            return self.vram.pages, (pages.frames >> np.uint64(12)).astype(np.intp)
        lo, hi = int(pages.frames.min()), int(pages.frames.max()) + _PAGE
        region = self.dma.region(lo, hi - lo)
        if region is None:
            return None  # spans buffers or is outside: let the run path find the culprit
        return region.reshape(-1, _PAGE), ((pages.frames - np.uint64(lo)) >> np.uint64(12)).astype(np.intp)

    def read(self, pages: Pages) -> np.ndarray:
        """The bytes of a translated range, as a new array."""
        if len(pages.frames) > 8:
            pa = self._page_array(pages, False)
            if pa is not None:
                return pa[0][pa[1]].reshape(-1)
        runs = self._runs(pages)
        if len(runs) == 1:
            t, addr, n = runs[0]
            return self.view(t, addr, n).copy()
        out = np.empty(pages.length, dtype=np.uint8)
        pos = 0
        for t, addr, n in runs:
            out[pos:pos + n] = self.view(t, addr, n)
            pos += n
        return out

    def write(self, pages: Pages, data: np.ndarray) -> None:
        if data.size != pages.length:
            raise ValueError("write size does not match the translated range")
        if len(pages.frames) > 8:
            pa = self._page_array(pages, True)
            if pa is not None:
                pa[0][pa[1]] = data.reshape(-1, _PAGE)
                if pages.targets[0] == regs.TARGET_VRAM:
                    self.engine_writes.mark_frames(pages.frames)
                return
        pos = 0
        for t, addr, n in self._runs(pages):
            self.view(t, addr, n, DATA, True)[:] = data[pos:pos + n]
            if t == regs.TARGET_VRAM:
                self.engine_writes.mark_range(addr, n)
            pos += n
