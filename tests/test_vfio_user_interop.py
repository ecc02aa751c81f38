"""vfio-user against an implementation nobody here wrote: Nutanix libvfio-user (built by
tests/libvfio_user.py from ../shared/third_party, patched in the build directory only).

- its sample client (`client -g`, the steps any PCI device must answer) against
  `gpuvm serve`, to completion;
- gpuvm's client attached to its sample servers: `server` (BAR1 made a power of two) --
  reads, writes, an interrupt, DMA both by the client's fd and by DMA_READ/DMA_WRITE
  messages the server sends, reset, unmap and unmap-all -- and `gpio-pci-idio-16`;
- a `gpuvm vm start` guest on a vGPU that `gpuvm serve --no-extensions` serves: the
  spec's commands alone carry a whole benchmark.
"""

from __future__ import annotations

import mmap
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from gpuvm.mdevctl import MdevStore
from gpuvm.serve import MdevServer, socket_path
from gpuvm.vfio import abi
from gpuvm.vfio.device import SparseArea
from gpuvm.vfio.user.client import VfioUserDevice
from libvfio_user import BuildError, build, missing_reason

PAGE = mmap.PAGESIZE


@pytest.fixture(scope="module")
def samples() -> Path:
    if reason := missing_reason():
        pytest.skip(reason)
    try:
        return build() / "samples"
    except BuildError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def short_tmp():
    path = Path(tempfile.mkdtemp(prefix="gpuvm-", dir="/tmp"))  # socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(short_tmp, monkeypatch):
    """`gpuvm serve`'s daemon with one mdev, extensions offered (a standard client does
    not ask for them, so it gets none)."""
    monkeypatch.setenv("GPUVM_STATE_DIR", str(short_tmp))
    definition = MdevStore().create("gpuvm-Q6000-2Q", mode="fv-opt")
    server = MdevServer([definition]).start()
    yield server, definition
    server.stop()


def start_sample(binary: Path, *args: str) -> subprocess.Popen:
    """A sample server listening on the socket named last in `args`."""
    proc = subprocess.Popen([str(binary), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    path = Path(args[-1])
    deadline = time.monotonic() + 30
    while not _listening(path):  # the path exists from bind(), a connect works from listen()
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sample server never listened"
        time.sleep(0.02)
    return proc


def _listening(path: Path) -> bool:
    """Whether a Unix socket bound at `path` listens (its /proc/net/unix flags carry
    __SO_ACCEPTCON), found without connecting: the samples serve one client at a time."""
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == str(path) and int(fields[3], 16) & 0x10000:
            return True
    return False


def shared_ram(device: VfioUserDevice, pages: int) -> tuple[np.ndarray, int]:
    """`pages` of memfd-backed memory the client may DMA-map (and its fd)."""
    fd = os.memfd_create("interop-ram")
    os.ftruncate(fd, pages * PAGE)
    memory = np.frombuffer(mmap.mmap(fd, pages * PAGE), dtype=np.uint8)
    device.share(memory.ctypes.data, memory.nbytes, fd)
    return memory, fd


# ------------------------------------------------------------- their client, our server
def test_libvfio_user_sample_client_runs_to_completion_against_gpuvm_serve(samples, served):
    server, definition = served
    proc = subprocess.run([str(samples / "client"), "-g", str(socket_path(definition.uuid))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    # it read the vGPU's config space in one 64-byte REGION_READ
    assert "config space: vendor 0x10de" in out
    # INTx is offered; the features gpuvm lacks were refused with the connection kept
    assert "IRQ INTx: count=1" in out
    assert "dirty page logging refused: Operation not supported" in out
    # a remap-mode BAR1 is no sparse mmap to a client that did not ask for gpuvm's fd
    assert "region_info[1] offset 0 flags 0x3 size 33554432 cap_sz 0 #FDs 0" in out
    assert "generic device run complete" in out
    deadline = time.monotonic() + 10
    while server.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.active  # its vGPU was removed when it left


# ------------------------------------------------------------- our client, their servers
def test_gpuvm_client_drives_the_libvfio_user_sample_server(samples, short_tmp):
    sock = short_tmp / "server.sock"
    proc = start_sample(samples / "server", str(sock))
    try:
        device = VfioUserDevice.connect(str(sock))
        assert device.extensions == frozenset()  # it offered none: none are used
        info = device.get_info()
        assert info.flags & abi.VFIO_DEVICE_FLAGS_PCI and info.num_regions == 9
        assert device.read(abi.VFIO_PCI_CONFIG_REGION_INDEX, 0, 2) == 0xDEAD
        assert device.read(abi.VFIO_PCI_CONFIG_REGION_INDEX, 2, 2) == 0xBEEF
        bar1 = device.get_region_info(1)
        assert bar1.size == 0x4000 and bar1.mappable
        assert bar1.sparse == (SparseArea(0, 0x1000), SparseArea(0x2000, 0x1000))
        assert device.get_region_info(0).size == 8

        # writes and reads (its BAR1 read returns the region's start, whatever the offset)
        device.write(1, 0, 4, 0x12345678)
        assert device.read(1, 0, 4) == 0x12345678

        memory, fd = shared_ram(device, 2)
        for window in range(2):  # its region 0 takes DMA by message, region 1 by the fd
            device.dma_map(window * PAGE, memory[window * PAGE:(window + 1) * PAGE],
                           abi.VFIO_DMA_MAP_FLAG_READ | abi.VFIO_DMA_MAP_FLAG_WRITE)
        assert device.get_irq_info(abi.VFIO_PCI_INTX_IRQ_INDEX).count == 1
        irq = os.eventfd(0, os.EFD_NONBLOCK)
        device.set_irqs(abi.VFIO_PCI_INTX_IRQ_INDEX, 0, [irq])

        # BAR0 is a timer: at the time written it raises INTx and does DMA to both
        # windows -- the second by DMA_WRITE/DMA_READ messages this client answers
        device.write(0, 0, 8, int(time.time()) + 1)
        assert select.select([irq], [], [], 10)[0], "no interrupt came"
        assert os.eventfd_read(irq) == 1
        assert device.serve_requests(timeout=2.0) == 4 + 2  # 4 writes of 1 KiB, 2 reads
        expected = b"".join(bytes([ord("A") + i]) * 1024 for i in range(4))
        assert bytes(memory[:PAGE]) == expected  # by message
        assert bytes(memory[PAGE:2 * PAGE]) == expected  # in place, by its mmap of our fd
        assert proc.poll() is None  # it compared what it read back with what it wrote
        assert 0 <= device.read(0, 0, 8) < 60  # seconds since the time written

        device.reset()
        device.dma_unmap(0, PAGE)
        device.dma_unmap_all()
        device.set_irqs(abi.VFIO_PCI_INTX_IRQ_INDEX, 0, [])
        device.close()
        os.close(irq)
        os.close(fd)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_gpuvm_client_drives_the_libvfio_user_gpio_sample(samples, short_tmp):
    """An 8-bit GPIO card: a write to 0x0 pulses output pins 0-7, and input pin i reads 1
    while output pin i has been pulsed a multiple of three times."""
    sock = short_tmp / "gpio.sock"
    proc = start_sample(samples / "gpio-pci-idio-16", str(sock))
    try:
        device = VfioUserDevice.connect(str(sock))
        assert device.read(abi.VFIO_PCI_CONFIG_REGION_INDEX, 0, 4) == 0x0DC8494F
        bar2 = device.get_region_info(2)
        assert bar2.size == 0x100 and bar2.readable and bar2.writable and not bar2.mappable
        assert device.read(2, 1, 1) == 0xFF
        device.write(2, 0, 1, 0b101)
        assert device.read(2, 1, 1) == 0b11111010
        device.write(2, 0, 1, 0b001)
        device.write(2, 0, 1, 0b001)
        assert device.read(2, 1, 1) == 0b11111011  # pin 0 pulsed 3 times, pin 2 once
        device.write(2, 4, 1, 0x80)
        assert device.read(2, 5, 1) == 0x7F
        irq = os.eventfd(0, os.EFD_NONBLOCK)
        device.set_irqs(abi.VFIO_PCI_INTX_IRQ_INDEX, 0, [irq])
        memory, fd = shared_ram(device, 1)
        device.dma_map(0x10000, memory, abi.VFIO_DMA_MAP_FLAG_READ)
        device.dma_unmap_all()
        device.reset()
        device.close()
        os.close(irq)
        os.close(fd)
        # it takes the next client (the device's state kept, as the spec asks)
        again = VfioUserDevice.connect(str(sock))
        assert again.read(2, 1, 1) == 0b11111011
        again.close()
        assert proc.poll() is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------- the spec alone, a whole run
def test_a_vm_runs_a_benchmark_on_a_vgpu_served_without_extensions(short_tmp, monkeypatch):
    monkeypatch.setenv("GPUVM_STATE_DIR", str(short_tmp))
    definition = MdevStore().create("gpuvm-Q6000-2Q", mode="fv-opt")
    server = MdevServer([definition], extensions=()).start()
    try:
        vm = subprocess.Popen([sys.executable, "-m", "gpuvm", "vm", "start", "--mdev",
                               definition.uuid, "--backend", "inproc", "-b", "mmul",
                               "-p", "32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                (served := server.active.get(definition.uuid)) and served.negotiated):
            time.sleep(0.02)
        assert served is not None and served.negotiated
        assert served.extensions == set()  # the VMM asked; the server offered none
        out, err = vm.communicate(timeout=300)
        assert vm.returncode == 0 and "PASS" in out, err[-3000:]
    finally:
        server.stop()
