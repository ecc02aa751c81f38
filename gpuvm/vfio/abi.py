"""The VFIO user ABI: the constants, ioctl numbers and structures of linux/vfio.h (and of
linux/iommufd.h for the cdev path) that gpuvm's devices and its kernel client speak.

Values are the kernel's (include/uapi/linux/vfio.h); tests/test_vfio_abi.py compiles a C
program against the machine's own headers and checks every constant, ioctl number,
structure size and field offset here against it.
"""

from __future__ import annotations

import ctypes

# struct vfio_device_info.flags
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1

# struct vfio_region_info.flags
VFIO_REGION_INFO_FLAG_READ = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2
VFIO_REGION_INFO_FLAG_CAPS = 1 << 3

# region-info capability ids
VFIO_REGION_INFO_CAP_SPARSE_MMAP = 1
VFIO_REGION_INFO_CAP_TYPE = 2

# vfio-pci region indices
VFIO_PCI_BAR0_REGION_INDEX = 0
VFIO_PCI_BAR1_REGION_INDEX = 1
VFIO_PCI_BAR2_REGION_INDEX = 2
VFIO_PCI_BAR3_REGION_INDEX = 3
VFIO_PCI_BAR4_REGION_INDEX = 4
VFIO_PCI_BAR5_REGION_INDEX = 5
VFIO_PCI_ROM_REGION_INDEX = 6
VFIO_PCI_CONFIG_REGION_INDEX = 7
VFIO_PCI_VGA_REGION_INDEX = 8
VFIO_PCI_NUM_REGIONS = 9

# vfio-pci IRQ indices
VFIO_PCI_INTX_IRQ_INDEX = 0
VFIO_PCI_MSI_IRQ_INDEX = 1
VFIO_PCI_MSIX_IRQ_INDEX = 2
VFIO_PCI_ERR_IRQ_INDEX = 3
VFIO_PCI_REQ_IRQ_INDEX = 4
VFIO_PCI_NUM_IRQS = 5

# struct vfio_irq_info.flags
VFIO_IRQ_INFO_EVENTFD = 1 << 0
VFIO_IRQ_INFO_MASKABLE = 1 << 1
VFIO_IRQ_INFO_AUTOMASKED = 1 << 2
VFIO_IRQ_INFO_NORESIZE = 1 << 3

# struct vfio_irq_set.flags
VFIO_IRQ_SET_DATA_NONE = 1 << 0
VFIO_IRQ_SET_DATA_BOOL = 1 << 1
VFIO_IRQ_SET_DATA_EVENTFD = 1 << 2
VFIO_IRQ_SET_ACTION_MASK = 1 << 3
VFIO_IRQ_SET_ACTION_UNMASK = 1 << 4
VFIO_IRQ_SET_ACTION_TRIGGER = 1 << 5

# struct vfio_iommu_type1_dma_map.flags
VFIO_DMA_MAP_FLAG_READ = 1 << 0
VFIO_DMA_MAP_FLAG_WRITE = 1 << 1

# ------------------------------------------------------------------ API and IOMMU types
VFIO_API_VERSION = 0
VFIO_TYPE1_IOMMU = 1
VFIO_TYPE1v2_IOMMU = 3

# struct vfio_group_status.flags
VFIO_GROUP_FLAGS_VIABLE = 1 << 0
VFIO_GROUP_FLAGS_CONTAINER_SET = 1 << 1

# struct vfio_device_info.flags: the device info itself may carry a capability chain
VFIO_DEVICE_FLAGS_CAPS = 1 << 7

# struct vfio_region_info_cap_type.type: the vendor-specific type space of vfio-pci
VFIO_REGION_TYPE_PCI_VENDOR_TYPE = 1 << 31
VFIO_REGION_TYPE_PCI_VENDOR_MASK = 0xFFFF

# struct vfio_iommu_type1_info.flags
VFIO_IOMMU_INFO_PGSIZES = 1 << 0
VFIO_IOMMU_INFO_CAPS = 1 << 1

# ------------------------------------------------------------------------ ioctl numbers
# The VFIO ioctls carry no size or direction in their number (the structures grow and
# announce their size in argsz instead), so each one is _IO(';', 100 + n).
_IOC_NRSHIFT, _IOC_TYPESHIFT = 0, 8
VFIO_TYPE = ord(";")
VFIO_BASE = 100


def _io(type_: int, nr: int) -> int:
    """Linux's _IO(type, nr): no data direction, size 0."""
    return (type_ << _IOC_TYPESHIFT) | (nr << _IOC_NRSHIFT)


# on the container (/dev/vfio/vfio)
VFIO_GET_API_VERSION = _io(VFIO_TYPE, VFIO_BASE + 0)
VFIO_CHECK_EXTENSION = _io(VFIO_TYPE, VFIO_BASE + 1)
VFIO_SET_IOMMU = _io(VFIO_TYPE, VFIO_BASE + 2)
# on a group (/dev/vfio/<group>)
VFIO_GROUP_GET_STATUS = _io(VFIO_TYPE, VFIO_BASE + 3)
VFIO_GROUP_SET_CONTAINER = _io(VFIO_TYPE, VFIO_BASE + 4)
VFIO_GROUP_UNSET_CONTAINER = _io(VFIO_TYPE, VFIO_BASE + 5)
VFIO_GROUP_GET_DEVICE_FD = _io(VFIO_TYPE, VFIO_BASE + 6)
# on a device fd
VFIO_DEVICE_GET_INFO = _io(VFIO_TYPE, VFIO_BASE + 7)
VFIO_DEVICE_GET_REGION_INFO = _io(VFIO_TYPE, VFIO_BASE + 8)
VFIO_DEVICE_GET_IRQ_INFO = _io(VFIO_TYPE, VFIO_BASE + 9)
VFIO_DEVICE_SET_IRQS = _io(VFIO_TYPE, VFIO_BASE + 10)
VFIO_DEVICE_RESET = _io(VFIO_TYPE, VFIO_BASE + 11)
# on the container once a type1 IOMMU is set (n = 12 is reused by the device's
# GET_PCI_HOT_RESET_INFO: the two live on different fds)
VFIO_IOMMU_GET_INFO = _io(VFIO_TYPE, VFIO_BASE + 12)
VFIO_IOMMU_MAP_DMA = _io(VFIO_TYPE, VFIO_BASE + 13)
VFIO_IOMMU_UNMAP_DMA = _io(VFIO_TYPE, VFIO_BASE + 14)

# The iommufd path (a device cdev /dev/vfio/devices/vfioX bound to /dev/iommu) came with
# kernel 6.6's linux/vfio.h and 6.2's linux/iommufd.h; Debian 12's linux-libc-dev (6.1)
# has neither, so the ABI test checks these only where the machine's headers define them.
VFIO_DEVICE_BIND_IOMMUFD = _io(VFIO_TYPE, VFIO_BASE + 18)
VFIO_DEVICE_ATTACH_IOMMUFD_PT = _io(VFIO_TYPE, VFIO_BASE + 19)
VFIO_DEVICE_DETACH_IOMMUFD_PT = _io(VFIO_TYPE, VFIO_BASE + 20)

IOMMUFD_TYPE = ord(";")
IOMMU_DESTROY = _io(IOMMUFD_TYPE, 0x80)
IOMMU_IOAS_ALLOC = _io(IOMMUFD_TYPE, 0x81)
IOMMU_IOAS_MAP = _io(IOMMUFD_TYPE, 0x85)
IOMMU_IOAS_UNMAP = _io(IOMMUFD_TYPE, 0x86)
# enum iommufd_ioas_map_flags
IOMMU_IOAS_MAP_FIXED_IOVA = 1 << 0
IOMMU_IOAS_MAP_WRITEABLE = 1 << 1
IOMMU_IOAS_MAP_READABLE = 1 << 2

# --------------------------------------------------------------------------- structures
# Field names are the kernel's, so the ABI test can check every offset by name.  A
# structure ending in a flexible array (`areas[]`, `data[]`) names it in `_flexible_`; its
# offset is the structure's size.
_u8, _u16, _u32, _s32, _u64 = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32,
                              ctypes.c_int32, ctypes.c_uint64)


class VfioInfoCapHeader(ctypes.Structure):
    """One link of an INFO ioctl's capability chain; `next` is an offset from the start
    of the info buffer (0 ends the chain)."""

    _fields_ = [("id", _u16), ("version", _u16), ("next", _u32)]


class VfioGroupStatus(ctypes.Structure):
    """struct vfio_group_status (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32)]


class VfioDeviceInfo(ctypes.Structure):
    """struct vfio_device_info (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("num_regions", _u32),
                ("num_irqs", _u32), ("cap_offset", _u32)]


class VfioRegionInfo(ctypes.Structure):
    """struct vfio_region_info (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("cap_offset", _u32),
                ("size", _u64), ("offset", _u64)]


class VfioRegionSparseMmapArea(ctypes.Structure):
    """struct vfio_region_sparse_mmap_area (linux/vfio.h)."""

    _fields_ = [("offset", _u64), ("size", _u64)]


class VfioRegionInfoCapSparseMmap(ctypes.Structure):
    """struct vfio_region_info_cap_sparse_mmap (linux/vfio.h)."""

    _fields_ = [("header", VfioInfoCapHeader), ("nr_areas", _u32), ("reserved", _u32)]
    _flexible_ = ("areas", VfioRegionSparseMmapArea)


class VfioRegionInfoCapType(ctypes.Structure):
    """struct vfio_region_info_cap_type (linux/vfio.h)."""

    _fields_ = [("header", VfioInfoCapHeader), ("type", _u32), ("subtype", _u32)]


class VfioIrqInfo(ctypes.Structure):
    """struct vfio_irq_info (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("count", _u32)]


class VfioIrqSet(ctypes.Structure):
    """The header of VFIO_DEVICE_SET_IRQS; `count` items of data (an s32 eventfd each
    with DATA_EVENTFD) follow it, and argsz covers them."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("start", _u32),
                ("count", _u32)]
    _flexible_ = ("data", _u8)


class VfioIommuType1Info(ctypes.Structure):
    """struct vfio_iommu_type1_info (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("iova_pgsizes", _u64),
                ("cap_offset", _u32)]


class VfioIommuType1DmaMap(ctypes.Structure):
    """struct vfio_iommu_type1_dma_map (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("vaddr", _u64), ("iova", _u64),
                ("size", _u64)]


class VfioIommuType1DmaUnmap(ctypes.Structure):
    """struct vfio_iommu_type1_dma_unmap (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("iova", _u64), ("size", _u64)]
    _flexible_ = ("data", _u8)


class VfioDeviceBindIommufd(ctypes.Structure):
    """struct vfio_device_bind_iommufd (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("iommufd", _s32), ("out_devid", _u32)]


class VfioDeviceAttachIommufdPt(ctypes.Structure):
    """struct vfio_device_attach_iommufd_pt (linux/vfio.h)."""

    _fields_ = [("argsz", _u32), ("flags", _u32), ("pt_id", _u32)]


class IommuIoasAlloc(ctypes.Structure):
    """struct iommu_ioas_alloc (linux/iommufd.h)."""

    _fields_ = [("size", _u32), ("flags", _u32), ("out_ioas_id", _u32)]


class IommuIoasMap(ctypes.Structure):
    """struct iommu_ioas_map (linux/iommufd.h)."""

    _fields_ = [("size", _u32), ("flags", _u32), ("ioas_id", _u32), ("__reserved", _u32),
                ("user_va", _u64), ("length", _u64), ("iova", _u64)]


class IommuIoasUnmap(ctypes.Structure):
    """struct iommu_ioas_unmap (linux/iommufd.h)."""

    _fields_ = [("size", _u32), ("ioas_id", _u32), ("iova", _u64), ("length", _u64)]


class IommuDestroy(ctypes.Structure):
    """struct iommu_destroy (linux/iommufd.h)."""

    _fields_ = [("size", _u32), ("id", _u32)]


# The C name of every structure above, for the ABI test and for error messages.
C_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "vfio_info_cap_header": VfioInfoCapHeader,
    "vfio_group_status": VfioGroupStatus,
    "vfio_device_info": VfioDeviceInfo,
    "vfio_region_info": VfioRegionInfo,
    "vfio_region_sparse_mmap_area": VfioRegionSparseMmapArea,
    "vfio_region_info_cap_sparse_mmap": VfioRegionInfoCapSparseMmap,
    "vfio_region_info_cap_type": VfioRegionInfoCapType,
    "vfio_irq_info": VfioIrqInfo,
    "vfio_irq_set": VfioIrqSet,
    "vfio_iommu_type1_info": VfioIommuType1Info,
    "vfio_iommu_type1_dma_map": VfioIommuType1DmaMap,
    "vfio_iommu_type1_dma_unmap": VfioIommuType1DmaUnmap,
    "vfio_device_bind_iommufd": VfioDeviceBindIommufd,
    "vfio_device_attach_iommufd_pt": VfioDeviceAttachIommufdPt,
    "iommu_ioas_alloc": IommuIoasAlloc,
    "iommu_ioas_map": IommuIoasMap,
    "iommu_ioas_unmap": IommuIoasUnmap,
    "iommu_destroy": IommuDestroy,
}
