"""What a VMM backend delivers a guest's GPU accesses to.

In native mode that is the emulated device itself; in the virtualized modes it is the
VM's vGPU in the mediator.  Both backends (KVM, in-process) speak only this interface, so
the path of one guest access is the same whichever way the guest runs.
"""

from __future__ import annotations

from typing import Callable, Protocol

from gpuvm.device.faults import ChannelFault

__all__ = ["ChannelFault", "GpuTarget"]


class GpuTarget(Protocol):
    def mmio_read(self, bar: int, offset: int, size: int) -> int: ...

    def mmio_write(self, bar: int, offset: int, size: int, value: int) -> None: ...

    def wait_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until predicate() holds (re-checked whenever the GPU signals this VM)."""
        ...

    def faults(self) -> list[ChannelFault]:
        """Faults of this VM's channels so far."""
        ...

    def counters(self) -> dict[str, int]:
        """This VM's exact event counts so far (flat names, e.g. 'mmio.bar0.write')."""
        ...

    def device_time_ns(self) -> int: ...
