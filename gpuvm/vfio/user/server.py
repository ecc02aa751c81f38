"""A vfio-user server: any VfioDevice (and its DeviceStats) behind one connected socket.

One `DeviceServer` per connection, handled by one thread: it answers each command in
order (the spec lets a client pipeline; the device sees the accesses in that order).
Every command is answered, as QEMU's docs/interop/vfio-user.rst asks: a refusal -- by
the device, by the checks here (region and IRQ indices, access sizes and bounds, argsz,
flags), a malformed payload, a command of the spec gpuvm does not offer, an unknown one,
an extension that was not negotiated -- is an error reply with an errno, and the
connection goes on.  It is closed (only this one) where the stream cannot go on: a
header whose size is below 16 bytes or above MAX_MESSAGE_SIZE (nothing after it can be
framed), a command before VERSION, a major version the server does not speak.  When the
client goes away, cleanly or killed, `on_disconnect` runs after the device has been
told: interrupts cleared and their eventfds closed, the mapping listener dropped, every
DMA mapping unmapped.  What each command does is tabled in gpuvm/vfio/user/__init__.py.

Memory:
- DMA_MAP carries the fd of the client's RAM; the server maps it (MAP_SHARED) and hands
  the view to `device.dma_map`, so the device reads and writes guest memory directly.
- A mappable region's GET_REGION_INFO reply to a client with the mapping extension
  carries the fd of the memory behind it (the memfd of the vGPU's own VRAM partition);
  `memory` translates the host addresses the device grants into offsets of that fd for
  GPUVM_MAPPING_EVENT (see gpuvm/vfio/user/__init__.py).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import mmap
import os
import selectors
import socket
import stat
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import numpy as np

from gpuvm.vfio import abi, caps
from gpuvm.vfio.device import VALUE_MASKS, PostedStores, RegionInfo, VfioError
from gpuvm.vfio.user import protocol as p
from gpuvm.vfio.user.vcpu_clock import ServedVcpu

log = logging.getLogger(__name__)

SERVER_CAPABILITIES = {"max_msg_fds": p.MAX_MSG_FDS,
                       "max_data_xfer_size": p.MAX_DATA_XFER_SIZE,
                       "max_dma_maps": p.MAX_DMA_MAPS,
                       "pgsizes": mmap.PAGESIZE, p.WRITE_MULTIPLE_KEY: True}

# The per-access path's layouts and constants, bound here once: looking each up in
# `protocol` on every message was a measurable part of a round trip
_ACCESS_MESSAGE, _ACCESS_WITH_VALUE = p.ACCESS_MESSAGE, p.ACCESS_WITH_VALUE
_VALUE, _VALUE_MASK, _WHOLE = p.VALUE, p.VALUE_MASK, p.ACCESS_MESSAGE.size
_READ, _WRITE, _COMMAND, _REPLY = p.REGION_READ, p.REGION_WRITE, p.TYPE_COMMAND, p.TYPE_REPLY
_MULTI_COUNT, _RECORD = p.WRITE_MULTI_COUNT, p.WRITE_MULTI_RECORD
_RECORDS = p.WRITE_MULTI_RECORDS
# a REGION_WRITE_MULTI value's mask by its count, for the counts a device takes whole
_WHOLE_COUNT = np.array([n in _VALUE_MASK for n in range(9)])


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

    def post(self, region: int, offset: int, size: int, allowed: bool) -> None:
        kind = p.MAPPING_POST if allowed else p.MAPPING_TRAP
        self.server.notify(p.MappingEvent(region, kind, offset, 0, size))


class DeviceServer:
    """Serves `device` on the connected socket `sock` (see the module docstring)."""

    def __init__(self, sock: socket.socket, device: Any, stats: Any = None,
                 memory: SharedMemory | None = None, name: str = "vfio-user",
                 on_disconnect: Callable[["DeviceServer"], None] | None = None,
                 extensions: tuple[str, ...] = p.EXTENSIONS) -> None:
        self.sock = sock
        self.device = device
        self.stats = stats if stats is not None else device
        self.memory = memory
        self.name = name
        self.on_disconnect = on_disconnect
        self.negotiated = False
        self.offered = frozenset(extensions)  # gpuvm extensions this server offers
        self.extensions: set[str] = set()  # ... and those the client asked for too
        # what VERSION learnt of the device: its regions, and for the access path the
        # size of each region that may be read / written (absent: it may not)
        self._regions: dict[int, RegionInfo] = {}
        self._read_limit: dict[int, int] = {}
        self._write_limit: dict[int, int] = {}
        self._write_limits = np.zeros(1, dtype=np.uint64)
        self._num_irqs = 0
        self.refusals = 0  # commands answered with an error (or dropped replies)
        self._send_lock = threading.Lock()
        self.channel = p.MessageReader(sock, spin_s=p.SPIN_S)  # serve(): poll, then sleep
        self._dma: dict[int, tuple[int, mmap.mmap]] = {}  # iova -> (size, mapping)
        self._irq_fds: dict[tuple[int, int], int] = {}  # (index, vector) -> eventfd
        self._irq_lock = threading.Lock()  # _irq_fds against a clock's waker
        # on a virtual clock: the VM's vCPU (use_clock), and what each access that
        # reaches the device does first -- the vCPU's tick once the guest started
        self.vcpu: ServedVcpu | None = None
        self._exit: Callable[[], None] | None = None
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

    def use_clock(self, party: Any) -> None:
        """The VM's vCPU is `party` (a GuestParty of the server's virtual clock), driven
        by this connection's accesses and GPUVM_CLOCK ops (gpuvm/vfio/user/vcpu_clock.py).
        Needs a thread of its own (`start`): a vCPU waits for its turn at the lock."""
        self.vcpu = ServedVcpu(party)
        party.waker = self._look_again

    def _look_again(self) -> None:
        """Wake the VMM's wait to look again (the clock woke its sleeping vCPU: its GPU
        signalled), as an interrupt would: its MSI eventfd (any thread; must not block)."""
        with self._irq_lock:
            fd = self._irq_fds.get((abi.VFIO_PCI_MSI_IRQ_INDEX, 0))
            if fd is not None:
                try:
                    os.eventfd_write(fd, 1)
                except OSError:
                    pass

    def _ended(self) -> None:
        raise _errno(VfioError("an access after the guest ended"), errno.EINVAL)

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
            if self.vcpu is not None:
                self.vcpu.retire()  # a VMM gone mid-run: only its vCPU leaves
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
        for index in sorted({k[0] for k in self._irq_fds}):
            try:
                self.device.set_irqs(index, 0, [])
            except VfioError:
                pass
        self._listening = False
        try:
            self.device.set_mapping_listener(None)
        except VfioError:
            pass
        for iova in list(self._dma):
            self._unmap_dma(iova, self._dma[iova][0])
        with self._irq_lock:
            for fd in self._irq_fds.values():
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
        (1, 2, 4 or 8 bytes) inside a region that allows it: the message every trapped
        access sends, decoded with one unpack, checked with one dict lookup and answered
        with one pack.  False (nothing done, nothing sent) for anything else -- another
        command, a no-reply flag, more or less than one message, a count the sizes do
        not agree with, an access outside its region -- which `_handle` then answers or
        refuses as the general path does."""
        if len(chunk) < _WHOLE or not self.negotiated:
            return False
        msg_id, command, size, flags, _, offset, region, count = \
            _ACCESS_MESSAGE.unpack_from(chunk)
        if size != len(chunk) or flags != _COMMAND:
            return False
        try:
            if command == _WRITE:
                value_layout = _VALUE.get(count)
                if value_layout is None or size != _WHOLE + count or \
                        offset + count > self._write_limit.get(region, 0):
                    return False
                self._answered_access = True
                if self._exit is not None:
                    self._exit()
                self.device.write(region, offset, count,
                                  value_layout.unpack_from(chunk, _WHOLE)[0])
                reply = _ACCESS_MESSAGE.pack(msg_id, _WRITE, _WHOLE, _REPLY, 0, offset, region,
                                             count)
            elif command == _READ:
                layout = _ACCESS_WITH_VALUE.get(count)
                if layout is None or size != _WHOLE or \
                        offset + count > self._read_limit.get(region, 0):
                    return False
                self._answered_access = True
                if self._exit is not None:
                    self._exit()
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
        """A command refused (by the device or by the checks here): an error reply
        (unless none is wanted), and the connection goes on."""
        self.refusals += 1
        log.info("%s: %s refused: %s", self.name, p.COMMAND_NAMES.get(h.command, h.command),
                 exc)
        if not h.flags & p.FLAG_NO_REPLY:
            self._error(h, getattr(exc, "errno", None) or errno.EINVAL)

    def _handle(self, msg: p.Message) -> bool:
        """Answer one message; False when the connection must close.  Every command gets
        a reply (an error reply when it is refused, unsupported or unknown) and the
        connection goes on; it closes only when the spec says so (a command before
        VERSION, a major version the server does not speak).  Fds that came with a
        message and were not kept by its command are closed here."""
        h = msg.header
        name = p.COMMAND_NAMES.get(h.command, str(h.command))
        try:
            if msg.is_reply or h.flags & p.TYPE_MASK != p.TYPE_COMMAND:
                # this server sends no command that awaits a reply: a stray reply (or a
                # type the spec does not define) answers nothing and is dropped
                self.refusals += 1
                log.info("%s: dropped an unexpected %s message (flags %#x)", self.name,
                         name, h.flags)
                return True
            if not self.negotiated and h.command != p.VERSION:
                self._error(h, errno.EINVAL)
                self.disconnect_reason = f"{name} before VERSION"
                return False
            handler = self._HANDLERS.get(h.command)
            if h.command in (p.REGION_READ, p.REGION_WRITE):
                self._answered_access = True
            try:
                if handler is None:
                    raise _errno(VfioError(f"command {h.command} is not in the spec"),
                                 errno.ENOSYS)
                payload, fds = handler(self, msg)
            except _HangUp as exc:
                self._error(h, exc.errno)
                self.disconnect_reason = f"{name}: {exc}"
                log.warning("%s: %s; closing the connection", self.name, exc)
                return False
            except VfioError as exc:  # a ProtocolError too: the payload was malformed
                self._refused(h, exc)
                return True
            if not h.flags & p.FLAG_NO_REPLY:
                self._reply(h, payload, fds)
            return True
        finally:
            for fd in msg.fds:
                _close(fd)

    # ---------------------------------------------------------------- checks
    def _region(self, index: int, what: str) -> RegionInfo:
        info = self._regions.get(index)
        if info is None:
            raise _errno(VfioError(f"{what}: no region {index} (the device has "
                                   f"{len(self._regions)})"), errno.EINVAL)
        return info

    def _argsz(self, argsz: int, need: int, what: str) -> None:
        if argsz < need:
            raise _errno(VfioError(f"{what}: argsz {argsz} is below the {need} bytes of "
                                   f"the reply"), errno.EINVAL)

    def _wire_region_info(self, info: RegionInfo) -> RegionInfo:
        """The region as this client may see it: sparse areas (and the MMAP flag, and the
        fd that comes with them) only for a client that negotiated the mapping
        extension -- gpuvm's fd is a vGPU's VRAM partition, whose pages the device grants
        one by one (GPUVM_MAPPING_EVENT), not the region's contents at region offsets as
        a standard client would map them."""
        if "mapping" in self.extensions or not (info.sparse or info.mappable):
            return info
        return replace(info, sparse=(), flags=info.flags & ~(
            abi.VFIO_REGION_INFO_FLAG_MMAP | abi.VFIO_REGION_INFO_FLAG_CAPS))

    # ---------------------------------------------------------------- commands
    def _version(self, msg: p.Message) -> tuple[bytes, list[int]]:
        v = p.unpack(p.VersionPayload, msg.payload, "VERSION")
        if self.negotiated:
            raise VfioError("VERSION sent again after the negotiation")
        if v.major != p.VERSION_MAJOR:
            raise _HangUp(f"VERSION major {v.major} (the server speaks {p.VERSION_MAJOR})",
                          errno.ENOTSUP)
        proposed: Any = {}
        text = msg.payload[ctypes.sizeof(p.VersionPayload):].split(b"\0", 1)[0]
        if text:
            try:
                proposed = json.loads(text.decode())
            except (UnicodeDecodeError, ValueError):
                raise VfioError("VERSION data is not UTF-8 JSON") from None
            if not isinstance(proposed, dict):
                raise VfioError("VERSION data is not a JSON object")
        client_caps = proposed.get("capabilities", {})
        if not isinstance(client_caps, dict):
            raise VfioError("VERSION capabilities is not a JSON object")
        wanted = client_caps.get(p.EXTENSIONS_KEY, [])
        if not isinstance(wanted, list):
            raise VfioError(f"VERSION capability {p.EXTENSIONS_KEY!r} is not a list")
        info = self.device.get_info()
        self._regions = {i: self.device.get_region_info(i) for i in range(info.num_regions)}
        self._num_irqs = info.num_irqs
        self._read_limit = {i: r.size for i, r in self._regions.items() if r.readable}
        self._write_limit = {i: r.size for i, r in self._regions.items() if r.writable}
        # the same by region index, for a whole REGION_WRITE_MULTI at once (last: 0)
        self._write_limits = np.zeros(max(self._regions, default=0) + 2, dtype=np.uint64)
        for i, size in self._write_limit.items():
            self._write_limits[i] = size
        self.extensions = {e for e in wanted if e in self.offered}
        reply_caps: dict[str, Any] = dict(SERVER_CAPABILITIES)
        if self.extensions:
            reply_caps[p.EXTENSIONS_KEY] = sorted(self.extensions)
        self.negotiated = True
        body = json.dumps({"capabilities": reply_caps}, sort_keys=True).encode() + b"\0"
        return bytes(p.VersionPayload(p.VERSION_MAJOR,
                                      min(v.minor, p.VERSION_MINOR))) + body, []

    def _dma_map(self, msg: p.Message) -> tuple[bytes, list[int]]:
        m = p.unpack(p.DmaMap, msg.payload, "DMA_MAP")
        where = f"DMA_MAP [{m.address:#x}, +{m.size:#x})"
        if len(msg.fds) != 1:
            raise _errno(VfioError(f"{where} came with {len(msg.fds)} fds; gpuvm maps only "
                                   f"fd-backed memory (one fd)"), errno.EINVAL)
        if m.flags & ~(p.DMA_FLAG_READ | p.DMA_FLAG_WRITE):
            raise _errno(VfioError(f"{where}: unknown flags {m.flags:#x}"), errno.EINVAL)
        if not m.size or m.size % mmap.PAGESIZE or m.offset % mmap.PAGESIZE or \
                m.address % mmap.PAGESIZE or m.address + m.size > 1 << 64:
            raise _errno(VfioError(f"{where} at fd offset {m.offset:#x} is empty, not "
                                   f"page-aligned or wraps"), errno.EINVAL)
        for start, (size, _) in self._dma.items():
            if start < m.address + m.size and m.address < start + size:
                raise _errno(VfioError(f"{where} overlaps the mapping at {start:#x}"),
                             errno.EEXIST)
        if len(self._dma) >= p.MAX_DMA_MAPS:
            raise _errno(VfioError(f"{where}: {p.MAX_DMA_MAPS} mappings are held already "
                                   f"(max_dma_maps)"), errno.ENOSPC)
        fd = msg.fds.pop()
        try:
            _check_backing(fd, m.offset + m.size, where)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if m.flags & p.DMA_FLAG_WRITE else 0)
            try:
                mapping = mmap.mmap(fd, m.size, flags=mmap.MAP_SHARED, prot=prot,
                                    offset=m.offset)
            except (OSError, ValueError, OverflowError) as exc:
                raise VfioError(f"{where}: cannot map the client's fd: {exc}") from None
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
        """The mappings inside [address, address + size) are let go (the spec: it must
        match a mapping; gpuvm also takes a range that covers several whole ones, as
        VFIO's type1 IOMMU does); with DMA_UNMAP_FLAG_ALL (address and size 0) every
        mapping is.  The reply is the request's DMA entry."""
        u = p.unpack(p.DmaUnmap, msg.payload, "DMA_UNMAP")
        where = f"DMA_UNMAP [{u.address:#x}, +{u.size:#x})"
        if u.flags == p.DMA_UNMAP_FLAG_ALL:
            if u.address or u.size:
                raise _errno(VfioError(f"{where}: unmap-all takes address and size 0"),
                             errno.EINVAL)
            for start in sorted(self._dma):
                self._unmap_dma(start, self._dma[start][0])
        elif u.flags & p.DMA_UNMAP_FLAG_GET_DIRTY_BITMAP:
            raise _errno(VfioError(f"{where}: gpuvm keeps no dirty bitmap"), errno.ENOTSUP)
        elif u.flags:
            raise _errno(VfioError(f"{where}: unknown flags {u.flags:#x}"), errno.EINVAL)
        else:
            end = u.address + u.size
            inside = [s for s, (n, _) in self._dma.items() if u.address <= s and s + n <= end]
            cut = [s for s, (n, _) in self._dma.items()
                   if s < end and u.address < s + n and s not in inside]
            if not inside or cut:
                raise _errno(VfioError(f"{where} matches no whole mapping"
                                       if not cut else f"{where} cuts the mapping at "
                                       f"{cut[0]:#x}"), errno.EINVAL)
            for start in inside:
                self._unmap_dma(start, self._dma[start][0])
        return msg.payload[:ctypes.sizeof(p.DmaUnmap)], []

    def _get_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        req = p.unpack(p.WireDeviceInfo, msg.payload, "DEVICE_GET_INFO")
        self._argsz(req.argsz, ctypes.sizeof(p.WireDeviceInfo), "DEVICE_GET_INFO")
        info = self.device.get_info()
        return bytes(p.WireDeviceInfo(ctypes.sizeof(p.WireDeviceInfo), info.flags,
                                      info.num_regions, info.num_irqs)), []

    def _get_region_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """argsz in the reply is the size the whole answer needs; when the client's argsz
        is smaller only the structure comes (the client asks again), and the region's
        fd comes only with the whole answer."""
        req = p.unpack(p.WireRegionInfo, msg.payload, "DEVICE_GET_REGION_INFO")
        self._argsz(req.argsz, caps.REGION_INFO_SIZE, "DEVICE_GET_REGION_INFO")
        self._region(req.index, "DEVICE_GET_REGION_INFO")
        info = self._wire_region_info(self.device.get_region_info(req.index))
        whole = caps.encode_region_info(info, 1 << 16)
        if req.argsz < len(whole):
            fixed = p.WireRegionInfo.from_buffer_copy(whole)
            fixed.argsz, fixed.cap_offset = len(whole), 0
            return bytes(fixed), []
        fixed = p.WireRegionInfo.from_buffer_copy(whole)
        fixed.argsz = len(whole)
        fds = [self.memory.fd] if info.mappable and self.memory is not None else []
        return bytes(fixed) + whole[caps.REGION_INFO_SIZE:], fds

    def _get_region_io_fds(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """gpuvm offers no ioeventfd or ioregionfd: the answer names no sub-region."""
        req = p.unpack(p.RegionIoFds, msg.payload, "DEVICE_GET_REGION_IO_FDS")
        self._argsz(req.argsz, ctypes.sizeof(p.RegionIoFds), "DEVICE_GET_REGION_IO_FDS")
        self._region(req.index, "DEVICE_GET_REGION_IO_FDS")
        return bytes(p.RegionIoFds(ctypes.sizeof(p.RegionIoFds), 0, req.index, 0)), []

    def _get_irq_info(self, msg: p.Message) -> tuple[bytes, list[int]]:
        req = p.unpack(p.WireIrqInfo, msg.payload, "DEVICE_GET_IRQ_INFO")
        self._argsz(req.argsz, ctypes.sizeof(p.WireIrqInfo), "DEVICE_GET_IRQ_INFO")
        if req.index >= self._num_irqs:
            raise _errno(VfioError(f"DEVICE_GET_IRQ_INFO: no IRQ index {req.index} (the "
                                   f"device has {self._num_irqs})"), errno.EINVAL)
        info = self.device.get_irq_info(req.index)
        return bytes(p.WireIrqInfo(ctypes.sizeof(p.WireIrqInfo), info.flags, info.index,
                               info.count)), []

    def _set_irqs(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """Eventfds to signal (DATA_EVENTFD | ACTION_TRIGGER, one fd a vector), or the
        index's eventfds taken away (the same without fds, or DATA_NONE with count 0).
        gpuvm's interrupts are not maskable and a client cannot trigger them: MASK,
        UNMASK, DATA_BOOL and a DATA_NONE trigger are refused (ENOTSUP).  A vector's
        eventfd that is replaced or taken away is closed here."""
        s = p.unpack(p.IrqSet, msg.payload, "DEVICE_SET_IRQS")
        if s.index >= self._num_irqs:
            raise _errno(VfioError(f"DEVICE_SET_IRQS: no IRQ index {s.index}"), errno.EINVAL)
        trigger_eventfd = abi.VFIO_IRQ_SET_DATA_EVENTFD | abi.VFIO_IRQ_SET_ACTION_TRIGGER
        disable = s.flags == abi.VFIO_IRQ_SET_DATA_NONE | abi.VFIO_IRQ_SET_ACTION_TRIGGER \
            and s.count == 0 or s.flags == trigger_eventfd and not msg.fds
        if disable:
            self.device.set_irqs(s.index, 0, [])
            with self._irq_lock:
                for key in [k for k in self._irq_fds if k[0] == s.index]:
                    _close(self._irq_fds.pop(key))
            return b"", []
        if s.flags != trigger_eventfd:
            raise _errno(VfioError(f"DEVICE_SET_IRQS flags {s.flags:#x}: gpuvm takes "
                                   f"eventfd triggers and their removal only"), errno.ENOTSUP)
        if len(msg.fds) != s.count:
            raise _errno(VfioError(f"DEVICE_SET_IRQS count {s.count} with {len(msg.fds)} "
                                   f"fds"), errno.EINVAL)
        fds = list(msg.fds)
        self.device.set_irqs(s.index, s.start, fds)
        msg.fds.clear()  # the device holds them now
        with self._irq_lock:
            for vector, fd in enumerate(fds, s.start):
                old = self._irq_fds.get((s.index, vector))
                self._irq_fds[(s.index, vector)] = fd
                if old is not None:
                    _close(old)
        return b"", []

    def _access(self, msg: p.Message, write: bool) -> tuple[bytes, list[int]]:
        """Any count from 1 to max_data_xfer_size inside a region that allows the access:
        a register's size (1, 2, 4, 8) is one device access, as on the fast path; any
        other count is the naturally aligned accesses of at most 4 bytes that cover it,
        in address order (config space read in bulk is its registers read one by one)."""
        name = "REGION_WRITE" if write else "REGION_READ"
        payload = msg.payload
        if len(payload) < p.ACCESS.size:
            raise p.ProtocolError(f"{name}: payload of {len(payload)} bytes, needs "
                                  f"{p.ACCESS.size}")
        offset, region, count = p.ACCESS.unpack_from(payload)
        data = payload[p.ACCESS.size:]
        where = f"{name} of {count} bytes at {offset:#x} of region {region}"
        if not 0 < count <= p.MAX_DATA_XFER_SIZE:
            raise _errno(VfioError(f"{where}: count must be 1..{p.MAX_DATA_XFER_SIZE}"),
                         errno.EINVAL)
        if write and len(data) != count:
            raise p.ProtocolError(f"{where} with {len(data)} data bytes")
        if not write and data:
            raise p.ProtocolError(f"{where}: the request carries {len(data)} data bytes")
        info = self._region(region, name)
        limit = (self._write_limit if write else self._read_limit).get(region)
        if limit is None:
            raise _errno(VfioError(f"{where}: the region is not "
                                   f"{'writable' if write else 'readable'}"), errno.EINVAL)
        if offset + count > info.size:
            raise _errno(VfioError(f"{where} runs past its {info.size:#x} bytes"),
                         errno.EINVAL)
        head = payload[:p.ACCESS.size]  # the reply echoes offset, region and count
        pieces = [(offset, count)] if count in _VALUE else _pieces(offset, count)
        if self._exit is not None:
            self._exit()
        if write:
            for at, n in pieces:
                self.device.write(region, at, n, int.from_bytes(
                    data[at - offset:at - offset + n], "little"))
            return head, []
        out = bytearray()
        for at, n in pieces:
            out += (self.device.read(region, at, n) & _VALUE_MASK[n]).to_bytes(n, "little")
        return head + bytes(out), []

    def _region_read(self, msg: p.Message) -> tuple[bytes, list[int]]:
        return self._access(msg, False)

    def _region_write(self, msg: p.Message) -> tuple[bytes, list[int]]:
        return self._access(msg, True)

    def _reset(self, msg: p.Message) -> tuple[bytes, list[int]]:
        if msg.payload:
            raise p.ProtocolError(f"DEVICE_RESET carries {len(msg.payload)} payload bytes")
        self.device.reset()
        return b"", []

    def _unsupported(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """A command of the spec that gpuvm does not offer (see the table in
        gpuvm/vfio/user/__init__.py): refused with ENOTSUP, the connection kept."""
        name = p.COMMAND_NAMES.get(msg.command, msg.command)
        raise _errno(VfioError(f"{name} is not supported by gpuvm"), errno.ENOTSUP)

    def _wrong_direction(self, msg: p.Message) -> tuple[bytes, list[int]]:
        name = p.COMMAND_NAMES.get(msg.command, msg.command)
        raise _errno(VfioError(f"{name} goes from server to client"), errno.EINVAL)

    def _extension(self, msg: p.Message, extension: str) -> None:
        if extension not in self.extensions:
            name = p.COMMAND_NAMES.get(msg.command, msg.command)
            raise _errno(VfioError(f"{name}: the {extension!r} extension was not "
                                   f"negotiated"), errno.ENOSYS)

    def _mapping_listen(self, msg: p.Message) -> tuple[bytes, list[int]]:
        self._extension(msg, "mapping")
        req = p.unpack(p.MappingListen, msg.payload, "GPUVM_MAPPING_LISTEN")
        if req.enable:
            self._listening = True
            self.device.set_mapping_listener(_ForwardingListener(self))
        else:
            self.device.set_mapping_listener(None)
            self._listening = False
        return b"", []

    def _stats(self, msg: p.Message) -> tuple[bytes, list[int]]:
        self._extension(msg, "stats")
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

    def _clock(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """GPUVM_CLOCK: one op of the VM's vCPU (gpuvm/vfio/user/vcpu_clock.py)."""
        self._extension(msg, "clock")
        req = p.unpack(p.ClockRequest, msg.payload, "GPUVM_CLOCK")
        vcpu = self.vcpu
        if vcpu is None:
            raise _errno(VfioError("GPUVM_CLOCK: this device is not on a virtual clock"),
                         errno.EINVAL)
        state = vcpu.handle(req.op, req.arg)
        self._exit = self._ended if vcpu.ended else vcpu.exit if vcpu.started else None
        return bytes(state), []

    def _write_multi(self, msg: p.Message) -> tuple[bytes, list[int]]:
        """REGION_WRITE_MULTI (the spec's, offered as "write_multiple"): several writes in
        one message -- gpuvm's VMM sends each drain of KVM's coalesced ring as one.  Each
        record is handed to the device in order exactly as the REGION_WRITE of its count
        would be (the vCPU's exit first, on a virtual clock), so each is still one
        trapped access of the modelled system; only the messages are fewer.  Every
        record is checked first: a malformed message (wr_cnt not the records that follow,
        none, a count outside 1..8, a write outside a writable region) is refused whole
        with EINVAL.  A write the device refuses ends the batch: the reply's wr_cnt says
        how many were done (an error reply where none was)."""
        payload = msg.payload
        n, rest = divmod(len(payload) - _MULTI_COUNT.size, _RECORD.size)
        if n < 1 or rest or _MULTI_COUNT.unpack_from(payload)[0] != n:
            raise _errno(VfioError(f"REGION_WRITE_MULTI: {len(payload)} payload bytes are "
                                   f"not wr_cnt and that many {_RECORD.size}-byte writes"),
                         errno.EINVAL)
        rec = np.frombuffer(payload, dtype=_RECORDS, count=n, offset=_MULTI_COUNT.size)
        offsets, regions, counts = rec["offset"], rec["region"], rec["count"]
        limits = self._write_limits
        limit = limits[np.minimum(regions, len(limits) - 1)]  # the last: 0, no region
        # (checked whole before any is done; offset > limit first: no u64 wrap after)
        bad = (counts - 1 > 7) | (offsets > limit) | (offsets + counts > limit)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise _errno(VfioError(f"REGION_WRITE_MULTI write {i}: {counts[i]} bytes at "
                                   f"{int(offsets[i]):#x} of region {regions[i]} is not "
                                   f"inside a writable region"), errno.EINVAL)
        self._answered_access = True
        exit_, write, masks = self._exit, self.device.write, _VALUE_MASK
        many = getattr(self.device, "write_many", None)
        whole = bool(_WHOLE_COUNT[counts].all())  # no count needs pieces
        values = rec["value"] & VALUE_MASKS[counts] if whole else rec["value"]
        done = 0
        try:
            if many is not None and whole:
                # the device takes them in order, each one trapped write (VfioDevice)
                many(PostedStores(regions, offsets, counts, values), exit_)
                done = n
            else:
                for offset, region, count, value in zip(offsets.tolist(), regions.tolist(),
                                                        counts.tolist(), values.tolist()):
                    if exit_ is not None:
                        exit_()
                    if count in masks:
                        write(region, offset, count, value & masks[count])
                    else:  # as REGION_WRITE takes it: aligned pieces, one access
                        for at, size in _pieces(offset, count):
                            write(region, at, size, value >> 8 * (at - offset) & masks[size])
                    done += 1
        except VfioError as exc:
            done = getattr(exc, "done", done)
            if not done:
                raise
            self.refusals += 1
            log.info("%s: REGION_WRITE_MULTI stopped after %d of %d writes: %s", self.name,
                     done, n, exc)
        return _MULTI_COUNT.pack(done), []

    _HANDLERS: dict[int, Callable[["DeviceServer", p.Message], tuple[bytes, list[int]]]] = {
        p.VERSION: _version, p.DMA_MAP: _dma_map, p.DMA_UNMAP: _dma_unmap,
        p.DEVICE_GET_INFO: _get_info, p.DEVICE_GET_REGION_INFO: _get_region_info,
        p.DEVICE_GET_REGION_IO_FDS: _get_region_io_fds,
        p.DEVICE_GET_IRQ_INFO: _get_irq_info, p.DEVICE_SET_IRQS: _set_irqs,
        p.REGION_READ: _region_read, p.REGION_WRITE: _region_write,
        p.DMA_READ: _wrong_direction, p.DMA_WRITE: _wrong_direction,
        p.DEVICE_RESET: _reset, p.REGION_WRITE_MULTI: _write_multi,
        p.DEVICE_FEATURE: _unsupported, p.MIG_DATA_READ: _unsupported,
        p.MIG_DATA_WRITE: _unsupported, p.GPUVM_MAPPING_LISTEN: _mapping_listen,
        p.GPUVM_DEVICE_STATS: _stats, p.GPUVM_CLOCK: _clock}


class _HangUp(VfioError):
    """A refusal after which the spec has the server close the connection."""

    def __init__(self, message: str, number: int) -> None:
        super().__init__(message)
        self.errno = number


def _pieces(offset: int, count: int) -> list[tuple[int, int]]:
    """[offset, offset + count) as naturally aligned pieces of 4, 2 or 1 bytes."""
    out = []
    end = offset + count
    while offset < end:
        n = 4
        while offset % n or offset + n > end:
            n //= 2
        out.append((offset, n))
        offset += n
    return out


def _check_backing(fd: int, end: int, where: str) -> None:
    """The client's fd must hold the bytes it maps: touching a page past the end of a
    file is SIGBUS, which would take the whole server down.  A memfd is sealed against
    shrinking here (where its owner allows seals), so it cannot be cut short later."""
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise VfioError(f"{where}: the fd cannot be examined: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _errno(VfioError(f"{where}: the fd is not a file or memfd"), errno.EINVAL)
    if st.st_size < end:
        raise _errno(VfioError(f"{where}: the fd holds {st.st_size:#x} bytes, the mapping "
                               f"ends at {end:#x}"), errno.EINVAL)
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    except OSError:
        pass  # not a memfd, or its seals are sealed: a file the client could still cut


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
