"""Incremental shadow resync is O(changed), and lazy BAR-window syncs wait for a use.

- A resync after k trapped stores reads and translates exactly those k entries (0 after
  none), and the shadow equals a full translation of what the guest wrote.
- Engine writes (no trap) reach it through the device's engine write log; tables in the
  guest's RAM (no trap either) are compared whole.
- Under a random mix of stores, engine writes, table moves and syncs, the incremental
  shadow always equals a fresh full sync (hypothesis).
- Through the mediator: in fv+lazy a BAR-VM flush marks the window stale and the next
  BAR access resyncs it (and sees the new mapping); a flush with nothing changed does not
  sync at all; fv stays eager; in fv-opt a change to a remapped page resyncs at the flush.
- A page table the guest has its copy engine write (no trap) is resynced through the
  device's engine write log, end to end.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuvm.device import layout, regs
from gpuvm.device.dma import DmaMappings
from gpuvm.device.layout import pte
from gpuvm.device.vram import Vram
from gpuvm.device.write_log import EngineWriteLog
from gpuvm.mediator.mediator import Mediator
from shadow.entries import EntryPolicy
from shadow.page_table import SMALL, ShadowSpace
from shadow.vram_pool import VramPool

from test_mediator_isolation import BAR1_SIZE, Vm

SLICE = 64 * regs.MiB
SHADOW = 16 * regs.MiB
PD = 0x10000
PTS = 0x100000  # guest tables: PTS + t * PT_BYTES
PT_BYTES = regs.SMALL_PTES_PER_PT * regs.PTE_SIZE
TABLES = 3
RAM = 4 * regs.MiB


class Guest:
    """A guest address space in a bare VRAM, with the trap path's note_write done by hand."""

    def __init__(self) -> None:
        self.vram = Vram(SLICE + SHADOW)
        self.log = EngineWriteLog(self.vram.size)
        self.ram = DmaMappings()
        self.ram.map(0, np.zeros(RAM, dtype=np.uint8), writable=True)
        self.policy = EntryPolicy(0, SLICE, 1 << 36, self.ram.ranges)
        self.counts: dict[str, int] = {}
        self.space = self.new_space(half=0)
        for t in range(TABLES):
            self.store_pde(1 + t, PTS + t * PT_BYTES)

    def new_space(self, log: EngineWriteLog | None = None, half: int = 1) -> ShadowSpace:
        """Spaces made for comparison take the other half of the shadow area."""
        pool = VramPool(SLICE + half * SHADOW // 2, SHADOW // 2, "shadow")
        return ShadowSpace(self.vram, self.policy, pool, PD, self.count, self.ram,
                           log or self.log)

    def count(self, name: str, n: int) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def store(self, addr: int, value: int) -> None:
        """A trapped 64-bit guest store (two 32-bit PRAMIN writes, as a driver does)."""
        self.vram.u64[addr >> 3] = value
        self.space.note_write(addr, 4)
        self.space.note_write(addr + 4, 4)

    def store_pde(self, index: int, table: int, target: int = regs.PDE_TARGET_VRAM) -> None:
        self.store(PD + index * regs.PDE_SIZE, layout.pde_small(table, target))

    def entry_addr(self, table: int, i: int) -> int:
        return PTS + table * PT_BYTES + i * regs.PTE_SIZE

    def scanned_by(self, incremental: bool = True) -> int:
        before = self.counts.get("shadow.ptes_scanned", 0)
        self.space.sync(incremental)
        return self.counts["shadow.ptes_scanned"] - before


def shadow_tables(space: ShadowSpace) -> dict[int, np.ndarray]:
    """PDE index -> the shadow's small table, found through the shadow directory."""
    out = {}
    shadow_pd = space.vram.u64[space.shadow_pd >> 3:(space.shadow_pd >> 3) + regs.PDE_COUNT]
    for index in np.flatnonzero(shadow_pd).tolist():
        small, _ = layout.pde_tables(int(shadow_pd[index]))
        if small is not None:
            addr = small[0]
            out[index] = space.vram.u64[addr >> 3:(addr >> 3) + regs.SMALL_PTES_PER_PT].copy()
    return out


def assert_same_as_full(g: Guest) -> None:
    fresh = g.new_space(EngineWriteLog(g.vram.size))
    fresh.sync(incremental=False)
    got, want = shadow_tables(g.space), shadow_tables(fresh)
    assert set(got) == set(want)
    for index in want:
        assert np.array_equal(got[index], want[index]), index


@pytest.fixture
def guest():
    g = Guest()
    g.space.sync(incremental=False)
    yield g
    g.vram.close()


def test_nothing_changed_scans_nothing(guest):
    assert guest.scanned_by() == 0
    assert guest.counts["shadow.syncs"] == 2  # still a sync: the flush asked for it
    assert_same_as_full(guest)


@pytest.mark.parametrize("k", [1, 7, 300])
def test_k_stores_scan_k_entries(guest, k):
    rng = np.random.default_rng(k)
    for n, i in enumerate(rng.choice(regs.SMALL_PTES_PER_PT, k, replace=False).tolist()):
        guest.store(guest.entry_addr(n % TABLES, i), pte((16 + n) << 12))
    assert guest.scanned_by() == k
    assert_same_as_full(guest)
    assert guest.scanned_by() == 0


def test_full_resync_still_reads_everything(guest):
    guest.store(guest.entry_addr(0, 5), pte(0x20000))
    assert guest.scanned_by(incremental=False) == TABLES * regs.SMALL_PTES_PER_PT
    assert_same_as_full(guest)


def test_engine_writes_are_seen_through_the_log(guest):
    """A copy engine writing a table page is not trapped; the log names the page, and the
    resync compares that page (512 entries), not the table."""
    addr = guest.entry_addr(1, 1000)
    guest.vram.u64[addr >> 3] = pte(0x30000)
    guest.log.mark_range(addr, 8)
    assert guest.scanned_by() == regs.SMALL_PAGE // regs.PTE_SIZE
    assert_same_as_full(guest)


def test_a_write_nobody_saw_is_missed(guest):
    """The tracking is what finds changes (this is what the log and the traps are for)."""
    addr = guest.entry_addr(1, 1000)
    guest.vram.u64[addr >> 3] = pte(0x30000)
    assert guest.scanned_by() == 0
    with pytest.raises(AssertionError):
        assert_same_as_full(guest)


def test_new_and_moved_tables_are_translated_in_full(guest):
    moved = PTS + TABLES * PT_BYTES
    guest.vram.u64[(moved >> 3) + 3] = pte(0x40000)  # written before the table is named
    guest.store_pde(2, moved)
    assert guest.scanned_by() == regs.SMALL_PTES_PER_PT
    assert_same_as_full(guest)
    guest.store_pde(2, moved + PT_BYTES)
    guest.store_pde(40, moved)
    assert guest.scanned_by() == 2 * regs.SMALL_PTES_PER_PT
    assert_same_as_full(guest)


def test_sysram_tables_are_compared_whole(guest):
    guest.store_pde(9, 0, target=regs.PDE_TARGET_SYSRAM)
    guest.space.sync(incremental=True)
    region = guest.ram.region(0, PT_BYTES).view(np.uint64)
    region[77] = pte(0x50000)  # a vCPU store into its RAM: no trap
    assert guest.scanned_by() == regs.SMALL_PTES_PER_PT
    assert_same_as_full(guest)


_OPS = st.lists(st.one_of(
    st.tuples(st.just("store"), st.integers(0, TABLES), st.integers(0, regs.SMALL_PTES_PER_PT - 1),
              st.integers(0, (SLICE >> 12) - 1)),
    st.tuples(st.just("engine"), st.integers(0, TABLES), st.integers(0, regs.SMALL_PTES_PER_PT - 1),
              st.integers(0, (SLICE >> 12) - 1)),
    st.tuples(st.just("pde"), st.integers(1, TABLES + 2), st.integers(0, TABLES), st.just(0)),
    st.tuples(st.just("clear_pde"), st.integers(1, TABLES + 2), st.just(0), st.just(0)),
    st.tuples(st.just("sync"), st.just(0), st.just(0), st.just(0)),
), max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_incremental_equals_full_under_any_history(ops):
    g = Guest()
    try:
        g.space.sync(incremental=False)
        for op, a, b, c in ops:
            if op == "store":
                g.store(g.entry_addr(a, b), pte(c << 12))
            elif op == "engine":
                addr = g.entry_addr(a, b)
                g.vram.u64[addr >> 3] = pte(c << 12)
                g.log.mark_range(addr, 8)
            elif op == "pde":
                g.store_pde(a, PTS + b * PT_BYTES)
            elif op == "clear_pde":
                g.store(PD + a * regs.PDE_SIZE, 0)
            else:
                g.space.sync(incremental=True)
        g.space.sync(incremental=True)
        assert_same_as_full(g)
    finally:
        g.vram.close()


# ---------------------------------------------------------------------- through the mediator
@pytest.fixture
def lazy_world():
    from gpuvm.device.gpu import Gpu

    gpu = Gpu(time_scale=1000, vram_size=1024 * regs.MiB).start()
    med = Mediator(gpu)
    yield gpu, med
    med.close()
    gpu.release_memory()


@pytest.mark.parametrize("mode", ["fv+lazy", "fv"])
def test_bar_window_syncs_at_first_use(lazy_world, mode):
    gpu, med = lazy_world
    vm = Vm(med, "vm0", mode)
    drv, vgpu = vm.drv, vm.vgpu
    offset = BAR1_SIZE - 0x10000
    page = vm.rig.b
    gpu.vram.u32[vgpu.policy.host_vram(page) >> 2] = 0x600DCAFE
    before = vgpu.counters().get("shadow.bar_syncs", 0)
    drv.map(drv.bar1_space, offset, page)
    drv.flush(drv.bar1_space, bar_vm=True)
    synced_at_flush = vgpu.counters().get("shadow.bar_syncs", 0) - before
    assert synced_at_flush == (0 if mode == "fv+lazy" else 1)
    assert vgpu.read(regs.BAR1, offset, 4) == 0x600DCAFE  # the use sees the new mapping
    assert vgpu.counters()["shadow.bar_syncs"] - before == 1
    drv.flush(drv.bar1_space, bar_vm=True)  # nothing changed since
    unchanged = vgpu.counters().get("shadow.bar_flushes_unchanged", 0)
    assert vgpu.counters()["shadow.bar_syncs"] - before == (1 if mode == "fv+lazy" else 2)
    assert unchanged == (1 if mode == "fv+lazy" else 0)


class Granted:
    """A VMM's view of what the vGPU granted (BAR remap): page offset -> host address."""

    def __init__(self) -> None:
        self.pages: dict[tuple[int, int], int] = {}

    def map(self, bar: int, offset: int, host: int, size: int) -> None:
        for i in range(0, size, regs.SMALL_PAGE):
            self.pages[(bar, offset + i)] = host + i

    def unmap(self, bar: int, offset: int, size: int) -> None:
        for i in range(0, size, regs.SMALL_PAGE):
            self.pages.pop((bar, offset + i), None)

    def post(self, bar: int, offset: int, size: int, allowed: bool) -> None:
        """Queues nothing: every store reaches the vGPU at once (always allowed)."""


def test_a_changed_remapped_page_is_resynced_at_the_flush(lazy_world):
    """fv-opt: a remapped page is used without a trap, so a flush that changes its entry
    cannot wait for a use; one that changes only unmapped entries can."""
    gpu, med = lazy_world
    vm = Vm(med, "vm0", "fv-opt")
    drv, vgpu = vm.drv, vm.vgpu
    granted = Granted()
    vgpu.set_mapping_listener(granted)
    offset = BAR1_SIZE - 0x10000
    first, second = vm.rig.b, vm.rig.c
    host = gpu.vram.host_address + vgpu.policy.vram_base

    def syncs() -> int:
        return vgpu.counters().get("shadow.bar_syncs", 0)

    drv.map(drv.bar1_space, offset, first)
    before = syncs()
    drv.flush(drv.bar1_space, bar_vm=True)
    assert syncs() == before  # the page was not granted: lazy
    vgpu.read(regs.BAR1, offset, 4)  # first use: resync, and the page is granted
    assert syncs() == before + 1
    assert granted.pages[(regs.BAR1, offset)] == host + first
    drv.map(drv.bar1_space, offset, second)
    drv.flush(drv.bar1_space, bar_vm=True)
    assert syncs() == before + 2  # at once: the guest reaches it without trapping
    assert granted.pages[(regs.BAR1, offset)] == host + second


@pytest.mark.parametrize("mode", ["fv+lazy", "fv"])
def test_a_page_table_written_by_the_copy_engine(lazy_world, mode):
    """The guest maps one of its own page tables into its GPU address space and has the
    copy engine write an entry there: no trap sees that store, the device's engine write
    log does, and after the flush the new mapping works."""
    gpu, med = lazy_world
    vm = Vm(med, "vm0", mode)
    drv, rig = vm.drv, vm.rig
    target_va = 0x58000000  # a PDE of its own
    index = (target_va >> 12) & (regs.SMALL_PTES_PER_PT - 1)
    table = drv._pt(rig.space, target_va >> regs.PDE_SPAN_SHIFT)
    entry = table + index * regs.PTE_SIZE
    table_va = 0x60000000
    drv.map(rig.space, table_va, entry & ~0xFFF)
    drv.flush(rig.space)
    gpu.vram.u32[vm.vgpu.policy.host_vram(rig.b) >> 2] = 0x7AB1E5ED
    vm.ram.write(rig.sys_base, np.array([pte(rig.b)], dtype=np.uint64))
    scanned = vm.vgpu.counters().get("shadow.ptes_scanned", 0)
    assert vm.copy(rig.sys_va(0), table_va + (entry & 0xFFF), 8)  # the engine's store
    drv.flush(rig.space)
    assert vm.copy(target_va, rig.sys_va(1), 4)
    assert vm.ram.read_u32(rig.sys_base + rig.pages * 4096) == 0x7AB1E5ED
    if mode == "fv+lazy":  # the resync compared the written page, not every table
        assert vm.vgpu.counters()["shadow.ptes_scanned"] - scanned < 4 * regs.SMALL_PTES_PER_PT
