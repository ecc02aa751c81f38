"""A vfio-user server: any VfioDevice (and its DeviceStats) behind one connected socket.

One `DeviceServer` per connection, handled by one thread: it answers each command in
order (the spec lets a client pipeline; the device sees the accesses in that order).
Refusals the device makes (VfioError) become error replies and the connection goes on;
a message the server cannot parse -- wrong sizes, a header that declares more than
MAX_MESSAGE_SIZE, a command before VERSION, an unknown command -- gets an error reply
and the connection is closed (only this one).  When the client goes away, cleanly or
killed, `on_disconnect` runs after the device has been told: interrupts cleared, the
mapping listener dropped, every DMA mapping unmapped and its fd closed.

Memory:
- DMA_MAP carries the fd of the client's RAM; the server maps it (MAP_SHARED) and hands
  the view to `device.dma_map`, so the device reads and writes guest memory directly.
- A mappable region's GET_REGION_INFO reply carries the fd of the memory behind it (the
  memfd of the vGPU's own VRAM partition); `memory` translates the host addresses the device grants into offsets of
  that fd for GPUVM_MAPPING_EVENT (see gpuvm/vfio/user/__init__.py).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import mmap
import os
import selectors
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from gpuvm.vfio import abi, caps
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.user import protocol as p

log = logging.getLogger(__name__)

SERVER_CAPABILITIES = {"max_msg_fds": p.MAX_MSG_FDS,
                       "max_data_xfer_size": p.MAX_DATA_XFER_SIZE,
                       "pgsizes": mmap.PAGESIZE}
GPUVM_EXTENSIONS = ["mapping", "stats"]

# The per-access path's layouts and constants, bound here once: looking each up in
# `protocol` on every message was a measurable part of a round trip
_ACCESS_MESSAGE, _ACCESS_WITH_VALUE = p.ACCESS_MESSAGE, p.ACCESS_WITH_VALUE
_VALUE, _VALUE_MASK, _WHOLE = p.VALUE, p.VALUE_MASK, p.ACCESS_MESSAGE.size
_READ, _WRITE, _COMMAND, _REPLY = p.REGION_READ, p.REGION_WRITE, p.TYPE_COMMAND, p.TYPE_REPLY


@dataclass(frozen=True)
class SharedMemory:
    """Host memory the server may hand out by fd: [address, address + size) of this
    process is bytes [0, size) of `fd`."""

    address: int
    size: int
    fd: int

    def offset_of(self, address: int, size: int) -> int | None:
        if self.address <= address and address + size <= self.address + self.size:
            return address - self.address
        return None


class _ForwardingListener:
    """The device's MappingListener on the server side: each grant or revoke becomes a
    GPUVM_MAPPING_EVENT message to the client."""

    def __init__(self, server: "DeviceServer") -> None:
        self.server = server

    def map(self, region: int, offset: int, host_address: int, size: int) -> None:
        fd_offset = self.server.memory.offset_of(host_address, size) \
            if self.server.memory else None
        if fd_offset is None:
            raise VfioError(f"region {region}: granted memory at {host_address:#x} is not "
                            f"in the shared memory the server hands out")
        self.server.notify(p.MappingEvent(region, p.MAPPING_MAP, offset, fd_offset, size))

    def unmap(self, region: int, offset: int, size: int) -> None:
        self.server.notify(p.MappingEvent(region, p.MAPPING_UNMAP, offset, 0, size))


class DeviceServer:
    """Serves `device` on the connected socket `sock` (see the module docstring)."""

    def __init__(self, sock: socket.socket, device: Any, stats: Any = None,
                 memory: SharedMemory | None = None, name: str = "vfio-user",
                 on_disconnect: Callable[["DeviceServer"], None] | None = None) -> None:
        self.sock = sock
        self.device = device
        self.stats = stats if stats is not None else device
        self.memory = memory
        self.name = name
        self.on_disconnect = on_disconnect
        self.negotiated = False
        self.extensions: set[str] = set()
        self._send_lock = threading.Lock()
        self.channel = p.Channel(sock, spin_s=p.SPIN_S)  # serve(): poll, then sleep
        self._dma: dict[int, tuple[int, mmap.mmap]] = {}  # iova -> (size, mapping)
        self._irq_fds: list[int] = []
        self._listening = False
        self._notify_id = 0
        self.thread: threading.Thread | None = None
        self.closed = threading.Event()
        self.disconnect_reason = ""
        # time this connection's register accesses kept the serving thread busy --
        # from the wait that returned them (its system call) to the reply sent --
        # reported under STATS_SERVER_TIME: a VM in another process learns from it
        # which part of each trap's round trip the server, one thread for every VM,
        # spent on it
        self.access_ns = 0
        self._answered_access = False

    def served_ns(self) -> tuple[int, int]:
        """The server's time on this device so far: answering its register accesses,
        and running its channels (a vGPU's; 0 for a device that does not say)."""
        engine = getattr(self.stats, "engine_host_ns", None)
        return self.access_ns, engine() if engine is not None else 0

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> "DeviceServer":
        self.thread = threading.Thread(target=self.serve, name=f"vfio-user {self.name}",
                                       daemon=True)
        self.thread.start()
        return self

    def serve(self) -> None:
        """Answer commands until the client hangs up or breaks the protocol."""
        channel, answer_access = self.channel, self._answer_access
        since = 0
        try:
            while True:
                try:
                    self._count_access(since)
                    chunk = channel.read_one(True)
                    since = time.perf_counter_ns()  # the wait itself is idle
                    if chunk is not None:
                        if answer_access(chunk):
                            continue
                        channel.push(chunk)
                    msg = channel.receive()
                    if chunk is None:
                        since = time.perf_counter_ns()  # it slept in there
                except EOFError:
                    self.disconnect_reason = "client hung up"
                    return
                except p.ProtocolError as exc:
                    header = getattr(exc, "header", None)
                    if header is not None:
                        self._error(header, errno.E2BIG)
                    self.disconnect_reason = str(exc)
                    log.warning("%s: %s; closing the connection", self.name, exc)
                    return
                if not self._handle(msg):
                    return
        except OSError as exc:
            self.disconnect_reason = f"socket error: {exc}"
        finally:
            self._teardown()

    def _count_access(self, since: int) -> None:
        """Charge the time since `since` to this connection's accesses if what was
        answered since then was one."""
        if self._answered_access:
            self.access_ns += time.perf_counter_ns() - since
            self._answered_access = False

    def on_readable(self, since: int | None = None) -> bool:
        """For a `ServerLoop`: read what arrived and answer every whole message in it;
        False once the connection is closed (torn down).  `since`: when the loop began
        the wait that returned this connection (its time is charged from there)."""
        try:
            return self._on_readable()
        finally:
            self._count_access(time.perf_counter_ns() if since is None else since)

    def _on_readable(self) -> bool:
        try:
            try:
                chunk = self.channel.read_now()
                if self.channel.idle and self._answer_access(chunk):
                    return True
                self.channel.push(chunk)
                while (msg := self.channel.buffered()) is not None:
                    if not self._handle(msg):
                        break
                else:
                    return True
            except EOFError:
                self.disconnect_reason = "client hung up"
            except p.ProtocolError as exc:
                header = getattr(exc, "header", None)
                if header is not None:
                    self._error(header, errno.E2BIG)
                self.disconnect_reason = str(exc)
                log.warning("%s: %s; closing the connection", self.name, exc)
        except OSError as exc:
            self.disconnect_reason = f"socket error: {exc}"
        self._teardown()
        return False

    def _teardown(self) -> None:
        try:
            self._release_device()
        finally:
            try:
                self.sock.close()
            finally:
                try:
                    if self.on_disconnect is not None:
                        self.on_disconnect(self)
                finally:
                    self.closed.set()

    def _release_device(self) -> None:
        """What the spec asks on client disconnect: its memory and eventfds let go."""
        try:
            self.device.set_irqs(abi.VFIO_PCI_MSI_IRQ_INDEX, 0, [])
        except VfioError:
            pass
        self._listening = False
        try:
            self.device.set_mapping_listener(None)
        except VfioError:
            pass
        for iova in list(self._dma):
            self._unmap_dma(iova, self._dma[iova][0])
        for fd in self._irq_fds:
            _close(fd)
        self._irq_fds.clear()

    # ---------------------------------------------------------------- sending
    def _reply(self, request: p.Header, payload: bytes = b"", fds: list[int] = ()) -> None:
        with self._send_lock:
            p.send(self.sock, p.encode(request.msg_id, request.command, payload,
                                       p.TYPE_REPLY), fds)

    def _error(self, request: p.Header, error: int) -> None:
        with self._send_lock:
            p.send(self.sock, p.encode(request.msg_id, request.command, b"",
                                       p.TYPE_REPLY | p.FLAG_ERROR, error))

    def notify(self, event: p.MappingEvent) -> None:
        if not self._listening:
            return
        with self._send_lock:
            self._notify_id = (self._notify_id + 1) & 0xFFFF
            try:
                p.send(self.sock, p.encode(self._notify_id, p.GPUVM_MAPPING_EVENT,
                                           bytes(event), p.TYPE_COMMAND | p.FLAG_NO_REPLY))
            except OSError:
                pass  # the client is gone; teardown follows on the receive side

    # ---------------------------------------------------------------- dispatch
    def _answer_access(self, chunk: bytes) -> bool:
        """Answer `chunk` when it is exactly one REGION_READ/WRITE of a register's size
        (1, 2, 4 or 8 bytes) that needs no check beyond its sizes: the message every
        trapped access sends, decoded with one unpack and answered with one pack.  False
        (nothing done, nothing sent) for anything else -- another command, a no-reply
        flag, more or less than one message, a count the sizes do not agree with --
        which `_handle` then answers or refuses as the general path does."""
        if len(chunk) < _WHOLE or not self.negotiated:
            return False
        msg_id, command, size, flags, _, offset, region, count = \
            _ACCESS_MESSAGE.unpack_from(chunk)
        if size != len(chunk) or flags != _COMMAND:
            return False
        self._answered_access = True
        try:
            if command == _WRITE:
                value_layout = _VALUE.get(count)
                if value_layout is None or size != _WHOLE + count:
                    return False
                self.device.write(region, offset, count,
                                  value_layout.unpack_from(chunk, _WHOLE)[0])
                reply = _ACCESS_MESSAGE.pack(msg_id, _WRITE, _WHOLE, _REPLY, 0, offset, region,
                                             count)
            elif command == _READ:
                layout = _ACCESS_WITH_VALUE.get(count)
                if layout is None or size != _WHOLE:
                    return False
                value = self.device.read(region, offset, count)
                reply = layout.pack(msg_id, _READ, _WHOLE + count, _REPLY, 0, offset, region,
                                    count, value & _VALUE_MASK[count])
            else:
                return False
        except VfioError as exc:
            self._refused(p.MessageHeader(msg_id, command, size, flags, 0), exc)
            return True
        with self._send_lock:
            sent = self.sock.send(reply)
            if sent < len(reply):
                self.sock.sendall(reply[sent:])
        return True

    def _refused(self, h: p.MessageHeader, exc: VfioError) -> None:
        """The device refused a command: an error reply (unless none is wanted), and the
        connection goes on."""
        log.info("%s: %s refused: %s", self.name, p.COMMAND_NAMES.get(h.command, h.command),
                 exc)
        if not h.flags & p.FLAG_NO_REPLY:
            self._error(h, getattr(exc, "errno", None) or errno.EINVAL)

    def _handle(self, msg: p.Message) -> bool:
        """Answer one message; False when the connection must close."""
        h = msg.header
        name = p.COMMAND_NAMES.get(h.command, str(h.command))
        if msg.is_reply:
            self._error(h, errno.EINVAL)
            self.disconnect_reason = f"unexpected reply {name}"
            return False
        if not self.negotiated and h.command != p.VERSION:
            self._error(h, errno.EINVAL)
            self.disconnect_reason = f"{name} before VERSION"
            return False
        handler = self._HANDLERS.get(h.command)
        if handler is None or (h.command >= 0x8000 and not self.extensions):
            self._error(h, errno.ENOSYS)
            self.disconnect_reason = f"unknown command {name}"
            for fd in msg.fds:
                _close(fd)
            return False
        if h.command in (p.REGION_READ, p.REGION_WRITE):
            self._answered_access = True
        try:
            payload, fds = handler(self, msg)
        except p.ProtocolError as exc:
            for fd in msg.fds:
                _close(fd)
            self._error(h, errno.EINVAL)
            self.disconnect_reason = f"{name}: {exc}"
            log.warning("%s: malformed %s (%s); closing the connection", self.name, name, exc)
            return False
        except VfioError as exc:
            self._refused(h, exc)
            return True
        if not h.flags & p.FLAG_NO_REPLY:
            self._reply(h, payload, fds)
        return True

    # ---------------------------------------------------------------- commands
    def _version(self, msg: p.Message) -> tuple[bytes, list[int]]:
        v = p.unpack(p.VersionPayload, msg.payload, "VERSION")
        if self.negotiated:
            raise p.ProtocolError("VERSION sent twice")
        if v.major != p.VERSION_MAJOR:
            raise p.ProtocolError(f"VERSION major {v.major} (server speaks "
                                  f"{p.VERSION_MAJOR})")
        proposed: dict = {}
        data = msg.payload[4:]
        if data:
            text = data.split(b"\0", 1)[0]
            try:
                proposed = json.loads(text.decode()) if text else {}
            except (UnicodeDecodeError, ValueError):
                raise p.ProtocolError("VERSION data is not JSON") from None
            if not isinstance(proposed, dict):
                raise p.ProtocolError("VERSION data is not a JSON object")
        client_caps = proposed.get("capabilities", {}) or {}
        reply_caps: dict[str, Any] = dict(SERVER_CAPABILITIES)
        if isinstance(client_caps, dict):
            wanted = client_caps.get("gpuvm")
            if isinstance(wanted, list):
                self.extensions = {e for e in wanted if e in GPUVM_EXTENSIONS}
                if self.extensions:
                    reply_caps["gpuvm"] = sorted(self.extensions)
        self.negotiated = True
        body = json.dumps({"capabilities": reply_caps}, sort_keys=True).encode() + b"\0"
        return bytes(p.VersionPayload(p.VERSION_MAJOR,
                                      min(v.minor, p.VERSION_MINOR))) + body, []

    def _dma_map(self, msg: p.Message) -> tuple[bytes, list[int]]:
        m = p.unpack(p.DmaMap, msg.payload, "DMA_MAP")
        if len(msg.fds) != 1:
            for fd in msg.fds:
                _close(fd)
            raise VfioError(f"DMA_MAP of [{m.address:#x}, +{m.size:#x}) came with "
                            f"{len(msg.fds)} fds; gpuvm maps only fd-backed memory")
        fd = msg.fds[0]
        try:
            if m.address in self._dma:
                raise _errno(VfioError(f"DMA_MAP at {m.address:#x} overlaps a mapping"),
                             errno.EEXIST)
            if not m.size or m.size % mmap.PAGESIZE or m.offset % mmap.PAGESIZE:
                raise VfioError(f"DMA_MAP size {m.size:#x} / offset {m.offset:#x} not "
                                f"page-aligned")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if m.flags & p.DMA_FLAG_WRITE else 0)
            try:
                mapping = mmap.mmap(fd, m.size, flags=mmap.MAP_SHARED, prot=prot,
                                    offset=m.offset)
            except (OSError, ValueError) as exc:
                raise VfioError(f"DMA_MAP cannot map the client's fd: {exc}") from None
        finally:
            _close(fd)
        flags = (abi.VFIO_DMA_MAP_FLAG_READ if m.flags & p.DMA_FLAG_READ else 0) | \
            (abi.VFIO_DMA_MAP_FLAG_WRITE if m.flags & p.DMA_FLAG_WRITE else 0)
        view = np.frombuffer(mapping, dtype=np.uint8)  # read-only unless PROT_WRITE
        try:
            self.device.dma_map(m.address, view, flags)
        except VfioError:
            del view
            _close_map(mapping)
            raise
        self._dma[m.address] = (m.size, mapping)
        return b"", []

    def _unmap_dma(self, iova: int, size: int) -> None:
        self.device.dma_unmap(iova, size)
        for start in [s for s, (n, _) in self._dma.items() if iova <= s and s + n <= iova + size]:
            _close_map(self._dma.pop(start)[1])

    def _dma_unmap(self, msg: p.Message) -> tuple[bytes, list[int]]:
        u = p.unpack(p.DmaUnmap, msg.payload, "DMA_UNMAP")
        self._unmap_dma(u.address, u.size)
        return bytes(p.DmaUnmap(ctypes.sizeof(p.DmaUnmap), u.flags, u.address, u.size)), []

    def _get_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        p.unpack(p.DeviceInfo, msg.payload, "DEVICE_GET_INFO")
        info = self.device.get_info()
        return bytes(p.DeviceInfo(ctypes.sizeof(p.DeviceInfo), info.flags, info.num_regions,
                                  info.num_irqs)), []

    def _get_region_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        req = p.unpack(p.RegionInfo, msg.payload, "DEVICE_GET_REGION_INFO")
        info = self.device.get_region_info(req.index)
        reply = caps.encode_region_info(info, max(req.argsz, caps.REGION_INFO_SIZE))
        fds = [self.memory.fd] if info.mappable and self.memory is not None else []
        # argsz in a reply is the size needed: the structure, plus the chain if it fits
        fixed = p.RegionInfo.from_buffer_copy(reply)
        if fixed.cap_offset:
            fixed.argsz = len(reply)
        elif not fixed.flags & abi.VFIO_REGION_INFO_FLAG_CAPS:
            fixed.argsz = caps.REGION_INFO_SIZE
        return bytes(fixed) + reply[caps.REGION_INFO_SIZE:], fds

    def _get_irq_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        req = p.unpack(p.IrqInfo, msg.payload, "DEVICE_GET_IRQ_INFO")
        info = self.device.get_irq_info(req.index)
        return bytes(p.IrqInfo(ctypes.sizeof(p.IrqInfo), info.flags, info.index,
                               info.count)), []

    def _set_irqs(self, msg: p.Message) -> tuple[bytes, list[int]]:
        s = p.unpack(p.IrqSet, msg.payload, "DEVICE_SET_IRQS")
        fds = list(msg.fds)
        trigger_eventfd = abi.VFIO_IRQ_SET_DATA_EVENTFD | abi.VFIO_IRQ_SET_ACTION_TRIGGER
        if s.flags == trigger_eventfd and fds:
            if len(fds) != s.count:
                for fd in fds:
                    _close(fd)
                raise p.ProtocolError(f"SET_IRQS count {s.count} with {len(fds)} fds")
            try:
                self.device.set_irqs(s.index, s.start, fds)
            except VfioError:
                for fd in fds:
                    _close(fd)
                raise
            self._irq_fds.extend(fds)
            return b"", []
        for fd in fds:
            _close(fd)
        if s.flags in (abi.VFIO_IRQ_SET_DATA_NONE | abi.VFIO_IRQ_SET_ACTION_TRIGGER,
                       trigger_eventfd) and s.count == 0:
            self.device.set_irqs(s.index, 0, [])
            return b"", []
        raise VfioError(f"SET_IRQS flags {s.flags:#x} are not supported (eventfd trigger "
                        f"or disable only)")

    def _access(self, msg: p.Message, write: bool) -> tuple[bytes, list[int]]:
        name = "REGION_WRITE" if write else "REGION_READ"
        payload = msg.payload
        if len(payload) < p.ACCESS.size:
            raise p.ProtocolError(f"{name}: payload of {len(payload)} bytes, needs "
                                  f"{p.ACCESS.size}")
        offset, region, count = p.ACCESS.unpack_from(payload)
        data = payload[p.ACCESS.size:]
        if count > p.MAX_DATA_XFER_SIZE:
            raise p.ProtocolError(f"{name} count {count} exceeds max_data_xfer_size")
        if write and len(data) != count:
            raise p.ProtocolError(f"{name} count {count} with {len(data)} data bytes")
        if not write and data:
            raise p.ProtocolError(f"{name} request carries {len(data)} data bytes")
        if count not in (1, 2, 4, 8):
            raise VfioError(f"{name} of {count} bytes: gpuvm devices take 1, 2, 4 or 8")
        head = payload[:p.ACCESS.size]  # the reply echoes offset, region and count
        if write:
            self.device.write(region, offset, count, int.from_bytes(data, "little"))
            return head, []
        value = self.device.read(region, offset, count)
        return head + (value & ((1 << (8 * count)) - 1)).to_bytes(count, "little"), []

    def _region_read(self, msg: p.Message) -> tuple[bytes, list[int]]:
        return self._access(msg, False)

    def _region_write(self, msg: p.Message) -> tuple[bytes, list[int]]:
        return self._access(msg, True)

    def _reset(self, msg: p.Message) -> tuple[bytes, list[int]]:
        if msg.payload:
            raise p.ProtocolError(f"DEVICE_RESET carries {len(msg.payload)} payload bytes")
        self.device.reset()
        return b"", []

    def _mapping_listen(self, msg: p.Message) -> tuple[bytes, list[int]]:
        if "mapping" not in self.extensions:
            raise p.ProtocolError("GPUVM_MAPPING_LISTEN without the mapping extension")
        req = p.unpack(p.MappingListen, msg.payload, "GPUVM_MAPPING_LISTEN")
        if req.enable:
            self._listening = True
            self.device.set_mapping_listener(_ForwardingListener(self))
        else:
            self.device.set_mapping_listener(None)
            self._listening = False
        return b"", []

    def _stats(self, msg: p.Message) -> tuple[bytes, list[int]]:
        if "stats" not in self.extensions:
            raise p.ProtocolError("GPUVM_DEVICE_STATS without the stats extension")
        what = p.unpack(p.DeviceStatsRequest, msg.payload, "GPUVM_DEVICE_STATS").what \
            if msg.payload else p.STATS_ALL
        body: dict[str, Any] = {}
        if what & p.STATS_COUNTERS:
            body["counters"] = self.stats.counters()
        if what & p.STATS_FAULTS:
            body["faults"] = [asdict(f) for f in self.stats.faults()]
        if what & p.STATS_DEVICE_TIME:
            body["device_time_ns"] = self.stats.device_time_ns()
        if what & p.STATS_SERVER_TIME:
            body["server_access_ns"], body["server_engine_ns"] = self.served_ns()
        return json.dumps(body).encode(), []

    _HANDLERS: dict[int, Callable[["DeviceServer", p.Message], tuple[bytes, list[int]]]] = {
        p.VERSION: _version, p.DMA_MAP: _dma_map, p.DMA_UNMAP: _dma_unmap,
        p.DEVICE_GET_INFO: _get_info, p.DEVICE_GET_REGION_INFO: _get_region_info,
        p.DEVICE_GET_IRQ_INFO: _get_irq_info, p.DEVICE_SET_IRQS: _set_irqs,
        p.REGION_READ: _region_read, p.REGION_WRITE: _region_write,
        p.DEVICE_RESET: _reset, p.GPUVM_MAPPING_LISTEN: _mapping_listen,
        p.GPUVM_DEVICE_STATS: _stats}


def _errno(exc: VfioError, number: int) -> VfioError:
    exc.errno = number  # type: ignore[attr-defined]
    return exc


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _close_map(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        pass  # the device still holds a view; the mapping goes with it


class ServerLoop:
    """Serves many connections from one thread (epoll): in a process that serves several
    VMs, one thread answering every socket spares the interpreter-lock hand-offs that a
    thread per connection pays on each message.  Device calls never block (the mediator
    queues submissions), so one slow VM cannot stall the others' traps."""

    def __init__(self, name: str = "vfio-user loop") -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._adding: list[DeviceServer] = []
        self._lock = threading.Lock()
        self._stop = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def add(self, server: DeviceServer) -> DeviceServer:
        with self._lock:
            self._adding.append(server)
        os.write(self._wake_w, b"\0")
        return server

    def _run(self) -> None:
        clock = time.perf_counter_ns
        while not self._stop:
            # `since`: when the wait that returned the events began (a poll's system
            # call is the server's work; a sleep is not), then when the last answer ended
            since = clock()
            events = self._selector.select(0) if p.SPIN_S else []
            if not events and p.SPIN_S:  # poll a little before sleeping (protocol.SPIN_S)
                deadline = time.perf_counter() + p.SPIN_S
                while not events and time.perf_counter() < deadline:
                    since = clock()
                    events = self._selector.select(0)
            if not events:
                events = self._selector.select()
                since = clock()
            for key, _ in events:
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    with self._lock:
                        adding, self._adding = self._adding, []
                    for server in adding:
                        self._selector.register(server.sock, selectors.EVENT_READ, server)
                    continue
                server = key.data
                readable = server.on_readable(since)
                since = clock()
                if not readable:
                    try:
                        self._selector.unregister(key.fileobj)
                    except (KeyError, ValueError):
                        pass
        self._selector.close()

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"\0")
        self.thread.join(10)
        os.close(self._wake_r)
        os.close(self._wake_w)
