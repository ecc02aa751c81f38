"""A device double behind the VFIO interface, for tests of the VMM without a GPU model.

`BarRegisterDevice` answers the VFIO calls a VMM makes at attach time (device info, region
info for the BARs it is given, PCI config space, DMA map, IRQs) and hands every BAR access
to `on_read` / `on_write`, which tests override to record or inject."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, IrqTriggers, RegionInfo, absent_region,
                               bar_region_info)
from gpuvm.vfio.pci_config import PciConfig
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.vfio_attach import AttachedDevice, attach

_CONFIG = vfio.VFIO_PCI_CONFIG_REGION_INDEX


class BarRegisterDevice:
    def __init__(self, bar_sizes: dict[int, int]) -> None:
        self.bar_sizes = dict(bar_sizes)
        self.config = PciConfig(regs.PCI_DEVICE_QUADRO_6000,
                                {b: (s, False) for b, s in self.bar_sizes.items()})
        self.irqs = IrqTriggers({vfio.VFIO_PCI_MSI_IRQ_INDEX: 1})
        self.dma_maps: list[tuple[int, int]] = []

    # the BAR accesses a test sees
    def on_read(self, region: int, offset: int, size: int) -> int:
        return 0

    def on_write(self, region: int, offset: int, size: int, value: int) -> None:
        pass

    # VFIO
    def get_info(self) -> DeviceInfo:
        return DeviceInfo(vfio.VFIO_DEVICE_FLAGS_PCI, vfio.VFIO_PCI_NUM_REGIONS,
                          vfio.VFIO_PCI_NUM_IRQS)

    def get_region_info(self, index: int) -> RegionInfo:
        if index in self.bar_sizes:
            return bar_region_info(index, self.bar_sizes[index])
        if index == _CONFIG:
            return RegionInfo(index, regs.PCI_CONFIG_SIZE, vfio.VFIO_REGION_INFO_FLAG_READ |
                              vfio.VFIO_REGION_INFO_FLAG_WRITE)
        return absent_region(index)

    def read(self, region: int, offset: int, size: int) -> int:
        if region == _CONFIG:
            return self.config.read(offset, size)
        return self.on_read(region, offset, size)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if region == _CONFIG:
            self.config.write(offset, size, value)
        else:
            self.on_write(region, offset, size, value)

    def set_mapping_listener(self, listener) -> None:
        pass

    def dma_map(self, iova, memory, flags) -> None:
        self.dma_maps.append((iova, memory.size))

    def dma_unmap(self, iova, size) -> None:
        self.dma_maps.clear()

    def get_irq_info(self, index: int) -> IrqInfo:
        return self.irqs.info(index)

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        self.irqs.set(index, start, eventfds)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass

    # DeviceStats
    def faults(self) -> list:
        return []

    def counters(self) -> dict[str, int]:
        return {}

    def device_time_ns(self) -> int:
        return 0


def attached(device, ram: GuestRam, name: str = "vm0") -> AttachedDevice:
    """`device` attached to the guest with RAM `ram`, as the runner attaches one."""
    return attach(device, device, ram, name)


class MmioPort:
    """The host-side test driver's view of a VFIO device: mmio_read/mmio_write on its BAR
    regions (HostDriver talks to anything with those two calls)."""

    def __init__(self, device) -> None:
        self.mmio_read = device.read
        self.mmio_write = device.write
