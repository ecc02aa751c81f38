"""Hypervisor structures the device can reach are freed only once nothing can reach them,
and a new tenant never sees an old one's data.

Each test is an attack from a guest, played against the mediator: a channel context the
device cached while the mediator freed what it pointed at, a PV space freed while a
channel was still bound to it, a flood of PV maps that fills the shadow reserve, a USERD
read past its page, a tenant reading what the previous tenant of its slice left.  The
reference monitor (on for the whole suite, tests/conftest.py) fails any test in which the
device touched freed shadow memory or another owner's memory.
"""

from __future__ import annotations


import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.host_driver import HostDriver
from gpuvm.device.kernels import kernel_object
from gpuvm.device.layout import pte
from gpuvm.mediator import monitor
from gpuvm.mediator.host_port import MEDIATOR_LOCK_WAITS
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.mediator.submission import WatchdogLimits
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam

from test_device_end_to_end import SUB_COMPUTE, SUB_COPY, VA_GPFIFO
from test_mediator_isolation import PATTERN, Vm
from test_mediator_traps import LockHolder
from vfio_doubles import attached
from waiting import wait_for

LONG = 200_000_000_000  # loop iterations: 200 s of device time (0.2 s wall at 1000x)
# a kernel that outlasts the watchdog's wall floor (0.2 s below) five times over: 1,000 s
# of device time, 1 s wall at 1000x.  With LONG the kernel's end and the floor came at
# the same wall time, and a loaded 2-core host let the kernel end first (no kill).
HUNG = 1_000_000_000_000


@pytest.fixture
def med():
    gpu = Gpu(time_scale=1000, vram_size=3 * 1024 * regs.MiB).start()
    m = Mediator(gpu, watchdog=WatchdogLimits(submission_ns=None))  # long kernels are meant
    yield m
    m.close()
    gpu.release_memory()


def kernel_then_copy(vm: Vm, code_va: int, cb_va: int, out_va: int, src: int, dst: int,
                     iterations: int = LONG) -> int:
    """One GPFIFO entry: a long loop kernel, then a copy the channel runs after it."""
    p = [out_va & 0xFFFFFFFF, out_va >> 32, iterations & 0xFFFFFFFF, iterations >> 32]
    return vm.rig.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                      + HostDriver.bind(SUB_COMPUTE, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
                      + HostDriver.launch(SUB_COMPUTE, code_va, cb_va, p)
                      + HostDriver.copy(SUB_COPY, src, dst, 4))


def engine_busy_for(med: Mediator, vm: Vm, vchid: int = 0) -> bool:
    ch = med.gpu.pfifo.channels[vm.vgpu.part.chid_base + vchid]
    return ch.resume_at > med.gpu.clock.now_ns()


def test_cached_context_never_walks_a_freed_directory(med):
    """The channel's context is cached on the device while its kernel runs; the guest
    points its RAMIN at another directory (the shadow instance is rebuilt) and unbinds
    another channel (the old shadow directory is no longer named by any bound channel
    and is freed).  Before the fix the device went on walking the freed directory when
    the kernel ended; now the rebuild kicks the channel and its context is reloaded."""
    vm = Vm(med, "attacker")
    drv, rig = vm.drv, vm.rig
    drv.vram_write(rig.code, kernel_object(regs.KERNEL_LOOP))
    drv.vram_wr32(rig.a, PATTERN)
    # a second directory with the same mappings
    other = drv.new_space()
    for va, phys, n, target in [(rig.va(0), rig.a, rig.pages, regs.TARGET_VRAM),
                                (rig.va(2), rig.c, rig.pages, regs.TARGET_VRAM),
                                (rig.va(3), rig.code, 2, regs.TARGET_VRAM),
                                (rig.sys_va(0), rig.sys_base, 3 * rig.pages + 1,
                                 regs.TARGET_SYSRAM),
                                (VA_GPFIFO, rig.ch.ring, 1, regs.TARGET_VRAM),
                                (rig.ch.pushbuf_va, rig.ch.pushbuf,
                                 HostDriver.PUSHBUF_BYTES // regs.SMALL_PAGE, regs.TARGET_VRAM)]:
        drv.map(other, va, phys, n, target=target)
    drv.flush(other)
    seq = kernel_then_copy(vm, rig.va(3), rig.va(3) + 0x1000, rig.va(2), rig.va(0),
                           rig.sys_va(0))
    assert wait_for(lambda: engine_busy_for(med, vm))
    drv.vram_wr32(rig.ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(other.pd))  # reflected
    spare = drv.create_channel(1, drv.new_space(), VA_GPFIFO)
    drv.wr(regs.PFIFO_CHAN_TABLE + spare.chid * regs.PFIFO_CHAN_STRIDE, 0)  # frees the old
    assert engine_busy_for(med, vm), "the kernel ended before the directory was freed"
    assert vm.attached.wait_event(lambda: vm.ram.read_u32(rig.fence) == seq or
                                  len(vm.vgpu.faults()) > 0, 20)
    assert vm.vgpu.faults() == []
    assert vm.ram.read_u32(rig.sys_base) == PATTERN  # the copy ran through the new directory
    assert monitor.ESCAPES == []


def hypercall(vm: Vm, op: int, key: int, entries: list[tuple[int, int]] = ()) -> tuple[int, int]:
    hc = 0x200000  # a page of the guest's RAM for the record
    hdr = vm.ram.struct_at(hc, abi.HcallHeader)
    hdr.op, hdr.count, hdr.args[0] = op, len(entries), key
    for i, (va, value) in enumerate(entries):
        vm.ram.write(hc + abi.HCALL_HEADER_BYTES + 16 * i, np.array([va, value], dtype=np.uint64))
    vm.vgpu.write(regs.BAR4, regs.BAR4_HYPERCALL, 4, hc)
    result = (int(hdr.status), int(hdr.args[3]))
    del hdr
    return result


def test_pv_space_freed_while_a_channel_is_bound_to_it(med):
    """HC_FREE_PGD of the space a running channel uses.  Before the fix its tables went
    back to the pool while the device still walked them; now the channel is moved off
    the space (rebuilt, kicked) first, and only faults itself."""
    vm = Vm(med, "pv", mode="pv")
    drv, rig = vm.drv, vm.rig
    drv.vram_write(rig.code, kernel_object(regs.KERNEL_LOOP))
    key = drv.alloc(regs.PD_BYTES)
    assert hypercall(vm, abi.HC_SET_PGD, key) == (abi.HC_OK, 0)
    drv.wr(regs.PFIFO_CHAN_TABLE, 0)
    ch = drv.create_channel(0, rig.space, VA_GPFIFO)
    entries = [(VA_GPFIFO, pte(ch.ring))]
    entries += [(ch.pushbuf_va + 0x1000 * i, pte(ch.pushbuf + 0x1000 * i)) for i in range(16)]
    entries += [(0x1000, pte(rig.a)), (0x2000, pte(rig.c)), (0x3000, pte(rig.code)),
                (0x4000, pte(rig.cb)), (0x5000, pte(rig.sys_base, regs.TARGET_SYSRAM)),
                (rig.sys_va(3), pte(rig.fence, regs.TARGET_SYSRAM))]
    assert hypercall(vm, abi.HC_MAP_BATCH, key, entries) == (abi.HC_OK, 0)
    assert hypercall(vm, abi.HC_VM_FLUSH, key) == (abi.HC_OK, 0)
    drv.vram_wr32(ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(key))
    rig.ch = ch
    drv.submit_runlist([0])
    kernel_then_copy(vm, 0x3000, 0x4000, 0x2000, 0x1000, 0x5000)
    assert wait_for(lambda: engine_busy_for(med, vm))
    assert hypercall(vm, abi.HC_FREE_PGD, key) == (abi.HC_OK, 0)
    assert engine_busy_for(med, vm), "the kernel ended before the space was freed"
    # the channel now walks a shadow of what the guest has at `key` (nothing): it faults
    assert vm.attached.wait_event(lambda: len(vm.vgpu.faults()) > 0, 20)
    assert "not present" in vm.vgpu.faults()[-1].reason
    assert vm.vgpu.counters()["pv.frees_while_bound"] == 1
    assert monitor.ESCAPES == []


def test_pv_tables_fill_beside_a_held_mediator_lock_and_the_flush_waits_for_it(med):
    """A PV VM's table hypercalls touch only its own tables and reserve, so they go on
    while another thread holds the mediator's lock; the flush reaches the physical GPU
    and waits for it.  (With every hypercall under that lock, eight pv VMs spent half
    their makespan waiting for each other.)"""
    vm = Vm(med, "pv", mode="pv")
    key = vm.drv.alloc(regs.PD_BYTES)
    holder = LockHolder(med.lock)
    try:
        assert hypercall(vm, abi.HC_SET_PGD, key) == (abi.HC_OK, 0)
        assert hypercall(vm, abi.HC_MAP_BATCH, key, [(0x1000, pte(vm.rig.a))]) == (abi.HC_OK, 0)
        assert holder.holding  # the holder still had the lock throughout
        assert vm.vgpu.counts.get(MEDIATOR_LOCK_WAITS, 0) == 0
    finally:
        holder.let_go()
    assert hypercall(vm, abi.HC_VM_FLUSH, key) == (abi.HC_OK, 0)  # waits for the holder
    holder.join()
    assert vm.vgpu.counts[MEDIATOR_LOCK_WAITS] == 1
    assert not med.lock._is_owned() and not vm.vgpu.lock._is_owned()


def test_pv_map_flood_is_refused_not_a_host_traceback(med):
    """Maps spanning more directories than the shadow reserve can hold tables for: the
    hypercall fails with HC_ENOMEM and a count; the VM and the host carry on."""
    small = PartitionSpec(vram_size=64 * regs.MiB, channels=2, shadow_size=2 * regs.MiB)
    vm = med.add_vm("flood", MODES["pv"], small)
    ram = GuestRam(8 * regs.MiB)
    dev = attached(vm, ram, "flood")
    hc = 0x100000
    key = 0x10000

    def call(op, entries=()):
        hdr = ram.struct_at(hc, abi.HcallHeader)
        hdr.op, hdr.count, hdr.args[0] = op, len(entries), key
        for i, (va, value) in enumerate(entries):
            ram.write(hc + abi.HCALL_HEADER_BYTES + 16 * i, np.array([va, value], np.uint64))
        vm.write(regs.BAR4, regs.BAR4_HYPERCALL, 4, hc)
        out = int(hdr.status)
        del hdr
        return out

    assert call(abi.HC_SET_PGD) == abi.HC_OK
    statuses = [call(abi.HC_MAP_BATCH, [(d << regs.PDE_SPAN_SHIFT, pte(0x1000 * d))
                                        for d in range(start, start + 64)])
                for start in range(0, 512, 64)]
    assert abi.HC_ENOMEM in statuses
    assert vm.counters()["trap.refused.hcall_nomem"] >= 1
    assert call(abi.HC_FREE_PGD) == abi.HC_OK  # and the VM can give it all back
    assert call(abi.HC_SET_PGD) == abi.HC_OK
    del dev


def test_userd_read_past_the_page_is_refused(med):
    vm = Vm(med, "reader")
    base = vm.drv.poll_va  # the guest's USERD poll area in its BAR1
    assert vm.vgpu.read(regs.BAR1, base + 0xFFC, 8) == (1 << 64) - 1
    vm.vgpu.read(regs.BAR1, base + 0xFF8, 8)  # the last 8 bytes of the page: fine
    assert vm.vgpu.counters()["trap.refused.userd"] == 1


def test_new_tenant_never_reads_the_old_tenants_data(med):
    """Tenant A fills its slice (and leaves a shadow behind); A goes; tenant B gets the
    same slice and reads it through PRAMIN: zeroes, not A's data."""
    spec = PartitionSpec(vram_size=64 * regs.MiB, channels=2, shadow_size=4 * regs.MiB)
    a = med.add_vm("tenant-a", MODES["fv"], spec)
    base, shadow = a.part.vram_base, a.part.shadow_pool.base
    med.gpu.vram.u32[(base >> 2):(base >> 2) + 1024 * 1024] = PATTERN  # 4 MiB of secrets
    med.gpu.vram.u32[(base + 60 * regs.MiB) >> 2] = PATTERN
    med.gpu.vram.u32[shadow >> 2] = PATTERN
    med.remove_vm(a)
    scrubbed = med.counts["scrub.bytes"]
    b = med.add_vm("tenant-b", MODES["fv"], spec)
    assert b.part.vram_base == base  # the same slice, handed to a new tenant
    assert med.counts["scrub.bytes"] - scrubbed == spec.vram_size + spec.shadow_size
    for addr in (0, 0x1000, 60 * regs.MiB):
        b.write(regs.BAR0, regs.PBUS_PRAMIN_BASE, 4, addr >> 16)
        assert b.read(regs.BAR0, regs.PRAMIN_WINDOW + (addr & 0xFFFF), 4) == 0
    assert not med.gpu.vram.u32[base >> 2:(base + spec.vram_size) >> 2].any()
    assert med.gpu.vram.u32[shadow >> 2] == 0


def test_monitor_sees_an_escape():
    """The monitor itself can fail: a channel no VM owns touching memory is reported."""
    gpu = Gpu(time_scale=1000, vram_size=1024 * regs.MiB)
    m = Mediator(gpu)
    try:
        assert m.monitor is not None
        gpu.mmu.actor = ("channel", 5)
        gpu.mmu.view(regs.TARGET_VRAM, 0, 4)
        v = m.add_vm("v", MODES["fv"], PartitionSpec(vram_size=64 * regs.MiB, channels=2))
        gpu.mmu.actor = ("channel", v.part.chid_base)
        gpu.mmu.view(regs.TARGET_VRAM, v.part.vram_base + 64 * regs.MiB, 4)  # past its slice
        gpu.mmu.view(regs.TARGET_VRAM, v.part.vram_base, 4)  # its own: fine
        gpu.mmu.phys_read_u64(regs.TARGET_VRAM, v.part.vram_base, "walk")  # a guest table
        found = monitor.take()
        assert [e.why for e in found] == ["a channel no VM owns is running",
                                          "outside v's memory",
                                          "a walk outside v's shadow reserve"]
    finally:
        gpu.mmu.actor = None
        m.close()
        gpu.release_memory()


def test_removed_vm_leaves_nothing_running(med):
    """A VM removed while its kernel holds the GPU: its submission ends, the engine is
    free, and the next VM's work runs at once."""
    hog, other = Vm(med, "hog"), Vm(med, "other")
    hog.drv.vram_write(hog.rig.code, kernel_object(regs.KERNEL_LOOP))
    kernel_then_copy(hog, hog.rig.va(3), hog.rig.va(3) + 0x1000, hog.rig.va(2), hog.rig.va(0),
                     hog.rig.sys_va(0))
    assert wait_for(lambda: engine_busy_for(med, hog))
    med.remove_vm(hog.vgpu)
    assert med.submissions.dispatcher.running is None
    assert not med.gpu.engines.graph.busy(med.gpu.clock.now_ns())
    other.drv.vram_wr32(other.rig.a, PATTERN)
    assert other.copy(other.rig.va(0), other.rig.sys_va(0), 4)
    assert other.ram.read_u32(other.rig.sys_base) == PATTERN


def test_watchdog_kills_a_hung_channel_and_hands_the_gpu_on():
    gpu = Gpu(time_scale=1000, vram_size=3 * 1024 * regs.MiB).start()
    m = Mediator(gpu, watchdog=WatchdogLimits(submission_ns=2_000_000_000, wall_floor_s=0.2))
    try:
        hung, good = Vm(m, "hung"), Vm(m, "good")
        hung.drv.vram_write(hung.rig.code, kernel_object(regs.KERNEL_LOOP))
        kernel_then_copy(hung, hung.rig.va(3), hung.rig.va(3) + 0x1000, hung.rig.va(2),
                         hung.rig.va(0), hung.rig.sys_va(0), HUNG)
        assert wait_for(lambda: engine_busy_for(m, hung))
        good.drv.vram_wr32(good.rig.a, PATTERN)
        assert good.copy(good.rig.va(0), good.rig.sys_va(0), 4)  # queued behind, then runs
        assert good.ram.read_u32(good.rig.sys_base) == PATTERN
        assert hung.attached.wait_event(lambda: len(hung.vgpu.faults()) > 0, 10)
        fault = hung.vgpu.faults()[-1]
        assert fault.reason.startswith("watchdog: submission held the GPU")
        assert hung.vgpu.counters()["watchdog.kills"] == 1 and m.counts["watchdog.kills"] == 1
        assert hung.drv.rd(regs.PFIFO_CHAN_ERROR_EXT) == \
            regs.PFIFO_CHAN_ERROR_FAULTED_EXT | regs.CHAN_ERR_TIMEOUT_EXT
        assert m.submissions.dispatcher.running is None or \
            m.submissions.dispatcher.running.vm is not hung.vgpu
        assert not gpu.engines.graph.busy(gpu.clock.now_ns())
        assert good.vgpu.faults() == []
    finally:
        m.close()
        gpu.release_memory()
