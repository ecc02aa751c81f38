"""The device driven with the exact sequences nouveau and Gdev use, checked for what those
drivers would see.  Each test names the function whose sequence it replays; the facts
come from nouveau (nvkm, nouveau_bo90b5.c), Gdev (common/gdev_nvidia_nvc0.c) and
envytools (rnndb/, docs/hw/)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.host_driver import HostDriver, method
from gpuvm.device.layout import pte

from test_device_end_to_end import SUB_COMPUTE, SUB_COPY, Rig

SUB_M2MF = 2
VA_EXTRA = 0x48000000  # a PDE of its own (index 9 in 128 KiB mode)


@pytest.fixture
def drv(gpu):
    d = HostDriver(gpu)
    d.init()
    d.setup_bar1(gpu.profile.bar1_size)
    return d


@pytest.fixture
def rig(gpu, sysram, drv):
    r = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB, n=128)  # 16 pages per buffer
    drv.submit_runlist([0])
    return r


def run_and_wait(gpu, rig, words: list[int]) -> bool:
    """Push words plus a fence; True when the fence landed, False when the channel faulted."""
    seq = rig.run(words)
    before = len(gpu.faults())
    gpu.wait_event(lambda: rig.sysram.read_u32(rig.fence) == seq or len(gpu.faults()) > before, 10)
    return rig.sysram.read_u32(rig.fence) == seq


def fill(sysram, addr: int, nbytes: int, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    sysram.write(addr, data)
    return data


def copy_bind() -> list[int]:
    return HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)


# ------------------------------------------------------------------------------ copy engine
def test_copy_exec_0x110_like_nvc0_bo_move_copy(gpu, sysram, rig):
    """nouveau nouveau_bo90b5.c nvc0_bo_move_copy: 0x30c..0x328 = src, dst, PAGE_SIZE x3,
    line_count, then EXEC 0x110.  All line_count pages arrive; nothing is written at the
    (unset) query address; no fault."""
    src = fill(sysram, rig.sys_base, 4 * 4096, seed=1)  # nouveau copies whole pages
    words = copy_bind() + method(SUB_COPY, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                                 rig.va(0) >> 32, rig.va(0) & 0xFFFFFFFF, 4096, 4096, 4096, 4) \
        + method(SUB_COPY, 0x300, 0x110)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    got = gpu.vram.u8[rig.a:rig.a + 4 * 4096]
    assert np.array_equal(got, src)
    assert gpu.counters()["copy.bytes"] == 4 * 4096
    assert gpu.faults() == []


def test_copy_exec_0x3110_like_gdev_memcpy_pcopy0(gpu, sysram, rig):
    """Gdev nvc0_fence_write (PCOPY0: 0x338 query address hi/lo, counter) then
    nvc0_memcpy_pcopy0: pitch 0x8000 lines with EXEC 0x3110 (QUERY_SHORT|QUERY|LINEAR),
    the remainder as one line with pitch 0.  The data arrives and the query writes the
    32-bit counter only."""
    size = 0x8000 + 0x234  # one 32 KiB line and a tail, inside the rig's 64 KiB buffers
    src = fill(sysram, rig.sys_base, 16 * 4096, seed=2)
    query_va = rig.sys_va(2)
    query = rig.sys_base + 2 * rig.pages * 4096
    sysram.write(query, np.full(4, 0xEEEEEEEE, dtype=np.uint32))
    pitch = 0x8000
    ycnt = size // pitch
    rem = size - pitch * ycnt
    words = copy_bind() + method(SUB_COPY, 0x338, query_va >> 32, query_va & 0xFFFFFFFF, 77)
    words += method(SUB_COPY, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                    rig.va(0) >> 32, rig.va(0) & 0xFFFFFFFF, pitch, pitch) \
        + method(SUB_COPY, 0x324, pitch, ycnt) + method(SUB_COPY, 0x300, 0x3110)
    s2, d2 = rig.sys_va(0) + pitch * ycnt, rig.va(0) + pitch * ycnt
    words += method(SUB_COPY, 0x30C, s2 >> 32, s2 & 0xFFFFFFFF, d2 >> 32, d2 & 0xFFFFFFFF, 0, 0) \
        + method(SUB_COPY, 0x324, rem, 1) + method(SUB_COPY, 0x300, 0x3110)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    assert np.array_equal(gpu.vram.u8[rig.a:rig.a + size], src[:size])
    assert gpu.vram.u8[rig.a + size] == 0  # nothing past the copy
    words_after = sysram.read(query, 16).view(np.uint32).tolist()
    assert words_after == [77, 0xEEEEEEEE, 0xEEEEEEEE, 0xEEEEEEEE]  # QUERY_SHORT: one word


def test_copy_query_without_short_writes_four_words(gpu, sysram, rig):
    """nvkm/engine/ce/fuc/com.fuc cmd_exec_query: QUERY without QUERY_SHORT writes
    {counter, 0, PTIMER low, PTIMER high}."""
    query_va, query = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    sysram.write(query, np.full(4, 0xEEEEEEEE, dtype=np.uint32))
    words = copy_bind() + method(SUB_COPY, 0x338, query_va >> 32, query_va & 0xFFFFFFFF, 5) \
        + method(SUB_COPY, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                 rig.va(0) >> 32, rig.va(0) & 0xFFFFFFFF, 64, 64, 64, 1) \
        + method(SUB_COPY, 0x300, regs.COPY_LAUNCH_NOUVEAU | regs.COPY_LAUNCH_QUERY)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    seq, zero, lo, hi = sysram.read(query, 16).view(np.uint32).tolist()
    assert (seq, zero) == (5, 0) and (hi << 32 | lo) > 0


def test_copy_line_count_is_always_used(gpu, sysram, rig):
    """com.fuc cmd_exec_kick always loads YCNT: the old 'multi-line' launch bit is gone,
    and a launch with YCNT 0 copies nothing (the firmware's state starts at zero)."""
    fill(sysram, rig.sys_base, 4096, seed=3)
    words = copy_bind() + method(SUB_COPY, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                                 rig.va(0) >> 32, rig.va(0) & 0xFFFFFFFF, 64, 64, 64, 0) \
        + method(SUB_COPY, 0x300, 0x110)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    assert not gpu.vram.u8[rig.a:rig.a + 4096].any()


@pytest.mark.parametrize("mthd,value", [(0x324, 0x10000), (0x328, 0x2000), (0x30C, 0x100)],
                         ids=["xcnt", "ycnt", "src_hi"])
def test_copy_value_wider_than_the_firmware_field_stops_the_channel(gpu, rig, mthd, value):
    """com.fuc dispatch: a value with bits outside the method's field is INVALID_BITFIELD
    (nouveau never sends one: it caps line_count at 8191 and lines at PAGE_SIZE)."""
    assert not run_and_wait(gpu, rig, copy_bind() + method(SUB_COPY, mthd, value))
    assert gpu.faults()[-1].code == regs.CHAN_ERR_SIZE_LIMIT_EXT


def test_copy_tiled_surface_is_refused_not_misread(gpu, rig):
    """com.fuc cmd_exec: SRC_LINEAR/DST_LINEAR clear means a tiled surface, which this
    model does not carry out: the channel stops with 'not modelled' instead of copying
    something else."""
    words = copy_bind() + method(SUB_COPY, 0x324, 64, 1) + method(SUB_COPY, 0x300, 0x100)
    assert not run_and_wait(gpu, rig, words)
    assert gpu.faults()[-1].code == regs.CHAN_ERR_UNSUPPORTED_EXT


def test_copy_format_remaps_components(gpu, sysram, rig):
    """com.fuc cmd_exec_set_format: FORMAT = selectors | (size-1) << 16 | (src n-1) << 20 |
    (dst n-1) << 24; selectors 0-3 source component, 4/5 the constants, 6 no write."""
    src = np.arange(64, dtype=np.uint8)  # 16 elements of 4 one-byte components
    sysram.write(rig.sys_base, src)
    gpu.vram.u8[rig.a:rig.a + 64] = 0xAA
    fmt = (3 << 0) | (4 << 4) | (0 << 8) | (6 << 12) | (0 << 16) | (3 << 20) | (3 << 24)
    words = copy_bind() + method(SUB_COPY, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                                 rig.va(0) >> 32, rig.va(0) & 0xFFFFFFFF, 64, 64, 16, 1,
                                 fmt, 0x5A, 0) \
        + method(SUB_COPY, 0x300, 0x111)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    got = gpu.vram.u8[rig.a:rig.a + 64].reshape(16, 4)
    el = src.reshape(16, 4)
    assert np.array_equal(got[:, 0], el[:, 3])
    assert (got[:, 1] == 0x5A).all()
    assert np.array_equal(got[:, 2], el[:, 0])
    assert (got[:, 3] == 0xAA).all()  # selector 6: left alone


# ------------------------------------------------------------------------------ M2MF
def test_m2mf_like_gdev_memcpy_m2mf(gpu, sysram, rig):
    """Gdev nvc0_memcpy_m2mf: 0x238 out hi/lo; 0x30c in hi/lo, pitch in/out (0x314/0x318),
    line length, line count; EXEC 0x102110 (QUERY_SHORT|QUERY_YES|LINEAR), with the query
    set by nvc0_fence_write (M2MF 0x32c address hi/lo, sequence)."""
    src = fill(sysram, rig.sys_base, 4 * 4096, seed=4)
    query_va, query = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    sysram.write(query, np.full(2, 0xEEEEEEEE, dtype=np.uint32))
    words = HostDriver.bind(SUB_M2MF, regs.CLASS_M2MF, regs.ENGINE_PGRAPH) \
        + method(SUB_M2MF, 0x32C, query_va >> 32, query_va & 0xFFFFFFFF, 9) \
        + method(SUB_M2MF, 0x238, rig.va(1) >> 32, rig.va(1) & 0xFFFFFFFF) \
        + method(SUB_M2MF, 0x30C, rig.sys_va(0) >> 32, rig.sys_va(0) & 0xFFFFFFFF,
                 0x1000, 0x1000, 0x1000, 4) \
        + method(SUB_M2MF, 0x300, 0x102110)
    assert run_and_wait(gpu, rig, words), gpu.faults()
    assert np.array_equal(gpu.vram.u8[rig.b:rig.b + 4 * 4096], src)
    assert sysram.read(query, 8).view(np.uint32).tolist() == [9, 0xEEEEEEEE]


# ------------------------------------------------------------------------------ PFIFO
def test_zero_length_gpfifo_entry_raises_ib_empty(gpu, sysram, drv, rig):
    """envytools docs/hw/fifo/dma-pusher.rst: an IB entry of length zero is a DMA_PUSHER
    IB_EMPTY error -- on that channel only."""
    other = Rig(gpu, sysram, drv, 2, sys_base=12 * regs.MiB, n=16)
    drv.submit_runlist([0, 2])
    ch = rig.ch
    entry = ch.ring + ch.put * regs.GPFIFO_ENTRY_SIZE
    drv.vram_wr32(entry, ch.pushbuf_va)
    drv.vram_wr32(entry + 4, 0)  # zero words
    ch.put += 1
    drv.doorbell(ch)
    assert gpu.wait_event(lambda: gpu.faults(), 5)
    fault = gpu.faults()[0]
    assert (fault.chid, fault.code) == (0, regs.CHAN_ERR_IB_EMPTY_EXT)
    assert drv.rd(regs.PFIFO_CHAN_ERROR_EXT) & 0xFF == regs.CHAN_ERR_IB_EMPTY_EXT
    assert drv.rd(regs.PFIFO_INTR) & regs.PFIFO_INTR_PBDMA
    assert run_and_wait(gpu, other, [])  # the other channel goes on


def test_semaphore_acquire_mask(gpu, sysram, rig):
    """envytools docs/hw/fifo/puller.rst SEMAPHORE_TRIGGER op 8 ACQUIRE_MASK: the channel
    waits until (word & sequence) != 0."""
    word = rig.sys_base + 2 * rig.pages * 4096
    sysram.write(word, np.array([0x10], dtype=np.uint32))
    va = rig.sys_va(2)
    seq = rig.run(method(0, regs.HOST_SEMAPHORE_ADDR_HI, va >> 32, va & 0xFFFFFFFF, 0x3,
                         regs.SEM_ACQUIRE_MASK))
    assert not gpu.wait_event(lambda: sysram.read_u32(rig.fence) == seq, 0.3)  # 0x10 & 3 == 0
    sysram.write(word, np.array([0x12], dtype=np.uint32))
    assert gpu.wait_event(lambda: sysram.read_u32(rig.fence) == seq, 5), gpu.faults()
    assert gpu.faults() == []


def test_runlist_event_like_gf100_fifo_runlist_commit(gpu, drv, rig):
    """nouveau gf100_fifo_runlist_commit writes 0x2270, 0x2274 = 0x01f00000 | n and sleeps
    until !(0x227c & 0x100000); gf100_fifo_intr sees 0x2100 bit 30 and
    gf100_fifo_intr_runlist acks 0x2a00 bit 28 ("update done")."""
    drv.wr(regs.PFIFO_RUNLIST_SUBMIT, 0x01F00000 | 1)
    assert drv.rd(regs.PFIFO_INTR) & 0x40000000
    assert drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO
    assert drv.rd(0x2A00) & 0x10000000
    drv.wr(0x2A00, 0x10000000)
    assert not drv.rd(0x2A00)
    assert not drv.rd(regs.PFIFO_INTR) & 0x40000000  # a level: gone with its status
    assert not drv.rd(0x227C) & 0x100000
    assert drv.rd(regs.PFIFO_RUNLIST_SUBMIT) == 1  # the count, not nouveau's upper bits
    assert run_and_wait(gpu, rig, [])  # channel 0 still served


# ------------------------------------------------------------------------------ memory
def _sysram_pt_pde(pt_addr: int, target: int) -> int:
    """A PDE as nouveau gf100_vmm_pgd_pde writes it for a small PT in host memory."""
    return layout.pde_small(pt_addr, target, volatile=target == regs.PDE_TARGET_SYSRAM)


@pytest.mark.parametrize("pde_target", [regs.PDE_TARGET_SYSRAM, regs.PDE_TARGET_SYSRAM_NOSNOOP])
def test_small_page_table_in_sysram(gpu, sysram, drv, rig, pde_target):
    """nouveau gf100_vmm_pgd_pde: 2 << 32 | VOL (bit 34) or 3 << 32 for a page table in
    host memory.  The device walks it there; a PDE target of 0 is absent and faults."""
    pt = 16 * regs.MiB  # guest-physical = bus address of the table
    index = (VA_EXTRA >> 12) & (regs.SMALL_PTES_PER_PT - 1)
    sysram.write(pt + 8 * index, np.array([pte(rig.a)], dtype=np.uint64))
    drv.vram_wr64(rig.space.pd + 8 * (VA_EXTRA >> regs.PDE_SPAN_SHIFT),
                  _sysram_pt_pde(pt, pde_target))
    drv.flush(rig.space)
    gpu.vram.u32[rig.a >> 2] = 0xC0FFEE
    assert run_and_wait(gpu, rig, copy_bind() + HostDriver.copy(SUB_COPY, VA_EXTRA,
                                                                rig.sys_va(1), 4))
    assert sysram.read_u32(rig.sys_base + rig.pages * 4096) == 0xC0FFEE
    drv.vram_wr64(rig.space.pd + 8 * (VA_EXTRA >> regs.PDE_SPAN_SHIFT),
                  layout.pde_small(pt, regs.PDE_TARGET_ABSENT))
    drv.flush(rig.space)
    assert not run_and_wait(gpu, rig, HostDriver.copy(SUB_COPY, VA_EXTRA, rig.sys_va(1), 4))
    assert gpu.faults()[-1].vm_reason == regs.FAULT_PDE_NOT_PRESENT


def test_large_pages_64k_mode(gpu, sysram, drv, rig):
    """PFFB_VM_CFG bit 0 (nouveau gf100_vmm_desc_16_12 / gf100_vmm_desc_16_16): 64 KiB
    large pages, 1024 of them per PDE, so a PDE spans 64 MiB and the directory has 16384
    entries.  The same VA lands on PDE index va >> 26."""
    drv.wr(regs.PFFB_VM_CFG, regs.PFFB_VM_CFG_LARGE_64K)
    assert drv.rd(regs.PFFB_VM_CFG) & regs.PFFB_VM_CFG_LARGE_64K
    space = drv.new_space()
    drv.alloc(regs.PD_BYTES_64K - regs.PD_BYTES)  # the directory is twice as long now
    lpt = drv.alloc(1024 * 8)
    frame = drv.alloc(0x10000, align=0x10000)
    va = 0x4C000000 + 3 * 0x10000  # PDE 0x13 in 64 MiB mode (9 in 128 MiB mode)
    drv.vram_wr64(space.pd + 8 * (va >> 26), layout.pde_large(lpt))
    drv.vram_wr64(lpt + 8 * ((va & (0x4000000 - 1)) >> 16), pte(frame))
    gpu.vram.u32[(frame + 0x1234) >> 2] = 0xBEEF
    # the rig's channel space, remapped into this 64 KiB-mode directory
    ch_space = rig.space
    for idx in range(regs.PDE_COUNT):  # carry the rig's 128 MiB PDEs over as 2 x 64 MiB
        old = drv.vram_rd32(ch_space.pd + 8 * idx + 4)  # the small-PT half
        if old:
            pt = layout.pde_tables(old << 32)[0][0]
            for half in range(2):
                drv.vram_wr64(space.pd + 8 * (2 * idx + half),
                              layout.pde_small(pt + half * 0x20000))
    drv.vram_wr32(rig.ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(space.pd))
    drv.flush(space)
    assert run_and_wait(gpu, rig, copy_bind() + HostDriver.copy(SUB_COPY, va + 0x1234,
                                                                rig.sys_va(1), 4)), gpu.faults()
    assert sysram.read_u32(rig.sys_base + rig.pages * 4096) == 0xBEEF


def test_bar1_mode_clear_is_plain_vram(gpu, drv):
    """envytools rnndb/bus/pbus.xml BAR1 MODE (bit 31); nouveau gf100_bar_bar1_fini
    clears only that bit.  BAR1 offset x is then VRAM address x, untranslated."""
    gpu.vram.u32[0x345670 >> 2] = 0x600DCAFE
    reg = drv.rd(regs.PBUS_BAR1_VM)
    drv.wr(regs.PBUS_BAR1_VM, reg & ~0x80000000)
    assert gpu.mmio_read(regs.BAR1, 0x345670, 4) == 0x600DCAFE
    gpu.mmio_write(regs.BAR1, 0x345674, 4, 0x12345678)
    assert gpu.vram.u32[0x345674 >> 2] == 0x12345678
    assert not drv.rd(regs.PFIFO_FAULT_UNIT_MASK)
    drv.wr(regs.PBUS_BAR1_VM, reg)  # MODE back on: unmapped offsets fault again
    assert gpu.mmio_read(regs.BAR1, 0x345670, 4) == 0xFFFFFFFF
    assert drv.rd(regs.PFIFO_FAULT_UNIT_MASK) & (1 << regs.FAULT_UNIT_BAR1)


def _record(drv, unit: int) -> tuple[int, int, int, int]:
    flags = drv.rd(regs.PFIFO_FAULT_RECORD + 0x10 * unit + regs.PFIFO_FAULT_FLAGS)
    # decoded as nouveau gf100_fifo_intr_fault does
    return flags & 0xF, (flags >> 6) & 1, (flags >> 7) & 1, (flags >> 8) & 0x1F


def test_fault_records_name_source_and_client(gpu, sysram, drv, rig):
    """nouveau gf100_fifo_intr_fault: reason bits 0-3, hub bit 6, write bit 7, client bits
    8-12; gf100_fifo_fault_hubclient: PCOPY0 1, PFIFO 6, BAR_READ 7, BAR_WRITE 8; compute
    accesses come from a GPC client (hub bit clear)."""
    assert not run_and_wait(gpu, rig, copy_bind() + HostDriver.copy(SUB_COPY, 0x7000000,
                                                                    rig.sys_va(0), 4))
    assert _record(drv, regs.FAULT_UNIT_PCOPY0) == (regs.FAULT_PDE_NOT_PRESENT, 1, 0, 1)
    gpu.mmio_read(regs.BAR1, 0x7F0000, 4)
    assert _record(drv, regs.FAULT_UNIT_BAR1)[1:] == (1, 0, 7)
    gpu.mmio_write(regs.BAR1, 0x7F0000, 4, 0)
    assert _record(drv, regs.FAULT_UNIT_BAR1)[1:] == (1, 1, 8)
    other = Rig(gpu, sysram, drv, 3, sys_base=12 * regs.MiB, n=16)
    drv.submit_runlist([0, 3])
    entry = other.ch.ring + other.ch.put * regs.GPFIFO_ENTRY_SIZE  # an unmapped pushbuffer
    word0, word1 = layout.gpfifo_entry(0x6000000, 4)
    drv.vram_wr32(entry, word0)
    drv.vram_wr32(entry + 4, word1)
    other.ch.put += 1
    drv.doorbell(other.ch)
    assert gpu.wait_event(lambda: any(f.chid == 3 for f in gpu.faults()), 5)
    assert _record(drv, regs.FAULT_UNIT_PFIFO)[1:] == (1, 0, 6)
    third = Rig(gpu, sysram, drv, 5, sys_base=14 * regs.MiB, n=16)
    drv.submit_runlist([0, 3, 5])
    third.run(HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
              + HostDriver.launch(SUB_COMPUTE, third.va(3), third.va(3) + 0x1000,
                                  [0x7000000, 0, 0x7001000, 0, 0x7002000, 0, third.n]))
    assert gpu.wait_event(lambda: any(f.chid == 5 for f in gpu.faults()), 5)
    assert _record(drv, regs.FAULT_UNIT_PGRAPH)[1:] == (0, 0, regs.FAULT_GPCCLIENT_TPC0_L1)


def test_targeted_flush_with_sysram_bit_matches_both_sysram_targets(gpu, sysram, drv, rig):
    """envytools rnndb/memory/gf100_pffb.xml: 0x100cb8 has one 'sysram' bit, so a
    targeted flush with it drops a directory given as non-coherent sysram (RAMIN target 3)
    as well as a coherent one."""
    pd = 20 * regs.MiB  # the channel's directory, copied into sysram
    sysram.write(pd, gpu.vram.u8[rig.space.pd:rig.space.pd + regs.PD_BYTES])
    drv.vram_wr32(rig.ch.inst + regs.RAMIN_PD_LO,
                  layout.ramin_ptr_lo(pd, regs.TARGET_SYSRAM_NOSNOOP))
    drv.doorbell(rig.ch)  # the device reloads RAMIN on a doorbell
    gpu.vram.u32[rig.a >> 2] = 1
    gpu.vram.u32[rig.b >> 2] = 2
    assert run_and_wait(gpu, rig, copy_bind() + HostDriver.copy(SUB_COPY, rig.va(0),
                                                                rig.sys_va(1), 4))
    assert sysram.read_u32(rig.sys_base + rig.pages * 4096) == 1
    # repoint VA_DATA's PDE (in the sysram directory) at the table that maps rig.va(1)
    index = rig.va(0) >> regs.PDE_SPAN_SHIFT
    moved = sysram.read(pd + 8 * (rig.va(1) >> regs.PDE_SPAN_SHIFT), 8).copy()
    pt_b = layout.pde_tables(int(moved.view(np.uint64)[0]))[0][0]
    offset_b = ((rig.va(1) >> 12) & (regs.SMALL_PTES_PER_PT - 1)) * 8
    offset_a = ((rig.va(0) >> 12) & (regs.SMALL_PTES_PER_PT - 1)) * 8
    entry_b = gpu.vram.u64[(pt_b + offset_b) >> 3]
    pt_a = layout.pde_tables(int(sysram.read(pd + 8 * index, 8).view(np.uint64)[0]))[0][0]
    gpu.vram.u64[(pt_a + offset_a) >> 3] = entry_b  # rig.va(0) now maps buffer b
    assert run_and_wait(gpu, rig, HostDriver.copy(SUB_COPY, rig.va(0), rig.sys_va(1), 4))
    assert sysram.read_u32(rig.sys_base + rig.pages * 4096) == 1  # cached: not flushed yet
    drv.wr(regs.PFFB_FLUSH_PD, layout.flush_pd_word(pd, sysram=True))
    drv.wr(regs.PFFB_FLUSH_TRIGGER, regs.PFFB_TRIGGER_GO | regs.PFFB_TRIGGER_ALL_PAGES)
    assert run_and_wait(gpu, rig, HostDriver.copy(SUB_COPY, rig.va(0), rig.sys_va(1), 4))
    assert sysram.read_u32(rig.sys_base + rig.pages * 4096) == 2


# ------------------------------------------------------------------------------ misc registers
def test_pflush_busy_bit_is_bit_1(gpu, drv):
    """nouveau gf100_bar_flush / g84_bar_flush: write 0x070000 = 1, then poll until
    (0x070000 & 2) clears."""
    before = gpu.counters().get("pflush.flushes", 0)
    drv.wr(0x070000, 0x00000001)
    assert not drv.rd(0x070000) & 0x00000002
    assert gpu.counters()["pflush.flushes"] == before + 1


def test_ptimer_time_0_low_bits_read_zero(gpu, drv):
    """envytools PTIMER: TIME_LOW bits 0-4 are always zero (nouveau nv04_timer_read reads
    TIME_1, TIME_0, TIME_1 and uses the pair as is)."""
    reads = [drv.rd(regs.PTIMER_TIME_0) for _ in range(50)]
    assert all(r & 0x1F == 0 for r in reads)
    assert len(set(reads)) > 1  # it still runs
