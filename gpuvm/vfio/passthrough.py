"""The whole emulated GPU as a VFIO device: native mode, as vfio-pci passes a card through.

BAR0's registers and BAR1 trap (the device has to see each access; BAR1 holds the
USERD doorbells).  BAR3 and BAR0's PRAMIN window are plain stores into VRAM once
translated, so where the VMM can count the guest's accesses through mapped pages
(`MemslotListener.count_direct`: native mode on KVM) they are mapped as memory, as
vfio-pci maps a real card's BARs: PRAMIN onto VRAM at its base, a BAR3 page once an
access through it has trapped, until BAR3's translations may change (a TLB flush, a new
BAR3 VM); elsewhere every access traps.  The configuration space is a real region; the VMM's DMA mappings are the GPU's
only way to system memory (its IOMMU table); the GPU's completion/fault events raise the
MSI vector's eventfd.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from gpuvm.device import regs
from gpuvm.device.clock import EventPrices, GuestParty
from gpuvm.device.dma import DmaMappings
from gpuvm.device.faults import ChannelFault
from gpuvm.device.gpu import Gpu
from gpuvm.vfio import abi
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, IrqTriggers, MappingListener, RegionInfo,
                               SparseArea, VfioError, bar_region_info, pci_device_info,
                               trapped_pci_region_info)
from gpuvm.vfio.pci_config import PciConfig

_CONFIG = abi.VFIO_PCI_CONFIG_REGION_INDEX


class PassthroughGpu:
    """A physical (emulated) GPU handed whole to one VM."""

    # whether BAR3 and PRAMIN are offered for mapping (sparse areas) at all: set before
    # the VM attaches, by whoever knows its VMM can count accesses through them
    apertures_as_memory = False

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.bar_sizes = {regs.BAR0: regs.BAR0_SIZE, regs.BAR1: gpu.profile.bar1_size,
                          regs.BAR3: gpu.profile.bar3_size}
        self.config = PciConfig(gpu.profile.pci_device,
                                {bar: (size, False) for bar, size in self.bar_sizes.items()})
        self.dma = DmaMappings()
        gpu.attach_sysram(self.dma)
        self.irqs = IrqTriggers({abi.VFIO_PCI_MSI_IRQ_INDEX: 1})
        gpu.event_listeners.append(self._interrupt)
        # virtual time: the VM's vCPU charged each bare-metal access at its price
        self.meter: GuestParty | None = None
        self._exit_ns: Mapping[int, int] = {}
        # The VMM's, where it counts accesses through mapped pages (native mode's
        # apertures as memory): BAR3 pages mapped so far, whether PRAMIN is
        self.listener: MappingListener | None = None
        self._mapped: set[int] = set()
        self._pramin_mapped = False
        gpu.bar3.on_forget.append(self._forget_pages)

    def use_meter(self, party: GuestParty, prices: EventPrices) -> None:
        """Charge each access the guest makes to `party` at `prices.exit_ns` (natively an
        exit stands for the bare-metal access: an uncached register access, a posted
        store through an aperture)."""
        self.meter, self._exit_ns = party, prices.exit_ns

    # ------------------------------------------------------------------ VfioDevice
    def get_info(self) -> DeviceInfo:
        return pci_device_info()

    def get_region_info(self, index: int) -> RegionInfo:
        if not self.apertures_as_memory:
            return trapped_pci_region_info(index, self.bar_sizes)
        if index == regs.BAR3:  # any page may be mapped once the guest has touched it
            size = self.bar_sizes[index]
            return bar_region_info(index, size, (SparseArea(0, size),))
        if index == regs.BAR0:  # the PRAMIN window, mapped onto VRAM at its base
            return bar_region_info(index, self.bar_sizes[index],
                                   (SparseArea(regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE),))
        return trapped_pci_region_info(index, self.bar_sizes)

    def read(self, region: int, offset: int, size: int) -> int:
        if region == _CONFIG:
            return self.config.read(offset, size)
        if self.meter is not None:
            self.meter.charge(self._exit_ns.get(region, 0))
        value = self.gpu.mmio_read(region, offset, size)
        if region == regs.BAR3 and self.listener is not None:
            self._map_page(offset)
        return value

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if self.meter is not None and region != _CONFIG:
            self.meter.charge(self._exit_ns.get(region, 0))
        if region == _CONFIG:
            self.config.write(offset, size, value)
            return
        self.gpu.mmio_write(region, offset, size, value)
        if self.listener is not None:
            if region == regs.BAR3:
                self._map_page(offset)
            elif region == regs.BAR0 and offset == regs.PBUS_PRAMIN_BASE:
                self._map_pramin()

    # ------------------------------------------------------------------ apertures as memory
    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """Map what the guest reaches through BAR3 and the PRAMIN window as memory --
        only where the VMM can count those accesses (they stand for the bare-metal
        accesses the model prices: `count_direct`); else every access traps."""
        if self.listener is not None:
            self._forget_pages()
            if self._pramin_mapped:
                self.listener.unmap(regs.BAR0, regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE)
                self._pramin_mapped = False
        self.listener = None
        count_direct = getattr(listener, "count_direct", None)
        if listener is not None and count_direct is not None and \
                count_direct(self.direct_accesses):
            self.listener = listener
            self._map_pramin()

    def direct_accesses(self, bar: int, reads: int, writes: int) -> None:
        """The guest's accesses through mapped pages, as the device counts and prices
        trapped ones: BAR0's are PRAMIN's (the only part of BAR0 mapped), BAR3's each
        took one translation of the BAR3 VM.  The VMM calls this once per access, each
        its own exit of the modelled system (after its tick), so the charge is one
        access's price."""
        if self.meter is not None:
            self.meter.charge(self._exit_ns.get(bar, 0) * (reads + writes))
        counts = self.gpu.counts.total
        if bar == regs.BAR0:
            counts["mmio.bar0.pramin.read"] += reads
            counts["mmio.bar0.pramin.write"] += writes
        elif bar == regs.BAR3:
            counts["mmio.bar3.read"] += reads
            counts["mmio.bar3.write"] += writes
            if self.gpu.bar3.reg & regs.PBUS_BARVM_ENABLE:
                counts["vm.translations"] += reads + writes

    def _map_page(self, offset: int) -> None:
        """Map the BAR3 page at `offset` if it lands in plain VRAM (the access that
        trapped has just translated it); it stays until BAR3's translations change."""
        page = offset >> 12
        if page in self._mapped:
            return
        with self.gpu.lock:
            frame = self.gpu.bar3.page_frame(page << 12)
        if frame is not None:
            assert self.listener is not None
            self.listener.map(regs.BAR3, page << 12, self.gpu.vram.host_address + frame,
                              0x1000)
            self._mapped.add(page)

    def _forget_pages(self) -> None:
        """BAR3's translations may change (a TLB flush, a new BAR3 VM): its pages trap
        again until touched."""
        if self._mapped and self.listener is not None:
            self.listener.unmap(regs.BAR3, 0, self.bar_sizes[regs.BAR3])
        self._mapped.clear()

    def _map_pramin(self) -> None:
        """The PRAMIN window onto VRAM at its base, where the whole window is VRAM."""
        assert self.listener is not None
        base = self.gpu.pbus.pramin_vram_base
        if self.gpu.vram.contains(base, regs.PRAMIN_WINDOW_SIZE):
            self.listener.map(regs.BAR0, regs.PRAMIN_WINDOW, self.gpu.vram.host_address + base,
                              regs.PRAMIN_WINDOW_SIZE)
            self._pramin_mapped = True
        elif self._pramin_mapped:
            self.listener.unmap(regs.BAR0, regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE)
            self._pramin_mapped = False

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        try:
            self.dma.map(iova, memory, writable=bool(flags & abi.VFIO_DMA_MAP_FLAG_WRITE))
        except ValueError as exc:
            raise VfioError(str(exc)) from None
        with self.gpu.lock:
            self.gpu.mmu.flush()

    def dma_unmap(self, iova: int, size: int) -> None:
        try:
            self.dma.unmap(iova, size)
        except ValueError as exc:
            raise VfioError(str(exc)) from None
        with self.gpu.lock:
            self.gpu.mmu.flush()

    def get_irq_info(self, index: int) -> IrqInfo:
        return self.irqs.info(index)

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        self.irqs.set(index, start, eventfds)

    def reset(self) -> None:
        """A function-level reset of an emulated card: not modelled beyond dropping the
        interrupt wiring; a fresh GPU per VM is how native mode starts clean."""
        self.irqs.clear()

    def close(self) -> None:
        self.irqs.clear()
        if self._forget_pages in self.gpu.bar3.on_forget:
            self.gpu.bar3.on_forget.remove(self._forget_pages)
        if self._interrupt in self.gpu.event_listeners:
            self.gpu.event_listeners.remove(self._interrupt)

    # ------------------------------------------------------------------ DeviceStats
    def counters(self) -> dict[str, int]:
        return self.gpu.counters()

    def faults(self) -> list[ChannelFault]:
        return self.gpu.faults()

    def device_time_ns(self) -> int:
        return self.gpu.device_time_ns()

    def _interrupt(self, chids: frozenset[int] | None = None) -> None:
        """The whole GPU is this VM's: every event on it is its own."""
        self.irqs.fire(abi.VFIO_PCI_MSI_IRQ_INDEX)
