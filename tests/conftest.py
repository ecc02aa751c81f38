"""Shared fixtures: a small emulated GPU with a guest-RAM-backed sysram port."""

from __future__ import annotations

import os

import pytest

from gpuvm.device import regs
from gpuvm.device.dma import RamPort
from gpuvm.device.gpu import Gpu
from gpuvm.mediator import monitor
from gpuvm.vmm.guest_ram import GuestRam

# The reference monitor judges every physical access of every mediator the suite makes.
monitor.enable()

# Guest RAM allocated as the guest touches it, not up front (the default for users,
# gpuvm.vmm.guest_ram): populating 256 MiB takes 0.1 s a VM on 2 cores, 50 s of the suite
# (833 s up front, 784 s on demand, 2026-11-26).  Contents are zero either way; the tests
# of the up-front path name it.
os.environ.setdefault("GPUVM_RAM_ALLOC", "ondemand")

TEST_VRAM = 384 * regs.MiB  # six partitions of 64 MiB: small, still a whole Quadro layout
FAST_CLOCK = 1000.0  # device time runs 1000x wall time: modelled ms pass in µs


@pytest.fixture
def sysram():
    ram = GuestRam(32 * regs.MiB)
    yield ram
    ram.close()


@pytest.fixture
def gpu(sysram):
    g = Gpu(time_scale=FAST_CLOCK, vram_size=TEST_VRAM)
    g.attach_sysram(RamPort(sysram.array))
    g.start()
    yield g
    g.release_memory()


@pytest.fixture(autouse=True)
def no_escapes():
    """Fail any test during which a device access left its owner's memory."""
    monitor.take()
    yield
    escapes = monitor.take()
    assert not escapes, "reference monitor: " + "; ".join(str(e) for e in escapes[:5])


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A fresh mdev/host state directory (mdevctl's definitions, the host's GPU count)."""
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def gpuvm_cli(capsys):
    """`gpuvm ARGS...` in this process: (exit code, stdout, stderr)."""
    from gpuvm import cli

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli.main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err
    return run


@pytest.fixture
def placement_watch():
    """(a MediatedMachine class for run_vms(machine=...), the GPU each VM's vGPU was
    placed on by it: {vm name: gpu index})."""
    from gpuvm.run.mediated import MediatedMachine
    placed: dict[str, int] = {}

    class Watched(MediatedMachine):
        def attach(self, spec):
            vgpu = super().attach(spec)
            placed[spec.name] = self.placement[spec.name]
            return vgpu
    return Watched, placed
