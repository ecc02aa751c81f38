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
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.clock import EventPrices, GuestParty, VirtualLock
from gpuvm.device.dma import DmaMappings
from gpuvm.device.faults import ChannelFault
from gpuvm.device.gpu import Gpu
from gpuvm.mediator import bar0_traps
from gpuvm.mediator.channel_table import ChannelTable
from gpuvm.mediator.channels import Channels
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.hypercalls import Hypercalls
from gpuvm.mediator.meter import VmMeter
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.planted import planted
from gpuvm.mediator.shadowing import Shadowing
from gpuvm.mediator.vm_faults import VmFaults
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import (VALUE_MASKS, DeviceInfo, IrqInfo, IrqTriggers, MappingListener,
                               PostedStores, RegionInfo, SparseArea, VfioError,
                               absent_region, bar_region_info, config_region_info,
                               pci_device_info)
from gpuvm.vfio.pci_config import PciConfig
from shadow.bar_window import NOT_VRAM
from shadow.entries import EntryPolicy
from shadow.frames import ResidentPolicy

if TYPE_CHECKING:
    from gpuvm.mediator.residency import Tenant

_PRAMIN_END = regs.PRAMIN_WINDOW + regs.PRAMIN_WINDOW_SIZE
# a forwarded BAR1/BAR3 access's counter, by BAR and by whether it writes (not formatted
# per access: fv's page-table stores take this path tens of thousands of times a run)
_FORWARDED = {bar: (f"trap.bar{bar}.forward.read", f"trap.bar{bar}.forward.write")
              for bar in (regs.BAR1, regs.BAR3)}
_PRAMIN_COUNTS = ("trap.bar0.pramin.read", "trap.bar0.pramin.write")
_UNLOCKED = frozenset({"virtual", "faked", "refused", "passthrough"})


_CONFIG = vfio.VFIO_PCI_CONFIG_REGION_INDEX
_PAGE_SHIFT = np.uint64(regs.SMALL_PAGE_SHIFT)  # a run of posted stores stays in one page


def _owned_by(owner: Mapping[int, object], vm: object, pchid: int) -> bool:
    return owner.get(pchid) is vm


class SchedulerPort(Protocol):
    """Where a vGPU's doorbells go (gpuvm.mediator.submission.Submissions)."""

    def submit(self, vm: object, pchid: int, put: int, ledger: list | None = None) -> None: ...

    def channel_reset(self, pchid: int) -> None: ...


@dataclass(frozen=True)
class MediatorServices:
    """What one mediator gives each of its vGPUs: the physical GPU (its register bus
    for passthrough registers, its engines and counters), the port the vGPU's parts
    drive it through, the scheduler's port, the mediator's lock, who owns which
    physical channel now, and the bus window each vGPU's DMA mappings live in.  Handed
    these, a vGPU never reaches back up to the mediator."""

    gpu: Gpu
    host: HostPort
    scheduler: SchedulerPort
    lock: threading.RLock
    owner: Mapping[int, object]
    bus_window: int


class VGpu:
    """A VM's virtual GPU: the VFIO device a VMM attaches, and the owner of its parts.

    It owns the VM's partition, DMA mappings, PCI config space, IRQs, virtual registers
    and meter, and builds its parts -- the channel table and channels, shadowing,
    hypercalls, fault records and the BAR0 trap table -- each with exactly the
    collaborators it uses.  Its own job is the VFIO surface: a trapped access is routed
    here (the trap table for BAR0 registers, the PRAMIN window, BAR1/BAR3 forwarding,
    BAR4's hypercall port) straight to the part whose handler owns the decision; no
    part calls back up to it."""

    def __init__(self, services: MediatorServices, name: str, part: Partition, mode: Mode,
                 uuid: str = "", type_id: str = "", tenant: "Tenant | None" = None) -> None:
        self.services = services
        self.gpu = services.gpu
        self.host = services.host
        self.mediator_lock = services.lock
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
            self._vram = services.gpu.vram
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
        self.config = PciConfig(services.gpu.profile.pci_device, bars)
        # INTx as every PCI function has it (a standard vfio-user client, libvfio-user's
        # sample, sets it up first), and the MSI vector gpuvm's VMM uses
        self.irqs = IrqTriggers({vfio.VFIO_PCI_INTX_IRQ_INDEX: 1, vfio.VFIO_PCI_MSI_IRQ_INDEX: 1})
        self.meter = VmMeter(services.lock)
        self.counts = self.meter.counts
        self.vregs: dict[str, int] = defaultdict(int)
        self.table = ChannelTable(part.channels)
        # whether this VM owns a physical channel now: the mediator's owner map, keyed
        # by this vGPU (read, never called)
        self.fault_state = VmFaults(part, self.table, services.gpu.faults,
                                    partial(_owned_by, services.owner, self))
        self._build_parts()
        # Physical channels are reused by later VMs: count only what happens from now on.
        self._device_baseline = self._device_channel_counts()
        self._engine_host_baseline = self._channels_host_ns()

    def _build_parts(self) -> None:
        """Channels, shadowing, hypercalls and the trap table, each given what it uses
        (afresh at a device reset; the channel table and fault records outlive it)."""
        host, meter, part, vram = self.host, self.meter, self.part, self._vram
        self.shadowing = Shadowing(vram, host, part, self.policy, self.space_policy,
                                   self.dma, meter, self.mode, self.table, self.vregs)
        scheduler = self.services.scheduler
        # the scheduler's port for this VM: its doorbells under this vGPU's key
        self.channels = Channels(self.table, part, self.policy, vram, host,
                                 partial(scheduler.submit, self), scheduler.channel_reset,
                                 meter, self.fault_state, self.shadowing)
        self.hypercalls = Hypercalls(self.dma, self.lock, meter, self.shadowing,
                                     self.channels, part, self.policy, vram, host)
        reads, writes = bar0_traps.build(bar0_traps.TrapParts(
            self.gpu, self.vregs, self.table, self.channels, self.shadowing,
            self.fault_state, meter, part, self.interrupt))
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
        self.meter.use(party, prices, vlock)

    # ------------------------------------------------------------------ VFIO: the trap path
    def read(self, region: int, offset: int, size: int) -> int:
        """A trapped read: routed to the handler that owns it (see write)."""
        meter = self.meter
        if meter.party is not None:
            meter.party.charge(meter.prices.exit_ns.get(region, 0))
        if region == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._r0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    return handler[1]()
                with meter.trap_hold:
                    return handler[1]()
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                return self._pramin(offset, size, None)
            return self._bar0_refused(offset, size, None)
        if region == _CONFIG:
            return self.config.read(offset, size)
        with meter.trap_hold:
            if region == regs.BAR1:
                slot = self.table.userd_slot(offset)
                if slot is not None:
                    self.counts["trap.bar1.userd.read"] += 1
                    return self.channels.userd_read(slot[0], slot[1], size)
            return self._bar_access(region, offset, size, None)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        """A trapped write, straight to the handler that owns the decision: a BAR0
        register's trap-table entry (under the mediator's lock unless it touches only
        this VM's state), the PRAMIN window, a doorbell (Channels.userd_write: to the
        scheduler), a BAR1/BAR3 page forwarded into the VM's arena, or a hypercall."""
        meter = self.meter
        if meter.party is not None:
            meter.party.charge(meter.prices.exit_ns.get(region, 0))
        if region == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._w0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    handler[1](value)
                    return
                with meter.trap_hold:
                    handler[1](value)
                return
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                self._pramin(offset, size, value)
                return
            self._bar0_refused(offset, size, value)
            return
        if region == _CONFIG:
            self.config.write(offset, size, value)
            return
        if region == regs.BAR4 and self.mode.pv:
            if offset == regs.BAR4_HYPERCALL and size == 4:
                self.hypercalls.handle(value)
            else:
                meter.count("trap.refused.bar4", 1)
            return
        with meter.trap_hold:
            if region == regs.BAR1:
                slot = self.table.userd_slot(offset)
                if slot is not None:
                    self.counts["trap.bar1.userd.write"] += 1
                    self.channels.userd_write(slot[0], slot[1], size, value)
                    return
            self._bar_access(region, offset, size, value)

    def write_many(self, stores: PostedStores, exit_: Callable[[], None] | None = None
                   ) -> None:
        """Posted stores, in the guest's order, each one trapped write as `write` takes
        it, `exit_` (the vCPU's exit on a virtual clock) called before each.

        Why: KVM's coalesced ring hands the VMM stores ~150 at a time, and nearly all
        (fv mmul: 49,000 of 49,139) are 8-byte page-table entries or PRAMIN words in a
        row -- a VMM serving several VMs spent ~80% of its time on them one at a time.
        A run of them into one page is still counted, priced, ticked and locked store
        by store, so counts and virtual times are those of one `write` each; what lands
        at once is the rest: one translation, one slice of VRAM, one note to the
        shadows.  Where the BAR window waits for a lazy resync, the run's first store
        goes through `write` (the resync happens there, charged to that exit) and the
        rest land at once; where they cannot land at once (a page that faults, a
        channel's RAMIN, an oversubscribed VM, misaligned stores) they go through
        `write` too.  The run's stores land after the last one's exit instead of
        between them: no one else may look at this VM's memory in between (other VMs
        cannot; its own engines see a posted store at no defined time anyway)."""
        n = len(stores)
        regions, offsets, sizes, values = stores.regions, stores.offsets, stores.sizes, \
            stores.values
        # where each run starts: a store that does not go on from the one before
        follows = np.zeros(n, dtype=bool)
        if n > 1:
            follows[1:] = (regions[1:] == regions[:-1]) & (sizes[1:] == sizes[:-1]) & \
                (offsets[1:] == offsets[:-1] + sizes[:-1]) & \
                (offsets[1:] >> _PAGE_SHIFT == offsets[:-1] >> _PAGE_SHIFT)
        starts = np.flatnonzero(~follows).tolist()
        write = self.write
        done = 0
        try:
            for s, e in zip(starts, starts[1:] + [n]):
                region, offset, size, value = next(stores.rows(s, s + 1))
                if e - s > 1 and self._land_run(region, offset, size, values[s:e], exit_):
                    done = e
                    continue
                if exit_ is not None:
                    exit_()
                write(region, offset, size, value)
                done = s + 1
                if e > done and not self._land_run(region, offset + size, size,
                                                   values[done:e], exit_):
                    for region, offset, size, value in stores.rows(done, e):
                        if exit_ is not None:
                            exit_()
                        write(region, offset, size, value)
                        done += 1
                done = e
        except VfioError as exc:
            exc.done = done  # type: ignore[attr-defined]  # (see VfioDevice)
            raise

    def _land_run(self, region: int, offset: int, size: int, values: np.ndarray,
                  exit_: Callable[[], None] | None) -> bool:
        """Stores of `values` from `offset` on, in a row (see write_many).  False,
        having done nothing, where they cannot land at once."""
        m = len(values)
        if self.tenant is not None:
            return False
        if region == regs.BAR3:
            window = self.shadowing.bar3
            page = offset >> 12
            if window.stale or page >= window.pages or not window.mapped(page):
                return False
            host = window.host_pages.item(page)
            guest = host - self.policy.vram_base + (offset & 0xFFF) \
                if host != NOT_VRAM else None
            counter, locked = _FORWARDED[regs.BAR3][1], True
        elif region == 0 and size == 4 and not offset & 3 and \
                regs.PRAMIN_WINDOW <= offset and offset + 4 * m <= _PRAMIN_END:
            guest = self._pramin_addr(offset)
            if not self.policy.guest_vram_ok(guest, 4 * m):
                return False
            counter, locked = _PRAMIN_COUNTS[1], False
        else:
            return False
        if guest is not None and self.channels.reflects(guest):
            return False  # a store there rebuilds a channel's shadow: one at a time
        meter = self.meter
        party = meter.party
        if party is not None or exit_ is not None:  # each store's exit, price and hold
            price = meter.prices.exit_ns.get(region, 0)
            hold = meter.trap_hold
            for _ in range(m):
                if exit_ is not None:
                    exit_()
                if party is not None:
                    party.charge(price)
                    if locked:
                        with hold:
                            pass
        values = values & VALUE_MASKS[size]
        self.counts[counter] += m
        with self.mediator_lock:
            if region == regs.BAR3:
                if not self.gpu.bar3_write_run(self.part.bar3_base + offset, size, values):
                    self.counts[counter] -= m  # counted again, one at a time
                    for k, value in enumerate(values.tolist()):
                        self._bar_access(region, offset + size * k, size, value)
                    return True
            else:
                self._vram.write_run(self.policy.host_vram(guest), 4, values)
            if guest is not None:
                self.shadowing.note_write(guest, size * m)
                self.channels.reflect(guest)
        return True

    def _bar0_refused(self, offset: int, size: int, value: int | None) -> int:
        """A BAR0 access the trap table has no handler for at this size (bar0_traps):
        refused, never forwarded at the guest's raw offset; a read answers all ones."""
        if planted("raw-bar0"):
            self.counts[f"trap.bar0.passthrough.{'read' if value is None else 'write'}"] += 1
            if value is None:
                return self.gpu.mmio_read(regs.BAR0, offset, size)
            self.gpu.mmio_write(regs.BAR0, offset, size, value)
            return 0
        self.meter.count("trap.refused.bar0", 1)
        return (1 << (8 * size)) - 1

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
        with self.mediator_lock:
            self.shadowing.set_remapper(listener)

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        window = self.services.bus_window
        with self.lock, self.mediator_lock:
            end = iova + memory.size
            if end > window:
                raise VfioError(f"{self.name}: DMA map [{iova:#x}, {end:#x}) is beyond the "
                                f"device's {window:#x}-byte bus window")
            try:
                self.dma.map(iova, memory, writable=bool(flags & vfio.VFIO_DMA_MAP_FLAG_WRITE))
            except ValueError as exc:
                raise VfioError(f"{self.name}: {exc}") from None
            self.shadowing.dma_changed()

    def dma_unmap(self, iova: int, size: int) -> None:
        with self.lock, self.mediator_lock:
            try:
                self.dma.unmap(iova, size)
            except ValueError as exc:
                raise VfioError(f"{self.name}: {exc}") from None
            self.shadowing.dma_changed()

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
        with self.lock, self.mediator_lock:
            self.teardown()
            self._build_parts()
            self.host.rebuild_runlist()

    def close(self) -> None:
        self.irqs.clear()
        self.set_mapping_listener(None)

    def faults(self) -> list[ChannelFault]:
        """Every fault of this VM's channels, in its own channel ids."""
        return self.fault_state.all()

    def _device_channel_counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        first, end = self.part.chid_base, self.part.chid_base + self.part.channels
        with self.gpu.lock:
            # the channels that counted anything, not every channel of the partition:
            # a recorded VM reads this with every counter snapshot
            for c, counts in self.gpu.counts.per_channel.items():
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
        return self.gpu.device_time_ns()

    def _channels_host_ns(self) -> int:
        chids = range(self.part.chid_base, self.part.chid_base + self.part.channels)
        return sum(self.gpu.pfifo.host_ns[c] for c in chids)

    def engine_host_ns(self) -> int:
        """Host time the device has spent running this vGPU's channels since it was
        created (pfifo.host_ns): in a server that serves every VM from one process,
        time no other VM's access is answered in."""
        return self._channels_host_ns() - self._engine_host_baseline

    # ------------------------------------------------------------------ PRAMIN
    def _pramin_addr(self, offset: int) -> int:
        """The guest VRAM address BAR0 `offset` in the PRAMIN window stands for now."""
        return (self.vregs["pramin_base"] << regs.PBUS_PRAMIN_BASE_SHIFT) + \
            offset - regs.PRAMIN_WINDOW

    def _pramin(self, offset: int, size: int, value: int | None) -> int:
        self.counts[_PRAMIN_COUNTS[value is not None]] += 1
        addr = self._pramin_addr(offset)
        if size != 4 or offset & 3 or not self.policy.guest_vram_ok(addr, 4):
            self.meter.count("trap.refused.pramin", 1)
            return 0xFFFFFFFF
        host = self.policy.host_vram(addr)
        if value is None:
            return self._vram.read_u32(host)
        with self.mediator_lock:
            self._vram.write_u32(host, value)
            self.shadowing.note_write(addr, 4)
            self.channels.reflect(addr)
        return 0

    # ------------------------------------------------------------------ BAR1 / BAR3
    def _bar_access(self, bar: int, offset: int, size: int, value: int | None) -> int:
        """A BAR1/BAR3 access outside the USERD poll area, mediator lock held: forwarded
        into the VM's arena of the physical BAR (or its page wherever it is now)."""
        if bar == regs.BAR1:
            window, arena = self.shadowing.window_in_use(bar), self.part.bar1_base
        elif bar == regs.BAR3:
            window, arena = self.shadowing.window_in_use(bar), self.part.bar3_base
        else:
            self.meter.count("trap.refused.bar", 1)
            return (1 << (8 * size)) - 1
        self.counts[_FORWARDED[bar][value is not None]] += 1
        page = offset >> 12
        if offset < 0 or page >= window.pages or (offset & 0xFFF) + size > 0x1000:
            self.meter.count(f"trap.refused.bar{bar}", 1)
            return (1 << (8 * size)) - 1
        if self.tenant is not None:
            host = window.host_pages.item(page)
            if host != NOT_VRAM:  # its page, wherever it is now (never the physical BAR)
                addr = host + (offset & 0xFFF)
                if value is None:
                    return self._vram.read_bytes(addr, size)
                self._vram.write_bytes(addr, size, value)
                guest = host - self.policy.vram_base + (offset & 0xFFF)
                self.shadowing.note_write(guest, size)  # (the incremental shadows' history)
                self.channels.reflect(guest)
                return 0
        if not window.mapped(page):
            self._bar_fault(bar, offset, value is not None)
            return (1 << (8 * size)) - 1
        if value is None:
            return self.gpu.mmio_read(bar, arena + offset, size)
        self.gpu.mmio_write(bar, arena + offset, size, value)
        host = window.host_pages.item(page)
        if host != NOT_VRAM:
            addr = host - self.policy.vram_base + (offset & 0xFFF)
            self.shadowing.note_write(addr, size)
            self.channels.reflect(addr)
        return 0

    def _bar_fault(self, bar: int, offset: int, write: bool) -> None:
        inst = layout.fault_inst_word(layout.barvm_inst(
            self.vregs["bar1_vm" if bar == regs.BAR1 else "bar3_vm"]))
        self.fault_state.bar_fault(bar, inst, offset, write)
        self.meter.count(f"vm.faults.bar{bar}", 1)

    # ------------------------------------------------------------------ lifecycle
    def teardown(self) -> None:
        self.channels.teardown()
        self.shadowing.teardown()
