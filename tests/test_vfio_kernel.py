"""The kernel VFIO client without a kernel VFIO: these machines have no /dev/vfio, so the
ioctl function is passed in.  `ScriptedKernel` plays the kernel's side from replies each
test writes, recording every (fd, request, argument bytes); the device, group and
container fds are real files in a temporary /dev/vfio, so open, pread/pwrite and mmap run
for real.  What needs a GPU bound to vfio-pci runs only where GPUVM_VFIO_DEVICE names one.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from gpuvm.errors import UserError
from gpuvm.vfio import abi, caps, kernel
from gpuvm.vfio.device import RegionInfo, RegionType, SparseArea, VfioError

ADDRESS = "0000:01:00.0"
GROUP = 42
PAGE = mmap.PAGESIZE
BAR1 = 1
BAR1_OFFSET = 4 * PAGE  # where the kernel says BAR1 starts in the device fd
BAR1_INFO = RegionInfo(BAR1, 4 * PAGE, 0xF, (SparseArea(PAGE, 2 * PAGE),), BAR1_OFFSET)
CONFIG_INFO = RegionInfo(abi.VFIO_PCI_CONFIG_REGION_INDEX, 256, 0x3, (), 0)


class ScriptedKernel:
    """The kernel's side of the ioctls, from replies a test sets per request number."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bytes | int]] = []
        self.replies: dict[int, Callable[[int, bytearray | int], int]] = {}

    def __call__(self, fd: int, request: int, arg: bytearray | int) -> int:
        self.calls.append((fd, request, bytes(arg) if isinstance(arg, bytearray) else arg))
        reply = self.replies.get(request)
        if reply is None:
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        return reply(fd, arg)

    def requests(self) -> list[int]:
        return [request for _, request, _ in self.calls]

    def args(self, request: int) -> list[bytes | int]:
        return [arg for _, r, arg in self.calls if r == request]


def write_struct(arg: bytearray, value: ctypes.Structure) -> None:
    arg[:ctypes.sizeof(value)] = bytes(value)


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A /dev/vfio, a /dev/iommu and a sysfs for one GPU in IOMMU group 42, bound to
    vfio-pci; the device fd is a file whose bytes the regions read and write."""
    dev = tmp_path / "dev" / "vfio"
    (dev / "devices").mkdir(parents=True)
    for name in ("vfio", str(GROUP)):
        (dev / name).write_bytes(b"")
    (tmp_path / "dev" / "iommu").write_bytes(b"")
    device_file = tmp_path / "device"
    device_file.write_bytes(bytes(range(256)) * (8 * PAGE // 256))
    os.symlink(device_file, dev / "devices" / "vfio0")  # the cdev is the device fd itself
    sysfs = tmp_path / "sys" / "bus" / "pci" / "devices"
    pci = sysfs / ADDRESS
    (pci / "vfio-dev" / "vfio0").mkdir(parents=True)
    os.symlink(f"../../../../kernel/iommu_groups/{GROUP}", pci / "iommu_group")
    os.symlink("../../../../bus/pci/drivers/vfio-pci", pci / "driver")
    return {"dev": dev, "iommu": tmp_path / "dev" / "iommu", "sysfs": sysfs,
            "device": device_file}


def group_kernel(host: dict[str, Path], viable: bool = True) -> ScriptedKernel:
    k = ScriptedKernel()
    k.replies[abi.VFIO_GET_API_VERSION] = lambda fd, arg: abi.VFIO_API_VERSION
    k.replies[abi.VFIO_CHECK_EXTENSION] = lambda fd, arg: int(arg == abi.VFIO_TYPE1v2_IOMMU)

    def status(fd: int, arg: bytearray) -> int:
        flags = abi.VFIO_GROUP_FLAGS_VIABLE if viable else 0
        write_struct(arg, abi.VfioGroupStatus(argsz=8, flags=flags))
        return 0

    k.replies[abi.VFIO_GROUP_GET_STATUS] = status
    k.replies[abi.VFIO_GROUP_SET_CONTAINER] = lambda fd, arg: 0
    k.replies[abi.VFIO_SET_IOMMU] = lambda fd, arg: 0
    k.replies[abi.VFIO_GROUP_GET_DEVICE_FD] = lambda fd, arg: os.open(host["device"],
                                                                       os.O_RDWR)
    add_device_replies(k)
    return k


def add_device_replies(k: ScriptedKernel) -> None:
    regions = {BAR1: BAR1_INFO, CONFIG_INFO.index: CONFIG_INFO}

    def device_info(fd: int, arg: bytearray) -> int:
        write_struct(arg, abi.VfioDeviceInfo(argsz=20, flags=abi.VFIO_DEVICE_FLAGS_PCI
                                             | abi.VFIO_DEVICE_FLAGS_RESET,
                                             num_regions=9, num_irqs=5))
        return 0

    def region_info(fd: int, arg: bytearray) -> int:
        asked = abi.VfioRegionInfo.from_buffer_copy(arg)
        info = regions.get(asked.index, RegionInfo(asked.index, 0, 0))
        reply = caps.encode_region_info(info, asked.argsz)
        arg[:len(reply)] = reply
        return 0

    def irq_info(fd: int, arg: bytearray) -> int:
        asked = abi.VfioIrqInfo.from_buffer_copy(arg)
        write_struct(arg, abi.VfioIrqInfo(argsz=16, flags=abi.VFIO_IRQ_INFO_EVENTFD,
                                          index=asked.index, count=1))
        return 0

    k.replies[abi.VFIO_DEVICE_GET_INFO] = device_info
    k.replies[abi.VFIO_DEVICE_GET_REGION_INFO] = region_info
    k.replies[abi.VFIO_DEVICE_GET_IRQ_INFO] = irq_info
    k.replies[abi.VFIO_DEVICE_SET_IRQS] = lambda fd, arg: 0
    k.replies[abi.VFIO_DEVICE_RESET] = lambda fd, arg: 0
    k.replies[abi.VFIO_IOMMU_MAP_DMA] = lambda fd, arg: 0

    def unmap(fd: int, arg: bytearray) -> int:
        return 0  # the size field, left as asked, is what the kernel unmapped

    k.replies[abi.VFIO_IOMMU_UNMAP_DMA] = unmap


def open_group(host: dict[str, Path], k: ScriptedKernel) -> kernel.KernelVfioDevice:
    return kernel.open_group_device(ADDRESS, dev_root=host["dev"], sysfs=host["sysfs"],
                                    ioctl=k)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ----------------------------------------------------------------- errors a user meets
def test_missing_dev_vfio_is_one_line_naming_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(kernel.VfioUnavailable) as err:
        kernel.open_group_device(ADDRESS, dev_root=tmp_path / "no-vfio")
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, UserError)
    assert f"no {tmp_path / 'no-vfio'}" in message and "modprobe vfio-pci" in message
    assert "gpuvm/vfio/README.md" in message


@pytest.mark.skipif(Path("/dev/vfio").exists(), reason="this host has /dev/vfio")
def test_this_host_without_vfio_says_so() -> None:
    with pytest.raises(kernel.VfioUnavailable, match="no /dev/vfio on this host"):
        kernel.open_kernel_device(ADDRESS)


def test_device_not_bound_to_vfio_pci_names_its_driver(host: dict[str, Path]) -> None:
    (host["dev"] / str(GROUP)).unlink()
    link = host["sysfs"] / ADDRESS / "driver"
    link.unlink()
    os.symlink("../../../../bus/pci/drivers/nvidia", link)
    before = open_fds()
    with pytest.raises(kernel.VfioUnavailable, match="bound to nvidia, not vfio-pci"):
        open_group(host, group_kernel(host))
    assert open_fds() == before


def test_no_iommu_group_asks_for_the_iommu(host: dict[str, Path]) -> None:
    (host["sysfs"] / ADDRESS / "iommu_group").unlink()
    with pytest.raises(kernel.VfioUnavailable, match="intel_iommu=on"):
        open_group(host, group_kernel(host))


def test_group_not_viable_names_the_group_and_closes_everything(host) -> None:
    before = open_fds()
    with pytest.raises(kernel.VfioUnavailable,
                       match=f"group {GROUP} is not viable.*iommu_groups/{GROUP}/devices"):
        open_group(host, group_kernel(host, viable=False))
    assert open_fds() == before


@pytest.mark.parametrize("text", ["01:00", "0000:01:00.8", "gpu0", ""])
def test_bad_pci_address_is_one_line(text: str) -> None:
    with pytest.raises(kernel.VfioUnavailable, match="is not a PCI address"):
        kernel.pci_address(text)


def test_short_pci_address_gains_the_domain() -> None:
    assert kernel.pci_address("01:00.0") == ADDRESS
    assert kernel.pci_address("0001:0A:1f.3") == "0001:0a:1f.3"


def test_failed_ioctl_names_the_ioctl_and_the_errno(host: dict[str, Path]) -> None:
    k = group_kernel(host)

    def refuse(fd: int, arg: bytearray) -> int:
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))

    k.replies[abi.VFIO_GROUP_GET_DEVICE_FD] = refuse
    with pytest.raises(VfioError, match=f"VFIO_GROUP_GET_DEVICE_FD on group {GROUP} "
                                        rf"\(device {ADDRESS}\) failed: Device or resource busy"):
        open_group(host, k)


def test_the_real_ioctl_on_a_non_vfio_fd_is_one_vfio_error() -> None:
    """system_ioctl is fcntl.ioctl: /dev/null refuses VFIO_GET_API_VERSION (ENOTTY)."""
    fd = os.open("/dev/null", os.O_RDWR)
    try:
        with pytest.raises(VfioError, match="VFIO_GET_API_VERSION on /dev/null failed"):
            kernel._call(kernel.system_ioctl, fd, abi.VFIO_GET_API_VERSION, 0, "/dev/null")
    finally:
        os.close(fd)


# ------------------------------------------------------------------- the group path
def test_group_path_issues_the_ioctls_in_the_kernels_order(host: dict[str, Path]) -> None:
    k = group_kernel(host)
    device = open_group(host, k)
    try:
        assert k.requests() == [abi.VFIO_GET_API_VERSION, abi.VFIO_CHECK_EXTENSION,
                                abi.VFIO_GROUP_GET_STATUS, abi.VFIO_GROUP_SET_CONTAINER,
                                abi.VFIO_SET_IOMMU, abi.VFIO_GROUP_GET_DEVICE_FD]
        container_fd = k.calls[0][0]
        group_fd = k.calls[2][0]
        assert k.args(abi.VFIO_CHECK_EXTENSION) == [abi.VFIO_TYPE1v2_IOMMU]
        assert k.args(abi.VFIO_GROUP_GET_STATUS) == [struct.pack("=II", 8, 0)]
        assert k.calls[3] == (group_fd, abi.VFIO_GROUP_SET_CONTAINER,
                              struct.pack("=i", container_fd))
        assert k.calls[4] == (container_fd, abi.VFIO_SET_IOMMU, abi.VFIO_TYPE1v2_IOMMU)
        assert k.calls[5] == (group_fd, abi.VFIO_GROUP_GET_DEVICE_FD, b"0000:01:00.0\0")
    finally:
        device.close()


def test_type1_v1_when_v2_is_missing(host: dict[str, Path]) -> None:
    k = group_kernel(host)
    k.replies[abi.VFIO_CHECK_EXTENSION] = lambda fd, arg: int(arg == abi.VFIO_TYPE1_IOMMU)
    device = open_group(host, k)
    device.close()
    assert k.args(abi.VFIO_SET_IOMMU) == [abi.VFIO_TYPE1_IOMMU]


def test_close_releases_device_group_and_container(host: dict[str, Path]) -> None:
    before = open_fds()
    device = open_group(host, group_kernel(host))
    assert open_fds() == before + 3
    device.close()
    device.close()
    assert open_fds() == before
    with pytest.raises(VfioError, match="is closed"):
        device.get_info()


# ---------------------------------------------------------------- device ioctls, bytes
@pytest.fixture
def device(host: dict[str, Path]):
    k = group_kernel(host)
    dev = open_group(host, k)
    k.calls.clear()
    yield dev, k
    dev.close()


def test_device_and_irq_info_marshalling(device) -> None:
    dev, k = device
    info = dev.get_info()
    assert (info.num_regions, info.num_irqs) == (9, 5)
    assert info.flags & abi.VFIO_DEVICE_FLAGS_PCI
    assert k.calls[0] == (dev.fd, abi.VFIO_DEVICE_GET_INFO, struct.pack("=5I", 20, 0, 0, 0, 0))
    irq = dev.get_irq_info(abi.VFIO_PCI_MSI_IRQ_INDEX)
    assert (irq.index, irq.count, irq.flags) == (1, 1, abi.VFIO_IRQ_INFO_EVENTFD)
    assert k.args(abi.VFIO_DEVICE_GET_IRQ_INFO) == [struct.pack("=4I", 16, 0, 1, 0)]


def test_region_info_takes_two_calls_when_it_has_capabilities(device) -> None:
    dev, k = device
    assert dev.get_region_info(BAR1) == BAR1_INFO
    needed = caps.required_argsz(caps.encode_region_info(BAR1_INFO, 32))
    asked = [abi.VfioRegionInfo.from_buffer_copy(a) for a in
             k.args(abi.VFIO_DEVICE_GET_REGION_INFO)]
    assert [(a.argsz, a.index) for a in asked] == [(32, BAR1), (needed, BAR1)]
    assert [len(a) for a in k.args(abi.VFIO_DEVICE_GET_REGION_INFO)] == [32, needed]
    k.calls.clear()
    assert dev.get_region_info(CONFIG_INFO.index) == CONFIG_INFO
    assert len(k.calls) == 1


def test_region_info_decodes_the_type_capability(device) -> None:
    dev, k = device
    vendor = RegionInfo(9, PAGE, 0xB, (), 9 << 40,  # READ | WRITE | CAPS
                        RegionType(abi.VFIO_REGION_TYPE_PCI_VENDOR_TYPE | 0x10DE, 1))

    def reply(fd: int, arg: bytearray) -> int:
        out = caps.encode_region_info(vendor, abi.VfioRegionInfo.from_buffer_copy(arg).argsz)
        arg[:len(out)] = out
        return 0

    k.replies[abi.VFIO_DEVICE_GET_REGION_INFO] = reply
    assert dev.get_region_info(9) == vendor


def test_read_and_write_go_to_the_region_offset_little_endian(device, host) -> None:
    dev, _ = device
    image = host["device"].read_bytes()
    for size in (1, 2, 4, 8):
        expect = int.from_bytes(image[BAR1_OFFSET + 0x10:BAR1_OFFSET + 0x10 + size], "little")
        assert dev.read(BAR1, 0x10, size) == expect
    dev.write(BAR1, 0x20, 4, 0x11223344)
    dev.write(BAR1, 0x28, 8, 0x0102030405060708)
    image = host["device"].read_bytes()
    assert image[BAR1_OFFSET + 0x20:BAR1_OFFSET + 0x24] == bytes([0x44, 0x33, 0x22, 0x11])
    assert image[BAR1_OFFSET + 0x28:BAR1_OFFSET + 0x30] == bytes(range(8, 0, -1))
    assert dev.read(BAR1, 0x20, 4) == 0x11223344
    assert dev.read(CONFIG_INFO.index, 0, 2) == 0x0100  # config region at fd offset 0


@pytest.mark.parametrize("call, fault", [
    (lambda d: d.read(BAR1, BAR1_INFO.size - 2, 4), "outside region 1"),
    (lambda d: d.read(BAR1, 0, 3), "only 1, 2, 4 or 8"),
    (lambda d: d.write(BAR1, 0, 2, 0x10000), "does not fit 2 bytes"),
    (lambda d: d.read(0, 0, 4), "region 0 of PCI device 0000:01:00.0 is not readable"),
])
def test_bad_region_access_is_one_vfio_error(device, call, fault: str) -> None:
    dev, _ = device
    with pytest.raises(VfioError, match=fault):
        call(dev)


class RecordingListener:
    def __init__(self) -> None:
        self.maps: list[tuple[int, int, int, int]] = []
        self.unmaps: list[tuple[int, int, int]] = []

    def map(self, region: int, offset: int, host_address: int, size: int) -> None:
        self.maps.append((region, offset, host_address, size))

    def unmap(self, region: int, offset: int, size: int) -> None:
        self.unmaps.append((region, offset, size))


def test_sparse_areas_are_mmapped_and_granted_to_the_listener(device, host) -> None:
    dev, _ = device
    listener = RecordingListener()
    dev.set_mapping_listener(listener)
    assert [(r, o, s) for r, o, _, s in listener.maps] == [(BAR1, PAGE, 2 * PAGE)]
    address = listener.maps[0][2]
    start = BAR1_OFFSET + PAGE
    assert ctypes.string_at(address, 64) == host["device"].read_bytes()[start:start + 64]
    ctypes.memmove(address + 8, b"\xAA\xBB", 2)  # a guest store through the mapping
    assert dev.read(BAR1, PAGE + 8, 2) == 0xBBAA
    dev.set_mapping_listener(None)
    assert listener.unmaps == [(BAR1, PAGE, 2 * PAGE)]


def page_aligned(pages: int) -> np.ndarray:
    return np.frombuffer(mmap.mmap(-1, pages * PAGE), dtype=np.uint8)


def test_dma_map_and_unmap_marshalling(device) -> None:
    dev, k = device
    memory = page_aligned(4)
    flags = abi.VFIO_DMA_MAP_FLAG_READ | abi.VFIO_DMA_MAP_FLAG_WRITE
    dev.dma_map(0x100000, memory, flags)
    container_fd = dev.dma.fd
    assert k.calls[-1] == (container_fd, abi.VFIO_IOMMU_MAP_DMA,
                           struct.pack("=IIQQQ", 32, flags, memory.ctypes.data, 0x100000,
                                       4 * PAGE))
    dev.dma_unmap(0x100000, 4 * PAGE)
    assert k.calls[-1] == (container_fd, abi.VFIO_IOMMU_UNMAP_DMA,
                           struct.pack("=IIQQ", 24, 0, 0x100000, 4 * PAGE))


def test_dma_unmap_that_takes_less_than_asked_is_an_error(device) -> None:
    dev, k = device

    def partial(fd: int, arg: bytearray) -> int:
        struct.pack_into("=Q", arg, 16, PAGE)
        return 0

    k.replies[abi.VFIO_IOMMU_UNMAP_DMA] = partial
    with pytest.raises(VfioError, match=f"took {PAGE:#x} bytes, not {2 * PAGE:#x}"):
        dev.dma_unmap(0, 2 * PAGE)


@pytest.mark.parametrize("iova, memory, fault", [
    (0x1001, lambda: page_aligned(1), "iova 0x1001 is not"),
    (0, lambda: page_aligned(2)[1:PAGE + 1], "host address"),
    (0, lambda: np.zeros(PAGE, dtype=np.uint32), "contiguous uint8"),
])
def test_dma_map_refuses_what_the_iommu_cannot_map(device, iova, memory, fault) -> None:
    dev, k = device
    with pytest.raises(VfioError, match=fault):
        dev.dma_map(iova, memory(), abi.VFIO_DMA_MAP_FLAG_READ)
    assert abi.VFIO_IOMMU_MAP_DMA not in k.requests()


def test_set_irqs_hands_eventfds_and_disables(device) -> None:
    dev, k = device
    fds = [os.eventfd(0), os.eventfd(0)]
    try:
        dev.set_irqs(abi.VFIO_PCI_MSIX_IRQ_INDEX, 3, fds)
    finally:
        for fd in fds:
            os.close(fd)
    trigger = abi.VFIO_IRQ_SET_ACTION_TRIGGER
    assert k.calls[-1] == (dev.fd, abi.VFIO_DEVICE_SET_IRQS,
                           struct.pack("=5I2i", 28, abi.VFIO_IRQ_SET_DATA_EVENTFD | trigger,
                                       2, 3, 2, *fds))
    dev.set_irqs(abi.VFIO_PCI_MSIX_IRQ_INDEX, 3, [])
    assert k.calls[-1] == (dev.fd, abi.VFIO_DEVICE_SET_IRQS,
                           struct.pack("=5I", 20, abi.VFIO_IRQ_SET_DATA_NONE | trigger,
                                       2, 0, 0))


def test_reset(device) -> None:
    dev, k = device
    dev.reset()
    assert k.calls == [(dev.fd, abi.VFIO_DEVICE_RESET, 0)]


# ----------------------------------------------------------------- the iommufd path
def test_cdev_path_binds_attaches_and_maps_through_the_ioas(host: dict[str, Path]) -> None:
    k = ScriptedKernel()
    add_device_replies(k)

    def alloc(fd: int, arg: bytearray) -> int:
        write_struct(arg, abi.IommuIoasAlloc(size=12, out_ioas_id=7))
        return 0

    def bind(fd: int, arg: bytearray) -> int:
        struct.pack_into("=I", arg, 12, 3)  # out_devid
        return 0

    k.replies[abi.IOMMU_IOAS_ALLOC] = alloc
    k.replies[abi.VFIO_DEVICE_BIND_IOMMUFD] = bind
    k.replies[abi.VFIO_DEVICE_ATTACH_IOMMUFD_PT] = lambda fd, arg: 0
    k.replies[abi.IOMMU_IOAS_MAP] = lambda fd, arg: 0
    k.replies[abi.IOMMU_IOAS_UNMAP] = lambda fd, arg: 0
    before = open_fds()
    dev = kernel.open_kernel_device(ADDRESS, dev_root=host["dev"], iommu=host["iommu"],
                                    sysfs=host["sysfs"], ioctl=k)
    try:
        iommufd = dev.dma.fd
        assert k.requests() == [abi.IOMMU_IOAS_ALLOC, abi.VFIO_DEVICE_BIND_IOMMUFD,
                                abi.VFIO_DEVICE_ATTACH_IOMMUFD_PT]
        assert k.calls[0] == (iommufd, abi.IOMMU_IOAS_ALLOC, struct.pack("=3I", 12, 0, 0))
        assert k.calls[1] == (dev.fd, abi.VFIO_DEVICE_BIND_IOMMUFD,
                              struct.pack("=IIiI", 16, 0, iommufd, 0))
        assert k.calls[2] == (dev.fd, abi.VFIO_DEVICE_ATTACH_IOMMUFD_PT,
                              struct.pack("=3I", 12, 0, 7))
        memory = page_aligned(1)
        dev.dma_map(0x2000, memory, abi.VFIO_DMA_MAP_FLAG_READ)
        assert k.calls[-1] == (iommufd, abi.IOMMU_IOAS_MAP, struct.pack(
            "=4I3Q", 40, abi.IOMMU_IOAS_MAP_FIXED_IOVA | abi.IOMMU_IOAS_MAP_READABLE, 7, 0,
            memory.ctypes.data, PAGE, 0x2000))
        dev.dma_unmap(0x2000, PAGE)
        assert k.calls[-1] == (iommufd, abi.IOMMU_IOAS_UNMAP,
                               struct.pack("=2I2Q", 24, 7, 0x2000, PAGE))
        assert dev.read(BAR1, 0, 1) == host["device"].read_bytes()[BAR1_OFFSET]
    finally:
        dev.close()
    assert open_fds() == before


def test_without_a_cdev_the_group_path_is_taken(host: dict[str, Path]) -> None:
    (host["sysfs"] / ADDRESS / "vfio-dev" / "vfio0").rmdir()
    k = group_kernel(host)
    dev = kernel.open_kernel_device(ADDRESS, dev_root=host["dev"], iommu=host["iommu"],
                                    sysfs=host["sysfs"], ioctl=k)
    dev.close()
    assert k.requests()[0] == abi.VFIO_GET_API_VERSION


# -------------------------------------------------------------- on a real vfio-pci GPU
REAL_DEVICE = os.environ.get("GPUVM_VFIO_DEVICE")


@pytest.mark.skipif(not Path("/dev/vfio").is_dir() or not REAL_DEVICE,
                    reason="needs a GPU bound to vfio-pci: /dev/vfio and GPUVM_VFIO_DEVICE="
                           "<PCI address> (this machine has no /dev/vfio)")
def test_real_device_config_space_and_regions() -> None:
    dev = kernel.open_kernel_device(REAL_DEVICE)
    try:
        info = dev.get_info()
        assert info.flags & abi.VFIO_DEVICE_FLAGS_PCI
        vendor = dev.read(abi.VFIO_PCI_CONFIG_REGION_INDEX, 0, 2)
        sysfs_vendor = (kernel.SYSFS_PCI_DEVICES / kernel.pci_address(REAL_DEVICE)
                        / "vendor").read_text()
        assert vendor == int(sysfs_vendor, 16)
        for index in range(info.num_regions):
            dev.get_region_info(index)
    finally:
        dev.close()
