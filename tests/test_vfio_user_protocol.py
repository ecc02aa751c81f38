"""vfio-user on the wire: a vGPU served by gpuvm's server, spoken to with raw sockets and
`struct` layouts written from the spec's tables (QEMU docs/interop/vfio-user.rst), not
from gpuvm's own ctypes structures, so a wrong field order or size in either fails here.
"""

from __future__ import annotations

import array
import json
import mmap
import os
import socket
import struct

import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.run.isolated import device_memory
from gpuvm.vfio.device import PostedStores
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.server import DeviceServer, ServerLoop

HEADER = "<HHIII"  # msg id, command, size, flags, error
CMD_VERSION, CMD_DMA_MAP, CMD_DMA_UNMAP, CMD_GET_INFO, CMD_GET_REGION_INFO = 1, 2, 3, 4, 5
CMD_GET_IRQ_INFO, CMD_SET_IRQS, CMD_READ, CMD_WRITE, CMD_RESET = 7, 8, 9, 10, 13
REPLY, ERROR = 0x1, 0x20
EINVAL, E2BIG, ENOSYS = 22, 7, 38


@pytest.fixture(params=["thread", "loop"])
def served(request):
    """A vGPU served on a thread of its own, or by a ServerLoop (one thread, epoll)."""
    gpu = Gpu(vram_size=256 * regs.MiB).start()
    med = Mediator(gpu)
    vgpu = med.add_vm("vm0", MODES["fv-opt"], PartitionSpec(vram_size=64 * regs.MiB))
    ours, theirs = socket.socketpair()
    gone = []
    server = DeviceServer(ours, vgpu, vgpu, device_memory(vgpu), "vm0",
                          on_disconnect=gone.append)
    loop = ServerLoop() if request.param == "loop" else None
    loop.add(server) if loop else server.start()
    yield theirs, vgpu, server, gone
    theirs.close()
    server.closed.wait(5)
    if loop:
        loop.close()
    med.close()
    gpu.release_memory()


def send(sock, msg_id, cmd, payload=b"", fds=(), flags=0):
    data = struct.pack(HEADER, msg_id, cmd, 16 + len(payload), flags, 0) + payload
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def recv(sock):
    """(header tuple, payload, fds) of the next message."""
    fds = array.array("i")
    data, anc, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(8 * fds.itemsize))
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[:len(raw) - len(raw) % fds.itemsize])
    assert len(data) == 16, data
    header = struct.unpack(HEADER, data)
    payload = b""
    while len(payload) < header[2] - 16:
        chunk = sock.recv(header[2] - 16 - len(payload))
        assert chunk
        payload += chunk
    return header, payload, list(fds)


def version(sock, caps=None):
    body = json.dumps({"capabilities": caps or {}}).encode() + b"\0"
    send(sock, 1, CMD_VERSION, struct.pack("<HH", 0, 1) + body)
    return recv(sock)


def test_version_reply_layout(served):
    sock, *_ = served
    header, payload, fds = version(sock, {"max_msg_fds": 8})
    assert header == (1, CMD_VERSION, 16 + len(payload), REPLY, 0) and not fds
    assert struct.unpack_from("<HH", payload) == (0, 1)
    assert payload.endswith(b"\0") and payload[4:].count(b"\0") == 1
    caps = json.loads(payload[4:-1])["capabilities"]
    assert caps["max_msg_fds"] >= 1 and caps["max_data_xfer_size"] == 1 << 20
    assert "gpuvm" not in caps  # not asked for: not offered


def test_each_reply_byte_exact(served):
    sock, vgpu, server, _ = served
    version(sock, {"gpuvm": ["mapping"]})
    send(sock, 2, CMD_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0))
    assert recv(sock) == ((2, CMD_GET_INFO, 32, REPLY, 0),
                          struct.pack("<IIII", 16, 0b11, 9, 5), [])

    send(sock, 3, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 32, 0, 0, 0, 0, 0))
    assert recv(sock) == ((3, CMD_GET_REGION_INFO, 48, REPLY, 0),
                          struct.pack("<IIIIQQ", 32, 0b11, 0, 0, regs.BAR0_SIZE, 0), [])

    # BAR1 in a remap mode: MMAP|CAPS, the chain does not fit in 32 bytes -> argsz says 64
    # (and the fd comes with the whole answer only)
    bar1 = vgpu.bar_sizes[regs.BAR1]
    send(sock, 4, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 32, 0, 1, 0, 0, 0))
    assert recv(sock) == ((4, CMD_GET_REGION_INFO, 48, REPLY, 0),
                          struct.pack("<IIIIQQ", 64, 0b1111, 1, 0, bar1, 0), [])
    send(sock, 5, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 64, 0, 1, 0, 0, 0))
    header, payload, fds = recv(sock)
    assert header == (5, CMD_GET_REGION_INFO, 16 + 64, REPLY, 0)
    assert payload == struct.pack("<IIIIQQ", 64, 0b1111, 1, 32, bar1, 0) + \
        struct.pack("<HHIII", 1, 1, 0, 1, 0) + struct.pack("<QQ", 0, bar1)
    assert len(fds) == 1 and os.fstat(fds[0]).st_size == 64 * regs.MiB  # its partition
    os.close(fds[0])

    send(sock, 6, CMD_GET_IRQ_INFO, struct.pack("<IIII", 16, 0, 1, 0))
    assert recv(sock) == ((6, CMD_GET_IRQ_INFO, 32, REPLY, 0),
                          struct.pack("<IIII", 16, 0b1001, 1, 1), [])

    efd = os.eventfd(0, os.EFD_NONBLOCK)
    send(sock, 7, CMD_SET_IRQS, struct.pack("<IIIII", 20, 0b100100, 1, 0, 1), [efd])
    assert recv(sock) == ((7, CMD_SET_IRQS, 16, REPLY, 0), b"", [])
    vgpu.interrupt()
    assert os.eventfd_read(efd) == 1  # the server signals the eventfd we passed
    os.close(efd)

    send(sock, 8, CMD_READ, struct.pack("<QII", regs.PCI_VENDOR_ID, 7, 2))
    assert recv(sock) == ((8, CMD_READ, 34, REPLY, 0),
                          struct.pack("<QII", regs.PCI_VENDOR_ID, 7, 2) +
                          struct.pack("<H", regs.PCI_VENDOR_NVIDIA), [])

    send(sock, 9, CMD_WRITE, struct.pack("<QII", regs.PMC_INTR_EN, 0, 4) +
         struct.pack("<I", 1))
    assert recv(sock) == ((9, CMD_WRITE, 32, REPLY, 0),
                          struct.pack("<QII", regs.PMC_INTR_EN, 0, 4), [])
    send(sock, 10, CMD_READ, struct.pack("<QII", regs.PMC_INTR_EN, 0, 4))
    assert recv(sock)[1][16:] == struct.pack("<I", 1)

    ram = os.memfd_create("test-ram")
    os.ftruncate(ram, 1 << 20)
    send(sock, 11, CMD_DMA_MAP, struct.pack("<IIQQQ", 32, 0b11, 0, 0, 1 << 20), [ram])
    assert recv(sock) == ((11, CMD_DMA_MAP, 16, REPLY, 0), b"", [])
    view = mmap.mmap(ram, 1 << 20)
    view[0x100:0x104] = b"\x11\x22\x33\x44"
    assert bytes(vgpu.dma.region(0x100, 4)) == b"\x11\x22\x33\x44"  # same pages
    send(sock, 12, CMD_DMA_MAP, struct.pack("<IIQQQ", 32, 0b11, 0, 0, 1 << 20), [ram])
    assert recv(sock) == ((12, CMD_DMA_MAP, 16, REPLY | ERROR, 17), b"", [])  # EEXIST
    send(sock, 13, CMD_DMA_UNMAP, struct.pack("<IIQQ", 24, 0, 0, 1 << 20))
    assert recv(sock) == ((13, CMD_DMA_UNMAP, 40, REPLY, 0),
                          struct.pack("<IIQQ", 24, 0, 0, 1 << 20), [])
    view.close()
    os.close(ram)

    send(sock, 14, CMD_RESET)
    assert recv(sock) == ((14, CMD_RESET, 16, REPLY, 0), b"", [])
    assert not server.closed.is_set()


def test_sparse_areas_and_fd_only_for_the_mapping_extension(served):
    """A standard client would mmap the fd at region offsets: the partition's VRAM is
    not laid out so, so it gets a trapped BAR (no MMAP, no CAPS, no fd)."""
    sock, vgpu, _, _ = served
    version(sock)
    send(sock, 2, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 64, 0, 1, 0, 0, 0))
    assert recv(sock) == ((2, CMD_GET_REGION_INFO, 48, REPLY, 0),
                          struct.pack("<IIIIQQ", 32, 0b11, 1, 0,
                                      vgpu.bar_sizes[regs.BAR1], 0), [])


def test_refusal_keeps_the_connection(served):
    sock, _, server, _ = served
    version(sock)
    send(sock, 2, CMD_GET_REGION_INFO, struct.pack("<IIIIQQ", 32, 0, 99, 0, 0, 0))
    assert recv(sock) == ((2, CMD_GET_REGION_INFO, 16, REPLY | ERROR, EINVAL), b"", [])
    send(sock, 3, CMD_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0))
    assert recv(sock)[0][4] == 0 and not server.closed.is_set()


ENOTSUP = 95


@pytest.mark.parametrize("bad, error", [
    (struct.pack(HEADER, 5, CMD_READ, 16 + 4, 0, 0) + b"\0" * 4, EINVAL),  # short payload
    (struct.pack(HEADER, 5, 0x7777, 16, 0, 0), ENOSYS),  # no such command
    (struct.pack(HEADER, 5, 0x8001, 20, 0, 0) + b"\1\0\0\0", ENOSYS),  # extension not agreed
    (struct.pack(HEADER, 5, 16, 24, 0, 0) + struct.pack("<II", 8, 1 << 18 | 1), ENOTSUP),
    (struct.pack(HEADER, 5, 6, 32, 0, 0) + struct.pack("<IIII", 16, 0, 0, 0), 0),  # io fds
    (struct.pack(HEADER, 5, CMD_READ, 32, 0, 0) + struct.pack("<QII", 0, 0xDEADBEEF, 4),
     EINVAL),  # no such region
    (struct.pack(HEADER, 5, CMD_READ, 32, 0, 0) + struct.pack("<QII", 0xFF, 7, 2), EINVAL),
    (struct.pack(HEADER, 5, 11, 32, 0, 0) + struct.pack("<QQ", 0, 4), EINVAL),  # DMA_READ
])
def test_every_command_is_answered_and_the_connection_kept(served, bad, error):
    """The spec: each command gets a reply -- an error reply for a malformed, unknown,
    unsupported or refused one -- and a refusal does not end the connection."""
    sock, vgpu, server, gone = served
    version(sock)
    sock.sendall(bad)
    header, payload, _ = recv(sock)
    assert header[:2] == (5, struct.unpack_from("<H", bad, 2)[0])
    assert header[3:] == ((REPLY | ERROR, error) if error else (REPLY, 0))
    send(sock, 6, CMD_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0))
    assert recv(sock)[0] == (6, CMD_GET_INFO, 32, REPLY, 0)
    assert not server.closed.is_set() and not gone


def test_a_header_that_cannot_be_framed_closes_only_that_connection(served):
    sock, vgpu, server, gone = served
    version(sock)
    sock.sendall(struct.pack(HEADER, 5, CMD_GET_INFO, 1 << 30, 0, 0))  # oversized
    header, payload, _ = recv(sock)
    assert header == (5, CMD_GET_INFO, 16, REPLY | ERROR, E2BIG)
    assert sock.recv(1) == b""  # then the server hangs up
    assert server.closed.wait(5) and gone == [server]
    # the device itself is untouched (its mediator still owns its channels for it):
    # on_disconnect decides
    assert vgpu.services.owner.get(vgpu.part.chid_base) is vgpu


def test_any_access_size_up_to_the_maximum(served):
    """QEMU reads config space in bulk: 64 bytes come back as the registers read one by
    one; a write of 3 bytes lands as a 2-byte and a 1-byte write."""
    sock, vgpu, _, _ = served
    version(sock)
    send(sock, 2, CMD_READ, struct.pack("<QII", 0, 7, 64))
    header, payload, _ = recv(sock)
    assert header == (2, CMD_READ, 16 + 16 + 64, REPLY, 0)
    assert payload[16:] == b"".join(vgpu.config.read(o, 4).to_bytes(4, "little")
                                    for o in range(0, 64, 4))
    send(sock, 3, CMD_WRITE, struct.pack("<QII", regs.PCI_COMMAND, 7, 3) + b"\6\0\0")
    assert recv(sock)[0][3:] == (REPLY, 0)
    assert vgpu.config.read(regs.PCI_COMMAND, 2) == 6  # the 2-byte command register
    send(sock, 4, CMD_READ, struct.pack("<QII", 0, 7, (1 << 20) + 1))
    assert recv(sock)[0][3:] == (REPLY | ERROR, EINVAL)


def test_unmap_all_unmaps_everything(served):
    sock, vgpu, _, _ = served
    version(sock)
    ram = os.memfd_create("test-ram")
    os.ftruncate(ram, 1 << 20)
    for i, iova in enumerate((0, 1 << 20)):
        send(sock, 2 + i, CMD_DMA_MAP, struct.pack("<IIQQQ", 32, 0b11, 0, iova, 1 << 20),
             [ram])
        assert recv(sock)[0][3:] == (REPLY, 0)
    send(sock, 4, CMD_DMA_UNMAP, struct.pack("<IIQQ", 24, 0b10, 0, 0))
    assert recv(sock) == ((4, CMD_DMA_UNMAP, 40, REPLY, 0),
                          struct.pack("<IIQQ", 24, 0b10, 0, 0), [])
    for iova in (0, 1 << 20):
        assert vgpu.dma.region(iova, 4) is None
    send(sock, 5, CMD_DMA_UNMAP, struct.pack("<IIQQ", 24, 0b10, 0, 4096))  # not 0, 0
    assert recv(sock)[0][3:] == (REPLY | ERROR, EINVAL)
    send(sock, 6, CMD_DMA_MAP, struct.pack("<IIQQQ", 32, 0b11, 0, 0, 2 << 20), [ram])
    assert recv(sock)[0][3:] == (REPLY | ERROR, EINVAL)  # past the end of the memfd
    os.close(ram)


def test_command_before_version_is_refused(served):
    sock, _, server, _ = served
    send(sock, 1, CMD_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0))
    assert recv(sock)[0] == (1, CMD_GET_INFO, 16, REPLY | ERROR, EINVAL)
    assert server.closed.wait(5)


CMD_WRITE_MULTI = 15  # REGION_WRITE_MULTI
WRITE = "<QIIQ"  # offset, region, count, data (8 bytes, little-endian)


def _multi(*writes, count=None):
    return struct.pack("<Q", len(writes) if count is None else count) + \
        b"".join(struct.pack(WRITE, *w) for w in writes)


def test_write_multiple_is_offered_to_every_client(served):
    """The spec's REGION_WRITE_MULTI, no gpuvm extension: a plain client is offered it."""
    sock, *_ = served
    header, payload, _ = version(sock)
    assert json.loads(payload[4:-1])["capabilities"]["write_multiple"] is True


def test_write_multi_is_trapped_writes_in_order_one_message(served):
    """REGION_WRITE_MULTI hands each write to the device as the REGION_WRITE of its
    count would, in order: the same counts as those writes, one reply of wr_cnt."""
    sock, vgpu, server, _ = served
    version(sock)
    writes = [(regs.PMC_INTR_EN, 0, 4, 1), (regs.PCI_COMMAND, 7, 2, 6),
              (regs.PMC_INTR_EN, 0, 4, 0), (regs.PMC_INTR_EN, 0, 4, 1)]
    before = vgpu.counters()
    send(sock, 5, CMD_WRITE_MULTI, _multi(*writes))
    assert recv(sock) == ((5, CMD_WRITE_MULTI, 24, REPLY, 0), struct.pack("<Q", 4), [])
    multi = vgpu.counters()
    for i, (offset, region, count, value) in enumerate(writes):
        send(sock, 10 + i, CMD_WRITE, struct.pack("<QII", offset, region, count) +
             value.to_bytes(count, "little"))
        assert recv(sock)[0][3:] == (REPLY, 0)
    trapped = vgpu.counters()
    by_multi = {k: v - before.get(k, 0) for k, v in multi.items() if v != before.get(k, 0)}
    by_writes = {k: v - multi.get(k, 0) for k, v in trapped.items() if v != multi.get(k, 0)}
    assert by_multi == by_writes and sum(by_multi.values()) == 3  # BAR0's (config: no trap)
    send(sock, 20, CMD_WRITE, struct.pack("<QII", regs.PMC_INTR_EN, 0, 4) + bytes(4))
    recv(sock)
    # the last write wins (in order); data past a write's count is not written
    send(sock, 21, CMD_WRITE_MULTI, _multi(*writes[:3], (regs.PMC_INTR_EN, 0, 4, 0xFF << 32 | 1),
                                           (regs.PCI_COMMAND, 7, 3, 0xAA000002)))
    assert recv(sock)[1] == struct.pack("<Q", 5)
    assert vgpu.read(0, regs.PMC_INTR_EN, 4) == 1
    assert vgpu.config.read(regs.PCI_COMMAND, 2) == 2  # 3 bytes: as REGION_WRITE takes them
    assert not server.closed.is_set()


@pytest.mark.parametrize("payload", [
    b"",  # no wr_cnt
    _multi(),  # no write
    _multi((regs.PMC_INTR_EN, 0, 4, 1))[:-1],  # cut short
    _multi((regs.PMC_INTR_EN, 0, 4, 1), count=2),  # wr_cnt is not the writes that follow
    _multi((regs.PMC_INTR_EN, 0, 4, 1), (regs.PMC_INTR_EN, 0, 4, 1), count=1),
    _multi((regs.PMC_INTR_EN, 0, 4, 1), (regs.PMC_INTR_EN, 0, 9, 1)),  # count > 8
    _multi((regs.PMC_INTR_EN, 0, 4, 1), (regs.PMC_INTR_EN, 0, 0, 1)),  # count 0
    _multi((regs.PMC_INTR_EN, 0, 4, 1), (regs.BAR0_SIZE - 2, 0, 4, 1)),  # past BAR0
    _multi((regs.PMC_INTR_EN, 0, 4, 1), (0, 0xDEADBEEF, 4, 1)),  # no such region
    _multi((regs.PMC_INTR_EN, 0, 4, 1), ((1 << 64) - 4, 7, 4, 1)),  # offset wraps
], ids=["empty", "no-write", "cut", "count-high", "count-low", "size-9", "size-0",
        "past-bar0", "no-region", "wraps"])
def test_a_malformed_write_multi_is_refused_whole_and_the_connection_goes_on(served,
                                                                              payload):
    """A hostile client's REGION_WRITE_MULTI gets EINVAL and does nothing -- not even its
    good first write -- and only that command is refused: the connection goes on."""
    sock, vgpu, server, gone = served
    version(sock)
    before = vgpu.counters()
    send(sock, 5, CMD_WRITE_MULTI, payload)
    assert recv(sock) == ((5, CMD_WRITE_MULTI, 16, REPLY | ERROR, EINVAL), b"", [])
    assert vgpu.counters() == before and vgpu.read(0, regs.PMC_INTR_EN, 4) == 0
    send(sock, 6, CMD_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0))
    assert recv(sock)[0] == (6, CMD_GET_INFO, 32, REPLY, 0)
    assert not server.closed.is_set() and not gone


@pytest.mark.parametrize("multi", [True, False], ids=["write-multi", "one-each"])
def test_the_client_posts_a_drain_in_one_message_or_writes_each(served, multi):
    """What a coalesced ring's drain costs a VMM: one REGION_WRITE_MULTI per
    MAX_POSTED_STORES, or one REGION_WRITE each where it may not use it; the device sees
    the same stores, counted the same, either way."""
    sock, vgpu, _, _ = served
    device = VfioUserDevice(sock, "vm0", write_multiple=multi)
    assert device.write_multiple == multi
    stores = [(0, regs.PMC_INTR_EN, 4, i & 1) for i in range(4097)]
    before, sent = vgpu.counters(), device._msg_id
    device.write_many(PostedStores.of(stores))
    assert device._msg_id - sent == (2 if multi else 4097)
    assert vgpu.counters()["trap.bar0.virtual.write"] - \
        before.get("trap.bar0.virtual.write", 0) == 4097
    assert vgpu.read(0, regs.PMC_INTR_EN, 4) == 0  # the last store, in order
