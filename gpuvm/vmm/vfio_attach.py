"""Attaching a VFIO device to a guest, the way QEMU's vfio-pci does.

1. Device info: it must be a PCI device.  Config space: the vendor id must be NVIDIA's;
   memory decoding and bus mastering are switched on in the command register.
2. Region info: each BAR region becomes a guest-physical MMIO window whose accesses trap
   to `device.read/write(region, offset, ...)`; an I/O BAR (a PV vGPU's hypercall port)
   becomes the guest's hypercall port; sparse-mmap areas may be mapped straight into the
   guest -- the device grants and revokes pages inside them through the mapping listener,
   and the VMM turns each grant into a KVM memslot or an in-process page mapping.
3. DMA: the guest's RAM is mapped at iova = guest-physical (VFIO_IOMMU_MAP_DMA), so the
   device reaches exactly that memory.
4. Interrupts: an eventfd for the MSI vector; a guest waiting for the GPU sleeps on it.

After this the VMM holds an `AttachedDevice` and never learns whether it is a whole GPU
or a vGPU.
"""

from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import DeviceStats, RegionInfo, VfioDevice, VfioError
from gpuvm.vmm import abi
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.guest_ram import GuestRam

MEMORY_BARS = tuple(BAR_BASES)
WAIT_SLICE_S = 0.05  # a wait re-checks at least this often (events nobody signals)


class AttachError(UserError):
    """The device cannot be attached as it presents itself; one line."""


class MemslotListener:
    """A device's BAR-remap grants as guest mappings, only inside the region's sparse
    areas (what a VMM may mmap); `table` is the guest's MemslotTable (KVM or in-process)."""

    def __init__(self, table: Any, regions: dict[int, RegionInfo]) -> None:
        self.table = table
        table.device_maps = True
        self.areas = {i: r.sparse for i, r in regions.items() if r.mappable}
        self.sizes = {i: r.size for i, r in regions.items() if i in BAR_BASES}

    def _check(self, region: int, offset: int, size: int) -> None:
        if not any(a.offset <= offset and offset + size <= a.offset + a.size
                   for a in self.areas.get(region, ())):
            raise VfioError(f"region {region}: [{offset:#x}, {offset + size:#x}) is outside "
                            f"its sparse-mmap areas")

    def map(self, region: int, offset: int, host_address: int, size: int) -> None:
        self._check(region, offset, size)
        self.table.map(BAR_BASES[region] + offset, host_address, size, replace=True)

    def unmap(self, region: int, offset: int, size: int) -> None:
        self._check(region, offset, size)
        self.table.unmap(BAR_BASES[region] + offset, size)

    def post(self, region: int, offset: int, size: int, allowed: bool) -> None:
        if not (region in self.sizes and 0 <= offset and offset + size <= self.sizes[region]):
            raise VfioError(f"region {region}: [{offset:#x}, {offset + size:#x}) is not "
                            f"inside a memory BAR")
        self.table.post(BAR_BASES[region] + offset, size, allowed)

    def slots_in_use(self) -> int:
        return self.table.slots_in_use

    def count_direct(self, counter: Callable[[int, int, int], None]) -> bool:
        """The device's mapped pages stand for accesses the model counts: if the guest's
        VMM can count them (KVM: from the guest's own counts), `counter(bar, reads,
        writes)` hears of them and this is True; else False (map nothing then)."""
        if not getattr(self.table, "accepts_direct", False):
            return False
        self.table.direct_counter = counter
        return True


@dataclass
class AttachedDevice:
    """A VFIO device as one guest's VMM holds it."""

    device: VfioDevice
    stats: DeviceStats
    regions: dict[int, RegionInfo]
    bar_sizes: dict[int, int]  # memory BARs the guest sees (guest-physical windows)
    ports: dict[int, tuple[int, int]] = field(default_factory=dict)  # port -> (region, off)
    irq_fd: int = -1
    # held while irq_fd is written from another thread (`look_again`) or closed: a write
    # after the close would land in whatever file took the number
    _irq_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def connect_mappings(self, memslots: Any) -> None:
        """Give the device the guest's memslot table for its sparse areas (BAR remap)."""
        if any(r.mappable for r in self.regions.values()):
            self.device.set_mapping_listener(MemslotListener(memslots, self.regions))

    def port_write(self, port: int, value: int) -> bool:
        """A guest `out` that belongs to the device (its I/O BAR); False if none does."""
        target = self.ports.get(port)
        if target is None:
            return False
        self.device.write(target[0], target[1], 4, value)
        return True

    def wait_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Sleep on the device's interrupt until predicate() holds or timeout passes."""
        deadline = time.monotonic() + timeout
        poller = select.poll()
        poller.register(self.irq_fd, select.POLLIN)
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if poller.poll(1000 * min(remaining, WAIT_SLICE_S)):
                try:
                    os.eventfd_read(self.irq_fd)
                except BlockingIOError:
                    pass
        return True

    def look_again(self) -> None:
        """Make a `wait_event` look at its predicate now, as an interrupt would (from any
        thread; nothing once detached): something it waits for may have changed that
        raises no interrupt of this device."""
        with self._irq_lock:
            if self.irq_fd >= 0:
                os.eventfd_write(self.irq_fd, 1)

    def detach(self) -> None:
        """The guest is gone: no interrupts, no mappings, no DMA into its RAM."""
        try:
            self.device.set_irqs(vfio.VFIO_PCI_MSI_IRQ_INDEX, 0, [])
            self.device.set_mapping_listener(None)
            self.device.dma_unmap(0, 1 << 64)
        finally:
            with self._irq_lock:
                if self.irq_fd >= 0:
                    os.close(self.irq_fd)
                    self.irq_fd = -1


def attach(device: VfioDevice, stats: DeviceStats, ram: GuestRam, name: str) -> AttachedDevice:
    """Attach `device` to the guest whose RAM is `ram` (see the module docstring)."""
    info = device.get_info()
    if not info.flags & vfio.VFIO_DEVICE_FLAGS_PCI:
        raise AttachError(f"{name}: the device is not a vfio-pci device")
    regions = {i: device.get_region_info(i) for i in range(info.num_regions)}
    config = vfio.VFIO_PCI_CONFIG_REGION_INDEX
    vendor = device.read(config, regs.PCI_VENDOR_ID, 2)
    if vendor != regs.PCI_VENDOR_NVIDIA:
        raise AttachError(f"{name}: PCI vendor {vendor:#06x} is not NVIDIA's")
    command = device.read(config, regs.PCI_COMMAND, 2)
    device.write(config, regs.PCI_COMMAND, 2,
                 command | regs.PCI_COMMAND_MEMORY | regs.PCI_COMMAND_IO |
                 regs.PCI_COMMAND_MASTER)
    bar_sizes = {i: regions[i].size for i in MEMORY_BARS if regions[i].size}
    if regs.BAR0 not in bar_sizes:
        raise AttachError(f"{name}: the device has no BAR0 registers")
    ports = {}
    if regions[regs.BAR4].size:
        ports[abi.PORT_HYPERCALL] = (regs.BAR4, regs.BAR4_HYPERCALL)
    attached = AttachedDevice(device, stats, regions, bar_sizes, ports)
    device.dma_map(0, ram.array, vfio.VFIO_DMA_MAP_FLAG_READ | vfio.VFIO_DMA_MAP_FLAG_WRITE)
    attached.irq_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    device.set_irqs(vfio.VFIO_PCI_MSI_IRQ_INDEX, 0, [attached.irq_fd])
    return attached
