"""The shadow of a guest's BAR1 or BAR3 VM: one VM's arena inside the physical BAR page
table.

The physical BAR VM is one address space shared by all VMs; VM i's guest BAR offset x is
physical BAR offset arena_i + x.  Its entries come from the guest's own BAR VM (instance
block -> page directory -> small table), validated like any other guest entry.  The
per-page host addresses it records are what BAR remap maps straight into the guest.

A guest that clears the MODE bit of its BAR VM register asks for a plain window onto its
VRAM (offset x = its VRAM address x); the window then holds identity entries over its
slice, made and validated like any other.

An incremental sync of a window whose instance block and directory entry are unchanged
resyncs only the entries the write history names (shadow.dirty); a change to either, or
a table in the guest's RAM, means the window is walked and compared whole.
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.dma import DmaPort, NoSysram
from gpuvm.device.vram import Vram
from gpuvm.device.write_log import EngineWriteLog
from shadow.dirty import WriteTracker
from shadow.entries import EntryPolicy
from shadow.guest_memory import GuestMemory
from shadow.page_table import Count, SyncStats, record, sync_entries, sync_listed
from shadow.pv_space import PvSpace

NOT_VRAM = -1  # host_pages entry of a page that is absent, refused, or in sysram


class BarWindow:
    """The shadow of one VM's BAR1 or BAR3 VM: its arena in the physical BAR page table, filled
    from the guest's own BAR VM after validation, and the host pages BAR remap may map into
    the guest."""

    def __init__(self, vram: Vram, policy: EntryPolicy, count: Count, phys_pt: int,
                 first_index: int, pages: int, guest_ram: DmaPort | None = None,
                 engine_writes: EngineWriteLog | None = None) -> None:
        self.vram = vram
        self.engine_writes = engine_writes
        self.policy = policy
        self.memory = GuestMemory(vram, policy, guest_ram or NoSysram())
        self.plain = False  # MODE clear: identity over the guest's VRAM
        self.count = count
        self.phys_pt = phys_pt  # host VRAM address of the physical BAR's small page table
        self.first = first_index
        self.pages = pages
        self.guest_inst: int | None = None
        self.guest_pd: int | None = None
        self.guest_pt: int | None = None
        self._snapshot: np.ndarray | None = None
        self.host_pages = np.full(pages, NOT_VRAM, dtype=np.int64)
        self.pv: PvSpace | None = None  # a PV guest's BAR VM: entries are already validated
        self.stale = False  # a flush asked for a resync that has not happened yet
        # write history of the walk (instance block, directory entry) and of the table;
        # None: nothing to go by (never walked, or the table is in sysram)
        self._walk: list[WriteTracker] = []
        self._table: WriteTracker | None = None

    def mapped(self, page: int) -> bool:
        """Whether the physical BAR's entry for window page `page` is present: a store
        there reaches memory (else it faults)."""
        return bool(self.vram.u64.item((self.phys_pt >> 3) + self.first + page)
                    & regs.PTE_PRESENT)

    def _window(self) -> np.ndarray:
        base = (self.phys_pt >> 3) + self.first
        return self.vram.u64[base:base + self.pages]

    def bind(self, guest_inst: int | None, pv: PvSpace | None = None,
             plain: bool = False) -> None:
        """The guest pointed its BAR VM at another instance block, turned the VM off
        (plain: the BAR is a window onto its VRAM), or made it unusable (None)."""
        self.guest_inst = guest_inst
        self.pv = pv
        self.plain = plain
        self._snapshot = None
        self._table = None
        self.stale = True

    def clear(self) -> None:
        self._window()[:] = 0
        self.host_pages[:] = NOT_VRAM
        self._snapshot = None
        self._table = None

    def note_write(self, addr: int, size: int) -> None:
        """A trapped guest store of `size` bytes at guest VRAM address `addr`.  (Every
        trapped store comes here, most far from these tables: the overlap is tested
        before a tracker is called.)"""
        end = addr + size
        for tracker in self._walk:
            if addr < tracker.end and tracker.guest < end:
                tracker.note(addr, size)
        table = self._table
        if table is not None and addr < table.end and table.guest < end:
            table.note(addr, size)

    def pending(self) -> bool:
        """Whether a sync now could find anything changed since the last one."""
        if any(t.pending(self._engine(t.guest)) for t in self._walk):
            return True
        if self._table is not None:
            return self._table.pending(self._engine(self._table.guest))
        return self._snapshot is not None  # a table in the guest's RAM: no write history

    def changed_offsets(self) -> np.ndarray:
        """Window pages whose entries may have changed since the last sync: those stored
        to, or all of them when the history cannot say (walk or engine writes, sysram)."""
        everything = np.arange(self.pages)
        if any(t.pending(self._engine(t.guest)) for t in self._walk):
            return everything
        if self._table is None:
            return everything if self._snapshot is not None else np.zeros(0, dtype=np.intp)
        if self._table.engine_written(self._engine(self._table.guest)):
            return everything
        return self._table.stored()

    def _host(self, addr: int) -> int:
        return self.policy.host_vram(addr)

    def _engine(self, addr: int) -> int:
        """Where the engine write log records engine stores to guest `addr`."""
        return self.policy.engine_vram(addr)

    def _guest_u32(self, addr: int) -> int:
        return int(self.vram.u32[self.policy.host_vram(addr) >> 2])

    def sync(self, incremental: bool) -> SyncStats:
        stats = SyncStats()
        if incremental and self._snapshot is not None and self._table is not None and \
                not any(t.pending(self._engine(t.guest)) for t in self._walk):
            self._sync_listed(stats)
        else:
            self._sync_walk(incremental, stats)
        self.stale = False
        record(self.count, stats, "bar_syncs")
        return stats

    def _sync_listed(self, stats: SyncStats) -> None:
        """Same instance block, directory entry and VRAM table as last time: only the
        entries the write history names."""
        table = self._table
        assert table is not None and self._snapshot is not None
        host = self._host(table.guest)
        idx = table.take(self._engine(table.guest))
        view = self.vram.u64[host >> 3:(host >> 3) + table.entries]
        window = self._window()
        if idx is None:  # most of the table rewritten: compare it whole
            current = self._snapshot.copy()
            current[:table.entries] = view
            sync_entries(current, self._snapshot, window, self.policy, regs.SMALL_PAGE, stats)
            self._snapshot = current
            self._set_host_pages()
            return
        sync_listed(idx, view, self._snapshot, window, self.policy, regs.SMALL_PAGE, stats)
        if idx.size:
            self._set_host_pages(idx)

    def _sync_walk(self, incremental: bool, stats: SyncStats) -> None:
        start = self.engine_writes.now if self.engine_writes is not None else 0
        entries = self._guest_entries(stats)
        self._walk = self._walk_trackers()
        for tracker in self._walk:
            tracker.seen = start  # history restarts with this walk
        self._table = None
        if entries is None:
            self.clear()
        elif self.plain:
            # identity entries of the emulator's making: nothing of the guest's is
            # scanned, but every entry is still validated against the slice
            translated, refused = self.policy.translate(entries, regs.SMALL_PAGE)
            window = self._window()
            window[:] = 0
            window[:entries.size] = translated
            stats.ptes_written += entries.size
            stats.ptes_refused += int(refused.sum())
            self._snapshot = None
            self._set_host_pages()
        elif self.pv is not None:
            table = self.pv.small_table(0)
            window = self._window()
            window[:] = 0
            if table is not None:
                n = min(entries.size, self.pages)
                window[:n] = table[:n]
            stats.ptes_written += self.pages
            self._set_host_pages()
        else:
            if self.guest_pt is not None:
                # its history starts before the table is read below
                self._table = WriteTracker(self.guest_pt, entries.size, self.engine_writes)
                entries = self.memory.table(regs.TARGET_VRAM, self.guest_pt, entries.size)
                assert entries is not None  # checked by _guest_entries just now
            padded = np.zeros(self.pages, dtype=np.uint64)
            padded[:entries.size] = entries
            snapshot = self._snapshot if incremental else None
            sync_entries(padded, snapshot, self._window(), self.policy, regs.SMALL_PAGE, stats)
            self._snapshot = padded
            self._set_host_pages()

    def _walk_trackers(self) -> list[WriteTracker]:
        """Trackers of what the walk just read: the instance block and the directory
        entry (any store there means walking again)."""
        out = []
        if self.guest_inst is not None and not self.plain and \
                self.policy.guest_vram_ok(self.guest_inst, regs.RAMIN_SIZE):
            out.append(WriteTracker(self.guest_inst, regs.RAMIN_SIZE // regs.PTE_SIZE,
                                    self.engine_writes))
        if self.guest_pd is not None and self.pv is None:
            out.append(WriteTracker(self.guest_pd, 1, self.engine_writes))
        return out

    def _set_host_pages(self, idx: np.ndarray | None = None) -> None:
        shadow = self._window() if idx is None else self._window()[idx]
        in_vram = layout.ptes_present(shadow) & \
            (layout.ptes_target(shadow) == np.uint64(regs.TARGET_VRAM))
        phys = layout.ptes_addr(shadow)
        pages = np.where(in_vram, phys.astype(np.int64), NOT_VRAM)
        if idx is None:
            self.host_pages = pages
        else:
            self.host_pages[idx] = pages

    def _guest_entries(self, stats: SyncStats) -> np.ndarray | None:
        inst = self.guest_inst
        self.guest_pd = self.guest_pt = None
        if self.plain:
            n = min(self.pages, self.policy.vram_size >> 12)
            return layout.ptes(np.arange(n, dtype=np.uint64) << np.uint64(regs.SMALL_PAGE_SHIFT))
        if inst is None or not self.policy.guest_vram_ok(inst, regs.RAMIN_SIZE):
            return None
        pd_lo = self._guest_u32(inst + regs.RAMIN_PD_LO)
        pd = layout.ramin_ptr(pd_lo, self._guest_u32(inst + regs.RAMIN_PD_HI))
        limit = layout.ramin_limit(self._guest_u32(inst + regs.RAMIN_LIMIT_LO),
                                   self._guest_u32(inst + regs.RAMIN_LIMIT_HI))
        stats.pdes_scanned = 1
        if self.pv is None and (layout.ramin_ptr_target(pd_lo) != regs.TARGET_VRAM or
                                not self.policy.guest_vram_ok(pd, regs.PDE_SIZE)):
            stats.ptes_refused += 1
            return None
        self.guest_pd = pd
        n = min(self.pages, (limit + 1) >> 12)
        if self.pv is not None:
            return np.zeros(n, dtype=np.uint64)  # only the size matters: see sync
        small, large = layout.pde_tables(int(self.vram.u64[self.policy.host_vram(pd) >> 3]))
        if large is not None:
            stats.ptes_refused += 1  # BAR VMs are mapped with small pages only
        if small is None:
            return None
        entries = self.memory.table(small[1], small[0], n)  # VRAM slice or the VM's RAM
        if entries is None:
            stats.ptes_refused += 1
            return None
        if small[1] == regs.TARGET_VRAM:
            self.guest_pt = small[0]  # a BAR page of the guest: keep trapping it
        return entries

    def guest_table_pages(self) -> list[int]:
        """Guest VRAM pages of this BAR VM's instance, directory and table (sensitive)."""
        pages = []
        if self.guest_inst is not None:
            pages.append(self.guest_inst & ~0xFFF)
        if self.guest_pd is not None:
            pages.append(self.guest_pd & ~0xFFF)
        if self.guest_pt is not None:
            end = self.guest_pt + self.pages * regs.PTE_SIZE
            pages.extend(range(self.guest_pt & ~0xFFF, end, regs.SMALL_PAGE))
        return pages
