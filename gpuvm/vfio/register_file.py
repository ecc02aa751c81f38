"""A PCI device whose BARs are plain register files: the floor of the trap path.

`gpuvm bench exits` measures a trapped store into it (a dict write and a count, nothing
behind) beside the same store into the emulated GPU and a vGPU; tests of the VMM use it
(overriding `bar_read`/`bar_write`) where no GPU model should be involved.  It answers
every VFIO call a VMM makes at attach time.
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs
from gpuvm.device.faults import ChannelFault
from gpuvm.vfio import abi
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, IrqTriggers, MappingListener, RegionInfo,
                               pci_device_info, trapped_pci_region_info)
from gpuvm.vfio.pci_config import PciConfig

_CONFIG = abi.VFIO_PCI_CONFIG_REGION_INDEX


class RegisterFileDevice:
    """A VFIO device whose BARs are plain register files: the floor of the trap path that
    `gpuvm bench exits` compares the GPU against, and a device for VMM tests with no GPU
    behind it."""

    def __init__(self, bar_sizes: dict[int, int]) -> None:
        self.bar_sizes = dict(bar_sizes)
        self.registers: dict[tuple[int, int], int] = {}
        self.reads = 0
        self.writes = 0
        self.dma_maps: list[tuple[int, int]] = []
        self.config = PciConfig(regs.PCI_DEVICE_QUADRO_6000,
                                {bar: (size, False) for bar, size in self.bar_sizes.items()})
        self.irqs = IrqTriggers({abi.VFIO_PCI_MSI_IRQ_INDEX: 1})

    # ------------------------------------------------------------------ the BARs
    def bar_read(self, region: int, offset: int, size: int) -> int:
        self.reads += 1
        return self.registers.get((region, offset), 0)

    def bar_write(self, region: int, offset: int, size: int, value: int) -> None:
        self.writes += 1
        self.registers[(region, offset)] = value

    # ------------------------------------------------------------------ VfioDevice
    def get_info(self) -> DeviceInfo:
        return pci_device_info()

    def get_region_info(self, index: int) -> RegionInfo:
        return trapped_pci_region_info(index, self.bar_sizes)

    def read(self, region: int, offset: int, size: int) -> int:
        if region == _CONFIG:
            return self.config.read(offset, size)
        return self.bar_read(region, offset, size)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if region == _CONFIG:
            self.config.write(offset, size, value)
        else:
            self.bar_write(region, offset, size, value)

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """No sparse areas: nothing is ever granted."""

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        self.dma_maps.append((iova, memory.size))  # a register file never DMAs

    def dma_unmap(self, iova: int, size: int) -> None:
        self.dma_maps = [(a, n) for a, n in self.dma_maps if not iova <= a < iova + size]

    def get_irq_info(self, index: int) -> IrqInfo:
        return self.irqs.info(index)

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        self.irqs.set(index, start, eventfds)

    def reset(self) -> None:
        self.registers.clear()

    def close(self) -> None:
        self.irqs.clear()

    # ------------------------------------------------------------------ DeviceStats
    def faults(self) -> list[ChannelFault]:
        return []

    def counters(self) -> dict[str, int]:
        return {"regs.reads": self.reads, "regs.writes": self.writes}

    def device_time_ns(self) -> int:
        return 0
