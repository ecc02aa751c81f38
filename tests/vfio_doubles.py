"""Test helpers for the VMM's side of VFIO.

`BarRegisterDevice` is the register-file device (every VFIO call a VMM makes at attach
time answered) whose BAR accesses tests intercept by overriding `on_read`/`on_write`;
`attached` attaches a device as the run loop does; `MmioPort` gives the host-side test
driver (HostDriver, which speaks mmio_read/mmio_write) a VFIO device's BAR regions."""

from __future__ import annotations

from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.vfio_attach import AttachedDevice, attach


class BarRegisterDevice(RegisterFileDevice):
    def on_read(self, region: int, offset: int, size: int) -> int:
        return 0

    def on_write(self, region: int, offset: int, size: int, value: int) -> None:
        pass

    def bar_read(self, region: int, offset: int, size: int) -> int:
        return self.on_read(region, offset, size)

    def bar_write(self, region: int, offset: int, size: int, value: int) -> None:
        self.on_write(region, offset, size, value)

    def counters(self) -> dict[str, int]:
        return {}


def attached(device, ram: GuestRam, name: str = "vm0") -> AttachedDevice:
    """`device` attached to the guest with RAM `ram`, as the run loop attaches one."""
    return attach(device, device, ram, name)


class MmioPort:
    """The host-side test driver's view of a VFIO device: mmio_read/mmio_write on its BAR
    regions (HostDriver talks to anything with those two calls)."""

    def __init__(self, device) -> None:
        self.mmio_read = device.read
        self.mmio_write = device.write
