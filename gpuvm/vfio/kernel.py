"""The host kernel's VFIO, from Python: a real GPU bound to vfio-pci, reached the way
QEMU reaches it, and offered to gpuvm's VMM as a `VfioDevice` like any emulated one.

Two ways in (gpuvm/vfio/README.md says how to prepare either):
- container/group: /dev/vfio/vfio (the container: API version, the type1 IOMMU, DMA
  maps) and /dev/vfio/<group> (the device's IOMMU group, which must be viable: every
  device in it bound to vfio-pci or to no driver), then the device fd by PCI address;
- iommufd cdev: /dev/vfio/devices/vfioX bound to /dev/iommu, attached to an IO address
  space that holds the DMA maps (kernel 6.6's ABI; Debian 12's 6.1 headers predate it,
  so abi.py carries its numbers and the ABI test checks them where the headers have
  them).

Every ioctl goes through one function passed in (`ioctl(fd, request, arg)`, arg an int
or a bytearray the kernel may write into, like fcntl.ioctl with mutate); the tests pass
one that records the argument bytes and writes crafted replies, since these machines
have no /dev/vfio.  Region access is pread/pwrite on the device fd at the region's
offset as the kernel reports it (never computed), and sparse areas are mmap'ed from the
same fd.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from gpuvm.errors import UserError
from gpuvm.vfio import abi, caps
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, MappingListener, RegionInfo,
                               SparseArea, VfioError)

Ioctl = Callable[[int, int, "bytearray | int"], int]

DEV_VFIO = Path("/dev/vfio")
DEV_IOMMU = Path("/dev/iommu")
SYSFS_PCI_DEVICES = Path("/sys/bus/pci/devices")
PAGE_SIZE = mmap.PAGESIZE
HOW_TO_BIND = "gpuvm/vfio/README.md says how to bind a GPU to vfio-pci"


def system_ioctl(fd: int, request: int, arg: bytearray | int) -> int:
    """The real ioctl(2); a bytearray argument is passed by pointer and written back."""
    if isinstance(arg, bytearray):
        return fcntl.ioctl(fd, request, arg, True)
    return fcntl.ioctl(fd, request, arg)


class VfioUnavailable(VfioError, UserError):
    """No usable VFIO device for what the user named: no module, no binding, no IOMMU
    group, no permission, or not a PCI address.  One line, saying what to do."""


def require_dev_root(dev_root: Path = DEV_VFIO) -> None:
    if not dev_root.is_dir():
        raise VfioUnavailable(f"no {dev_root} on this host: the vfio-pci module is not "
                              f"loaded (modprobe vfio-pci); {HOW_TO_BIND}")


_IOCTL_NAMES = {value: name for name, value in vars(abi).items()
                if isinstance(value, int) and name.startswith(("VFIO_", "IOMMU_"))
                and (value >> 8) == abi.VFIO_TYPE and name not in ("VFIO_TYPE",)}


def _call(ioctl: Ioctl, fd: int, request: int, arg: bytearray | int, what: str) -> int:
    try:
        return ioctl(fd, request, arg)
    except OSError as err:
        name = _IOCTL_NAMES.get(request, hex(request))
        raise VfioError(f"{name} on {what} failed: {os.strerror(err.errno or 0)}") from None


def _open(path: Path, what: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise VfioUnavailable(f"no {path} ({what}) on this host; {HOW_TO_BIND}") from None
    except PermissionError:
        raise VfioUnavailable(f"{path}: permission denied; give your user the file "
                              f"(chown) or run as root; {HOW_TO_BIND}") from None
    except OSError as err:
        raise VfioUnavailable(f"cannot open {path} ({what}): {err.strerror}") from None


# ------------------------------------------------------------------------------- sysfs
_PCI_ADDRESS = re.compile(r"(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")


def pci_address(text: str) -> str:
    """The full domain:bus:device.function form sysfs uses ("01:00.0" gets "0000:")."""
    match = _PCI_ADDRESS.fullmatch(text.strip().lower())
    if match is None:
        raise VfioUnavailable(f"{text!r} is not a PCI address (expected like 0000:01:00.0)")
    domain, bus, device, function = match.groups()
    return f"{domain or '0000'}:{bus}:{device}.{function}"


def _sysfs_device(address: str, sysfs: Path) -> Path:
    path = sysfs / pci_address(address)
    if not path.exists():
        raise VfioUnavailable(f"no PCI device {pci_address(address)} under {sysfs}")
    return path


def _link_name(path: Path) -> str | None:
    return Path(os.readlink(path)).name if os.path.islink(path) else None


def bound_driver(address: str, sysfs: Path = SYSFS_PCI_DEVICES) -> str | None:
    """The driver a PCI device is bound to now, or None."""
    return _link_name(_sysfs_device(address, sysfs) / "driver")


def iommu_group_of(address: str, sysfs: Path = SYSFS_PCI_DEVICES) -> int:
    """The IOMMU group of a PCI device: the number its sysfs `iommu_group` link names."""
    name = _link_name(_sysfs_device(address, sysfs) / "iommu_group")
    if name is None:
        raise VfioUnavailable(f"PCI device {pci_address(address)} has no IOMMU group: turn "
                              "the IOMMU on (intel_iommu=on or amd_iommu=on on the kernel "
                              "command line)")
    return int(name)


def vfio_cdev_of(address: str, sysfs: Path = SYSFS_PCI_DEVICES) -> str | None:
    """The device's vfio cdev name (vfioX under /dev/vfio/devices), if the kernel made one."""
    cdevs = _sysfs_device(address, sysfs) / "vfio-dev"
    names = sorted(p.name for p in cdevs.iterdir()) if cdevs.is_dir() else []
    return names[0] if names else None


# ------------------------------------------------------------------------- DMA spaces
class DmaSpace(Protocol):
    """Where a device's DMA mappings live: a type1 container or an iommufd IOAS."""

    def map(self, vaddr: int, iova: int, size: int, flags: int) -> None: ...

    def unmap(self, iova: int, size: int) -> None: ...

    def close(self) -> None: ...


class Type1Container:
    """/dev/vfio/vfio with the type1 IOMMU: the groups' shared DMA address space."""

    def __init__(self, fd: int, ioctl: Ioctl) -> None:
        self.fd, self.ioctl = fd, ioctl
        self.iommu_type = 0

    @classmethod
    def open(cls, dev_root: Path = DEV_VFIO, ioctl: Ioctl = system_ioctl) -> Type1Container:
        require_dev_root(dev_root)
        container = cls(_open(dev_root / "vfio", "the VFIO container"), ioctl)
        try:
            version = _call(ioctl, container.fd, abi.VFIO_GET_API_VERSION, 0, "the container")
            if version != abi.VFIO_API_VERSION:
                raise VfioError(f"VFIO API version {version}; gpuvm speaks "
                                f"{abi.VFIO_API_VERSION}")
            for iommu in (abi.VFIO_TYPE1v2_IOMMU, abi.VFIO_TYPE1_IOMMU):
                if container.check_extension(iommu):
                    container.iommu_type = iommu
                    break
            else:
                raise VfioError("the VFIO container offers no type1 IOMMU")
        except BaseException:
            container.close()
            raise
        return container

    def check_extension(self, extension: int) -> bool:
        return _call(self.ioctl, self.fd, abi.VFIO_CHECK_EXTENSION, extension,
                     "the container") > 0

    def set_iommu(self) -> None:
        """Once the first group is in the container."""
        _call(self.ioctl, self.fd, abi.VFIO_SET_IOMMU, self.iommu_type, "the container")

    def map(self, vaddr: int, iova: int, size: int, flags: int) -> None:
        arg = abi.VfioIommuType1DmaMap(argsz=ctypes.sizeof(abi.VfioIommuType1DmaMap),
                                       flags=flags, vaddr=vaddr, iova=iova, size=size)
        _call(self.ioctl, self.fd, abi.VFIO_IOMMU_MAP_DMA, bytearray(arg),
              f"the container (iova {iova:#x}, {size:#x} bytes)")

    def unmap(self, iova: int, size: int) -> None:
        arg = abi.VfioIommuType1DmaUnmap(argsz=ctypes.sizeof(abi.VfioIommuType1DmaUnmap),
                                         iova=iova, size=size)
        buf = bytearray(arg)
        _call(self.ioctl, self.fd, abi.VFIO_IOMMU_UNMAP_DMA, buf,
              f"the container (iova {iova:#x})")
        unmapped = abi.VfioIommuType1DmaUnmap.from_buffer(buf).size
        if unmapped != size:
            raise VfioError(f"DMA unmap of iova {iova:#x} took {unmapped:#x} bytes, "
                            f"not {size:#x}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class VfioGroup:
    """/dev/vfio/<group>: the unit of isolation the device belongs to."""

    def __init__(self, fd: int, number: int, ioctl: Ioctl) -> None:
        self.fd, self.number, self.ioctl = fd, number, ioctl

    @classmethod
    def open(cls, number: int, dev_root: Path = DEV_VFIO,
             ioctl: Ioctl = system_ioctl) -> VfioGroup:
        group = cls(_open(dev_root / str(number), f"IOMMU group {number}"), number, ioctl)
        try:
            flags = group.status()
            if not flags & abi.VFIO_GROUP_FLAGS_VIABLE:
                raise VfioUnavailable(
                    f"IOMMU group {number} is not viable: bind every device in "
                    f"/sys/kernel/iommu_groups/{number}/devices to vfio-pci (or unbind it)")
        except BaseException:
            group.close()
            raise
        return group

    def status(self) -> int:
        buf = bytearray(abi.VfioGroupStatus(argsz=ctypes.sizeof(abi.VfioGroupStatus)))
        _call(self.ioctl, self.fd, abi.VFIO_GROUP_GET_STATUS, buf, f"group {self.number}")
        return abi.VfioGroupStatus.from_buffer(buf).flags

    def set_container(self, container: Type1Container) -> None:
        _call(self.ioctl, self.fd, abi.VFIO_GROUP_SET_CONTAINER,
              bytearray(struct.pack("=i", container.fd)), f"group {self.number}")

    def device_fd(self, address: str) -> int:
        name = bytearray(pci_address(address).encode() + b"\0")
        return _call(self.ioctl, self.fd, abi.VFIO_GROUP_GET_DEVICE_FD, name,
                     f"group {self.number} (device {pci_address(address)})")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class IommufdIoas:
    """/dev/iommu with one IO address space: the iommufd path's DMA maps."""

    def __init__(self, fd: int, ioas_id: int, ioctl: Ioctl) -> None:
        self.fd, self.ioas_id, self.ioctl = fd, ioas_id, ioctl

    @classmethod
    def open(cls, path: Path = DEV_IOMMU, ioctl: Ioctl = system_ioctl) -> IommufdIoas:
        fd = _open(path, "iommufd")
        try:
            buf = bytearray(abi.IommuIoasAlloc(size=ctypes.sizeof(abi.IommuIoasAlloc)))
            _call(ioctl, fd, abi.IOMMU_IOAS_ALLOC, buf, "iommufd")
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, abi.IommuIoasAlloc.from_buffer(buf).out_ioas_id, ioctl)

    def map(self, vaddr: int, iova: int, size: int, flags: int) -> None:
        ioas_flags = abi.IOMMU_IOAS_MAP_FIXED_IOVA
        if flags & abi.VFIO_DMA_MAP_FLAG_READ:
            ioas_flags |= abi.IOMMU_IOAS_MAP_READABLE
        if flags & abi.VFIO_DMA_MAP_FLAG_WRITE:
            ioas_flags |= abi.IOMMU_IOAS_MAP_WRITEABLE
        arg = abi.IommuIoasMap(size=ctypes.sizeof(abi.IommuIoasMap), flags=ioas_flags,
                               ioas_id=self.ioas_id, user_va=vaddr, length=size, iova=iova)
        _call(self.ioctl, self.fd, abi.IOMMU_IOAS_MAP, bytearray(arg),
              f"IOAS {self.ioas_id} (iova {iova:#x}, {size:#x} bytes)")

    def unmap(self, iova: int, size: int) -> None:
        arg = abi.IommuIoasUnmap(size=ctypes.sizeof(abi.IommuIoasUnmap),
                                 ioas_id=self.ioas_id, iova=iova, length=size)
        _call(self.ioctl, self.fd, abi.IOMMU_IOAS_UNMAP, bytearray(arg),
              f"IOAS {self.ioas_id} (iova {iova:#x})")

    def bind(self, device_fd: int) -> int:
        """Bind a vfio cdev to this iommufd and attach it to the IOAS; its device id."""
        bind = abi.VfioDeviceBindIommufd(argsz=ctypes.sizeof(abi.VfioDeviceBindIommufd),
                                         iommufd=self.fd)
        buf = bytearray(bind)
        _call(self.ioctl, device_fd, abi.VFIO_DEVICE_BIND_IOMMUFD, buf, "the vfio cdev")
        attach = abi.VfioDeviceAttachIommufdPt(
            argsz=ctypes.sizeof(abi.VfioDeviceAttachIommufdPt), pt_id=self.ioas_id)
        _call(self.ioctl, device_fd, abi.VFIO_DEVICE_ATTACH_IOMMUFD_PT, bytearray(attach),
              "the vfio cdev")
        return abi.VfioDeviceBindIommufd.from_buffer(buf).out_devid

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ------------------------------------------------------------------------------- mmap
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_shared(fd: int, offset: int, size: int) -> int:
    """mmap(2) of `size` bytes of `fd` at `offset`, read/write, shared; the host address."""
    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED,
                         fd, offset)
    if address in (None, _MAP_FAILED):
        raise VfioError(f"mmap of {size:#x} bytes at device offset {offset:#x} failed: "
                        f"{os.strerror(ctypes.get_errno())}")
    return address


def unmap(address: int, size: int) -> None:
    _libc.munmap(address, size)


# ----------------------------------------------------------------------------- device
@dataclass
class _Mapped:
    region: int
    area: SparseArea
    address: int


@dataclass
class KernelVfioDevice:
    """A device fd from the kernel, as a gpuvm `VfioDevice`.  `owned` are closed after
    the device fd (its group and container, or its iommufd)."""

    fd: int
    dma: DmaSpace | None
    ioctl: Ioctl = system_ioctl
    owned: list = field(default_factory=list)
    name: str = "the device"
    _regions: dict[int, RegionInfo] = field(default_factory=dict)
    _mapped: list[_Mapped] = field(default_factory=list)
    _listener: MappingListener | None = None
    _dma_pins: dict[int, np.ndarray] = field(default_factory=dict)

    def _ioctl(self, request: int, arg: bytearray | int) -> int:
        if self.fd < 0:
            raise VfioError(f"{self.name} is closed")
        return _call(self.ioctl, self.fd, request, arg, self.name)

    # ----------------------------------------------------------------------- info
    def get_info(self) -> DeviceInfo:
        buf = bytearray(abi.VfioDeviceInfo(argsz=ctypes.sizeof(abi.VfioDeviceInfo)))
        self._ioctl(abi.VFIO_DEVICE_GET_INFO, buf)
        info = abi.VfioDeviceInfo.from_buffer(buf)
        return DeviceInfo(info.flags, info.num_regions, info.num_irqs)

    def _region_info_call(self, index: int, argsz: int) -> bytes:
        buf = bytearray(argsz)
        buf[:caps.REGION_INFO_SIZE] = bytes(abi.VfioRegionInfo(argsz=argsz, index=index))
        self._ioctl(abi.VFIO_DEVICE_GET_REGION_INFO, buf)
        return bytes(buf)

    def get_region_info(self, index: int) -> RegionInfo:
        """Two calls when the region has capabilities: the first learns the argsz the
        chain needs, the second fetches it."""
        reply = self._region_info_call(index, caps.REGION_INFO_SIZE)
        needed = caps.required_argsz(reply)
        if needed > caps.REGION_INFO_SIZE:
            reply = self._region_info_call(index, needed)
        info = caps.decode_region_info(reply)
        self._regions[index] = info
        return info

    def _region(self, index: int) -> RegionInfo:
        return self._regions.get(index) or self.get_region_info(index)

    def get_irq_info(self, index: int) -> IrqInfo:
        buf = bytearray(abi.VfioIrqInfo(argsz=ctypes.sizeof(abi.VfioIrqInfo), index=index))
        self._ioctl(abi.VFIO_DEVICE_GET_IRQ_INFO, buf)
        info = abi.VfioIrqInfo.from_buffer(buf)
        return IrqInfo(info.index, info.count, info.flags)

    # ---------------------------------------------------------------- region access
    def _check_access(self, region: int, offset: int, size: int,
                      allowed: Callable[[RegionInfo], bool], verb: str) -> RegionInfo:
        if size not in (1, 2, 4, 8):
            raise VfioError(f"{verb} of {size} bytes: only 1, 2, 4 or 8")
        info = self._region(region)
        if not allowed(info):
            raise VfioError(f"region {region} of {self.name} is not {verb}able")
        if offset < 0 or offset + size > info.size:
            raise VfioError(f"{verb} at {offset:#x}+{size} is outside region {region} "
                            f"({info.size:#x} bytes)")
        return info

    def read(self, region: int, offset: int, size: int) -> int:
        info = self._check_access(region, offset, size, lambda i: i.readable, "read")
        data = os.pread(self.fd, size, info.offset + offset)
        if len(data) != size:
            raise VfioError(f"read at {offset:#x} of region {region} returned "
                            f"{len(data)} of {size} bytes")
        return int.from_bytes(data, "little")

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        info = self._check_access(region, offset, size, lambda i: i.writable, "write")
        if not 0 <= value < 1 << (8 * size):
            raise VfioError(f"value {value:#x} does not fit {size} bytes")
        written = os.pwrite(self.fd, value.to_bytes(size, "little"), info.offset + offset)
        if written != size:
            raise VfioError(f"write at {offset:#x} of region {region} took {written} of "
                            f"{size} bytes")

    # -------------------------------------------------------------------- mmap
    def mappable_areas(self, region: int) -> tuple[SparseArea, ...]:
        """The parts of a region the VMM may map: its sparse areas, or the whole region
        when it is mmap-able without a sparse-mmap capability."""
        info = self._region(region)
        if not info.mappable or info.size == 0:
            return ()
        areas = info.sparse or (SparseArea(0, info.size),)
        return tuple(a for a in areas if a.size)

    def mmap_area(self, region: int, area: SparseArea) -> int:
        """Map one area of a region from the device fd; the host address."""
        info = self._region(region)
        where = info.offset + area.offset
        if where % PAGE_SIZE or area.size % PAGE_SIZE:
            raise VfioError(f"area {area.offset:#x}+{area.size:#x} of region {region} is "
                            "not page aligned")
        address = map_shared(self.fd, where, area.size)
        self._mapped.append(_Mapped(region, area, address))
        return address

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """A kernel device's mappable areas are fixed: they are all granted to the new
        listener at once (and revoked from the old one)."""
        for mapped in self._mapped:
            if self._listener is not None:
                self._listener.unmap(mapped.region, mapped.area.offset, mapped.area.size)
            unmap(mapped.address, mapped.area.size)
        self._mapped.clear()
        self._listener = listener
        if listener is None:
            return
        for region in range(self.get_info().num_regions):
            for area in self.mappable_areas(region):
                address = self.mmap_area(region, area)
                listener.map(region, area.offset, address, area.size)

    # --------------------------------------------------------------------- DMA
    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        if self.dma is None:
            raise VfioError(f"{self.name} has no IOMMU to map DMA through")
        if memory.dtype != np.uint8 or not memory.flags["C_CONTIGUOUS"]:
            raise VfioError("DMA memory must be one contiguous uint8 array")
        vaddr, size = memory.ctypes.data, memory.nbytes
        for what, value in (("host address", vaddr), ("iova", iova), ("size", size)):
            if value % PAGE_SIZE:
                raise VfioError(f"DMA map at iova {iova:#x}: {what} {value:#x} is not "
                                f"{PAGE_SIZE}-byte aligned")
        self.dma.map(vaddr, iova, size, flags)
        self._dma_pins[iova] = memory  # the kernel pins its pages; keep the array alive

    def dma_unmap(self, iova: int, size: int) -> None:
        if self.dma is None:
            raise VfioError(f"{self.name} has no IOMMU to map DMA through")
        self.dma.unmap(iova, size)
        for start in [s for s in self._dma_pins if iova <= s < iova + size]:
            del self._dma_pins[start]

    # --------------------------------------------------------------------- IRQs
    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        count = len(eventfds)
        flags = abi.VFIO_IRQ_SET_ACTION_TRIGGER | (
            abi.VFIO_IRQ_SET_DATA_EVENTFD if count else abi.VFIO_IRQ_SET_DATA_NONE)
        header = abi.VfioIrqSet(argsz=ctypes.sizeof(abi.VfioIrqSet) + 4 * count,
                                flags=flags, index=index, start=start if count else 0,
                                count=count)
        self._ioctl(abi.VFIO_DEVICE_SET_IRQS,
                    bytearray(bytes(header) + struct.pack(f"={count}i", *eventfds)))

    def reset(self) -> None:
        self._ioctl(abi.VFIO_DEVICE_RESET, 0)

    def close(self) -> None:
        if self.fd < 0:
            return
        self.set_mapping_listener(None)
        os.close(self.fd)
        self.fd = -1
        for resource in self.owned:
            resource.close()
        self.owned.clear()
        self._dma_pins.clear()


# ----------------------------------------------------------------------------- opening
def open_group_device(address: str, *, dev_root: Path = DEV_VFIO,
                      sysfs: Path = SYSFS_PCI_DEVICES,
                      ioctl: Ioctl = system_ioctl) -> KernelVfioDevice:
    """The container/group path: container, group (viable), type1 IOMMU, device fd."""
    require_dev_root(dev_root)
    address = pci_address(address)
    number = iommu_group_of(address, sysfs)
    container = Type1Container.open(dev_root, ioctl)
    owned: list = [container]
    try:
        if not (dev_root / str(number)).exists():
            driver = bound_driver(address, sysfs)
            raise VfioUnavailable(
                f"no {dev_root / str(number)}: PCI device {address} (IOMMU group {number}) "
                f"is bound to {driver or 'no driver'}, not vfio-pci; {HOW_TO_BIND}")
        group = VfioGroup.open(number, dev_root, ioctl)
        owned.insert(0, group)
        group.set_container(container)
        container.set_iommu()
        fd = group.device_fd(address)
    except BaseException:
        for resource in owned:
            resource.close()
        raise
    return KernelVfioDevice(fd, container, ioctl, owned, f"PCI device {address}")


def open_cdev_device(address: str, *, dev_root: Path = DEV_VFIO,
                     iommu: Path = DEV_IOMMU, sysfs: Path = SYSFS_PCI_DEVICES,
                     ioctl: Ioctl = system_ioctl) -> KernelVfioDevice:
    """The iommufd path: /dev/vfio/devices/vfioX bound to /dev/iommu, attached to a
    fresh IO address space."""
    require_dev_root(dev_root)
    address = pci_address(address)
    cdev = vfio_cdev_of(address, sysfs)
    if cdev is None:
        raise VfioUnavailable(f"PCI device {address} has no vfio cdev (a kernel with "
                              f"CONFIG_VFIO_DEVICE_CDEV and the device bound to vfio-pci "
                              f"make one); {HOW_TO_BIND}")
    ioas = IommufdIoas.open(iommu, ioctl)
    try:
        fd = _open(dev_root / "devices" / cdev, f"vfio cdev of {address}")
    except BaseException:
        ioas.close()
        raise
    try:
        ioas.bind(fd)
    except BaseException:
        os.close(fd)
        ioas.close()
        raise
    return KernelVfioDevice(fd, ioas, ioctl, [ioas], f"PCI device {address}")


def open_kernel_device(address: str, *, dev_root: Path = DEV_VFIO,
                       iommu: Path = DEV_IOMMU, sysfs: Path = SYSFS_PCI_DEVICES,
                       ioctl: Ioctl = system_ioctl) -> KernelVfioDevice:
    """The iommufd cdev where the host offers one, else the container/group path."""
    if iommu.exists() and vfio_cdev_of(address, sysfs) is not None:
        return open_cdev_device(address, dev_root=dev_root, iommu=iommu, sysfs=sysfs,
                                ioctl=ioctl)
    return open_group_device(address, dev_root=dev_root, sysfs=sysfs, ioctl=ioctl)
