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

from gpuvm.device import regs
from gpuvm.device.clock import VirtualLock
from gpuvm.device.dma import BusMap
from gpuvm.device.gpu import Gpu
from gpuvm.mediator import monitor
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import (BUS_WINDOW, DEFAULT_HOST_BACKING, PartitionError,
                                     PartitionSpec, PartitionTable)
from gpuvm.mediator.planted import planted
from gpuvm.mediator.residency import COUNTERS as RESIDENCY_COUNTERS
from gpuvm.mediator.residency import Residency
from gpuvm.mediator.submission import Submissions, WatchdogLimits
from gpuvm.mediator.tenancy import Tenancy
from gpuvm.mediator.vgpu import MediatorServices, VGpu
from scheduler import FifoPolicy
from scheduler.policy import Policy
from shadow.vram_pool import VramPool

HYP_GLOBAL = 16 * regs.MiB  # top of VRAM: physical BAR tables, runlist


class Mediator:
    """The physical GPU's one driver, and the vGPUs' maker: see the module docstring.

    It builds the physical GPU's port (HostPort) and the scheduler (Submissions) and
    hands both to each vGPU it creates; the vGPUs' parts then drive the device and the
    scheduler through those, never through the mediator."""

    def __init__(self, gpu: Gpu, policy: Policy | None = None,
                 watchdog: WatchdogLimits | None = None,
                 host_backing: int = DEFAULT_HOST_BACKING) -> None:
        self.gpu = gpu
        self.lock = threading.RLock()
        # the same lock in virtual time, where the GPU's clock is virtual (VmMeter.trap_hold)
        self.vlock = VirtualLock(gpu.clock) if gpu.clock.virtual else None
        self.hyp_global = HYP_GLOBAL
        self.counts: defaultdict[str, int] = defaultdict(int)  # the mediator's own events
        self.bus = BusMap()  # every vGPU's DMA mappings, each at its partition's window
        self.bus_window = BUS_WINDOW
        gpu.attach_sysram(self.bus)
        prof = gpu.profile
        self.table = PartitionTable(gpu.vram.size, HYP_GLOBAL, prof.bar1_size, prof.bar3_size,
                                    host_backing)
        self.hyp = VramPool(gpu.vram.size - HYP_GLOBAL, HYP_GLOBAL, "hypervisor",
                            gpu.vram.zero)
        self.vgpus: list[VGpu] = []
        self.owner: dict[int, VGpu] = {}
        self.monitor: monitor.ReferenceMonitor | None = None
        if monitor.enabled():
            self.monitor = monitor.ReferenceMonitor(self.vgpus, self.owner,
                                                    gpu.vram.size - HYP_GLOBAL, HYP_GLOBAL,
                                                    self.bus_window)
            with gpu.lock:
                gpu.mmu.monitor = self.monitor
        self.host = HostPort(gpu, self.hyp.alloc)  # (the pool scrubs what it hands out)
        # the owners (and the residency pool, while oversubscribed vGPUs exist): kept
        # here, read by the scheduler's verdicts
        self.tenancy = Tenancy(self.lock, self.host, self.counts, self.vgpus, self.owner)
        self.submissions = Submissions(self.host, policy or FifoPolicy(), self.tenancy.kill,
                                       watchdog or WatchdogLimits(), residency=self.tenancy,
                                       clock=gpu.clock)
        self._services = MediatorServices(gpu, self.host, self.submissions, self.lock,
                                          self.owner, self.bus_window)
        gpu.pfifo.idle_listeners.append(self.submissions.on_idle)
        gpu.event_listeners.append(self._interrupt)

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
                tenancy = self.tenancy
                if tenancy.residency is None:
                    tenancy.residency = Residency(self.gpu, part.vram_base, self.table.pool_size)
                tenant = tenancy.residency.join(name, part.vram_size)
            elif planted("unscrubbed-slice") and self.gpu.vram.piece(part.vram_base):
                pass  # the last tenant's piece, as it left it
            else:  # the slice gets a memfd of its own: the one its VMM may be handed
                try:
                    self.gpu.vram.carve(part.vram_base, part.vram_size, f"gpuvm-vram-{name}")
                except (OSError, ValueError):
                    self.table.release(part)
                    raise
                self._scrub(part.vram_base, part.vram_size)
            self._scrub(part.shadow_pool.base, part.shadow_pool.size)
            part.shadow_pool.scrub = self.gpu.vram.zero
            vgpu = VGpu(self._services, name, part, mode, uuid, type_id, tenant)
            if tenant is not None:
                tenant.count = vgpu.meter.count
                tenant.spaces = lambda: vgpu.shadowing.spaces.values()
                tenant.flush = self.host.flush
                for counter in RESIDENCY_COUNTERS:  # in its rows from the start
                    vgpu.meter.count(counter, 0)
            self.bus.add(part.sys_base, self.bus_window, vgpu.dma)
            self.vgpus.append(vgpu)
            self.host.runlists.append(vgpu.table)
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
            self.host.runlists.remove(vgpu.table)
            self.host.rebuild_runlist()
            for c in pchids:
                self.owner.pop(c, None)
            self.bus.remove(vgpu.part.sys_base)
            if vgpu.tenant is not None and self.tenancy.residency is not None:
                self.tenancy.residency.leave(vgpu.tenant)
            self.table.release(vgpu.part)
            # (an oversubscribed vGPU's pool was never carved)
            if vgpu.tenant is None and not planted("unscrubbed-slice"):
                self.gpu.vram.merge(vgpu.part.vram_base)
            if self.table.pool_base is None:
                self.tenancy.residency = None

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
