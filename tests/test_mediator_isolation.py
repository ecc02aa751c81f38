"""A guest that maps another VM's VRAM, hypervisor VRAM, or memory beyond its RAM never
reaches it -- through channel page tables, the BAR1/BAR3 VMs, the PRAMIN window, RAMIN
pointers or PV hypercalls -- and the victim's results stay correct."""

from __future__ import annotations

import os
import select
import time
import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.host_driver import HostDriver
from gpuvm.device.layout import pte
from gpuvm.mediator.mediator import HYP_GLOBAL, Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam

from test_device_end_to_end import SUB_COPY, Rig
from vfio_doubles import MmioPort, attached

PATTERN = 0x5EC12E70
BAR1_SIZE = 16 * regs.MiB


class Vm:
    def __init__(self, med: Mediator, name: str, mode: str = "fv") -> None:
        self.ram = GuestRam(32 * regs.MiB)
        self.vgpu = med.add_vm(name, MODES[mode])
        self.attached = attached(self.vgpu, self.ram, name)  # RAM DMA-mapped, MSI wired
        self.drv = HostDriver(MmioPort(self.vgpu))
        self.drv.init()
        self.drv.setup_bar1(BAR1_SIZE)
        self.rig = Rig(self.vgpu, self.ram, self.drv, 0, sys_base=4 * regs.MiB, n=16)
        self.drv.submit_runlist([0])

    def copy(self, src_va: int, dst_va: int, n: int = 64) -> bool:
        """Run a copy; True if it completed, False if the channel faulted."""
        seq = self.rig.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                           + HostDriver.copy(SUB_COPY, src_va, dst_va, n))
        before = len(self.vgpu.faults())
        self.attached.wait_event(lambda: self.ram.read_u32(self.rig.fence) == seq or
                             len(self.vgpu.faults()) > before, 10)
        return self.ram.read_u32(self.rig.fence) == seq


@pytest.fixture
def world():
    gpu = Gpu(time_scale=1000, vram_size=3 * 1024 * regs.MiB).start()
    med = Mediator(gpu)
    victim = Vm(med, "victim")
    attacker = Vm(med, "attacker")
    # the victim's secret page, and a hypervisor page, both hold a pattern
    secret = victim.vgpu.policy.host_vram(victim.rig.a)
    gpu.vram.u32[secret >> 2] = PATTERN
    hyp = gpu.vram.size - HYP_GLOBAL + 0x400000
    gpu.vram.u32[hyp >> 2] = PATTERN
    base = attacker.vgpu.policy.vram_base
    targets = {"other VM's VRAM": secret - base, "hypervisor VRAM": hyp - base}
    yield gpu, med, victim, attacker, targets
    med.close()
    gpu.release_memory()


def victim_still_fine(gpu, victim):
    secret = victim.vgpu.policy.host_vram(victim.rig.a)
    assert gpu.vram.u32[secret >> 2] == PATTERN
    assert victim.copy(victim.rig.va(0), victim.rig.sys_va(0), 4)
    assert victim.ram.read_u32(victim.rig.sys_base) == PATTERN
    assert victim.vgpu.faults() == []


def _interrupted(fd: int) -> int:
    """How many interrupts the eventfd holds now (read: it starts again from 0)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return os.eventfd_read(fd) if poller.poll(0) else 0


def _drained(fd: int, quiet_s: float = 0.2) -> None:
    """Read the eventfd until it stays quiet for `quiet_s`: a copy returns once its fence
    is written, and the engine raises the completion's interrupt a moment after -- under
    load (the suite's two workers on two cores) after a single read had already found
    nothing."""
    while select.select([fd], [], [], quiet_s)[0]:
        os.eventfd_read(fd)


def test_a_vms_completions_interrupt_that_vm_only(world):
    """A real vGPU raises only its own interrupts: another VM's completions would send
    this VM's guest to look again at nothing -- one more trap each -- so its time would
    grow with the number of VMs beside it."""
    gpu, med, victim, attacker, _ = world
    assert victim.copy(victim.rig.va(0), victim.rig.sys_va(0), 4)
    assert attacker.copy(attacker.rig.va(0), attacker.rig.sys_va(0), 4)
    _drained(attacker.attached.irq_fd)
    _drained(victim.attached.irq_fd)
    for _ in range(4):  # each waits for its interrupt (and reads it)
        assert victim.copy(victim.rig.va(0), victim.rig.sys_va(0), 4)
    assert _interrupted(attacker.attached.irq_fd) == 0
    # an event of no channel in particular still reaches everyone
    with gpu.lock:
        gpu.signal()
        gpu._work.notify_all()
    deadline = time.monotonic() + 5
    while not (seen := _interrupted(attacker.attached.irq_fd)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen > 0


@pytest.mark.parametrize("which", ["other VM's VRAM", "hypervisor VRAM"])
def test_channel_page_table(world, which):
    gpu, med, victim, attacker, targets = world
    va = 0x70000000
    attacker.drv.map(attacker.rig.space, va, targets[which] & ~0xFFF)
    attacker.drv.flush(attacker.rig.space)
    assert attacker.vgpu.counters()["shadow.ptes_refused"] >= 1
    assert not attacker.copy(va, attacker.rig.sys_va(0), 4)  # read attempt faults
    assert "page not present" in attacker.vgpu.faults()[-1].reason
    assert attacker.ram.read_u32(attacker.rig.sys_base) != PATTERN
    victim_still_fine(gpu, victim)


def test_sysram_beyond_ram(world):
    gpu, med, victim, attacker, targets = world
    victim.ram.write(0x100000, np.array([PATTERN], dtype=np.uint32))
    # the victim's RAM sits at another bus window: name it relative to the attacker's
    gpa_of_victim = victim.vgpu.part.sys_base - attacker.vgpu.part.sys_base + 0x100000
    va = 0x71000000

    def fresh_channel() -> None:
        """A faulted channel stays stopped: each attempt gets a newly bound one."""
        attacker.drv.wr(regs.PFIFO_CHAN_TABLE, 0)
        attacker.rig.ch = attacker.drv.create_channel(0, attacker.rig.space, 0x30000000)
        attacker.drv.submit_runlist([0])

    for gpa in (attacker.ram.size, gpa_of_victim):
        attacker.drv.map(attacker.rig.space, va, gpa, target=regs.TARGET_SYSRAM)
        attacker.drv.flush(attacker.rig.space)
        fresh_channel()
        assert not attacker.copy(va, attacker.rig.sys_va(0), 4)  # read attempt
        fresh_channel()
        assert not attacker.copy(attacker.rig.va(0), va, 4)  # write attempt
        assert "page not present" in attacker.vgpu.faults()[-1].reason
    assert victim.ram.read_u32(0x100000) == PATTERN
    assert attacker.vgpu.counters()["shadow.ptes_refused"] >= 2
    victim_still_fine(gpu, victim)


@pytest.mark.parametrize("bar", [regs.BAR1, regs.BAR3])
@pytest.mark.parametrize("which", ["other VM's VRAM", "hypervisor VRAM"])
def test_bar_vms(world, bar, which):
    gpu, med, victim, attacker, targets = world
    drv = attacker.drv
    if bar == regs.BAR3:
        space = drv.new_space()
        inst = drv._instance(space, 8 * regs.MiB - 1)
        drv.wr(regs.PBUS_BAR3_VM, layout.barvm_word(inst))
    else:
        space = drv.bar1_space
    offset = 0x200000
    drv.map(space, offset, targets[which] & ~0xFFF)
    drv.flush(space, bar_vm=True)
    value = attacker.vgpu.read(bar, offset + (targets[which] & 0xFFF), 4)
    assert value != PATTERN and value == 0xFFFFFFFF
    attacker.vgpu.write(bar, offset + (targets[which] & 0xFFF), 4, 0xBAD)
    unit = regs.FAULT_UNIT_BAR1 if bar == regs.BAR1 else regs.FAULT_UNIT_BAR3
    assert drv.rd(regs.PFIFO_FAULT_UNIT_MASK) & (1 << unit)
    assert gpu.vram.u32[(attacker.vgpu.policy.vram_base + targets[which]) >> 2] == PATTERN
    victim_still_fine(gpu, victim)


@pytest.mark.parametrize("which", ["other VM's VRAM", "hypervisor VRAM"])
def test_pramin_window(world, which):
    gpu, med, victim, attacker, targets = world
    assert attacker.drv.vram_rd32(targets[which]) == 0xFFFFFFFF
    attacker.drv.vram_wr32(targets[which], 0xBAD)
    assert attacker.vgpu.counters()["trap.refused.pramin"] == 2
    assert gpu.vram.u32[(attacker.vgpu.policy.vram_base + targets[which]) >> 2] == PATTERN
    victim_still_fine(gpu, victim)


def test_ramin_pointers(world):
    gpu, med, victim, attacker, targets = world
    drv = attacker.drv
    target = targets["other VM's VRAM"] & ~0xFFF
    # an instance block outside the slice is refused outright
    drv.wr(regs.PFIFO_CHAN_TABLE + 8 * 2, layout.chan_word(target))
    assert attacker.vgpu.counters()["trap.refused.channel_instance"] == 1
    # a channel whose RAMIN points its directory and USERD at the victim's page
    ch = drv.create_channel(3, attacker.rig.space, 0x30000000)
    drv.vram_wr32(ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(target))
    drv.vram_wr32(ch.inst + regs.RAMIN_USERD_LO, layout.ramin_ptr_lo(target))
    drv.submit_runlist([0, 3])
    drv.push(ch, HostDriver.release(attacker.rig.sys_va(0), 1))
    assert attacker.attached.wait_event(lambda: len(attacker.vgpu.faults()) >= 1, 10)
    assert attacker.vgpu.faults()[-1].chid == 3
    assert "not present" in attacker.vgpu.faults()[-1].reason
    assert gpu.vram.u32[(attacker.vgpu.policy.vram_base + targets["other VM's VRAM"]) >> 2] \
        == PATTERN
    victim_still_fine(gpu, victim)


@pytest.mark.parametrize("which", ["other VM's VRAM", "hypervisor VRAM", "sysram"])
def test_pv_hypercalls(world, which):
    gpu, med, victim, attacker, targets = world
    pv = Vm(med, "pv-attacker", mode="pv")
    key = pv.drv.alloc(regs.PD_BYTES)
    hc = 0x200000  # a page of the PV guest's RAM for the hypercall record

    def call(op: int, entries: list[tuple[int, int]]) -> tuple[int, int]:
        hdr = pv.ram.struct_at(hc, abi.HcallHeader)
        hdr.op, hdr.count, hdr.args[0] = op, len(entries), key
        for i, (va, value) in enumerate(entries):
            pv.ram.write(hc + abi.HCALL_HEADER_BYTES + 16 * i,
                         np.array([va, value], dtype=np.uint64))
        pv.vgpu.write(regs.BAR4, regs.BAR4_HYPERCALL, 4, hc)
        result = (hdr.status, hdr.args[3])
        del hdr
        return result

    # a guest cannot name memory below its slice, so the victim here is one placed above
    above = Vm(med, "victim-above")
    secret = above.vgpu.policy.host_vram(above.rig.a)
    gpu.vram.u32[secret >> 2] = PATTERN
    scanned_before = pv.vgpu.counters().get("shadow.ptes_scanned", 0)
    assert call(abi.HC_SET_PGD, []) == (abi.HC_OK, 0)
    if which == "sysram":
        bad = pte(pv.ram.size, regs.TARGET_SYSRAM)
    elif which == "other VM's VRAM":
        bad = pte(secret - pv.vgpu.policy.vram_base)
    else:
        bad = pte((targets[which] + attacker.vgpu.policy.vram_base
                   - pv.vgpu.policy.vram_base) & ~0xFFF)
    good = pte(pv.rig.a)
    status, refused = call(abi.HC_MAP_BATCH, [(0x1000, good), (0x2000, bad)])
    assert (status, refused) == (abi.HC_EINVAL, 1)
    assert call(abi.HC_VM_FLUSH, []) == (abi.HC_OK, 0)
    counts = pv.vgpu.counters()
    assert counts["hcall.entries"] == 2 and counts["shadow.ptes_refused"] == 1
    assert counts.get("shadow.ptes_scanned", 0) == scanned_before  # hypercalls never scan
    # the refused entry is not present: a copy through it faults, the good one works
    pv.drv.wr(regs.PFIFO_CHAN_TABLE, 0)
    ch = pv.drv.create_channel(0, pv.rig.space, 0x30000000)
    pv.drv.vram_wr32(ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(key))
    status, _ = call(abi.HC_MAP_BATCH, [(0x30000000, pte(ch.ring)),
                                        *((ch.pushbuf_va + 0x1000 * i, pte(ch.pushbuf + 0x1000 * i))
                                          for i in range(16)),
                                        (0x3000, pte(pv.rig.sys_base, regs.TARGET_SYSRAM)),
                                        (pv.rig.sys_va(3), pte(pv.rig.fence, regs.TARGET_SYSRAM))])
    assert status == abi.HC_OK
    call(abi.HC_VM_FLUSH, [])
    pv.rig.ch = ch
    pv.drv.submit_runlist([0])
    assert pv.copy(0x1000, 0x3000, 4)
    assert not pv.copy(0x2000, 0x3000, 4)
    assert gpu.vram.u32[secret >> 2] == PATTERN
    victim_still_fine(gpu, victim)
    victim_still_fine(gpu, above)


def test_remap_plan_diff_coalesces_and_tears_down():
    """Remap changes come out as runs: consecutive BAR pages onto consecutive VRAM pages
    are one mapping; a page turning sensitive is unmapped and the run split around it."""
    import numpy as np

    from shadow.bar_window import NOT_VRAM
    from shadow.remap import RemapPlan, RemapState

    host = np.array([0x10000, 0x11000, 0x12000, 0x40000, NOT_VRAM, 0x50000], dtype=np.int64)
    state = RemapState.empty(6)
    unmaps, maps = state.diff(RemapPlan.build(host, set(), set()))
    assert unmaps == [] and maps == [(0, 3, 0x10000), (3, 1, 0x40000), (5, 1, 0x50000)]
    unmaps, maps = state.diff(RemapPlan.build(host, {0x11000}, {5 << 12}))
    assert unmaps == [(1, 1), (5, 1)] and maps == []
    assert state.diff(RemapPlan.build(host, {0x11000}, {5 << 12})) == ([], [])
