"""The device driven the way a driver drives it: page tables through PRAMIN, two channels,
copies and mmul kernels, semaphore fences in sysram, and the faults a driver would see."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.clock import DeviceClock
from gpuvm.device.host_driver import HostDriver, method
from gpuvm.device.kernels import kernel_object

VA_DATA = 0x10000000  # channel VAs from 256 MiB up
VA_SYS = 0x20000000
VA_GPFIFO = 0x30000000
SUB_COMPUTE, SUB_COPY = 1, 4


def fence_ok(sysram, addr: int, value: int) -> bool:
    return sysram.read_u32(addr) == value


class Rig:
    """One channel with VRAM data buffers and a sysram window, set up as a driver would."""

    def __init__(self, gpu, sysram, drv: HostDriver, chid: int, sys_base: int, n: int = 64):
        self.gpu, self.sysram, self.drv, self.chid = gpu, sysram, drv, chid
        self.n = n
        nbytes = 4 * n * n
        self.pages = (nbytes + 4095) // 4096
        self.space = drv.new_space()
        self.a, self.b, self.c = (drv.alloc(nbytes) for _ in range(3))
        self.code = drv.alloc(4096)
        self.cb = drv.alloc(4096)
        for i, buf in enumerate((self.a, self.b, self.c)):
            drv.map(self.space, VA_DATA + i * 0x1000000, buf, self.pages)
        drv.map(self.space, VA_DATA + 0x3000000, self.code)
        drv.map(self.space, VA_DATA + 0x3001000, self.cb)
        self.sys_base = sys_base
        drv.map(self.space, VA_SYS, sys_base, 3 * self.pages + 1, target=regs.TARGET_SYSRAM)
        drv.flush(self.space)
        self.ch = drv.create_channel(chid, self.space, VA_GPFIFO)
        drv.vram_write(self.code, kernel_object(regs.KERNEL_MMUL))
        self.fence = sys_base + 3 * self.pages * 4096  # last sysram page holds the fence
        self.seq = 0

    def va(self, i: int) -> int:
        return VA_DATA + i * 0x1000000

    def sys_va(self, i: int) -> int:
        return VA_SYS + i * self.pages * 4096

    def run(self, words: list[int]) -> int:
        self.seq += 1
        fence_va = VA_SYS + 3 * self.pages * 4096
        self.drv.push(self.ch, words + HostDriver.release(fence_va, self.seq))
        return self.seq


@pytest.fixture
def drv(gpu):
    d = HostDriver(gpu)
    d.init()
    d.setup_bar1(gpu.profile.bar1_size)
    return d


def test_identity_and_vram_discovery(gpu, drv):
    assert drv.rd(regs.PMC_BOOT_0) == 0x0C0C00A3
    assert drv.vram_size() == gpu.vram.size
    assert drv.rd(regs.PMC_ENABLE) & regs.PMC_ENABLE_PFIFO


def test_two_channels_copy_and_mmul(gpu, sysram, drv):
    rng = np.random.default_rng(1)
    rigs = [Rig(gpu, sysram, drv, chid, sys_base=(1 + chid) * 4 * regs.MiB) for chid in (0, 3)]
    drv.submit_runlist([0, 3])
    mats = {}
    for rig in rigs:
        a = rng.standard_normal((rig.n, rig.n), dtype=np.float32)
        b = rng.standard_normal((rig.n, rig.n), dtype=np.float32)
        mats[rig.chid] = (a, b)
        sysram.write(rig.sys_base, a)
        sysram.write(rig.sys_base + rig.pages * 4096, b)
        nbytes = 4 * rig.n * rig.n
        words = (HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                 + HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
                 + HostDriver.copy(SUB_COPY, rig.sys_va(0), rig.va(0), nbytes)
                 + HostDriver.copy(SUB_COPY, rig.sys_va(1), rig.va(1), nbytes)
                 + HostDriver.launch(SUB_COMPUTE, rig.va(3), rig.va(3) + 0x1000,
                                     [rig.va(0) & 0xFFFFFFFF, rig.va(0) >> 32,
                                      rig.va(1) & 0xFFFFFFFF, rig.va(1) >> 32,
                                      rig.va(2) & 0xFFFFFFFF, rig.va(2) >> 32, rig.n])
                 + HostDriver.copy(SUB_COPY, rig.va(2), rig.sys_va(2), nbytes))
        rig.expect = rig.run(words)
    for rig in rigs:
        assert gpu.wait_event(lambda r=rig: fence_ok(sysram, r.fence, r.expect), 10), \
            gpu.faults()
        a, b = mats[rig.chid]
        got = sysram.read(rig.sys_base + 2 * rig.pages * 4096, 4 * rig.n * rig.n).view(np.float32)
        np.testing.assert_allclose(got.reshape(rig.n, rig.n), a @ b, rtol=1e-4, atol=1e-4)
    counts = gpu.counters()
    assert counts["compute.kernels"] == 2
    assert counts["chan.0.copy.launches"] == counts["chan.3.copy.launches"] == 3
    assert counts["copy.bytes"] == 6 * 4 * 64 * 64
    assert gpu.faults() == []


def test_unmapped_address_faults_only_that_channel(gpu, sysram, drv):
    good = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    bad = Rig(gpu, sysram, drv, 1, sys_base=8 * regs.MiB)
    drv.submit_runlist([0, 1])
    unmapped = 0x7000000000
    bad.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
            + HostDriver.copy(SUB_COPY, unmapped, bad.va(0), 4096))
    assert gpu.wait_event(lambda: len(gpu.faults()) == 1, 10)
    fault = gpu.faults()[0]
    assert fault.chid == 1 and fault.engine == "PCOPY0"
    assert "page not present" in fault.reason or "PDE not present" in fault.reason
    assert fault.address == unmapped
    unit = regs.FAULT_UNIT_PCOPY0
    assert drv.rd(regs.PFIFO_FAULT_UNIT_MASK) & (1 << unit)
    rec = regs.PFIFO_FAULT_RECORD + unit * regs.PFIFO_FAULT_RECORD_STRIDE
    assert drv.rd(rec + regs.PFIFO_FAULT_INST) == layout.fault_inst_word(bad.ch.inst)
    assert drv.rd(rec + regs.PFIFO_FAULT_ADDR_LO) == unmapped & 0xFFFFFFFF
    assert drv.rd(rec + regs.PFIFO_FAULT_ADDR_HI) == unmapped >> 32
    assert drv.rd(regs.PFIFO_INTR) & regs.PFIFO_INTR_VM_FAULT
    assert drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO
    err = drv.rd(regs.PFIFO_CHAN_ERROR_EXT + 4 * 1)
    assert err == regs.PFIFO_CHAN_ERROR_FAULTED_EXT | regs.CHAN_ERR_VM_FAULT_EXT
    # the other channel is untouched and keeps working
    seq = good.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                   + HostDriver.copy(SUB_COPY, good.sys_va(0), good.va(0), 4096))
    assert gpu.wait_event(lambda: fence_ok(sysram, good.fence, seq), 10)
    assert drv.rd(regs.PFIFO_CHAN_ERROR_EXT) == 0


def test_missing_tlb_flush_is_observable(gpu, sysram, drv):
    rig = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    drv.submit_runlist([0])
    new_va = 0x50000000
    copy = HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
    # Touch the page table covering new_va so the TLB holds it (page not yet mapped).
    drv.map(rig.space, new_va + 0x1000, rig.a)
    drv.flush(rig.space)
    seq = rig.run(copy + HostDriver.copy(SUB_COPY, new_va + 0x1000, rig.sys_va(0), 16))
    assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 10)
    # Map new_va without flushing: the device still uses the cached table and faults.
    drv.map(rig.space, new_va, rig.b)
    rig.run(HostDriver.copy(SUB_COPY, new_va, rig.sys_va(0), 16))
    assert gpu.wait_event(lambda: len(gpu.faults()) == 1, 10)
    assert "page not present" in gpu.faults()[0].reason
    assert gpu.faults()[0].address == new_va


def test_stale_translation_then_flush(gpu, sysram, drv):
    """Remapping without a flush keeps reading the old page; the flush switches over."""
    rig = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    drv.submit_runlist([0])
    drv.vram_wr32(rig.a, 0xAAAA0001)
    drv.vram_wr32(rig.b, 0xBBBB0002)
    va = 0x60000000
    drv.map(rig.space, va, rig.a)
    drv.flush(rig.space)
    copy = HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
    seq = rig.run(copy + HostDriver.copy(SUB_COPY, va, rig.sys_va(0), 4))
    assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 10)
    assert sysram.read_u32(rig.sys_base) == 0xAAAA0001
    drv.map(rig.space, va, rig.b)  # no flush
    seq = rig.run(HostDriver.copy(SUB_COPY, va, rig.sys_va(0), 4))
    assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 10)
    assert sysram.read_u32(rig.sys_base) == 0xAAAA0001  # stale
    flushes = gpu.counters()["tlb.flushes"]
    drv.flush(rig.space)
    assert gpu.counters()["tlb.flushes"] == flushes + 1
    seq = rig.run(HostDriver.copy(SUB_COPY, va, rig.sys_va(0), 4))
    assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 10)
    assert sysram.read_u32(rig.sys_base) == 0xBBBB0002


@pytest.mark.parametrize("garbage, reason", [
    ([0xC0000000], "bad method header"),  # type 6: no such command (a zero word is a no-op)
    (method(1, regs.HOST_OBJECT, 0x1234), "unknown class"),
    (HostDriver.bind(2, regs.CLASS_COPY, regs.ENGINE_PCOPY0) + method(2, 0x400, 1),
     "unknown method"),  # (an empty subchannel is skipped, as the PBDMA's EMPTY_SUBC)
])
def test_garbage_pushbuffer_stops_only_its_channel(gpu, sysram, drv, garbage, reason):
    good = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    bad = Rig(gpu, sysram, drv, 5, sys_base=8 * regs.MiB)
    drv.submit_runlist([0, 5])
    bad.run(garbage)
    assert gpu.wait_event(lambda: len(gpu.faults()) == 1, 10)
    assert gpu.faults()[0].chid == 5 and reason in gpu.faults()[0].reason
    seq = good.run([])
    assert gpu.wait_event(lambda: fence_ok(sysram, good.fence, seq), 10)


def test_bad_kernel_magic(gpu, sysram, drv):
    rig = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    drv.submit_runlist([0])
    drv.vram_wr32(rig.code, 0x12345678)
    rig.run(HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
            + HostDriver.launch(SUB_COMPUTE, rig.va(3), rig.va(3) + 0x1000, [0] * 7))
    assert gpu.wait_event(lambda: len(gpu.faults()) == 1, 10)
    assert "bad kernel object" in gpu.faults()[0].reason


def test_engine_time_follows_profile(gpu, sysram, drv):
    """A loop kernel the profile costs at 2 ms keeps PGRAPH busy 2 ms of device time."""
    rig = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
    drv.submit_runlist([0])
    drv.vram_write(rig.code, kernel_object(regs.KERNEL_LOOP))
    iterations = 2_000_000 - gpu.profile.compute.launch_ns
    out = rig.va(0)
    t0 = gpu.device_time_ns()
    seq = rig.run(HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
                  + HostDriver.launch(SUB_COMPUTE, rig.va(3), rig.va(3) + 0x1000,
                                      [out & 0xFFFFFFFF, out >> 32, iterations, 0]))
    assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 10)
    assert gpu.device_time_ns() - t0 >= 2_000_000
    assert gpu.engines.graph.busy_ns == 2_000_000
    assert drv.vram_rd32(rig.a) == iterations


def test_unimplemented_register_is_counted_not_accepted(gpu, drv):
    assert drv.rd(0x00ABC0) == 0xBADF1100
    drv.wr(0x00ABC0, 5)
    assert drv.rd(0x00ABC0) == 0xBADF1100
    assert gpu.counters()["mmio.unimplemented"] == 3


def test_bar1_unmapped_access_faults(gpu, drv):
    assert gpu.mmio_read(regs.BAR1, 0x7F0000, 4) == 0xFFFFFFFF
    assert drv.rd(regs.PFIFO_FAULT_UNIT_MASK) & (1 << regs.FAULT_UNIT_BAR1)
    rec = regs.PFIFO_FAULT_RECORD + regs.FAULT_UNIT_BAR1 * regs.PFIFO_FAULT_RECORD_STRIDE
    assert drv.rd(rec + regs.PFIFO_FAULT_ADDR_LO) == 0x7F0000
    assert drv.rd(rec + regs.PFIFO_FAULT_FLAGS) & 0xF == regs.FAULT_PDE_NOT_PRESENT  # empty PD


class JumpyClock(DeviceClock):
    """A device clock that leaps 3 ms at every reading: work always ends 'between' two
    readings, the race a loaded host produces now and then with short kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.t = 0

    def now_ns(self) -> int:
        self.t += 3_000_000
        return self.t

    def wall_seconds_until(self, device_ns: int) -> float:
        return 0.0 if device_ns <= self.t else 1e-4


def test_work_ending_between_clock_readings_is_not_forgotten(sysram):
    from gpuvm.device.dma import RamPort
    from gpuvm.device.gpu import Gpu
    from conftest import TEST_VRAM

    gpu = Gpu(vram_size=TEST_VRAM, clock=JumpyClock())
    gpu.attach_sysram(RamPort(sysram.array))
    gpu.start()
    try:
        drv = HostDriver(gpu)
        drv.init()
        drv.setup_bar1(gpu.profile.bar1_size)
        rig = Rig(gpu, sysram, drv, 0, sys_base=4 * regs.MiB)
        drv.submit_runlist([0])
        drv.vram_write(rig.code, kernel_object(regs.KERNEL_LOOP))
        out = rig.va(0)
        bind = HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
        for k in range(20):  # 5 ms kernels: a pass skips each, the next reading is past it
            seq = rig.run((bind if k == 0 else [])
                          + HostDriver.launch(SUB_COMPUTE, rig.va(3), rig.va(3) + 0x1000,
                                              [out & 0xFFFFFFFF, out >> 32, 5_000_000, 0]))
            assert gpu.wait_event(lambda: fence_ok(sysram, rig.fence, seq), 5), \
                f"kernel {k} never completed"
    finally:
        gpu.release_memory()
