"""Where a replay test runs its source's literal sequence: on the bare device (native) and
through a vGPU in each mediated mode, with one rig (a channel, buffers, a fence) set up the
same way on each.  A second VM runs beside the mediated one, so a test can check that a
VM's faults and interrupts stay its own."""

from __future__ import annotations

import os
import select
from dataclasses import dataclass, field
from typing import Callable

import pytest

from gpuvm.device import regs
from gpuvm.device.dma import RamPort
from gpuvm.device.gpu import Gpu
from gpuvm.device.host_driver import HostDriver
from gpuvm.mediator.mediator import Mediator
from gpuvm.vmm.guest_ram import GuestRam

from conftest import FAST_CLOCK, TEST_VRAM
from test_device_end_to_end import Rig
from test_mediator_isolation import Vm

REPLAY_MODES = ["native", "fv", "fv-opt", "pv"]


@dataclass
class Target:
    """One place to replay on: the driver's register port, its rig, and what the
    guest (or host) sees of faults and interrupts."""

    mode: str
    gpu: Gpu
    drv: HostDriver
    rig: Rig
    ram: GuestRam
    faults: Callable[[], list]
    wait: Callable[[Callable[[], bool], float], bool]
    irq_fd: int | None = None  # the VM's MSI eventfd (mediated modes)
    other: Vm | None = None  # a second VM beside this one (mediated modes)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def run(self, words: list[int], timeout: float = 10) -> bool:
        """Push words plus a fence; True when the fence landed, False on a new fault."""
        before = len(self.faults())
        seq = self.rig.run(words)
        self.wait(lambda: self.ram.read_u32(self.rig.fence) == seq or
                  len(self.faults()) > before, timeout)
        return self.ram.read_u32(self.rig.fence) == seq

    def interrupts(self) -> int:
        """MSIs the VM got since the last look (mediated modes)."""
        assert self.irq_fd is not None
        n = 0
        while select.select([self.irq_fd], [], [], 0)[0]:
            n += os.eventfd_read(self.irq_fd)
        return n


def make_target(mode: str) -> Target:
    if mode == "native":
        ram = GuestRam(32 * regs.MiB)
        gpu = Gpu(time_scale=FAST_CLOCK, vram_size=TEST_VRAM)
        gpu.attach_sysram(RamPort(ram.array))
        gpu.start()
        drv = HostDriver(gpu)
        drv.init()
        drv.setup_bar1(gpu.profile.bar1_size)
        rig = Rig(gpu, ram, drv, 0, sys_base=4 * regs.MiB, n=16)
        drv.submit_runlist([0])
        t = Target(mode, gpu, drv, rig, ram, gpu.faults, gpu.wait_event)
        t.closers = [gpu.release_memory, ram.close]
        return t
    gpu = Gpu(time_scale=FAST_CLOCK, vram_size=3 * 1024 * regs.MiB).start()
    med = Mediator(gpu)
    vm = Vm(med, "vm", mode)
    other = Vm(med, "other", "fv")
    t = Target(mode, gpu, vm.drv, vm.rig, vm.ram, vm.vgpu.faults, vm.attached.wait_event,
               vm.attached.irq_fd, other)
    t.closers = [med.close, gpu.release_memory]
    return t


@pytest.fixture(params=REPLAY_MODES)
def target(request):
    t = make_target(request.param)
    yield t
    for close in t.closers:
        close()
