"""The isolation probe natively: through every vector it reads the bytes at the address
and writes its marker there (no isolation to stop it), or faults where the hardware
would; the mediator's isolation tests run the same probe under virtualization."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.native import NativeMachine
from gpuvm.vfio.passthrough import PassthroughGpu
from gpuvm.vmm.guest_programs import PROBE_VECTORS

VRAM = 384 * regs.MiB
SECRET_VRAM = 0x4000000  # far above what the driver allocates for itself
SECRET_RAM = 0x3000000  # guest RAM the guest's own heap never reaches in these runs
SECRET = np.arange(0xA0, 0xB0, dtype=np.uint8)
MARKER = bytes.fromhex("5052424b") * 4  # "PRBK" little endian, repeated


class SeededGpu(PassthroughGpu):
    """A whole GPU with a known pattern in its VRAM and, once the VMM DMA-maps it, in the
    guest's RAM (seen through that mapping)."""

    def __init__(self, gpu) -> None:
        super().__init__(gpu)
        gpu.vram.u8[SECRET_VRAM:SECRET_VRAM + 16] = SECRET

    def dma_map(self, iova, memory, flags) -> None:
        super().dma_map(iova, memory, flags)
        memory[SECRET_RAM - iova:SECRET_RAM - iova + 16] = SECRET
        self.secret_ram = memory[SECRET_RAM - iova:SECRET_RAM - iova + 16]  # read after


class Seeded(NativeMachine):
    """Native on a seeded GPU; remembers what is in both places after the run."""

    device_class = SeededGpu
    last: dict[str, bytes] = {}

    def detach(self, spec):
        device = self.devices[spec.name]
        Seeded.last = {"vram": bytes(device.gpu.vram.u8[SECRET_VRAM:SECRET_VRAM + 16]),
                       "ram": bytes(device.secret_ram)}
        super().detach(spec)


OPTIONS = RunOptions(backend="inproc", vram_size=VRAM, wait_slice=2.0)


def probe(vector: str, addr: int, length: int = 16, **spec):
    (r,) = run_vms([VmSpec("vm0", "probe", [PROBE_VECTORS[vector], addr, length], **spec)],
                   OPTIONS, machine=Seeded)
    return r


@pytest.mark.parametrize("vector", ["channel_pt", "bar1", "bar3", "pramin"])
def test_vram_vectors_read_and_write(vector):
    r = probe(vector, SECRET_VRAM)
    assert r.passed, r.error()
    rec = r.record
    assert rec["vector"] == vector and rec["faulted"] == "0"
    assert rec["data"] == SECRET.tobytes().hex()
    assert rec["wrote"] == "1"
    assert Seeded.last["vram"] == MARKER


def test_unaligned_short_probe():
    r = probe("bar1", SECRET_VRAM + 3, 5)
    assert r.record["data"] == SECRET[3:8].tobytes().hex()


def test_ramin_vector_moves_the_foreign_userd_words():
    r = probe("ramin", SECRET_VRAM)
    rec = r.record
    assert r.passed and rec["data"] == SECRET.tobytes().hex()
    assert rec["wrote"] == "1" and rec["changed"] == "1"


def test_sysram_vector_reaches_guest_ram_and_faults_beyond_it():
    r = probe("sysram", SECRET_RAM)
    assert r.record["data"] == SECRET.tobytes().hex() and r.record["wrote"] == "1"
    assert Seeded.last["ram"] == MARKER
    beyond = probe("sysram", 1 << 31)
    rec = beyond.record
    assert beyond.passed  # the probe ran; the fault is its finding
    assert rec["faulted"] == "1" and rec["wrote"] == "0" and rec["data"] == "-"
    assert rec["chan_err"] == "dma_target"


def test_vram_beyond_the_gpu_faults():
    r = probe("channel_pt", VRAM + 0x1000)
    assert r.record["faulted"] == "1" and r.record["chan_err"] == "dma_target"


def test_pv_map_needs_the_pv_build():
    r = probe("pv_map", SECRET_VRAM)
    assert not r.passed and r.record["reason"] == "pv_map_needs_the_pv_build"
