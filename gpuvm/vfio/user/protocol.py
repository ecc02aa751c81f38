"""The vfio-user wire format: header, commands, payload layouts, and fd passing.

Every message is a 16-byte header {u16 msg id, u16 command, u32 size (header included),
u32 flags, u32 error} followed by the command's payload; flags bits 0-3 are the type
(0 command, 1 reply), bit 4 no-reply, bit 5 error.  A reply echoes the command's msg id
and command; an error reply is the header alone with the error bit and an errno.  File
descriptors (guest RAM for DMA_MAP, region memory with GET_REGION_INFO, eventfds with
SET_IRQS) travel as SCM_RIGHTS ancillary data of the message they belong to.  All
integers are little-endian (the host's order).  Payload layouts are those of QEMU's
docs/interop/vfio-user.rst (protocol 0.1), built here with ctypes so that a test can
compare bytes field by field.

gpuvm's extensions (commands outside the spec's range, offered in VERSION's JSON under
"gpuvm" and used only when both sides list them) are documented with their numbers below
and in gpuvm/vfio/user/__init__.py.
"""

from __future__ import annotations

import array
import ctypes
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gpuvm.vfio.device import VfioError

# ---------------------------------------------------------------- commands (spec table)
VERSION = 1
DMA_MAP = 2
DMA_UNMAP = 3
DEVICE_GET_INFO = 4
DEVICE_GET_REGION_INFO = 5
DEVICE_GET_REGION_IO_FDS = 6
DEVICE_GET_IRQ_INFO = 7
DEVICE_SET_IRQS = 8
REGION_READ = 9
REGION_WRITE = 10
DMA_READ = 11
DMA_WRITE = 12
DEVICE_RESET = 13
REGION_WRITE_MULTI = 15
DEVICE_FEATURE = 16
MIG_DATA_READ = 17
MIG_DATA_WRITE = 18

# gpuvm extensions (not in the spec; see the package docstring)
GPUVM_MAPPING_LISTEN = 0x8001  # client -> server: {u32 enable}; grants follow as below
GPUVM_MAPPING_EVENT = 0x8002  # server -> client, no reply: one BAR-remap grant/revoke
GPUVM_DEVICE_STATS = 0x8003  # client -> server: reply = JSON {counters, faults, time}
GPUVM_CLOCK = 0x8004  # client -> server: {op, arg}; reply = the vCPU's ClockState

COMMAND_NAMES = {VERSION: "VERSION", DMA_MAP: "DMA_MAP", DMA_UNMAP: "DMA_UNMAP",
                 DEVICE_GET_INFO: "DEVICE_GET_INFO",
                 DEVICE_GET_REGION_INFO: "DEVICE_GET_REGION_INFO",
                 DEVICE_GET_REGION_IO_FDS: "DEVICE_GET_REGION_IO_FDS",
                 DEVICE_GET_IRQ_INFO: "DEVICE_GET_IRQ_INFO",
                 DEVICE_SET_IRQS: "DEVICE_SET_IRQS", REGION_READ: "REGION_READ",
                 REGION_WRITE: "REGION_WRITE", DMA_READ: "DMA_READ", DMA_WRITE: "DMA_WRITE",
                 DEVICE_RESET: "DEVICE_RESET", REGION_WRITE_MULTI: "REGION_WRITE_MULTI",
                 DEVICE_FEATURE: "DEVICE_FEATURE", MIG_DATA_READ: "MIG_DATA_READ",
                 MIG_DATA_WRITE: "MIG_DATA_WRITE",
                 GPUVM_MAPPING_LISTEN: "GPUVM_MAPPING_LISTEN",
                 GPUVM_MAPPING_EVENT: "GPUVM_MAPPING_EVENT",
                 GPUVM_DEVICE_STATS: "GPUVM_DEVICE_STATS", GPUVM_CLOCK: "GPUVM_CLOCK"}

# ---------------------------------------------------------------- header flags
TYPE_COMMAND = 0
TYPE_REPLY = 1
TYPE_MASK = 0xF
FLAG_NO_REPLY = 1 << 4
FLAG_ERROR = 1 << 5

# ---------------------------------------------------------------- version / limits
VERSION_MAJOR = 0
VERSION_MINOR = 1
MAX_DATA_XFER_SIZE = 1 << 20  # the spec's default max_data_xfer_size
MAX_MSG_FDS = 8
MAX_DMA_MAPS = 1024  # windows a client may hold at once (the spec's default is 65535)
EXTENSIONS_KEY = "gpuvm"  # VERSION capabilities: the gpuvm extensions a side offers
EXTENSIONS = ("mapping", "stats", "clock")
WRITE_MULTIPLE_KEY = "write_multiple"  # VERSION capability: REGION_WRITE_MULTI is served
MAX_MESSAGE_SIZE = MAX_DATA_XFER_SIZE + 4096  # a larger header.size is refused (E2BIG)
# Polling for the peer's next message before sleeping pays only when the peer runs on
# another core meanwhile: with fewer than 4 cores the poller takes the core the peer
# needs (measured: 6x slower on 2 cores, 1.4x faster on 16).  Polling with a sched_yield
# between tries was measured too on 2 cores (load ~11, Python ping-pong): no faster than
# blocking, and plain polling 1.1-3.7x slower.
#
# GPUVM_VFIO_USER_POLL_US overrides that choice (microseconds, 0 = never poll), read once
# when this module is imported, so that both sides of a connection -- a server process
# inherits the VMM's environment -- poll alike: it lets the 16-core behaviour be measured
# on a small host (`gpuvm bench vfio-user --poll-us`), or polling be turned off on a
# large one.
POLL_ENV = "GPUVM_VFIO_USER_POLL_US"
DEFAULT_SPIN_S = 50e-6 if len(os.sched_getaffinity(0)) >= 4 else 0.0


def _spin_from_env(default: float) -> float:
    text = os.environ.get(POLL_ENV, "").strip()
    if not text:
        return default
    try:
        us = float(text)
    except ValueError:
        us = -1.0
    if not 0 <= us <= 1e6:
        # Read at import, before any CLI error handling: one line and exit status 2, as
        # every bad input gets, rather than a traceback from an import.
        sys.stderr.write(f"gpuvm: error: {POLL_ENV}={text!r}: expected microseconds "
                         f"between 0 and 1000000\n")
        raise SystemExit(2)
    return us * 1e-6


SPIN_S = _spin_from_env(DEFAULT_SPIN_S)

DMA_FLAG_READ = 1 << 0
DMA_FLAG_WRITE = 1 << 1
DMA_UNMAP_FLAG_GET_DIRTY_BITMAP = 1 << 0  # linux/vfio.h, as libvfio-user uses them
DMA_UNMAP_FLAG_ALL = 1 << 1

_u16, _u32, _u64 = ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64


class Header(ctypes.LittleEndianStructure):
    """The vfio-user message header (msg_id, command, size, flags, error) as it goes on the
    socket."""

    _pack_ = 1
    _fields_ = [("msg_id", _u16), ("command", _u16), ("size", _u32), ("flags", _u32),
                ("error", _u32)]


class VersionPayload(ctypes.LittleEndianStructure):
    """Followed by a NUL-terminated UTF-8 JSON object (optional)."""
    _pack_ = 1
    _fields_ = [("major", _u16), ("minor", _u16)]


class DmaMap(ctypes.LittleEndianStructure):
    """DMA_MAP's payload: a range of the client's memory the server may reach, by fd offset or
    address."""

    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("offset", _u64), ("address", _u64),
                ("size", _u64)]


class DmaUnmap(ctypes.LittleEndianStructure):
    """DMA_UNMAP's payload: a range the server may no longer reach."""

    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("address", _u64), ("size", _u64)]


class DmaAccess(ctypes.LittleEndianStructure):
    """DMA_READ/DMA_WRITE (server -> client): a request, then `count` data bytes (a write
    request, a read reply).  The spec gives the DMA_WRITE reply a 4-byte count; the u64
    sent here, as libvfio-user sends and expects it, reads the same in its low half."""
    _pack_ = 1
    _fields_ = [("address", _u64), ("count", _u64)]


class RegionIoFds(ctypes.LittleEndianStructure):
    """DEVICE_GET_REGION_IO_FDS request and reply head (then `count` sub-regions)."""
    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("count", _u32)]


class WireDeviceInfo(ctypes.LittleEndianStructure):
    """struct vfio_device_info as DEVICE_GET_INFO carries it (argsz first); the device
    API's own answer is gpuvm.vfio.device.DeviceInfo."""
    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("num_regions", _u32),
                ("num_irqs", _u32)]


class WireRegionInfo(ctypes.LittleEndianStructure):
    """struct vfio_region_info as DEVICE_GET_REGION_INFO carries it; a reply may carry its
    capability chain after it.  The device API's own answer is
    gpuvm.vfio.device.RegionInfo."""
    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("cap_offset", _u32),
                ("size", _u64), ("offset", _u64)]


class WireIrqInfo(ctypes.LittleEndianStructure):
    """struct vfio_irq_info as DEVICE_GET_IRQ_INFO carries it; the device API's own
    answer is gpuvm.vfio.device.IrqInfo."""
    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("count", _u32)]


class IrqSet(ctypes.LittleEndianStructure):
    """DEVICE_SET_IRQS' payload: which interrupts of an index to set up, then their eventfds."""

    _pack_ = 1
    _fields_ = [("argsz", _u32), ("flags", _u32), ("index", _u32), ("start", _u32),
                ("count", _u32)]


class RegionAccess(ctypes.LittleEndianStructure):
    """REGION_READ/WRITE: followed by `count` data bytes (a write request, a read reply)."""
    _pack_ = 1
    _fields_ = [("offset", _u64), ("region", _u32), ("count", _u32)]


class MappingListen(ctypes.LittleEndianStructure):
    """GPUVM_MAPPING_LISTEN request: 1 = send me grants (and replay the current ones),
    0 = stop (every grant is revoked first)."""
    _pack_ = 1
    _fields_ = [("enable", _u32)]


MAPPING_UNMAP = 0
MAPPING_MAP = 1
MAPPING_TRAP = 2  # stores to [offset, +size) must each reach the device (MappingListener.post)
MAPPING_POST = 3  # ... may wait, in order, for the guest's next exit


class MappingEvent(ctypes.LittleEndianStructure):
    """GPUVM_MAPPING_EVENT: map `size` bytes at `offset` of BAR `region` onto bytes
    [fd_offset, fd_offset + size) of the region's mmap fd (kind MAP), or unmap them; or
    (kinds POST / TRAP, fd_offset 0) say whether stores there may queue."""
    _pack_ = 1
    _fields_ = [("region", _u32), ("kind", _u32), ("offset", _u64), ("fd_offset", _u64),
                ("size", _u64)]


STATS_COUNTERS, STATS_FAULTS, STATS_DEVICE_TIME = 1, 2, 4
STATS_SERVER_TIME = 8  # the server's time on this connection: its accesses, its channels
# ... as the client's counters name them
SERVER_ACCESS_COUNTER, SERVER_ENGINE_COUNTER = "server.access_ns", "server.engine_ns"
STATS_ALL = STATS_COUNTERS | STATS_FAULTS | STATS_DEVICE_TIME


class DeviceStatsRequest(ctypes.LittleEndianStructure):
    """GPUVM_DEVICE_STATS request: which parts to return (STATS_*; an empty payload means
    all); a guest's fence wait asks for the faults alone on every check."""
    _pack_ = 1
    _fields_ = [("what", _u32)]


# GPUVM_CLOCK ops: what the VMM reports of its vCPU on the server's virtual clock (see
# gpuvm/vfio/user/vcpu_clock.py, where each is handled)
CLOCK_START = 1  # the guest starts: this connection's thread is its vCPU from now
CLOCK_EXIT = 2  # an exit the server sees nothing of (a port the VMM answers itself)
CLOCK_NOW = 3  # the vCPU's state (a phase mark reads its time)
CLOCK_SETTLE = 4  # close the current exit (the guest ends)
CLOCK_WAIT = 5  # the guest begins to wait on its GPU
CLOCK_BLOCK = 6  # ... and sleeps, unless the GPU signalled since generation `arg`
CLOCK_AWAKE = 7  # the wait is over
CLOCK_END = 8  # the guest ended: the vCPU leaves the clock
CLOCK_OPS = {CLOCK_START: "START", CLOCK_EXIT: "EXIT", CLOCK_NOW: "NOW",
             CLOCK_SETTLE: "SETTLE", CLOCK_WAIT: "WAIT", CLOCK_BLOCK: "BLOCK",
             CLOCK_AWAKE: "AWAKE", CLOCK_END: "END"}


class ClockRequest(ctypes.LittleEndianStructure):
    """GPUVM_CLOCK request: one CLOCK_* op and its argument (BLOCK's generation)."""
    _pack_ = 1
    _fields_ = [("op", _u32), ("pad", _u32), ("arg", _u64)]


class ClockState(ctypes.LittleEndianStructure):
    """GPUVM_CLOCK reply: the vCPU's virtual time (ns), its GPU's signal generation, and
    its waits for the mediator's lock so far (how many, how long in virtual ns)."""
    _pack_ = 1
    _fields_ = [("v", _u64), ("generation", _u64), ("lock_waits", _u64),
                ("lock_wait_ns", _u64)]


HEADER_SIZE = ctypes.sizeof(Header)
assert HEADER_SIZE == 16

# The same layouts as precompiled structs, for the per-access path (a trapped BAR access
# is one REGION_READ/WRITE and its reply): packing a struct.Struct costs a fraction of
# building a ctypes structure and copying it to bytes.  The ctypes classes above stay the
# reference the tests compare against; these must agree with them (asserted below).
HEADER = struct.Struct("<HHIII")
ACCESS = struct.Struct("<QII")  # RegionAccess
assert HEADER.size == HEADER_SIZE and ACCESS.size == ctypes.sizeof(RegionAccess)
# A whole REGION_READ/WRITE message in one struct: header + RegionAccess (a write's
# request, a read's request, a write's reply), and the same + the value in the sizes a
# register access has (a write's request, a read's reply): one pack or one unpack per
# message on either side.
ACCESS_MESSAGE = struct.Struct("<HHIIIQII")
VALUE_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
ACCESS_WITH_VALUE = {n: struct.Struct(ACCESS_MESSAGE.format + c) for n, c in VALUE_CODES.items()}
VALUE = {n: struct.Struct("<" + c) for n, c in VALUE_CODES.items()}
VALUE_MASK = {n: (1 << 8 * n) - 1 for n in VALUE_CODES}
assert ACCESS_MESSAGE.size == HEADER_SIZE + ACCESS.size
# REGION_WRITE_MULTI (the spec's): the payload is {u64 wr_cnt} and wr_cnt of these, {u64
# offset, u32 region, u32 count (1..8), u8 data[8]} -- a REGION_WRITE's access and its
# data, always 8 bytes (read here as one little-endian u64, of which `count` bytes count);
# the reply is {u64 wr_cnt}, the writes done
WRITE_MULTI_COUNT = struct.Struct("<Q")
WRITE_MULTI_RECORD = struct.Struct("<QIIQ")
# the same records as numpy reads a whole message of them at once
WRITE_MULTI_RECORDS = np.dtype([("offset", "<u8"), ("region", "<u4"), ("count", "<u4"),
                                ("value", "<u8")])
assert WRITE_MULTI_RECORDS.itemsize == WRITE_MULTI_RECORD.size
MAX_POSTED_STORES = 4096  # records a client puts in one (a KVM coalesced ring holds 170)


class ProtocolError(VfioError):
    """The peer broke the protocol (malformed, oversized, wrong reply, hung up)."""


class MessageHeader(NamedTuple):
    """A received header, decoded (the fields of `Header`)."""
    msg_id: int
    command: int
    size: int
    flags: int
    error: int


@dataclass(slots=True)
class Message:
    """One whole message read from a socket: its header, payload and the fds that came with it."""

    header: MessageHeader
    payload: bytes
    fds: list[int] = field(default_factory=list)

    @property
    def command(self) -> int:
        return self.header.command

    @property
    def is_reply(self) -> bool:
        return self.header.flags & TYPE_MASK == TYPE_REPLY


def encode(msg_id: int, command: int, payload: bytes = b"", flags: int = TYPE_COMMAND,
           error: int = 0) -> bytes:
    return HEADER.pack(msg_id & 0xFFFF, command, HEADER_SIZE + len(payload), flags,
                       error) + payload


def send(sock: socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """One message; its fds ride on the first bytes (SCM_RIGHTS)."""
    if fds:
        sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                      array.array("i", fds))])
        data = data[sent:]
    if data:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes:
    buf = bytearray()
    space = socket.CMSG_SPACE(MAX_MSG_FDS * array.array("i").itemsize)
    while len(buf) < n:
        chunk, ancillary, _flags, _addr = sock.recvmsg(n - len(buf), space)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[:len(data) - len(data) % got.itemsize])
                fds.extend(got)
        if not chunk:
            if buf or fds:
                raise ProtocolError(f"peer hung up inside a message ({len(buf)} of {n} "
                                    f"bytes)")
            raise EOFError
        buf += chunk
    return bytes(buf)


def receive(sock: socket.socket, max_size: int = MAX_MESSAGE_SIZE) -> Message:
    """The next message; EOFError when the peer hung up between messages,
    ProtocolError (with the header read, when there was one) when it is malformed."""
    fds: list[int] = []
    raw = _recv_exact(sock, HEADER_SIZE, fds)
    header = MessageHeader._make(HEADER.unpack(raw))
    if header.size < HEADER_SIZE or header.size > max_size:
        for fd in fds:
            _close(fd)
        err = ProtocolError(f"message {header.msg_id} ({COMMAND_NAMES.get(header.command, header.command)}) "
                            f"declares size {header.size}; allowed {HEADER_SIZE}..{max_size}")
        err.header = header  # type: ignore[attr-defined]
        raise err
    payload = _recv_exact(sock, header.size - HEADER_SIZE, fds) if header.size > HEADER_SIZE \
        else b""
    return Message(header, payload, fds)


class MessageReader:
    """Messages from one socket, read with as few system calls as possible: one recvmsg
    usually brings a whole message (often the next one's start too, which waits in the
    buffer).  Fds arrive with the first byte of the message they belong to; the sender
    sends each message's fds with its first bytes, so they are given to the message
    being assembled when they arrive.

    The per-access paths (a client awaiting the reply to a REGION_READ/WRITE, a server
    awaiting the next command) take one read with `read_one` and decode it themselves
    when it is exactly the message they expect; anything else goes back with `push` and
    is read as messages by `receive`."""

    READ_SIZE = 1 << 16

    def __init__(self, sock: socket.socket, max_size: int = MAX_MESSAGE_SIZE,
                 spin_s: float = 0.0) -> None:
        self.sock = sock
        self.spin_s = spin_s
        self.max_size = max_size
        self._buf = bytearray()
        self._fds: list[int] = []
        self._space = socket.CMSG_SPACE(MAX_MSG_FDS * array.array("i").itemsize)

    def _read(self, fds: bool, size: int = READ_SIZE, flags: int = 0) -> bytes:
        """One read.  fds=False reads without room for ancillary data -- cheaper, which a
        trapped access pays on each reply -- for a reader that expects no fds: any that
        come anyway are closed by the kernel (MSG_CTRUNC), never leaked."""
        if not fds:
            return self.sock.recv(size, flags)
        chunk, ancillary, _flags, _addr = self.sock.recvmsg(size, self._space, flags)
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(data[:len(data) - len(data) % got.itemsize])
                self._fds.extend(got)
        return chunk

    def next_chunk(self, fds: bool = True, size: int = READ_SIZE) -> bytes:
        """One read of at most `size` bytes (polling first for spin_s), not buffered: the
        caller buffers it or decodes it.  Fds that came with it wait in the channel.
        EOFError when the peer hung up between messages."""
        chunk = self._poll_read(fds, size) if self.spin_s else self._read(fds, size)
        if not chunk:
            if self._buf or self._fds:
                raise ProtocolError(f"peer hung up inside a message ({len(self._buf)} "
                                    f"bytes buffered)")
            raise EOFError
        return chunk

    def read_one(self, fds: bool, size: int = READ_SIZE) -> bytes | None:
        """For the per-access paths: one read of at most `size` bytes (polling first for
        spin_s), returned unbuffered for the caller to decode, or to give back with
        `push`.  None when bytes or fds of an earlier read wait in the buffer (nothing is
        read then) or when fds came with this read (then it waits in the buffer with
        them): `receive` takes over.  EOFError when the peer hung up."""
        if self._buf or self._fds:
            return None
        if self.spin_s:
            chunk = self._poll_read(fds, size)
        else:
            chunk = self._read(True, size) if fds else self.sock.recv(size)
        if not chunk:
            if self._fds:
                for fd in self._fds:
                    _close(fd)
                self._fds.clear()
                raise ProtocolError("peer hung up after sending fds")
            raise EOFError
        if self._fds:
            self._buf += chunk
            return None
        return chunk

    def _poll_read(self, fds: bool, size: int) -> bytes:
        """A reply usually comes within microseconds; sleeping in recvmsg for it costs a
        wake-up, which in a virtual machine is an interprocessor interrupt and several
        times the round trip.  So try to read for spin_s first, then block.  Each try is
        the read itself: a failed one raises BlockingIOError (~1 µs), but asking poll(2)
        first costs a second system call on every message, which measured slower
        (gpuvm bench vfio-user, 2 cores polling: +0.3-0.5 µs a round trip)."""
        recv, clock = self.sock.recv, time.perf_counter
        deadline = clock() + self.spin_s
        while True:
            try:
                if fds:
                    return self._read(True, size, socket.MSG_DONTWAIT)
                return recv(size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if clock() >= deadline:
                    return self._read(fds, size)

    def push(self, chunk: bytes) -> None:
        """Give back what `read_one` or `read_now` returned: `receive` reads it as
        messages."""
        self._buf += chunk

    @property
    def idle(self) -> bool:
        """Nothing buffered: the next byte read starts a message."""
        return not self._buf and not self._fds

    def _fill(self, fds: bool = True) -> None:
        self._buf += self.next_chunk(fds)

    def read_now(self) -> bytes:
        """`next_chunk` without polling (the caller knows the socket is readable)."""
        spin, self.spin_s = self.spin_s, 0.0
        try:
            return self.next_chunk()
        finally:
            self.spin_s = spin

    def buffered(self) -> Message | None:
        """The next message if the buffer holds all of it, else None (no system call)."""
        if len(self._buf) < HEADER_SIZE:
            return None
        size = int.from_bytes(self._buf[4:8], "little")
        if HEADER_SIZE <= size <= self.max_size and len(self._buf) < size:
            return None
        return self.receive()  # complete, or malformed: receive() raises

    def receive(self, fds: bool = True) -> Message:
        """As `receive(sock)`: EOFError between messages, ProtocolError if malformed.
        fds=False: the caller expects a message without fds (see `_read`)."""
        while len(self._buf) < HEADER_SIZE:
            self._fill(fds)
        header = MessageHeader._make(HEADER.unpack_from(self._buf))
        if header.size < HEADER_SIZE or header.size > self.max_size:
            for fd in self._fds:
                _close(fd)
            self._fds.clear()
            err = ProtocolError(f"message {header.msg_id} "
                                f"({COMMAND_NAMES.get(header.command, header.command)}) "
                                f"declares size {header.size}; allowed "
                                f"{HEADER_SIZE}..{self.max_size}")
            err.header = header  # type: ignore[attr-defined]
            raise err
        while len(self._buf) < header.size:
            self._fill(fds)
        payload = bytes(self._buf[HEADER_SIZE:header.size])
        del self._buf[:header.size]
        fds, self._fds = self._fds, []
        return Message(header, payload, fds)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def unpack(cls: type[ctypes.Structure], payload: bytes, what: str) -> ctypes.Structure:
    """The fixed structure at the start of a payload, or ProtocolError if it is short."""
    need = ctypes.sizeof(cls)
    if len(payload) < need:
        raise ProtocolError(f"{what}: payload of {len(payload)} bytes, needs {need}")
    return cls.from_buffer_copy(payload)
