"""The device interface of VFIO shape that everything GPU-facing implements.

A VMM attaches a gpuvm device the way QEMU's vfio-pci attaches a VFIO device: it asks for
the device info and each region's info, turns BAR regions into MMIO traps and their
sparse-mmap areas into guest mappings, DMA-maps the guest's RAM (the device reaches
system memory only through those mappings), and hands the device an eventfd per
interrupt.  The emulated physical GPU passed through whole (native mode) and each vGPU
(a mediated device) implement the same calls, so the VMM never knows which it holds.

Where gpuvm differs from the kernel ABI it says so here:
- `read`/`write` take and return integers of 1, 2, 4 or 8 bytes (what one trapped guest
  access carries) rather than byte buffers; the kernel client (`kernel.py`) adapts.
- A vGPU decides at run time which BAR pages are safe to map into the guest (BAR remap
  follows the guest's BAR page tables), so besides the static sparse-mmap capability it
  tells the VMM of grants and revocations through a `MappingListener`.  The kernel gets
  the same effect by zapping and re-faulting a region's mmap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np

from gpuvm.device import regs
from gpuvm.device.faults import ChannelFault
from gpuvm.vfio import abi


@dataclass(frozen=True)
class SparseArea:
    """A part of a region the VMM may map straight into the guest (no trap)."""

    offset: int
    size: int


@dataclass(frozen=True)
class RegionType:
    """The type capability of a device-specific region (VFIO_REGION_INFO_CAP_TYPE):
    a bus-wide type and a subtype within it, e.g. a vendor's (PCI_VENDOR_TYPE | vendor)."""

    type: int
    subtype: int


@dataclass(frozen=True)
class RegionInfo:
    """struct vfio_region_info, with the sparse-mmap and type capabilities decoded."""

    index: int
    size: int
    flags: int
    sparse: tuple[SparseArea, ...] = ()
    offset: int = 0  # where the region starts in the device fd (kernel/vfio-user)
    type: RegionType | None = None  # device-specific regions only

    @property
    def readable(self) -> bool:
        return bool(self.flags & abi.VFIO_REGION_INFO_FLAG_READ)

    @property
    def writable(self) -> bool:
        return bool(self.flags & abi.VFIO_REGION_INFO_FLAG_WRITE)

    @property
    def mappable(self) -> bool:
        return bool(self.flags & abi.VFIO_REGION_INFO_FLAG_MMAP)


@dataclass(frozen=True)
class IrqInfo:
    """struct vfio_irq_info."""

    index: int
    count: int
    flags: int


@dataclass(frozen=True)
class DeviceInfo:
    """struct vfio_device_info."""

    flags: int
    num_regions: int
    num_irqs: int


# a value's mask by its size in bytes (index), for a whole column of stores at once
VALUE_MASKS = np.array([(1 << 8 * n) - 1 for n in range(9)], dtype=np.uint64)


@dataclass(frozen=True)
class PostedStores:
    """Stores a VMM queued (KVM's coalesced ring) and hands a device at once, in the
    guest's order: each one trapped write of `sizes[i]` bytes (1, 2, 4 or 8) of
    `values[i]` (masked to its size) at `offsets[i]` of region `regions[i]`.

    Why columns: a drain is ~150 stores, nearly all in runs into one page; numpy does
    the per-store work (their windows, masks, where a run ends, the wire records) and
    Python only what each run needs."""

    regions: np.ndarray  # uint32
    offsets: np.ndarray  # uint64
    sizes: np.ndarray  # uint32
    values: np.ndarray  # uint64

    @classmethod
    def of(cls, stores: "list[tuple[int, int, int, int]]") -> "PostedStores":
        """From (region, offset, size, value) tuples (tests, the fuzzer)."""
        a = np.array(stores, dtype=np.uint64).reshape(-1, 4)
        sizes = a[:, 2].astype(np.uint32)
        return cls(a[:, 0].astype(np.uint32), a[:, 1].copy(), sizes,
                   a[:, 3] & VALUE_MASKS[np.minimum(sizes, 8)])

    def __len__(self) -> int:
        return len(self.offsets)

    def rows(self, start: int = 0, stop: int | None = None
             ) -> Iterator[tuple[int, int, int, int]]:
        """(region, offset, size, value) of stores start..stop as Python ints."""
        cut = slice(start, stop)
        return zip(self.regions[cut].tolist(), self.offsets[cut].tolist(),
                   self.sizes[cut].tolist(), self.values[cut].tolist())


class VfioError(Exception):
    """A request the device refuses (bad region, offset, DMA range, IRQ index); one line."""


class MappingListener(Protocol):
    """The VMM's side of run-time BAR remap: map `size` bytes of host memory at
    `host_address` into the guest at `offset` of BAR region `region`, or take it away."""

    def map(self, region: int, offset: int, host_address: int, size: int) -> None: ...

    def unmap(self, region: int, offset: int, size: int) -> None: ...

    def post(self, region: int, offset: int, size: int, allowed: bool) -> None:
        """Stores to [offset, offset+size) of `region` take effect only at a later trapped
        access: the VMM may queue them, in order, until the guest's next exit (allowed);
        or, from now on, each must reach the device before the guest goes on.  Said on
        the trap path of the access that changes it.  A VMM may ignore it (every store
        then reaches the device at once, which is always correct)."""
        ...


class VfioDevice(Protocol):
    """What a VMM may do with an attached device (see the module docstring)."""

    def get_info(self) -> DeviceInfo: ...

    def get_region_info(self, index: int) -> RegionInfo: ...

    def read(self, region: int, offset: int, size: int) -> int: ...

    def write(self, region: int, offset: int, size: int, value: int) -> None: ...

    # A device may also take posted stores (KVM's coalesced ring, drained) at once:
    # write_many(stores: PostedStores, exit_) -- in order, each one trapped write,
    # `exit_` (None, or the vCPU's exit on a virtual clock) called before each.  A
    # refused store raises VfioError with `done` set to the number of stores before it,
    # which took effect.  The VMM looks it up with getattr.

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """Where grants and revocations of sparse areas go (BAR remap)."""
        ...

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        """Let the device reach `memory` (uint8, host memory of the VM) at bus address
        `iova`; flags are VFIO_DMA_MAP_FLAG_READ/WRITE."""
        ...

    def dma_unmap(self, iova: int, size: int) -> None: ...

    def get_irq_info(self, index: int) -> IrqInfo: ...

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        """DATA_EVENTFD | ACTION_TRIGGER: signal eventfds[i] for vector start + i; an empty
        list (DATA_NONE) disables the index."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None:
        """The VMM lets go of the device (the device fd is closed)."""
        ...


class DeviceStats(Protocol):
    """What the lab observes of a device beside the VFIO interface: exact counts, the
    channel faults of this device's channels, and the device clock.  (A real VFIO device
    has no such call; the lab's instrumentation is kept apart from the ABI on purpose.)"""

    def counters(self) -> dict[str, int]: ...

    def faults(self) -> list[ChannelFault]: ...

    def device_time_ns(self) -> int: ...


# ------------------------------------------------------------------------------ helpers
def bar_region_info(index: int, size: int, sparse: tuple[SparseArea, ...] = ()) -> RegionInfo:
    """A BAR region: readable and writable, mmap-able where it has sparse areas."""
    flags = abi.VFIO_REGION_INFO_FLAG_READ | abi.VFIO_REGION_INFO_FLAG_WRITE
    if sparse:
        flags |= abi.VFIO_REGION_INFO_FLAG_MMAP | abi.VFIO_REGION_INFO_FLAG_CAPS
    return RegionInfo(index, size, flags, sparse)


def pci_device_info(reset: bool = True) -> DeviceInfo:
    """A vfio-pci device: nine regions (BAR0-5, ROM, config, VGA), five IRQ indices."""
    flags = abi.VFIO_DEVICE_FLAGS_PCI | (abi.VFIO_DEVICE_FLAGS_RESET if reset else 0)
    return DeviceInfo(flags, abi.VFIO_PCI_NUM_REGIONS, abi.VFIO_PCI_NUM_IRQS)


def config_region_info() -> RegionInfo:
    """PCI configuration space: 256 bytes, read and written (never mapped)."""
    return RegionInfo(abi.VFIO_PCI_CONFIG_REGION_INDEX, regs.PCI_CONFIG_SIZE,
                      abi.VFIO_REGION_INFO_FLAG_READ | abi.VFIO_REGION_INFO_FLAG_WRITE)


def trapped_pci_region_info(index: int, bar_sizes: dict[int, int]) -> RegionInfo:
    """Region info of a device whose BARs all trap (no sparse areas) and whose other
    regions are config space or absent; VfioError past the nine vfio-pci regions."""
    if index in bar_sizes:
        return bar_region_info(index, bar_sizes[index])
    if index == abi.VFIO_PCI_CONFIG_REGION_INDEX:
        return config_region_info()
    if 0 <= index < abi.VFIO_PCI_NUM_REGIONS:
        return absent_region(index)
    raise VfioError(f"no region {index} (a vfio-pci device has {abi.VFIO_PCI_NUM_REGIONS})")


def absent_region(index: int) -> RegionInfo:
    """A region index the device does not implement: size 0, no flags."""
    return RegionInfo(index, 0, 0)


class IrqTriggers:
    """The eventfds a device signals per IRQ index (VFIO_DEVICE_SET_IRQS bookkeeping)."""

    def __init__(self, counts: dict[int, int]) -> None:
        self.counts = counts  # vectors per index
        self._fds: dict[int, list[int]] = {}

    def info(self, index: int) -> IrqInfo:
        if index not in self.counts:
            return IrqInfo(index, 0, 0)
        return IrqInfo(index, self.counts[index],
                       abi.VFIO_IRQ_INFO_EVENTFD | abi.VFIO_IRQ_INFO_NORESIZE)

    def set(self, index: int, start: int, eventfds: list[int]) -> None:
        count = self.counts.get(index, 0)
        if not eventfds:
            self._fds.pop(index, None)
            return
        if start < 0 or start + len(eventfds) > count:
            raise VfioError(f"IRQ index {index} has {count} vectors; cannot set "
                            f"{len(eventfds)} from {start}")
        fds = self._fds.setdefault(index, [-1] * count)
        fds[start:start + len(eventfds)] = eventfds

    def fire(self, index: int, vector: int = 0) -> None:
        """Signal one vector's eventfd, if the VMM gave one."""
        fds = self._fds.get(index)
        if fds and fds[vector] >= 0:
            try:
                os.eventfd_write(fds[vector], 1)
            except OSError:
                pass  # the VMM closed its end: nobody listens any more

    def clear(self) -> None:
        self._fds.clear()

