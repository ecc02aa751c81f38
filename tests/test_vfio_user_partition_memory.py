"""One memfd per VRAM partition: what a VMM is handed over vfio-user is its own partition
and nothing else, sealed so it cannot be resized, while the device still sees VRAM as one
array.  The client here is a raw socket speaking the spec's layouts (no gpuvm client)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.vram import Vram
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.run.isolated import device_memory
from gpuvm.vfio.user.server import DeviceServer
from test_vfio_user_protocol import CMD_GET_REGION_INFO, recv, send, version

SIZES = {"vm0": 64 * regs.MiB, "vm1": 32 * regs.MiB}
MARK = 0x5EC12E7A


@pytest.fixture
def two_served():
    """Two vGPUs on one GPU, vm1 served on a socket; yields (client socket, gpu, vgpus,
    their mediator)."""
    gpu = Gpu(vram_size=256 * regs.MiB).start()
    med = Mediator(gpu)
    vgpus = {name: med.add_vm(name, MODES["fv-opt"], PartitionSpec(vram_size=size))
             for name, size in SIZES.items()}
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, vgpus["vm1"], vgpus["vm1"], device_memory(vgpus["vm1"]),
                          "vm1").start()
    yield theirs, gpu, vgpus, med
    theirs.close()
    server.closed.wait(5)
    med.close()
    gpu.release_memory()


def bar1_fd(sock) -> int:
    """GET_REGION_INFO of BAR1 (a remap region): the fd that comes with the reply to a
    client with the mapping extension."""
    version(sock, {"gpuvm": ["mapping"]})
    send(sock, 2, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 64, 0, regs.BAR1, 0, 0, 0))
    header, _payload, fds = recv(sock)
    assert header[4] == 0 and len(fds) == 1
    return fds[0]


def test_client_receives_only_its_partition(two_served):
    sock, gpu, vgpus, med = two_served
    mine, other = vgpus["vm1"].part, vgpus["vm0"].part
    fd = bar1_fd(sock)
    try:
        assert os.fstat(fd).st_size == mine.vram_size
        gpu.vram.u32[(other.vram_base >> 2) + 3] = MARK  # the other VM's data
        gpu.vram.u32[(mine.vram_base >> 2) + 5] = MARK  # ours
        view = mmap.mmap(fd, mine.vram_size)
        words = np.frombuffer(view, dtype=np.uint32)
        assert words[5] == MARK and np.count_nonzero(words == MARK) == 1
        view[64:68] = struct.pack("<I", 0x1234)  # the device sees what the VMM writes
        assert gpu.vram.read_u32(mine.vram_base + 64) == 0x1234
        del words
        view.close()
        with pytest.raises(ValueError):  # nothing past the partition to map
            mmap.mmap(fd, mine.vram_size + mmap.PAGESIZE)
        with pytest.raises(ValueError):
            mmap.mmap(fd, mmap.PAGESIZE, offset=mine.vram_size)
    finally:
        os.close(fd)


BEYOND = """
import ctypes, os, sys
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
fd, size = int(sys.argv[1]), int(sys.argv[2])
addr = libc.mmap(None, 4096, 3, 1, fd, size)  # PROT_READ|WRITE, MAP_SHARED, past the end
print(ctypes.c_uint32.from_address(addr).value, flush=True)  # must not get here
"""


def test_mapping_past_the_partition_faults(two_served):
    """A client that maps past the fd's end (the kernel lets it) faults on the first
    access: there is no other VM's memory behind the partition's memfd."""
    sock, _gpu, vgpus, _med = two_served
    fd = bar1_fd(sock)
    try:
        size = os.fstat(fd).st_size
        child = subprocess.run([sys.executable, "-c", BEYOND, str(fd), str(size)],
                               pass_fds=[fd], capture_output=True, timeout=60)
        assert child.returncode == -signal.SIGBUS and not child.stdout
    finally:
        os.close(fd)


def test_received_fd_cannot_be_resized(two_served):
    sock, gpu, vgpus, med = two_served
    fd = bar1_fd(sock)
    try:
        size = os.fstat(fd).st_size
        for new_size in (0, size // 2, size * 2):
            with pytest.raises(OSError) as err:
                os.ftruncate(fd, new_size)
            assert err.value.errno == errno.EPERM
        with pytest.raises(OSError):  # and the seals cannot be taken off or added to
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        assert os.fstat(fd).st_size == size
        part = vgpus["vm1"].part
        gpu.vram.u8[part.vram_base + part.vram_size - 1] = 7  # the device still reaches it
        assert gpu.vram.u8[part.vram_base + part.vram_size - 1] == 7
    finally:
        os.close(fd)


def test_a_reclaimed_partition_is_a_new_memfd(two_served):
    """What the next tenant of a slice writes never shows in the old tenant's mapping."""
    sock, gpu, vgpus, med = two_served
    fd = bar1_fd(sock)
    old = mmap.mmap(fd, os.fstat(fd).st_size)
    os.close(fd)
    try:
        part = vgpus["vm1"].part
        old[0:4] = struct.pack("<I", MARK)
        sock.close()  # the VMM goes; its vGPU is removed and the slice given back
        med.remove_vm(vgpus["vm1"])
        assert gpu.vram.read_u32(part.vram_base) == 0  # scrubbed
        again = med.add_vm("vm2", MODES["fv-opt"], PartitionSpec(vram_size=SIZES["vm1"]))
        assert again.part.vram_base == part.vram_base  # the same slice, reused
        gpu.vram.write_u32(again.part.vram_base + 8, MARK)
        assert old[0:12] == bytes(12)  # the old memfd's pages were freed, not shared
        assert device_memory(again).fd != device_memory(vgpus["vm0"]).fd
    finally:
        old.close()


def test_vram_is_one_array_across_pieces():
    vram = Vram(16 * regs.MiB)
    try:
        base, size = 4 * regs.MiB, 2 * regs.MiB
        vram.u8[base - 8:base + size + 8] = 0xAB  # spans reserved, carved, reserved
        piece = vram.carve(base, size, "test")
        assert piece.host_address == vram.host_address + base and piece.size == size
        assert not vram.u8[base:base + size].any()  # a carved piece starts zeroed
        assert (vram.u8[base - 8:base] == 0xAB).all()  # its neighbours keep their bytes
        vram.u8[base - 4:base + 4] = 0xCD  # one numpy write across two memfds
        shared = mmap.mmap(piece.fd, size)
        assert shared[0:4] == b"\xCD" * 4
        vram.zero(base - regs.MiB, 2 * regs.MiB)  # and a zero across them
        assert shared[0:4] == bytes(4) and not vram.u8[base - regs.MiB:base].any()
        with pytest.raises(ValueError):
            vram.carve(base + regs.MiB, size)  # overlaps
        with pytest.raises(ValueError):
            vram.carve(base + size + 1, regs.MiB)  # not whole pages
        vram.u8[base:base + 4] = 1
        vram.merge(base)
        assert vram.piece(base) is None and not vram.u8[base:base + size].any()
        assert shared[0:4] == bytes(4)  # the piece's pages went with it
        shared.close()
    finally:
        vram.close()
