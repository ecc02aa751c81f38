"""The vfio-user client against a scripted server (raw sockets, the spec's layouts): the
per-access path reads replies without room for fds, so an fd a server attaches where none
belongs is closed by the kernel instead of piling up in the VMM, while the one reply that
does carry an fd (a mappable region's memory) still delivers it."""

from __future__ import annotations

import array
import os
import socket
import struct
import threading

from gpuvm.device import regs
from gpuvm.vfio.user.client import VfioUserDevice
from test_vfio_user_protocol import CMD_GET_REGION_INFO, CMD_READ, CMD_VERSION, CMD_WRITE, \
    HEADER, REPLY, recv

SPARSE_BAR = struct.pack("<IIIIQQ", 64, 0b1111, 1, 32, 1 << 20, 0) + \
    struct.pack("<HHIII", 1, 1, 0, 1, 0) + struct.pack("<QQ", 0, 1 << 20)


def reply(sock, header, payload=b"", fds=()):
    data = struct.pack(HEADER, header[0], header[1], 16 + len(payload), REPLY, 0) + payload
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                 if fds else [])


def scripted_server(sock, memfd, stray):
    """Answers VERSION, then every access with `stray` attached (which no access reply
    may carry), and GET_REGION_INFO with `memfd`, until the client hangs up."""
    while True:
        try:
            header, payload, fds = recv(sock)
        except (AssertionError, OSError):
            return
        for fd in fds:
            os.close(fd)
        if header[1] == CMD_VERSION:
            reply(sock, header, struct.pack("<HH", 0, 1) + b'{"capabilities": {}}\0')
        elif header[1] in (CMD_READ, CMD_WRITE):
            data = payload[:16] + (b"\x2a\0\0\0" if header[1] == CMD_READ else b"")
            reply(sock, header, data, [stray])
        elif header[1] == CMD_GET_REGION_INFO:
            reply(sock, header, SPARSE_BAR, [memfd])


def fds_open_on(name: str) -> int:
    """How many of this process's fds are the memfd called `name` (other tests' threads
    may open and close fds meanwhile: only this file's are counted)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} ")
        except OSError:
            pass
    return count


def test_stray_fds_on_access_replies_are_not_kept_and_region_fds_are():
    ours, theirs = socket.socketpair()
    region_name, stray_name = f"test-region-{os.getpid()}", f"test-stray-{os.getpid()}"
    memfd, stray = os.memfd_create(region_name), os.memfd_create(stray_name)
    os.ftruncate(memfd, 1 << 20)
    server = threading.Thread(target=scripted_server, args=(theirs, memfd, stray),
                              daemon=True)
    server.start()
    device = VfioUserDevice(ours, "scripted")
    try:
        for i in range(50):
            device.write(regs.BAR0, regs.PMC_INTR_EN, 4, i)
            assert device.read(regs.BAR0, regs.PMC_INTR_EN, 4) == 0x2A
        assert fds_open_on(stray_name) == 1  # the server's own: 100 came, none stayed
        info = device.get_region_info(regs.BAR1)
        assert info.sparse and fds_open_on(region_name) == 2  # the region's fd is kept
    finally:
        device.close()
        theirs.close()
        server.join(5)
        os.close(memfd)
        os.close(stray)
