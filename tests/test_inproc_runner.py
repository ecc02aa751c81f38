"""The in-process backend: private globals per guest, callbacks counted as exits, a
failing callback ends only its guest, stop() lands in C, BAR remap skips the callback."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestSession, boot_params_for
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.inproc.runner import InprocRunner
from gpuvm.vfio.passthrough import PassthroughGpu
from vfio_doubles import attached

VRAM = 384 * regs.MiB


@pytest.fixture(scope="module")
def library():
    return guest_programs.build_all(["driver"], kinds=("shared",))["driver"].shared


class Guest:
    """One native guest on its own GPU, assembled by hand (no gpuvm.run)."""

    def __init__(self, library, bench: str, params: list[int], target=None,
                 wait_timeout: float = 2.0) -> None:
        self.gpu = Gpu(vram_size=VRAM).start()
        self.ram = GuestRam(64 * regs.MiB)
        self.device = (target or PassthroughGpu)(self.gpu)
        self.attached = attached(self.device, self.ram)
        self.bar_sizes = self.attached.bar_sizes
        self.session = GuestSession(bench, self.ram, self.attached, wait_timeout=wait_timeout)
        boot_params_for(self.ram, bench, params, 0, BAR_BASES, self.bar_sizes)
        self.runner = InprocRunner("vm0", library, self.ram, self.session, self.bar_sizes)

    def run(self, timeout: float = 60.0):
        self.runner.start()
        try:
            return self.runner.join(timeout)
        finally:
            self.gpu.release_memory()


def test_two_guests_at_once_have_their_own_driver_state(library):
    a, b = Guest(library, "mmul", [48]), Guest(library, "madd", [40])
    a.runner.start()
    b.runner.start()
    outs = [a.runner.join(60), b.runner.join(60)]
    for g in (a, b):
        g.gpu.release_memory()
    assert all(o.passed for o in outs), [o.describe_failure() for o in outs]
    assert a.session.results[0]["bench"] == "mmul" and b.session.results[0]["bench"] == "madd"


def test_every_callback_is_an_exit_with_the_kvm_names(library):
    g = Guest(library, "vecadd", [2048])
    out = g.run()
    assert out.passed and out.backend == "inproc"
    total = {}
    for p in g.session.phases:
        for k, v in p.counters.items():
            total[k] = total.get(k, 0) + v
    exits = {k for k in total if k.startswith("exits.")}
    assert exits <= {"exits.io", *(f"exits.mmio.bar{b}.{d}" for b in (0, 1, 3)
                                   for d in ("read", "write"))}
    # natively every BAR callback reaches the device, and every port write is an exit
    assert total["exits.mmio.bar3.write"] == total["mmio.bar3.write"]
    assert total["exits.mmio.bar1.write"] == total["mmio.bar1.write"]
    assert total["exits.io"] == sum(v for k, v in total.items() if k.startswith("port."))


class FailingGpu(PassthroughGpu):
    """The GPU, except that the 50th BAR0 write raises (a VMM bug in the middle of Init)."""

    left = 50

    def write(self, region, offset, size, value):
        if region == 0:
            self.left -= 1
            if self.left == 0:
                raise RuntimeError("injected VMM failure")
        super().write(region, offset, size, value)


def test_an_exception_in_a_callback_ends_only_that_guest(library):
    g = Guest(library, "mmul", [32], target=FailingGpu)
    out = g.run()
    assert not out.passed
    assert out.failure == "VMM error: RuntimeError: injected VMM failure"
    assert g.session.exit_code is None  # it never reached its own exit
    # nothing was called after the failure: the abort flag stopped the guest at once
    bar0_writes = sum(p.counters.get("exits.mmio.bar0.write", 0) for p in g.session.phases)
    assert bar0_writes == 50
    # and the process is fine: the next guest runs normally
    assert Guest(library, "idle", []).run().passed


def test_stop_lands_the_guest_and_reports_the_reason(library):
    g = Guest(library, "loop", [30 * 10**9])  # a 30 s kernel
    out = g.run(timeout=0.5)
    assert out.failure == "timed out after 0.5 s"
    assert not g.runner.alive()


def test_remapped_bar_pages_are_plain_memory_not_exits(library):
    """BAR1 page 0x80000 (where the probe maps its target) backed straight by the VRAM
    page it names: the guest reads the right bytes without a single BAR1 read exit."""
    target = 0x1000000
    g = Guest(library, "probe", [2, target, 16])
    g.gpu.vram.u8[target:target + 16] = np.arange(16, dtype=np.uint8) + 0x40
    host = g.gpu.vram.u8[target:].ctypes.data
    g.runner.memslots.map(BAR_BASES[1] + 0x80000, host, 0x1000)
    out = g.run()
    assert out.passed
    rec = g.session.results[0]
    assert rec["data"] == bytes(range(0x40, 0x50)).hex() and rec["wrote"] == "1"
    launch = next(p for p in g.session.phases if p.name == "Launch")
    assert launch.counters.get("exits.mmio.bar1.read", 0) == 0
    assert launch.counters.get("exits.mmio.bar1.write", 0) == 0


def test_unmapping_makes_pages_trap_again(library):
    g = Guest(library, "probe", [2, 0x1000000, 16])
    host = g.gpu.vram.u8.ctypes.data
    g.runner.memslots.map(BAR_BASES[1] + 0x80000, host, 0x2000)
    g.runner.memslots.unmap(BAR_BASES[1] + 0x80000, 0x2000)
    out = g.run()
    assert out.passed
    launch = next(p for p in g.session.phases if p.name == "Launch")
    assert launch.counters["exits.mmio.bar1.read"] == 4  # 16 bytes, 32-bit loads


def test_missing_boot_parameters_fail_cleanly(library):
    g = Guest(library, "idle", [])
    g.ram.write(abi.GUEST_BOOT_PARAMS, bytes(8))  # wipe the magic
    out = g.run()
    assert not out.passed and "no boot parameters" in out.failure
