"""Shadow page tables for a guest GPU address space.

The guest keeps its page directory in its own VRAM slice and its page tables there or in
its own RAM (a PDE names each table's target: VRAM, coherent or non-coherent sysram); the
GPU walks the shadow, which lives in hypervisor VRAM and holds only validated, translated
entries.  Sysram tables are read only through the VM's RAM (shadow.guest_memory).

Two ways to bring a shadow up to date:
- full: read every PDE, translate every entry of every present table (what GPUvm did on
  each TLB flush), vectorized per table;
- incremental: look only at the entries that may have changed since the last sync and
  translate those that did.  For tables in VRAM the trapped stores and the device's engine
  write log say which (shadow.dirty), so the work -- and what is counted and charged as
  scanned -- follows the changes, not the table sizes.  Tables in the guest's RAM are
  written without traps: they are compared whole with the copy taken at the last sync.
  Whatever has no write history (a new table, a moved one, the first sync, a sync after
  the VM's DMA mappings changed) is translated in full.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.dma import DmaPort, NoSysram
from gpuvm.device.vram import Vram
from gpuvm.device.write_log import EngineWriteLog
from shadow.dirty import WriteTracker
from shadow.entries import EntryPolicy
from shadow.guest_memory import GuestMemory
from shadow.vram_pool import PoolExhausted, VramPool

Count = Callable[[str, int], None]

SMALL, LARGE = 0, 1


def guest_table(kind: int, pde: int) -> tuple[int, int, int] | None:
    """(guest address, target, entries) of the table one half of a guest PDE names."""
    small, large = layout.pde_tables(pde)
    if kind == SMALL:
        return None if small is None else (small[0], small[1], regs.SMALL_PTES_PER_PT)
    if large is None:
        return None
    return large[0], large[1], regs.LARGE_PTES_PER_PT >> large[2]


@dataclass
class _ShadowPt:
    guest: int  # guest address of the guest table (VRAM slice or RAM, per target)
    target: int  # TARGET_VRAM / TARGET_SYSRAM / TARGET_SYSRAM_NOSNOOP
    entries: int
    shadow: int  # host VRAM address of the shadow table
    snapshot: np.ndarray  # the guest table as of the last sync
    tracker: WriteTracker | None = field(default=None)  # VRAM tables: what changed since


@dataclass
class SyncStats:
    pdes_scanned: int = 0
    ptes_scanned: int = 0
    ptes_written: int = 0
    ptes_refused: int = 0


def sync_entries(current: np.ndarray, snapshot: np.ndarray | None, dest: np.ndarray,
                 policy: EntryPolicy, page: int, stats: SyncStats) -> None:
    """Translate guest entries into `dest`: all of them, or those that differ from snapshot."""
    stats.ptes_scanned += current.size
    if snapshot is not None:
        idx = np.flatnonzero(current != snapshot)
        if idx.size:
            translated, refused = policy.translate(current[idx], page)
            dest[idx] = translated
            stats.ptes_written += int(idx.size)
            stats.ptes_refused += int(refused.sum())
        return
    translated, refused = policy.translate(current, page)
    dest[:] = translated
    stats.ptes_written += current.size
    stats.ptes_refused += int(refused.sum())


def sync_listed(idx: np.ndarray, view: np.ndarray, snapshot: np.ndarray, dest: np.ndarray,
                policy: EntryPolicy, page: int, stats: SyncStats) -> None:
    """Resync the listed entries only (those the write history names): read, compare with
    the snapshot, translate what differs.  Only they are scanned."""
    stats.ptes_scanned += int(idx.size)
    if not idx.size:
        return
    values = view[idx]
    differ = values != snapshot[idx]
    if differ.any():
        idx, values = idx[differ], values[differ]
        translated, refused = policy.translate(values, page)
        dest[idx] = translated
        snapshot[idx] = values
        stats.ptes_written += int(idx.size)
        stats.ptes_refused += int(refused.sum())


def record(count: Count, stats: SyncStats, what: str = "syncs") -> None:
    """Count one sync: `syncs` for channel page tables, `bar_syncs` for BAR-VM windows."""
    count(f"shadow.{what}", 1)
    count("shadow.pdes_scanned", stats.pdes_scanned)
    count("shadow.ptes_scanned", stats.ptes_scanned)
    count("shadow.ptes_written", stats.ptes_written)
    count("shadow.ptes_refused", stats.ptes_refused)


class ShadowSpace:
    """The shadow of one guest address space (a page directory in the guest's slice)."""

    def __init__(self, vram: Vram, policy: EntryPolicy, pool: VramPool, guest_pd: int,
                 count: Count, guest_ram: DmaPort | None = None,
                 engine_writes: EngineWriteLog | None = None) -> None:
        self.vram = vram
        self.policy = policy
        self.memory = GuestMemory(vram, policy, guest_ram or NoSysram())
        self.pool = pool
        self.guest_pd = guest_pd
        self.count = count
        self.engine_writes = engine_writes
        self.shadow_pd = self._alloc_zeroed(regs.PD_BYTES)
        self._pd_snapshot: np.ndarray | None = None
        self._pd_tracker = WriteTracker(guest_pd, regs.PDE_COUNT, engine_writes)
        self._pts: dict[tuple[int, int], _ShadowPt] = {}  # (pde index, kind) -> table
        self._by_page: dict[int, list[WriteTracker]] = {}  # guest VRAM page -> trackers
        self.stale = True

    def _alloc_zeroed(self, size: int) -> int:
        addr = self.pool.alloc(size)
        self.vram.u8[addr:addr + size] = 0
        return addr

    def _u64(self, addr: int, n: int) -> np.ndarray:
        return self.vram.u64[addr >> 3:(addr >> 3) + n]

    def layout(self) -> frozenset[tuple[tuple[int, int], int, int, int]]:
        """The guest tables shadowed now, as (PDE half, address, target, entries): when it
        changes, so do the pages that must stay trapped (and which tracker hears what)."""
        return frozenset((key, pt.guest, pt.target, pt.entries) for key, pt in self._pts.items())

    def guest_table_pages(self) -> list[int]:
        """Guest VRAM pages holding this space's directory and tables (sensitive pages).
        Tables in sysram are not BAR pages: nothing to keep trapped for them."""
        pages = list(range(self.guest_pd, self.guest_pd + regs.PD_BYTES, regs.SMALL_PAGE))
        for pt in self._pts.values():
            if pt.target == regs.TARGET_VRAM:
                pages.extend(range(pt.guest, pt.guest + pt.entries * regs.PTE_SIZE,
                                   regs.SMALL_PAGE))
        return pages

    def note_write(self, addr: int, size: int) -> None:
        """A trapped guest store of `size` bytes at guest VRAM address `addr`."""
        pd = self._pd_tracker  # (a table may overlap the directory: ask both)
        if addr < pd.end and pd.guest < addr + size:
            pd.note(addr, size)
        trackers = self._by_page.get(addr >> regs.SMALL_PAGE_SHIFT)
        if trackers is not None:
            for tracker in trackers:
                tracker.note(addr, size)

    def _index_pages(self) -> None:
        by_page: dict[int, list[WriteTracker]] = {}
        for pt in self._pts.values():
            if pt.tracker is not None:
                for page in range(pt.guest >> regs.SMALL_PAGE_SHIFT,
                                  ((pt.tracker.end - 1) >> regs.SMALL_PAGE_SHIFT) + 1):
                    by_page.setdefault(page, []).append(pt.tracker)
        self._by_page = by_page

    def release(self) -> None:
        for pt in self._pts.values():
            self.pool.free(pt.shadow)
        self._pts.clear()
        self._by_page = {}
        self.pool.free(self.shadow_pd)

    # ------------------------------------------------------------------ sync
    def sync(self, incremental: bool) -> SyncStats:
        stats = SyncStats()
        before = self.layout()
        pd_ok = self.policy.guest_vram_ok(self.guest_pd, regs.PD_BYTES)
        if incremental and pd_ok and self._pd_snapshot is not None:
            self._sync_changed(stats)
        else:
            self._sync_all(pd_ok, stats)
        if self.layout() != before:
            self._index_pages()
        self.stale = False
        record(self.count, stats)
        return stats

    def _sync_all(self, pd_ok: bool, stats: SyncStats) -> None:
        """Every PDE read, every present table translated in full."""
        if not pd_ok:
            guest_pd = np.zeros(regs.PDE_COUNT, dtype=np.uint64)
            stats.ptes_refused += 1
        else:
            self._pd_tracker.take(self.policy.engine_vram(self.guest_pd))  # history restarts
            guest_pd = self._u64(self.policy.host_vram(self.guest_pd), regs.PDE_COUNT).copy()
        stats.pdes_scanned = regs.PDE_COUNT
        # Absent PDEs shadow to zero in one vector write; only present ones (and ones that
        # had tables before) are visited, each table translated as one array.
        self._u64(self.shadow_pd, regs.PDE_COUNT)[guest_pd == 0] = 0
        visit = set(np.flatnonzero(guest_pd).tolist()) | {i for i, _ in self._pts}
        for index in sorted(visit):
            self._sync_pde(index, int(guest_pd[index]), False, stats)
        self._pd_snapshot = guest_pd

    def _sync_changed(self, stats: SyncStats) -> None:
        """Only the PDEs and entries the write history names (and sysram tables, which
        have none): O(changed)."""
        host_pd = self.policy.host_vram(self.guest_pd)
        idx = self._pd_tracker.take(self.policy.engine_vram(self.guest_pd))
        snapshot = self._pd_snapshot
        assert snapshot is not None
        guest_pd = self._u64(host_pd, regs.PDE_COUNT)
        if idx is None:  # most of the directory rewritten: compare it whole
            idx = np.arange(regs.PDE_COUNT)
        stats.pdes_scanned = int(idx.size)
        visit: set[int] = set()
        if idx.size:
            values = guest_pd[idx]
            differ = values != snapshot[idx]
            snapshot[idx[differ]] = values[differ]
            visit.update(idx[differ].tolist())
        for (index, _), pt in self._pts.items():
            if pt.tracker is None or pt.tracker.pending(self.policy.engine_vram(pt.guest)):
                visit.add(index)
        for index in sorted(visit):
            self._sync_pde(index, int(snapshot[index]), True, stats)

    def _sync_pde(self, index: int, pde: int, incremental: bool, stats: SyncStats) -> None:
        # What a shadow PDE keeps of the guest's: the large-PT size field only; the
        # addresses, targets and volatile bits are the shadow's own (tables in host VRAM).
        shadow_pde = layout.pde_size_bits(pde)
        for kind in (SMALL, LARGE):
            key = (index, kind)
            old = self._pts.get(key)
            named = guest_table(kind, pde)
            current = None if named is None else self.memory.view(named[1], named[0], named[2])
            if current is None:
                if named is not None:
                    stats.ptes_refused += 1  # a table outside the VM's memory: the PDE half
                if old is not None:
                    self.pool.free(old.shadow)
                    del self._pts[key]
                continue
            guest, target, entries = named
            if old is not None and (old.guest, old.target, old.entries) != named:
                self.pool.free(old.shadow)
                del self._pts[key]
                old = None
            try:
                table = self._sync_table(kind, current, guest, target, old, incremental, stats)
            except PoolExhausted:
                # more tables than the VM's shadow reserve holds: this half stays absent
                # (the guest faults there), the host carries on
                stats.ptes_refused += 1
                self.count("shadow.tables_refused_nomem", 1)
                continue
            self._pts[key] = table
            if kind == SMALL:
                shadow_pde |= layout.pde_small(table.shadow)
            else:
                shadow_pde |= layout.pde_large(table.shadow)
        self.vram.u64[(self.shadow_pd >> 3) + index] = shadow_pde

    def _sync_table(self, kind: int, current: np.ndarray, guest: int, target: int,
                    old: _ShadowPt | None, incremental: bool, stats: SyncStats) -> _ShadowPt:
        """`current` is a live view of the guest table."""
        entries = current.size
        page = regs.SMALL_PAGE if kind == SMALL else regs.LARGE_PAGE
        if target != regs.TARGET_VRAM:
            self.count("shadow.sysram_tables", 1)
        if old is None:
            old = _ShadowPt(guest, target, entries,
                            self._alloc_zeroed(entries * regs.PTE_SIZE),
                            np.zeros(entries, dtype=np.uint64))
            if target == regs.TARGET_VRAM:
                old.tracker = WriteTracker(guest, entries, self.engine_writes)
            incremental = False
        dest = self._u64(old.shadow, entries)
        if old.tracker is not None:
            idx = old.tracker.take(self.policy.engine_vram(guest))  # history restarts here
            if incremental and idx is not None:
                sync_listed(idx, current, old.snapshot, dest, self.policy, page, stats)
                return old
        snapshot = current.copy()
        sync_entries(snapshot, old.snapshot if incremental else None, dest, self.policy, page,
                     stats)
        old.snapshot = snapshot
        return old
