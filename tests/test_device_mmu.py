"""The page-table walker on its own: formats, large pages, flags, limits, and the TLB."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gpuvm.device import layout, regs
from gpuvm.device.counters import Counters
from gpuvm.device.dma import RamPort
from gpuvm.device.layout import pte
from gpuvm.device.mmu import DmaFault, Mmu, Space, VmFault
from gpuvm.device.vram import Vram

PD = 0x10000
SPT = 0x100000  # small page table (256 KiB)
LPT = 0x200000  # large page table


@pytest.fixture(scope="module")
def vram():
    v = Vram(64 * regs.MiB)
    yield v
    v.close()


@pytest.fixture
def mmu(vram):
    vram.u8[:] = 0
    m = Mmu(vram, Counters())
    m.dma = RamPort(np.zeros(1 << 20, dtype=np.uint8))
    return m


def set_pde(vram, index, small=None, large=None, large_size=0):
    value = 0
    if small is not None:
        value |= layout.pde_small(small)
    if large is not None:
        value |= layout.pde_large(large, size=large_size)
    vram.u64[(PD + index * 8) >> 3] = value


def test_small_pages_translate_and_coalesce(mmu, vram):
    set_pde(vram, 0, small=SPT)
    for i, frame in enumerate([0x400000, 0x401000, 0x900000]):
        vram.u64[(SPT + (0x10 + i) * 8) >> 3] = pte(frame)
    pages = mmu.translate(Space(PD), 0x10000 + 0x800, 3 * 4096 - 0x800, write=False)
    assert pages.frames.tolist() == [0x400000, 0x401000, 0x900000]
    runs = mmu._runs(pages)
    assert runs == [(0, 0x400800, 0x1800), (0, 0x900000, 0x1000)]


def test_large_pages_and_pt_size(mmu, vram):
    set_pde(vram, 1, large=LPT, large_size=1)  # half-size large PT: 512 entries
    vram.u64[(LPT + 3 * 8) >> 3] = pte(0x1000000)
    va = regs.PDE_SPAN + 3 * regs.LARGE_PAGE + 0x5000
    target, phys = mmu.translate_one(Space(PD), va, write=False)
    assert (target, phys) == (regs.TARGET_VRAM, 0x1005000)
    with pytest.raises(VmFault) as exc:
        mmu.translate(Space(PD), regs.PDE_SPAN + 600 * regs.LARGE_PAGE, 4, write=False)
    assert exc.value.reason == regs.FAULT_PT_TOO_SHORT


def test_flags_and_limit(mmu, vram):
    set_pde(vram, 0, small=SPT)
    vram.u64[(SPT + 8) >> 3] = pte(0x400000, read_only=True)
    vram.u64[(SPT + 16) >> 3] = pte(0x401000, supervisor=True)
    space = Space(PD, limit=0x2FFF)
    mmu.translate(space, 0x1000, 4, write=False)
    with pytest.raises(VmFault) as exc:
        mmu.translate(space, 0x1000, 4, write=True)
    assert exc.value.reason == regs.FAULT_READ_ONLY
    with pytest.raises(VmFault) as exc:
        mmu.translate(space, 0x2000, 4, write=False, user=True)
    assert exc.value.reason == regs.FAULT_SUPERVISOR_ONLY
    mmu.translate(space, 0x2000, 4, write=False, user=False)  # BAR (host) access is fine
    with pytest.raises(VmFault) as exc:
        mmu.translate(space, 0x2FFC, 8, write=False)
    assert exc.value.reason == regs.FAULT_VM_LIMIT


def test_a_page_walked_before_is_still_checked_per_access(mmu, vram):
    """translate_one keeps each page's walk until a flush: each access is still checked
    against the space's limit and the PTE's flags, and counted."""
    set_pde(vram, 0, small=SPT)
    vram.u64[(SPT + 8) >> 3] = pte(0x400000, read_only=True)
    vram.u64[(SPT + 16) >> 3] = pte(0x401000, supervisor=True)
    space = Space(PD)
    before = mmu.counters.total["vm.translations"]
    for _ in range(2):
        assert mmu.translate_one(space, 0x1004, False) == (regs.TARGET_VRAM, 0x400004)
        with pytest.raises(VmFault) as exc:
            mmu.translate_one(space, 0x1008, True)
        assert exc.value.reason == regs.FAULT_READ_ONLY
        assert mmu.translate_one(space, 0x2000, True) == (regs.TARGET_VRAM, 0x401000)
        with pytest.raises(VmFault) as exc:
            mmu.translate_one(space, 0x2000, False, user=True)
        assert exc.value.reason == regs.FAULT_SUPERVISOR_ONLY
        with pytest.raises(VmFault) as exc:  # the same directory under a shorter limit
            mmu.translate_one(Space(PD, limit=0x1FFF), 0x2000, False)
        assert exc.value.reason == regs.FAULT_VM_LIMIT
    assert mmu.counters.total["vm.translations"] == before + 4


def test_sysram_target_outside_port_is_a_dma_fault(mmu, vram):
    set_pde(vram, 0, small=SPT)
    vram.u64[(SPT + 8) >> 3] = pte(0x200000, target=regs.TARGET_SYSRAM)  # port is 1 MiB
    pages = mmu.translate(Space(PD), 0x1000, 16, write=False)
    with pytest.raises(DmaFault):
        mmu.read(pages)


def test_tlb_keeps_old_table_until_flush(mmu, vram):
    set_pde(vram, 0, small=SPT)
    vram.u64[(SPT + 8) >> 3] = pte(0x400000)
    assert mmu.translate_one(Space(PD), 0x1000, False)[1] == 0x400000
    vram.u64[(SPT + 8) >> 3] = pte(0x500000)
    assert mmu.translate_one(Space(PD), 0x1000, False)[1] == 0x400000
    mmu.flush(PD, regs.TARGET_VRAM)
    assert mmu.translate_one(Space(PD), 0x1000, False)[1] == 0x500000


def test_page_gather_matches_run_copy(mmu, vram):
    set_pde(vram, 0, small=SPT)
    rng = np.random.default_rng(7)
    frames = rng.permutation(np.arange(0x800, 0x800 + 64, dtype=np.uint64)) << np.uint64(12)
    vram.u64[(SPT >> 3):(SPT >> 3) + 64] = layout.ptes(frames)
    vram.u8[0x800000:0x800000 + 64 * 4096] = rng.integers(0, 255, 64 * 4096, dtype=np.uint8)
    pages = mmu.translate(Space(PD), 0, 64 * 4096, write=False)
    fast = mmu.read(pages)
    expect = np.concatenate([vram.u8[int(f):int(f) + 4096] for f in frames])
    np.testing.assert_array_equal(fast, expect)
    partial = mmu.read(mmu.translate(Space(PD), 100, 5 * 4096, write=False))
    np.testing.assert_array_equal(partial, expect[100:100 + 5 * 4096])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # state reset per example
@given(ptes=st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=8),
       pde=st.integers(0, 2 ** 64 - 1), va=st.integers(0, 8 * 4096), length=st.integers(1, 9000))
def test_garbage_tables_fault_cleanly(mmu, vram, ptes, pde, va, length):
    """Whatever a guest writes into its tables, a walk returns pages or a clean fault."""
    vram.u64[PD >> 3] = pde
    vram.u64[SPT >> 3:(SPT >> 3) + len(ptes)] = np.array(ptes, dtype=np.uint64)
    mmu.flush()
    try:
        pages = mmu.translate(Space(PD), va, length, write=False)
    except VmFault:
        return
    try:
        data = mmu.read(pages)
    except DmaFault:
        return
    assert data.size == length


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ptes=st.lists(st.integers(0, 2 ** 64 - 1), min_size=4, max_size=4),
       pde=st.integers(0, 2 ** 64 - 1), va=st.integers(0, 4 * 4096 - 1),
       write=st.booleans(), user=st.booleans())
def test_scalar_walk_agrees_with_range_walk(mmu, vram, ptes, pde, va, write, user):
    """The BAR path and the engine path must never disagree about a translation."""
    vram.u64[PD >> 3] = pde
    vram.u64[SPT >> 3:(SPT >> 3) + 4] = np.array(ptes, dtype=np.uint64)
    mmu.flush()

    def outcome(fn):
        try:
            return fn()
        except VmFault as exc:
            return ("fault", exc.reason)

    one = outcome(lambda: mmu.translate_one(Space(PD), va, write, user))
    rng = outcome(lambda: (lambda p: (int(p.targets[0]), int(p.frames[0]) + (va & 0xFFF)))(
        mmu.translate(Space(PD), va, 1, write, user)))
    assert one == rng
