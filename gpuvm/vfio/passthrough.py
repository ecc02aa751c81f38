"""The whole emulated GPU as a VFIO device: native mode, as vfio-pci passes a card through.

Every BAR is a trapped region (the emulated device has to see each access: BAR1 and BAR3
are apertures through its own page tables, so nothing can be mapped straight into the
guest); the configuration space is a real region; the VMM's DMA mappings are the GPU's
only way to system memory (its IOMMU table); the GPU's completion/fault events raise the
MSI vector's eventfd.
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs
from gpuvm.device.clock import EventPrices, GuestParty
from gpuvm.device.dma import DmaMappings
from gpuvm.device.faults import ChannelFault
from gpuvm.device.gpu import Gpu
from gpuvm.vfio import abi
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, IrqTriggers, MappingListener, RegionInfo,
                               VfioError, pci_device_info, trapped_pci_region_info)
from gpuvm.vfio.pci_config import PciConfig

_CONFIG = abi.VFIO_PCI_CONFIG_REGION_INDEX


class PassthroughGpu:
    """A physical (emulated) GPU handed whole to one VM."""

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

    def use_meter(self, party: GuestParty, prices: EventPrices) -> None:
        """Charge each access the guest makes to `party` at `prices.exit_ns` (natively an
        exit stands for the bare-metal access: an uncached register access, a posted
        store through an aperture)."""
        self.meter, self._exit_ns = party, prices.exit_ns

    # ------------------------------------------------------------------ VfioDevice
    def get_info(self) -> DeviceInfo:
        return pci_device_info()

    def get_region_info(self, index: int) -> RegionInfo:
        return trapped_pci_region_info(index, self.bar_sizes)

    def read(self, region: int, offset: int, size: int) -> int:
        if region == _CONFIG:
            return self.config.read(offset, size)
        if self.meter is not None:
            self.meter.charge(self._exit_ns.get(region, 0))
        return self.gpu.mmio_read(region, offset, size)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if self.meter is not None and region != _CONFIG:
            self.meter.charge(self._exit_ns.get(region, 0))
        if region == _CONFIG:
            self.config.write(offset, size, value)
            return
        self.gpu.mmio_write(region, offset, size, value)

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """Nothing is ever mapped: every BAR access must reach the emulated device."""

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
