"""The mediator: one physical GPU, several vGPUs.

It is the physical GPU's only driver.  It brings the device up, owns the physical BAR1
and BAR3 address spaces (each VM's arena is a window into them), the USERD poll area, the
runlist and the hypervisor's VRAM, creates and destroys partitions as VMs come and go,
and hands doorbells to the scheduler.  Oversubscribed vGPUs share a pool of its VRAM,
their residency switched before each of their submissions is rung (residency.py).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import nullcontext

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.clock import VirtualLock
from gpuvm.device.dma import BusMap
from gpuvm.device.gpu import Gpu
from gpuvm.mediator import monitor
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import (BUS_WINDOW, DEFAULT_HOST_BACKING, PartitionError,
                                     PartitionSpec, PartitionTable)
from gpuvm.mediator.residency import COUNTERS as RESIDENCY_COUNTERS
from gpuvm.mediator.residency import Residency, WorkingSetTooLarge
from gpuvm.mediator.submission import Submissions, WatchdogLimits
from gpuvm.mediator.vgpu import VGpu
from scheduler import FifoPolicy
from scheduler.policy import Policy
from shadow.vram_pool import VramPool

HYP_GLOBAL = 16 * regs.MiB  # top of VRAM: physical BAR tables, runlist


class Mediator:
    def __init__(self, gpu: Gpu, policy: Policy | None = None,
                 watchdog: WatchdogLimits | None = None,
                 host_backing: int = DEFAULT_HOST_BACKING) -> None:
        self.gpu = gpu
        self.lock = threading.RLock()
        # the same lock in virtual time, where the GPU's clock is virtual (VGpu.under_lock)
        self.vlock = VirtualLock(gpu.clock) if gpu.clock.virtual else None
        self.hyp_global = HYP_GLOBAL
        self.counts: defaultdict[str, int] = defaultdict(int)  # the mediator's own events
        self.bus = BusMap()  # every vGPU's DMA mappings, each at its partition's window
        self.bus_window = BUS_WINDOW
        self.engine_writes = gpu.mmu.engine_writes
        gpu.attach_sysram(self.bus)
        prof = gpu.profile
        self.table = PartitionTable(gpu.vram.size, HYP_GLOBAL, prof.bar1_size, prof.bar3_size,
                                    host_backing)
        self.residency: Residency | None = None  # while oversubscribed vGPUs exist
        self.hyp = VramPool(gpu.vram.size - HYP_GLOBAL, HYP_GLOBAL, "hypervisor",
                            gpu.vram.zero)
        self.vgpus: list[VGpu] = []
        self.owner: dict[int, VGpu] = {}
        self.monitor: monitor.ReferenceMonitor | None = None
        if monitor.enabled():
            self.monitor = monitor.ReferenceMonitor(self)
            with gpu.lock:
                gpu.mmu.monitor = self.monitor
        self._bring_up()
        self.submissions = Submissions(self, policy or FifoPolicy(), self._kill,
                                       watchdog or WatchdogLimits(), residency=self,
                                       clock=gpu.clock)
        gpu.pfifo.idle_listeners.append(self.submissions.on_idle)
        gpu.event_listeners.append(self._interrupt)

    # ------------------------------------------------------------------ physical device
    def rd(self, offset: int) -> int:
        return self.gpu.mmio_read(regs.BAR0, offset, 4)

    def submit(self, vm: VGpu, pchid: int, put: int) -> None:
        self.submissions.submit(vm, pchid, put, vm.doorbell_ledger())

    def channel_reset(self, pchid: int) -> None:
        self.submissions.channel_reset(pchid)

    def wr(self, offset: int, value: int) -> None:
        self.gpu.mmio_write(regs.BAR0, offset, 4, value)

    def _zeroed(self, size: int) -> int:
        return self.hyp.alloc(size)  # the pool scrubs what it hands out

    def _bar_vm(self, size: int) -> tuple[int, int, int]:
        """(instance, directory, small table) of one physical BAR VM, in hypervisor VRAM."""
        inst = self._zeroed(regs.RAMIN_SIZE)
        pd = self._zeroed(regs.PD_BYTES)
        pt = self._zeroed(regs.SMALL_PTES_PER_PT * regs.PTE_SIZE)
        v = self.gpu.vram
        pd_lo, pd_hi = layout.ramin_ptr_words(pd)
        limit_lo, limit_hi = layout.ramin_limit_words(size - 1)
        v.write_u32(inst + regs.RAMIN_PD_LO, pd_lo)
        v.write_u32(inst + regs.RAMIN_PD_HI, pd_hi)
        v.write_u32(inst + regs.RAMIN_LIMIT_LO, limit_lo)
        v.write_u32(inst + regs.RAMIN_LIMIT_HI, limit_hi)
        v.u64[pd >> 3] = layout.pde_small(pt)
        return inst, pd, pt

    def _bring_up(self) -> None:
        prof = self.gpu.profile
        self.wr(regs.PMC_ENABLE, regs.PMC_ENABLE_PFIFO | regs.PMC_ENABLE_PGRAPH |
                regs.PMC_ENABLE_PCOPY0 | regs.PMC_ENABLE_PCOPY1 | regs.PMC_ENABLE_PTIMER)
        self.wr(regs.PFIFO_CTRL, regs.PFIFO_CTRL_ENABLE)
        self.wr(regs.PFIFO_INTR_EN, 0xFFFFFFFF)
        inst1, self.bar1_pd, self.bar1_pt = self._bar_vm(prof.bar1_size)
        inst3, self.bar3_pd, self.bar3_pt = self._bar_vm(prof.bar3_size)
        self.wr(regs.PBUS_BAR1_VM, layout.barvm_word(inst1))
        self.wr(regs.PBUS_BAR3_VM, layout.barvm_word(inst3))
        self.wr(regs.PFIFO_USERD_POLL, layout.userd_poll_word(0))  # poll area at BAR1 0
        self.runlist = self._zeroed(regs.NUM_CHANNELS * regs.RUNLIST_ENTRY_SIZE)

    def flush(self, pd: int, bar_vm: bool = False) -> None:
        """A real TLB flush of a hypervisor-owned directory, through the flush registers."""
        self.wr(regs.PFFB_FLUSH_PD, layout.flush_pd_word(pd))
        self.wr(regs.PFFB_FLUSH_TRIGGER, regs.PFFB_TRIGGER_BAR_VM if bar_vm
                else regs.PFFB_TRIGGER_GO | regs.PFFB_TRIGGER_ALL_PAGES)

    def set_poll_page(self, pchid: int, userd: int | None) -> None:
        """Map physical channel pchid's USERD page in the poll area (None: unmap)."""
        self.gpu.vram.u64[(self.bar1_pt >> 3) + pchid] = 0 if userd is None else layout.pte(userd)
        self.flush(self.bar1_pd, bar_vm=True)

    def rebuild_runlist(self) -> None:
        chids = sorted(c for v in self.vgpus for c in v.runlist_pchids())
        entries = layout.runlist_entries(chids)
        self.gpu.vram.u8[self.runlist:self.runlist + entries.nbytes] = entries.view(np.uint8)
        self.wr(regs.PFIFO_RUNLIST_ADDR, layout.runlist_word(self.runlist))
        self.wr(regs.PFIFO_RUNLIST_SUBMIT, len(chids))

    def kick(self, pchid: int) -> None:
        """Preempt a physical channel: the device drops the context it cached and loads
        the instance block afresh when the channel next runs."""
        self.wr(regs.PFIFO_KICK, pchid)

    def _kill(self, pchid: int, reason: str) -> None:
        """The watchdog's verdict on a submission (scheduler thread, no lock held)."""
        vgpu = self.owner.get(pchid)
        # the owner's lock before ours: one of its hypercalls may hold it
        with (vgpu.lock if vgpu is not None else nullcontext()), self.lock:
            self.counts["watchdog.kills"] += 1
            owner = self.owner.get(pchid)
            if owner is None:  # nobody owns it any more: the device must hold nothing for it
                self.wr(regs.PFIFO_CHAN_TABLE + pchid * regs.PFIFO_CHAN_STRIDE, 0)
            elif owner is vgpu:  # (a VM that took the channel since has nothing to lose)
                vgpu.channels.kill(pchid, reason)


    # ------------------------------------------------------------------ residency
    def needs_residency(self, vm: object) -> bool:
        """Whether a submission of this VM must wait for its pages (scheduler thread, no
        lock): only oversubscribed vGPUs do."""
        return getattr(vm, "tenant", None) is not None

    def make_resident(self, vm: object) -> bool:
        """Before the VM's submission is rung: its working set into the pool.  A working
        set that cannot fit faults that VM alone (its channels are ended with the reason);
        returns whether the submission may go."""
        with vm.lock, self.lock:
            if vm not in self.vgpus or self.residency is None:
                return False
            try:
                self.residency.make_resident(vm.tenant)
            except WorkingSetTooLarge as exc:
                self.counts["residency.refused"] += 1
                for ch in list(vm.channels.by_vchid.values()):
                    if ch.bound:
                        vm.channels.kill(ch.pchid, str(exc), "residency.refused")
                return False
            return True

    # ------------------------------------------------------------------ the submission port
    def now_ns(self) -> int:
        return self.gpu.device_time_ns()

    def ring(self, pchid: int, put: int) -> None:
        self.gpu.mmio_write(regs.BAR1, pchid * regs.USERD_STRIDE + regs.USERD_GP_PUT, 4, put)

    def runnable(self, pchid: int) -> bool:
        with self.gpu.lock:
            return pchid in self.gpu.pfifo.runlist and self.gpu.pfifo.channels[pchid].runnable

    # ------------------------------------------------------------------ VMs
    def _interrupt(self, chids: frozenset[int] | None) -> None:
        """Completions or faults on the GPU's channels `chids`: the vGPUs owning them
        raise their MSI, and only they -- an interrupt for another VM's work would wake
        this VM's waiter to look again at nothing (over vfio-user, a round trip on the
        server's one thread), for every VM's completion.
        An event of no channel in particular (None), or of a channel no vGPU owns,
        interrupts every vGPU: a waiter re-checks its own condition."""
        owners = None if chids is None else {self.owner.get(c) for c in chids}
        for vgpu in list(self.vgpus):
            if owners is None or None in owners or vgpu in owners:
                vgpu.interrupt()

    def add_vm(self, name: str, mode: Mode, spec: PartitionSpec | None = None,
               share: float = 1.0, uuid: str = "", type_id: str = "") -> VGpu:
        """Create a vGPU (an mdev instance): its partition, its bus window, its scheduler
        share.  The VMM then attaches it and DMA-maps the guest's memory."""
        spec = spec or PartitionSpec()
        if spec.oversubscribed and mode.pv:
            raise PartitionError("an oversubscribed vGPU runs the fv modes only (its shadows "
                                 "are re-pointed from guest entries, which PV tables do not "
                                 "keep)")
        with self.lock:
            part = self.table.allocate(spec)
            tenant = None
            if spec.oversubscribed:  # its VRAM starts in a zeroed backing store
                if self.residency is None:
                    self.residency = Residency(self.gpu, part.vram_base, self.table.pool_size)
                tenant = self.residency.join(name, part.vram_size)
            else:  # the slice gets a memfd of its own: the one its VMM may be handed
                try:
                    self.gpu.vram.carve(part.vram_base, part.vram_size, f"gpuvm-vram-{name}")
                except (OSError, ValueError):
                    self.table.release(part)
                    raise
                self._scrub(part.vram_base, part.vram_size)
            self._scrub(part.shadow_pool.base, part.shadow_pool.size)
            part.shadow_pool.scrub = self.gpu.vram.zero
            vgpu = VGpu(self, name, part, mode, uuid, type_id, tenant)
            if tenant is not None:
                tenant.count = vgpu.count
                tenant.spaces = lambda: vgpu.shadowing.spaces.values()
                tenant.flush = self.flush
                for counter in RESIDENCY_COUNTERS:  # in its rows from the start
                    vgpu.count(counter, 0)
            self.bus.add(part.sys_base, self.bus_window, vgpu.dma)
            self.vgpus.append(vgpu)
            for c in range(part.chid_base, part.chid_base + part.channels):
                self.owner[c] = vgpu
        self.submissions.add_vm(vgpu, share)
        return vgpu

    def _scrub(self, base: int, size: int) -> None:
        """No tenant sees what the previous one left: a slice (and its shadow reserve) is
        zeroed before it is handed out (whole pages go back to the kernel, vectorized)."""
        self.gpu.vram.zero(base, size)
        self.counts["scrub.ranges"] += 1
        self.counts["scrub.bytes"] += size

    def remove_vm(self, vgpu: VGpu) -> None:
        """Stop a VM's channels, free its shadows and its partition; others keep running."""
        pchids = set(range(vgpu.part.chid_base, vgpu.part.chid_base + vgpu.part.channels))
        self.submissions.remove_vm(vgpu, pchids)
        with vgpu.lock, self.lock:
            vgpu.close()
            vgpu.teardown()
            self.vgpus.remove(vgpu)
            self.rebuild_runlist()
            for c in pchids:
                self.owner.pop(c, None)
            self.bus.remove(vgpu.part.sys_base)
            if vgpu.tenant is not None and self.residency is not None:
                self.residency.leave(vgpu.tenant)
            self.table.release(vgpu.part)
            if vgpu.tenant is None:  # an oversubscribed vGPU's pool was never carved
                self.gpu.vram.merge(vgpu.part.vram_base)
            if self.table.pool_base is None:
                self.residency = None

    def close(self) -> None:
        # the scheduler first: a vGPU still here is one whose run was cut short, and its
        # removal is no event of the run's virtual time to wait for (a stopped run's
        # device time may never reach it)
        self.submissions.close()
        for vgpu in list(self.vgpus):
            self.remove_vm(vgpu)
        if self.submissions.on_idle in self.gpu.pfifo.idle_listeners:
            self.gpu.pfifo.idle_listeners.remove(self.submissions.on_idle)
        if self._interrupt in self.gpu.event_listeners:
            self.gpu.event_listeners.remove(self._interrupt)
        with self.gpu.lock:
            if self.gpu.mmu.monitor is self.monitor:
                self.gpu.mmu.monitor = None
