"""The per-access paths of vfio-user (a register's REGION_READ/WRITE decoded and answered
with one struct each, on both sides) against everything they must hand to the general
path: pipelined messages, split messages, no-reply flags, sizes that disagree, refusals,
a mapping event ahead of a reply, an echo that differs.  The peers are raw sockets with
the spec's layouts, so each case is exactly the bytes it names."""

from __future__ import annotations

import mmap
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.vfio import abi
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vfio.user import protocol as p
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.server import DeviceServer, ServerLoop
from test_vfio_user_protocol import CMD_READ, CMD_VERSION, CMD_WRITE, EINVAL, ERROR, HEADER, \
    REPLY, recv, send, version

REFUSED = 0xBAD0  # the test device refuses every access here
NO_REPLY = 0x10
CMD_MAPPING_EVENT = 0x8002


class RefusingRegisters(RegisterFileDevice):
    def bar_read(self, region: int, offset: int, size: int) -> int:
        if offset == REFUSED:
            raise VfioError("refused read")
        return super().bar_read(region, offset, size)

    def bar_write(self, region: int, offset: int, size: int, value: int) -> None:
        if offset == REFUSED:
            raise VfioError("refused write")
        super().bar_write(region, offset, size, value)


@pytest.fixture(params=["thread", "loop"])
def served(request):
    """A register file served on a thread of its own, or by a ServerLoop; polling on,
    so the fast path also runs after a poll."""
    device = RefusingRegisters({0: regs.BAR0_SIZE})
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, device, name="regs")
    server.channel.spin_s = 20e-6
    loop = ServerLoop() if request.param == "loop" else None
    loop.add(server) if loop else server.start()
    yield theirs, device, server
    theirs.close()
    server.closed.wait(5)
    if loop:
        loop.close()


def write_msg(msg_id, offset, value, size=4, flags=0, count=None, data=None):
    data = value.to_bytes(size, "little") if data is None else data
    count = size if count is None else count
    return struct.pack(HEADER, msg_id, CMD_WRITE, 32 + len(data), flags, 0) + \
        struct.pack("<QII", offset, 0, count) + data


def read_msg(msg_id, offset, size=4, extra=b""):
    return struct.pack(HEADER, msg_id, CMD_READ, 32 + len(extra), 0, 0) + \
        struct.pack("<QII", offset, 0, size) + extra


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_each_register_size_round_trips_byte_exact(served, size):
    sock, device, _ = served
    version(sock)
    value = 0x1122334455667788 & ((1 << 8 * size) - 1)
    sock.sendall(write_msg(2, 0x100, value, size))
    assert recv(sock) == ((2, CMD_WRITE, 32, REPLY, 0), struct.pack("<QII", 0x100, 0, size),
                          [])
    sock.sendall(read_msg(3, 0x100, size))
    assert recv(sock) == ((3, CMD_READ, 32 + size, REPLY, 0),
                          struct.pack("<QII", 0x100, 0, size) + value.to_bytes(size, "little"),
                          [])
    assert device.registers[(0, 0x100)] == value


def test_pipelined_and_split_messages_are_answered_in_order(served):
    sock, device, _ = served
    version(sock)
    # three accesses in one send: more than one message in a read
    sock.sendall(write_msg(2, 0x10, 7) + write_msg(3, 0x14, 8) + read_msg(4, 0x10))
    assert [recv(sock)[0][0] for _ in range(3)] == [2, 3, 4]
    # one access in two sends: less than one message in a read
    whole = write_msg(5, 0x18, 9)
    sock.sendall(whole[:20])
    time.sleep(0.05)
    sock.sendall(whole[20:])
    assert recv(sock)[0] == (5, CMD_WRITE, 32, REPLY, 0)
    assert [device.registers[(0, o)] for o in (0x10, 0x14, 0x18)] == [7, 8, 9]


def test_no_reply_flag_is_honoured(served):
    sock, device, _ = served
    version(sock)
    sock.sendall(write_msg(2, 0x20, 5, flags=NO_REPLY))
    time.sleep(0.05)  # read by the server alone, not with the next message
    sock.sendall(read_msg(3, 0x20))
    header, payload, _ = recv(sock)  # the first reply is the read's
    assert header[0] == 3 and payload[16:] == b"\5\0\0\0"


def test_a_refused_access_gets_an_error_reply_and_the_connection_goes_on(served):
    sock, _, server = served
    version(sock)
    sock.sendall(write_msg(2, REFUSED, 1))
    assert recv(sock) == ((2, CMD_WRITE, 16, REPLY | ERROR, EINVAL), b"", [])
    sock.sendall(read_msg(3, REFUSED))
    assert recv(sock) == ((3, CMD_READ, 16, REPLY | ERROR, EINVAL), b"", [])
    sock.sendall(read_msg(4, 0x30))
    assert recv(sock)[0] == (4, CMD_READ, 36, REPLY, 0) and not server.closed.is_set()


@pytest.mark.parametrize("bad", [
    write_msg(2, 0x40, 0, count=4, data=b"\1\2"),  # count 4, 2 data bytes
    write_msg(2, 0x40, 0, count=2, data=b"\1\2\3\4"),  # count 2, 4 data bytes
    read_msg(2, 0x40, 4, extra=b"\0\0\0\0"),  # a read that carries data
])
def test_sizes_that_disagree_get_einval_and_the_connection_goes_on(served, bad):
    """The header frames the message, so the stream goes on past a malformed payload:
    the spec's error reply, and the next command is answered."""
    sock, device, server = served
    version(sock)
    sock.sendall(bad)
    assert recv(sock)[0] == (2, struct.unpack_from("<H", bad, 2)[0], 16, REPLY | ERROR, EINVAL)
    assert (0, 0x40) not in device.registers
    sock.sendall(read_msg(3, 0x30))
    assert recv(sock)[0] == (3, CMD_READ, 36, REPLY, 0) and not server.closed.is_set()


def test_an_access_before_version_is_refused(served):
    sock, device, server = served
    sock.sendall(write_msg(1, 0x50, 1))
    assert recv(sock)[0] == (1, CMD_WRITE, 16, REPLY | ERROR, EINVAL)
    assert server.closed.wait(5) and not device.registers


# ---------------------------------------------------------------- the client's side
def scripted(script, capabilities=b'{"capabilities": {"gpuvm": ["mapping"]}}'):
    """A VfioUserDevice whose server answers VERSION (with these capabilities), then runs
    `script(sock)` in a thread."""
    ours, theirs = socket.socketpair()

    def run():
        header, _, _ = recv(theirs)
        assert header[1] == CMD_VERSION
        body = capabilities + b"\0"
        theirs.sendall(struct.pack(HEADER, header[0], CMD_VERSION, 20 + len(body), REPLY, 0)
                       + struct.pack("<HH", 0, 1) + body)
        try:
            script(theirs)
        except (AssertionError, OSError):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    device = VfioUserDevice(ours, "scripted")
    device._channel.spin_s = 20e-6
    return device, theirs, thread


def reply_to(header, payload=b"", flags=REPLY, error=0, size=None):
    return struct.pack(HEADER, header[0], header[1], size or 16 + len(payload), flags,
                       error) + payload


def test_client_takes_a_reply_in_pieces_and_a_changed_echo():
    def script(sock):
        header, payload, _ = recv(sock)  # a read: its reply in three pieces
        whole = reply_to(header, payload[:16] + b"\x2a\0\0\0")
        for i in (0, 7, 30):
            sock.sendall(whole[i:{0: 7, 7: 30, 30: None}[i]])
            time.sleep(0.02)
        header, payload, _ = recv(sock)  # a write: its echo names another offset
        sock.sendall(reply_to(header, struct.pack("<QII", 0x999, 0, 4)))
        header, payload, _ = recv(sock)  # a read whose reply has 2 bytes, not 4
        sock.sendall(reply_to(header, payload[:16] + b"\1\2"))

    device, theirs, thread = scripted(script)
    try:
        assert device.read(0, 0x140, 4) == 0x2A
        device.write(0, 0x140, 4, 1)  # accepted: a reply to this message, not refused
        with pytest.raises(p.ProtocolError, match="REGION_READ of 4 returned 2 bytes"):
            device.read(0, 0x140, 4)
    finally:
        device.close()
        theirs.close()
        thread.join(5)


def test_client_applies_an_event_ahead_of_the_reply_and_raises_on_an_error_reply():
    def script(sock):
        header, _, _ = recv(sock)
        sock.sendall(reply_to(header, error=22, flags=REPLY | ERROR))  # refused
        header, payload, _ = recv(sock)
        # a grant in a region the client has no fd for, then the reply: the client must
        # read the event as a message (and refuse it) instead of taking it for the reply
        event = struct.pack("<IIQQQ", 1, 1, 0, 0, 4096)
        sock.sendall(struct.pack(HEADER, 1, CMD_MAPPING_EVENT, 16 + len(event),
                                 NO_REPLY, 0) + event + reply_to(header, payload[:16]))

    device, theirs, thread = scripted(script)
    try:
        with pytest.raises(VfioError, match=r"REGION_WRITE refused by the server \(EINVAL\)"):
            device.write(0, 0x140, 4, 1)
        with pytest.raises(p.ProtocolError, match="a grant in region 1, which came with no fd"):
            device.write(0, 0x140, 4, 2)
    finally:
        device.close()
        theirs.close()
        thread.join(5)


def test_client_sends_each_register_size_byte_exact():
    seen = []

    def script(sock):
        for _ in range(8):
            header, payload, _ = recv(sock)
            seen.append((header, payload))
            data = b"\xff" * 8 if header[1] == CMD_READ else b""
            sock.sendall(reply_to(header, payload[:16] + data[:payload[12]]))

    device, theirs, thread = scripted(script)
    try:
        for size in (1, 2, 4, 8):
            device.write(0, 0x200, size, -1)  # masked to the size
            assert device.read(0, 0x204, size) == (1 << 8 * size) - 1
    finally:
        device.close()
        theirs.close()
        thread.join(5)
    for i, size in enumerate((1, 2, 4, 8)):
        (wh, wp), (rh, rp) = seen[2 * i], seen[2 * i + 1]
        assert wh[1:] == (CMD_WRITE, 32 + size, 0, 0) and \
            wp == struct.pack("<QII", 0x200, 0, size) + b"\xff" * size
        assert rh[1:] == (CMD_READ, 32, 0, 0) and rp == struct.pack("<QII", 0x204, 0, size)
        assert rh[0] == (wh[0] + 1) & 0xFFFF


def test_client_asks_again_when_the_reply_needs_more_even_without_caps():
    """The spec's argsz: the size the whole reply needs, whatever the flags say."""
    asked = []

    def script(sock):
        header, payload, _ = recv(sock)
        asked.append(struct.unpack_from("<I", payload)[0])
        sock.sendall(reply_to(header, struct.pack("<IIIIQQ", 40, 0b11, 2, 0, 0x100, 0)))
        header, payload, _ = recv(sock)
        asked.append(struct.unpack_from("<I", payload)[0])
        sock.sendall(reply_to(header, struct.pack("<IIIIQQ", 40, 0b11, 2, 0, 0x100, 0) +
                              bytes(8)))

    device, theirs, thread = scripted(script)
    try:
        assert device.get_region_info(2).size == 0x100
        assert asked == [32, 40]
    finally:
        device.close()
        theirs.close()
        thread.join(5)


def test_client_uses_no_extension_the_server_did_not_list():
    """Against a standard server gpuvm's VMM sends only the spec's commands."""
    commands = []

    def script(sock):
        header, payload, _ = recv(sock)
        commands.append(header[1])
        sock.sendall(reply_to(header, payload[:16] + b"\7\0\0\0"))

    device, theirs, thread = scripted(script, b'{"capabilities": {"max_msg_fds": 1}}')
    try:
        assert device.extensions == frozenset()
        device.set_mapping_listener(object())  # kept, nothing sent
        assert device.counters() == {} and device.faults() == []
        assert device.read(0, 0x140, 4) == 7
        assert commands == [CMD_READ]
    finally:
        device.close()
        theirs.close()
        thread.join(5)


def test_client_answers_the_servers_dma_ahead_of_a_reply():
    """A server that does its DMA by message does it while it handles a command: the
    client writes and reads its mapped memory, replies, then takes its own reply."""
    got = []

    def script(sock):
        header, payload, fds = recv(sock)  # DMA_MAP
        for fd in fds:
            os.close(fd)
        sock.sendall(reply_to(header))
        header, payload, _ = recv(sock)  # a read: DMA first
        sock.sendall(struct.pack(HEADER, 9, 12, 16 + 16 + 4, 0, 0) +
                     struct.pack("<QQ", 0x1010, 4) + b"\xde\xad\xbe\xef")
        got.append(recv(sock))
        sock.sendall(struct.pack(HEADER, 10, 11, 32, 0, 0) + struct.pack("<QQ", 0x1010, 4))
        got.append(recv(sock))
        sock.sendall(struct.pack(HEADER, 11, 11, 32, 0, 0) + struct.pack("<QQ", 0x9000, 4))
        got.append(recv(sock))
        sock.sendall(reply_to(header, payload[:16] + b"\1\0\0\0"))

    device, theirs, thread = scripted(script)
    fd = os.memfd_create("dma")
    os.ftruncate(fd, 4096)
    memory = np.frombuffer(mmap.mmap(fd, 4096), dtype=np.uint8)
    try:
        device.share(memory.ctypes.data, 4096, fd)
        device.dma_map(0x1000, memory, abi.VFIO_DMA_MAP_FLAG_READ | abi.VFIO_DMA_MAP_FLAG_WRITE)
        assert device.read(0, 0x140, 4) == 1
        assert bytes(memory[0x10:0x14]) == b"\xde\xad\xbe\xef"
        assert got[0] == ((9, 12, 32, REPLY, 0), struct.pack("<QQ", 0x1010, 4), [])
        assert got[1] == ((10, 11, 36, REPLY, 0),
                          struct.pack("<QQ", 0x1010, 4) + b"\xde\xad\xbe\xef", [])
        assert got[2][0] == (11, 11, 16, REPLY | ERROR, 14)  # EFAULT: outside the mapping
    finally:
        device.close()
        theirs.close()
        thread.join(5)
        os.close(fd)
