"""A VM's virtual GPU: a mediated device (mdev) with the VFIO device interface.

The VMM attaches it like any VFIO device (gpuvm/vfio/device.py) and hands it every trapped
access as `read`/`write(region, offset, ...)`.  BAR0 goes through the trap table
(bar0_traps); the PRAMIN window is translated into the VM's slice; BAR1 and BAR3 are
forwarded into the VM's arena of the physical BARs (translated by the shadow of the
guest's BAR VM), except the USERD poll area, where doorbells are caught.  Writes that land
in a sensitive page (a shadowed instance block) are reflected into its shadow.  In remap
modes the safe BAR1/BAR3 pages are granted to the VMM's mapping listener (the sparse
areas of those regions); a PV vGPU has BAR4, an I/O port whose write is the hypercall.
System memory is reachable only through the DMA mappings the VMM made.

An oversubscribed vGPU (mediator/residency.py) is served through its overlay view: the
mediator's reads and writes of its VRAM, BAR1/BAR3 data accesses included, go to wherever
each page is now (a pool frame or the backing store), never through the physical BARs,
whose frames may hold another VM's pages at the time; its BAR pages are not remapped.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import ctypes

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.clock import FREE, EventPrices, GuestParty, VirtualLock
from gpuvm.device.dma import DmaMappings
from gpuvm.device.engines import Engine
from gpuvm.device.faults import ChannelFault, fault_flags
from gpuvm.mediator import bar0_traps
from gpuvm.mediator.channels import Channels
from gpuvm.mediator.host_port import under_mediator_lock
from gpuvm.mediator.hypercalls import Hypercalls
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.shadowing import Shadowing
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, IrqTriggers, MappingListener, RegionInfo,
                               config_region_info, pci_device_info,
                               SparseArea, VfioError, absent_region, bar_region_info)
from gpuvm.vfio.pci_config import PciConfig
from shadow.bar_window import NOT_VRAM
from shadow.entries import EntryPolicy
from shadow.frames import ResidentPolicy

if TYPE_CHECKING:
    from gpuvm.mediator.mediator import Mediator
    from gpuvm.mediator.residency import Tenant

_PRAMIN_END = regs.PRAMIN_WINDOW + regs.PRAMIN_WINDOW_SIZE
_UNLOCKED = frozenset({"virtual", "faked", "refused"})


_CONFIG = vfio.VFIO_PCI_CONFIG_REGION_INDEX
T = TypeVar("T")


class VGpu:
    def __init__(self, med: "Mediator", name: str, part: Partition, mode: Mode,
                 uuid: str = "", type_id: str = "", tenant: "Tenant | None" = None) -> None:
        self.med = med
        self.name = name
        self.uuid = uuid
        self.type_id = type_id
        self.part = part
        self.dma = DmaMappings()  # this vGPU's IOMMU table: what the VMM DMA-mapped
        # This vGPU's own lock: held while its PV tables and its shadow reserve change.
        # A hypercall that only fills the VM's own tables takes this one and not the
        # mediator's, as a hypervisor serves each VM's page-table hypercalls on that VM's
        # own vCPU -- under the mediator's one lock eight pv VMs spent 54% of their
        # makespan waiting for each other (docs/model-validation.md, 2026-11-29).  A
        # thread that needs both takes this one first.
        self.lock = threading.RLock()
        self.tenant = tenant  # oversubscribed: its residency in the shared pool
        if tenant is None:
            self.mode = mode
            self._vram = med.gpu.vram
            self.policy = EntryPolicy(part.vram_base, part.vram_size, part.sys_base,
                                      self.dma.ranges)
            self.space_policy = self.policy  # what its channel shadows translate with
        else:
            self.mode = replace(mode, remap=False)
            self._vram = tenant.view
            # read through the overlay view; its engines write pool frame p for page p,
            # which is where the engine write log names their stores (engine_base)
            self.policy = EntryPolicy(tenant.view.base, part.vram_size, part.sys_base,
                                      self.dma.ranges, engine_base=part.vram_base)
            self.space_policy = ResidentPolicy(tenant.view.base, part.vram_size, part.sys_base,
                                               self.dma.ranges, engine_base=part.vram_base,
                                               frame_base=part.vram_base,
                                               frames=tenant.frames)
            tenant.policy = self.space_policy
        self.bar_sizes = {regs.BAR0: regs.BAR0_SIZE, regs.BAR1: part.spec.bar1_size,
                          regs.BAR3: part.spec.bar3_size}
        bars = {bar: (size, False) for bar, size in self.bar_sizes.items()}
        if mode.pv:
            bars[regs.BAR4] = (regs.BAR4_SIZE, True)
        self.config = PciConfig(med.gpu.profile.pci_device, bars)
        # INTx as every PCI function has it (a standard vfio-user client, libvfio-user's
        # sample, sets it up first), and the MSI vector gpuvm's VMM uses
        self.irqs = IrqTriggers({vfio.VFIO_PCI_INTX_IRQ_INDEX: 1, vfio.VFIO_PCI_MSI_IRQ_INDEX: 1})
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.vregs: dict[str, int] = defaultdict(int)
        self._fault_records = [[0, 0, 0, 0] for _ in range(regs.PFIFO_FAULT_UNITS)]
        self._fault_mask = 0
        self._pfifo_intr = 0
        self._faults_seen = 0
        self._watchdog_faults: list[ChannelFault] = []
        # virtual time: the VM's vCPU to charge each event to, at these prices, and the
        # mediator's lock in virtual time (use_meter; None: a wall-clock run)
        self.meter: GuestParty | None = None
        self._prices = FREE
        self._vlock: VirtualLock | None = None
        self.channels = Channels(self, med, self._vram)
        self.shadowing = Shadowing(self, med, self._vram)
        self.hypercalls = Hypercalls(self, med, self._vram)
        self._install_traps()
        # Physical channels are reused by later VMs: count only what happens from now on.
        self._device_baseline = self._device_channel_counts()
        self._engine_host_baseline = self._channels_host_ns()

    def _install_traps(self) -> None:
        reads, writes = bar0_traps.build(self)
        # Virtual, faked and refused registers touch only this VM's own state (written by
        # this VM's vCPU alone), so they skip the mediator lock: it costs more than the
        # rest of a trap on this host.
        self._r0 = {off: (f"trap.bar0.{label}.read", fn, label not in _UNLOCKED)
                    for off, (label, fn) in reads.items()}
        self._w0 = {off: (f"trap.bar0.{label}.write", fn, label not in _UNLOCKED)
                    for off, (label, fn) in writes.items()}

    def use_meter(self, party: GuestParty, prices: EventPrices, vlock: VirtualLock) -> None:
        """Charge this VM's events to `party`'s virtual time at `prices`, and take the
        mediator's lock in virtual time (`vlock`, the mediator's) as well as for real."""
        self.meter, self._prices, self._vlock = party, prices, vlock

    def doorbell_ledger(self) -> list | None:
        """A doorbell is rung: its entry in the vCPU's event stream (filled in with the
        engine time it takes), or None off a virtual clock."""
        return None if self.meter is None else self.meter.stream.doorbell()

    def count(self, name: str, n: int) -> None:
        self.counts[name] += n
        if self.meter is not None:
            price = self._prices.counter_ns.get(name)
            if price:
                self.meter.charge(price * n, name in self._prices.locked)

    def under_lock(self, locked_ns: int, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` under the mediator's lock, on this VM's behalf: for real (its
        wall-clock wait counted, host_port.under_mediator_lock), and on a virtual clock
        also in virtual time, the VM charged `locked_ns` of the mediator's work under it
        beside what `work` counts there."""
        party = self.meter
        if party is None:
            return under_mediator_lock(self.med.lock, self.counts, work, *args)
        vlock = self._vlock
        vlock.ask(party)
        with self.med.lock:
            vlock.taken(party)
            party.hold(locked_ns)
            try:
                return work(*args)
            finally:
                vlock.released(party)

    def guest_u32(self, guest_addr: int) -> int:
        return self._vram.read_u32(self.policy.host_vram(guest_addr))

    # ------------------------------------------------------------------ VFIO: the trap path
    def read(self, region: int, offset: int, size: int) -> int:
        if self.meter is not None:
            self.meter.charge(self._prices.exit_ns.get(region, 0))
        if region == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._r0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    return handler[1]()
                return self.under_lock(self._prices.exit_locked_ns, handler[1])
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                return self._pramin(offset, size, None)
            self.counts["trap.bar0.passthrough.read"] += 1
            return self.med.gpu.mmio_read(region, offset, size)
        if region == _CONFIG:
            return self.config.read(offset, size)
        return self.under_lock(self._prices.exit_locked_ns, self._bar_access, region,
                               offset, size, None)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if self.meter is not None:
            self.meter.charge(self._prices.exit_ns.get(region, 0))
        if region == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._w0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    handler[1](value)
                    return
                self.under_lock(self._prices.exit_locked_ns, handler[1], value)
                return
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                self._pramin(offset, size, value)
                return
            self.counts["trap.bar0.passthrough.write"] += 1
            self.med.gpu.mmio_write(region, offset, size, value)
            return
        if region == _CONFIG:
            self.config.write(offset, size, value)
            return
        if region == regs.BAR4 and self.mode.pv:
            if offset == regs.BAR4_HYPERCALL and size == 4:
                self.hypercalls.handle(value)
            else:
                self.count("trap.refused.bar4", 1)
            return
        self.under_lock(self._prices.exit_locked_ns, self._bar_access, region, offset,
                        size, value)

    # ------------------------------------------------------------------ VFIO: the rest
    def get_info(self) -> DeviceInfo:
        return pci_device_info()

    def get_region_info(self, index: int) -> RegionInfo:
        if index in (regs.BAR1, regs.BAR3):
            # in remap modes the whole arena is a sparse area: the VMM may map any of it,
            # and the listener says which pages are granted now
            size = self.bar_sizes[index]
            sparse = (SparseArea(0, size),) if self.mode.remap else ()
            return bar_region_info(index, size, sparse)
        if index == regs.BAR0:
            return bar_region_info(index, regs.BAR0_SIZE)
        if index == regs.BAR4 and self.mode.pv:
            return RegionInfo(index, regs.BAR4_SIZE, vfio.VFIO_REGION_INFO_FLAG_WRITE)
        if index == _CONFIG:
            return config_region_info()
        if 0 <= index < vfio.VFIO_PCI_NUM_REGIONS:
            return absent_region(index)
        raise VfioError(f"{self.name}: no region {index}")

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        with self.med.lock:
            if listener is None and self.shadowing.remapper is not None:
                self.shadowing.unmap_all()
            self.shadowing.remapper = listener
            self.shadowing.refresh_remap()

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        with self.lock, self.med.lock:
            end = iova + memory.size
            if end > self.med.bus_window:
                raise VfioError(f"{self.name}: DMA map [{iova:#x}, {end:#x}) is beyond the "
                                f"device's {self.med.bus_window:#x}-byte bus window")
            try:
                self.dma.map(iova, memory, writable=bool(flags & vfio.VFIO_DMA_MAP_FLAG_WRITE))
            except ValueError as exc:
                raise VfioError(f"{self.name}: {exc}") from None
            self.shadowing.dma_changed()

    def dma_unmap(self, iova: int, size: int) -> None:
        with self.lock, self.med.lock:
            try:
                self.dma.unmap(iova, size)
            except ValueError as exc:
                raise VfioError(f"{self.name}: {exc}") from None
            self.shadowing.dma_changed()

    def guest_memory(self, iova: int, size: int) -> np.ndarray:
        """A view of DMA-mapped guest memory (the hypercall record), or VfioError."""
        view = self.dma.region(iova, size)
        if view is None:
            raise VfioError(f"{self.name}: [{iova:#x}, {iova + size:#x}) is not DMA-mapped")
        return view

    def guest_struct(self, iova: int, cls: type[ctypes.Structure]) -> ctypes.Structure:
        return cls.from_buffer(self.guest_memory(iova, ctypes.sizeof(cls)))

    def get_irq_info(self, index: int) -> IrqInfo:
        return self.irqs.info(index)

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        self.irqs.set(index, start, eventfds)

    def interrupt(self) -> None:
        """The GPU signalled completions or faults: raise this vGPU's MSI, and its INTx
        (each only if the VMM gave it an eventfd: a VMM uses one or the other)."""
        self.irqs.fire(vfio.VFIO_PCI_MSI_IRQ_INDEX)
        self.irqs.fire(vfio.VFIO_PCI_INTX_IRQ_INDEX)

    def reset(self) -> None:
        """Device reset: stop and drop the VM's channels and shadows, start afresh."""
        with self.lock, self.med.lock:
            self.teardown()
            self.channels = Channels(self, self.med, self._vram)
            self.shadowing = Shadowing(self, self.med, self._vram)
            self.hypercalls = Hypercalls(self, self.med, self._vram)
            self._install_traps()
            self.med.rebuild_runlist()

    def close(self) -> None:
        self.irqs.clear()
        self.set_mapping_listener(None)

    def watchdog_fault(self, vchid: int, reason: str) -> None:
        self._watchdog_faults.append(ChannelFault(vchid, reason, 0, "PFIFO",
                                                  regs.CHAN_ERR_TIMEOUT_EXT))
        self.med.gpu.signal(self.part.chid_base + vchid)  # it looks again: sees the fault

    def faults(self) -> list[ChannelFault]:
        mine = list(self._watchdog_faults)
        for f in self.med.gpu.faults():
            vchid = f.chid - self.part.chid_base
            if 0 <= vchid < self.part.channels and self.med.owner.get(f.chid) is self:
                mine.append(ChannelFault(vchid, f.reason, f.address, f.engine, f.code, f.unit,
                                         f.vm_reason, f.write))
        return mine

    def _device_channel_counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        first, end = self.part.chid_base, self.part.chid_base + self.part.channels
        with self.med.gpu.lock:
            # the channels that counted anything, not every channel of the partition:
            # a recorded VM reads this with every counter snapshot
            for c, counts in self.med.gpu.counts.per_channel.items():
                if first <= c < end:
                    for name, value in counts.items():
                        out[name] += value
        return out

    def counters(self) -> dict[str, int]:
        out = dict(self.counts)
        for name, value in self._device_channel_counts().items():
            delta = value - self._device_baseline.get(name, 0)
            if delta:
                out[name] = out.get(name, 0) + delta
        out["remap.pages"] = self.shadowing.remapped_pages()
        slots = getattr(self.shadowing.remapper, "slots_in_use", None)
        if slots is not None:
            out["remap.memslots"] = slots()
        return out

    def device_time_ns(self) -> int:
        return self.med.gpu.device_time_ns()

    def _channels_host_ns(self) -> int:
        chids = range(self.part.chid_base, self.part.chid_base + self.part.channels)
        return sum(self.med.gpu.pfifo.host_ns[c] for c in chids)

    def engine_host_ns(self) -> int:
        """Host time the device has spent running this vGPU's channels since it was
        created (pfifo.host_ns): in a server that serves every VM from one process,
        time no other VM's access is answered in."""
        return self._channels_host_ns() - self._engine_host_baseline

    # ------------------------------------------------------------------ PRAMIN
    def _pramin(self, offset: int, size: int, value: int | None) -> int:
        kind = "read" if value is None else "write"
        self.counts[f"trap.bar0.pramin.{kind}"] += 1
        addr = (self.vregs["pramin_base"] << regs.PBUS_PRAMIN_BASE_SHIFT) + \
            offset - regs.PRAMIN_WINDOW
        if size != 4 or offset & 3 or not self.policy.guest_vram_ok(addr, 4):
            self.count("trap.refused.pramin", 1)
            return 0xFFFFFFFF
        host = self.policy.host_vram(addr)
        if value is None:
            return self._vram.read_u32(host)
        with self.med.lock:
            self._vram.write_u32(host, value)
            self.shadowing.note_write(addr, 4)
            self.channels.reflect(addr)
        return 0

    # ------------------------------------------------------------------ BAR1 / BAR3
    def _bar_access(self, bar: int, offset: int, size: int, value: int | None) -> int:
        kind = "read" if value is None else "write"
        if bar == regs.BAR1:
            slot = self.channels.userd_slot(offset)
            if slot is not None:
                ch, reg = slot
                self.counts[f"trap.bar1.userd.{kind}"] += 1
                if value is None:
                    return self.channels.userd_read(ch, reg, size)
                self.channels.userd_write(ch, reg, size, value)
                return 0
            window, arena = self.shadowing.window_in_use(bar), self.part.bar1_base
        elif bar == regs.BAR3:
            window, arena = self.shadowing.window_in_use(bar), self.part.bar3_base
        else:
            self.count("trap.refused.bar", 1)
            return (1 << (8 * size)) - 1
        self.counts[f"trap.bar{bar}.forward.{kind}"] += 1
        page = offset >> 12
        if offset < 0 or page >= window.pages or (offset & 0xFFF) + size > 0x1000:
            self.count(f"trap.refused.bar{bar}", 1)
            return (1 << (8 * size)) - 1
        if self.tenant is not None:
            host = int(window.host_pages[page])
            if host != NOT_VRAM:  # its page, wherever it is now (never the physical BAR)
                addr = host + (offset & 0xFFF)
                if value is None:
                    return self._vram.read_bytes(addr, size)
                self._vram.write_bytes(addr, size, value)
                guest = host - self.policy.vram_base + (offset & 0xFFF)
                self.shadowing.note_write(guest, size)  # (the incremental shadows' history)
                self.channels.reflect(guest)
                return 0
        phys_pte = int(self._vram.u64[(window.phys_pt >> 3) + window.first + page])
        if not phys_pte & regs.PTE_PRESENT:
            self._bar_fault(bar, offset, value is not None)
            return (1 << (8 * size)) - 1
        if value is None:
            return self.med.gpu.mmio_read(bar, arena + offset, size)
        self.med.gpu.mmio_write(bar, arena + offset, size, value)
        host = int(window.host_pages[page])
        if host != NOT_VRAM:
            addr = host - self.policy.vram_base + (offset & 0xFFF)
            self.shadowing.note_write(addr, size)
            self.channels.reflect(addr)
        return 0

    def _bar_fault(self, bar: int, offset: int, write: bool) -> None:
        unit = regs.FAULT_UNIT_BAR1 if bar == regs.BAR1 else regs.FAULT_UNIT_BAR3
        inst = layout.fault_inst_word(layout.barvm_inst(
            self.vregs["bar1_vm" if bar == regs.BAR1 else "bar3_vm"]))
        self._fault_records[unit] = [inst, offset & 0xFFFFFFFF, offset >> 32,
                                     fault_flags(unit, regs.FAULT_PAGE_NOT_PRESENT, write)]
        self._fault_mask |= 1 << unit
        self._pfifo_intr |= regs.PFIFO_INTR_VM_FAULT
        self.count(f"vm.faults.bar{bar}", 1)

    # ------------------------------------------------------------------ handlers used by bar0_traps
    def set_bar_vm(self, bar: int, value: int) -> None:
        self.vregs["bar1_vm" if bar == regs.BAR1 else "bar3_vm"] = value
        self.shadowing.bind_window(bar, value)

    def set_userd_poll(self, value: int) -> None:
        self.channels.userd_poll = value
        self.shadowing.refresh_remap()

    def runlist_submit(self, value: int) -> None:
        self.vregs["runlist_len"] = value & regs.PFIFO_RUNLIST_LEN_MASK
        self.channels.runlist_submit(self.vregs["runlist_addr"], value & regs.PFIFO_RUNLIST_LEN_MASK)

    def runlist_pchids(self) -> list[int]:
        return self.channels.runlist_pchids()

    def tlb_flush(self, trigger: int) -> None:
        self.shadowing.guest_flush(self.vregs["flush_pd"], trigger)

    def pgraph_busy(self) -> int:
        """PGRAPH_STATUS as this VM may see it: busy only while working for its channels."""
        gpu = self.med.gpu
        engine = gpu.engines.graph
        inst = engine.current_inst
        mine = any(ch.bound and ch.shadow_inst == inst for ch in self.channels.by_vchid.values())
        return int(mine and engine.busy(gpu.clock.now_ns()))

    def pcopy_channel(self, engine: Engine) -> int:
        inst = engine.current_inst
        for ch in self.channels.by_vchid.values():
            if ch.bound and ch.shadow_inst == inst:
                return layout.pcopy_chan_word(ch.guest_inst)
        return 0

    # ------------------------------------------------------------------ virtual interrupts/faults
    def _collect_faults(self) -> None:
        """Turn device faults of this VM's channels into its own fault records."""
        faults = self.faults()
        for f in faults[self._faults_seen:]:
            ch = self.channels.by_vchid.get(f.chid)
            if f.unit >= 0:
                inst = layout.fault_inst_word(ch.guest_inst) if ch and ch.guest_inst else 0
                self._fault_records[f.unit] = [
                    inst, f.address & 0xFFFFFFFF, f.address >> 32,
                    fault_flags(f.unit, f.vm_reason, f.write)]
                self._fault_mask |= 1 << f.unit
                self._pfifo_intr |= regs.PFIFO_INTR_VM_FAULT
            else:
                self._pfifo_intr |= regs.PFIFO_INTR_PBDMA
        self._faults_seen = len(faults)

    def pfifo_intr(self) -> int:
        self._collect_faults()
        return self._pfifo_intr

    def pfifo_intr_clear(self, value: int) -> None:
        self._collect_faults()
        self._pfifo_intr &= ~value

    def pmc_intr(self) -> int:
        return regs.PMC_INTR_PFIFO if self.pfifo_intr() else 0

    def fault_mask(self) -> int:
        self._collect_faults()
        return self._fault_mask

    def fault_mask_clear(self, value: int) -> None:
        self._fault_mask &= ~value

    def fault_record(self, unit: int, word: int) -> int:
        self._collect_faults()
        return self._fault_records[unit][word]

    # ------------------------------------------------------------------ lifecycle
    def teardown(self) -> None:
        self.channels.teardown()
        self.shadowing.teardown()
