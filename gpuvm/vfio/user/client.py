"""`VfioUserDevice`: the VfioDevice (and DeviceStats) protocol spoken over a vfio-user
socket, so `gpuvm/vmm/vfio_attach.attach` attaches a device in another process unchanged.

Each call is one command and its reply (a lock keeps a VM's vCPU thread and its run loop
from interleaving).  While it waits for a reply the client answers the commands the
server sends first: DMA_READ/DMA_WRITE of the memory it DMA-mapped (a server that does
its DMA by message, as the spec allows, does it while it handles a command), and
GPUVM_MAPPING_EVENT -- the device grants BAR pages while it handles the access that made
them safe, so the grant reaches the VM's memslots before the access returns, exactly
when an in-process listener would have run.  A server's command that comes while no
call waits is answered by `serve_requests`.

gpuvm's extensions (gpuvm/vfio/user/__init__.py) are asked for in VERSION and used only
if the server's reply lists them too: against a standard server (libvfio-user's) no
mapping listener is installed (its regions trap, or map by the spec's sparse areas), and
the lab's counters are the client's own (no device counters, no channel faults, no
device clock: `counters` holds the VMM's memslots alone, `faults` is empty and
`device_time_ns` 0).

DMA_MAP needs the fd behind the memory it maps: `share(address, size, fd)` names memory
the client may hand over (the VMM shares its guest RAM memfd before attaching); mapping
anything else is refused, as QEMU refuses to DMA-map RAM it cannot pass by fd.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import select
import socket
import threading
from typing import Any, Callable

import numpy as np

from gpuvm.device.faults import ChannelFault
from gpuvm.vfio import abi, caps
from gpuvm.vfio.device import (DeviceInfo, IrqInfo, MappingListener, PostedStores, RegionInfo,
                               VfioError)
from gpuvm.vfio.user import protocol as p
from gpuvm.vfio.user.server import SharedMemory

CLIENT_CAPABILITIES = {"max_msg_fds": p.MAX_MSG_FDS,
                       "max_data_xfer_size": p.MAX_DATA_XFER_SIZE}

# The only replies that bring fds (a mappable region's memory, io fds); others are read
# without room for ancillary data (protocol.MessageReader._read)
REPLIES_WITH_FDS = frozenset({p.DEVICE_GET_REGION_INFO, p.DEVICE_GET_REGION_IO_FDS})

# The per-access path's layouts and constants, bound here once: looking each up in
# `protocol` on every access was a measurable part of a round trip
_ACCESS_MESSAGE, _ACCESS_WITH_VALUE = p.ACCESS_MESSAGE, p.ACCESS_WITH_VALUE
_VALUE, _VALUE_MASK, _WHOLE = p.VALUE, p.VALUE_MASK, p.ACCESS_MESSAGE.size
_READ, _WRITE, _COMMAND, _REPLY = p.REGION_READ, p.REGION_WRITE, p.TYPE_COMMAND, p.TYPE_REPLY
_MULTI_COUNT = p.WRITE_MULTI_COUNT


class VfioUserDevice:
    """A device served over `sock` (connected); see the module docstring."""

    def __init__(self, sock: socket.socket, name: str = "vfio-user",
                 extensions: tuple[str, ...] = p.EXTENSIONS,
                 write_multiple: bool = True) -> None:
        self.sock = sock
        self.name = name
        self.asked = tuple(extensions)  # the gpuvm extensions this client offers
        self._lock = threading.RLock()
        self._channel = p.MessageReader(sock, spin_s=p.SPIN_S)
        self._msg_id = 0
        self._shared: list[SharedMemory] = []
        self._listener: MappingListener | None = None
        self._grants: dict[tuple[int, int], tuple[int, int]] = {}  # (region, off) -> fd
        self._region_fds: dict[int, int] = {}  # region -> its mmap fd
        self._region_maps: dict[int, tuple[mmap.mmap, int]] = {}  # fd -> (map, address)
        self._dma: dict[int, tuple[int, int, int]] = {}  # iova -> (address, size, flags)
        self._closed = False
        self.server_capabilities = self._negotiate()
        offered = self.server_capabilities.get(p.EXTENSIONS_KEY, [])
        # used only when both sides offered it
        self.extensions = frozenset(e for e in self.asked
                                    if isinstance(offered, list) and e in offered)
        # posted stores in one REGION_WRITE_MULTI (write_many) where the server says so
        self.write_multiple = write_multiple and \
            self.server_capabilities.get(p.WRITE_MULTIPLE_KEY) is True

    @classmethod
    def connect(cls, path: str, name: str = "", extensions: tuple[str, ...] = p.EXTENSIONS,
                write_multiple: bool = True) -> "VfioUserDevice":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise VfioError(f"cannot connect to vfio-user socket {path}: "
                            f"{exc.strerror}") from None
        return cls(sock, name or path, extensions, write_multiple)

    # ---------------------------------------------------------------- transport
    def _next_msg_id(self) -> int:
        """The id of the next command (the lock is held)."""
        if self._closed:
            raise self._closed_error()
        self._msg_id = (self._msg_id + 1) & 0xFFFF
        return self._msg_id

    def _closed_error(self) -> VfioError:
        return VfioError(f"{self.name}: the device is closed")

    def _call(self, command: int, payload: bytes = b"",
              fds: list[int] | tuple[int, ...] = ()) -> p.Message:
        with self._lock:
            msg_id = self._next_msg_id()
            try:
                p.send(self.sock, p.encode(msg_id, command, payload), fds)
                msg = self._await_reply(msg_id, command, command in REPLIES_WITH_FDS)
            except EOFError:
                raise VfioError(f"{self.name}: the vfio-user server hung up") from None
            except OSError as exc:
                raise VfioError(f"{self.name}: vfio-user socket: {exc}") from None
            return self._accepted(msg, command)

    def _await_reply(self, msg_id: int, command: int, with_fds: bool) -> p.Message:
        """The reply to `msg_id`, answering the server's commands that come ahead of it."""
        while True:
            msg = self._channel.receive(with_fds)
            if not msg.is_reply:
                self._server_command(msg)
                continue
            if msg.header.msg_id != msg_id or msg.command != command:
                raise p.ProtocolError(
                    f"{self.name}: expected the reply to {msg_id} "
                    f"({p.COMMAND_NAMES.get(command)}), got message "
                    f"{msg.header.msg_id} command {msg.command}")
            return msg

    def _accepted(self, msg: p.Message, command: int) -> p.Message:
        """`msg`, or VfioError when it is an error reply."""
        if msg.header.flags & p.FLAG_ERROR:
            for fd in msg.fds:
                os.close(fd)
            err = msg.header.error
            raise VfioError(f"{self.name}: {p.COMMAND_NAMES.get(command, command)} "
                            f"refused by the server ({errno.errorcode.get(err, err)})")
        return msg

    def _access(self, request: bytes, expected: bytes, reply_size: int, msg_id: int,
                command: int) -> bytes | p.Message:
        """Send a REGION_READ/WRITE and take its reply (the lock is held).

        The fast path, which every trapped access takes: one read brings exactly
        `reply_size` bytes starting with `expected` (the reply's header and the echoed
        access), and those bytes are returned.  Anything else -- a mapping event first,
        an error reply, part of a reply, an echo that differs -- is given back to the
        channel and read as messages: the reply Message is returned then (error replies
        raise VfioError)."""
        channel = self._channel
        try:
            sent = self.sock.send(request)
            if sent < len(request):
                self.sock.sendall(request[sent:])
            chunk = channel.read_one(False, reply_size)
            if chunk is not None:
                if len(chunk) == reply_size and chunk.startswith(expected):
                    return chunk
                channel.push(chunk)
            msg = self._await_reply(msg_id, command, False)
        except EOFError:
            raise VfioError(f"{self.name}: the vfio-user server hung up") from None
        except OSError as exc:
            raise VfioError(f"{self.name}: vfio-user socket: {exc}") from None
        return self._accepted(msg, command)

    # ---------------------------------------------------------------- server's commands
    def _server_command(self, msg: p.Message) -> None:
        """A command from the server (the lock is held): DMA_READ/DMA_WRITE answered
        from the DMA-mapped memory, a mapping event applied; anything else refused with
        an error reply (unless it wants none).  The connection goes on either way."""
        for fd in msg.fds:
            os.close(fd)
        h = msg.header
        if h.command == p.GPUVM_MAPPING_EVENT and "mapping" in self.extensions:
            self._mapping_event(msg)  # a grant it cannot apply: ProtocolError, raised
            return
        try:
            if h.command == p.DMA_READ:
                reply = self._dma_read(msg.payload)
            elif h.command == p.DMA_WRITE:
                reply = self._dma_write(msg.payload)
            else:
                raise _errno(VfioError(f"{self.name}: the server sent command "
                                       f"{p.COMMAND_NAMES.get(h.command, h.command)}, "
                                       f"which a client does not take"), errno.ENOSYS)
        except VfioError as exc:
            if not h.flags & p.FLAG_NO_REPLY:
                p.send(self.sock, p.encode(h.msg_id, h.command, b"",
                                           p.TYPE_REPLY | p.FLAG_ERROR,
                                           getattr(exc, "errno", None) or errno.EINVAL))
            return
        if not h.flags & p.FLAG_NO_REPLY:
            p.send(self.sock, p.encode(h.msg_id, h.command, reply, p.TYPE_REPLY))

    def _dma_window(self, address: int, count: int, flag: int, what: str) -> int:
        """The host address of [address, address + count) of bus memory, which one
        DMA-mapped window must hold whole with `flag` (READ or WRITE) allowed."""
        for iova, (host, size, flags) in self._dma.items():
            if iova <= address and address + count <= iova + size:
                if not flags & flag:
                    raise _errno(VfioError(f"{self.name}: {what} of [{address:#x}, "
                                           f"+{count:#x}): the mapping forbids it"),
                                 errno.EPERM)
                return host + address - iova
        raise _errno(VfioError(f"{self.name}: {what} of [{address:#x}, +{count:#x}) is "
                               f"outside every DMA mapping"), errno.EFAULT)

    def _dma_read(self, payload: bytes) -> bytes:
        req = p.unpack(p.DmaAccess, payload, "DMA_READ")
        if len(payload) != ctypes.sizeof(p.DmaAccess) or not \
                0 < req.count <= p.MAX_DATA_XFER_SIZE:
            raise _errno(VfioError(f"{self.name}: DMA_READ of {req.count} bytes in a "
                                   f"{len(payload)}-byte request"), errno.EINVAL)
        host = self._dma_window(req.address, req.count, p.DMA_FLAG_READ, "DMA_READ")
        return bytes(req) + ctypes.string_at(host, req.count)

    def _dma_write(self, payload: bytes) -> bytes:
        req = p.unpack(p.DmaAccess, payload, "DMA_WRITE")
        data = payload[ctypes.sizeof(p.DmaAccess):]
        if len(data) != req.count or not 0 < req.count <= p.MAX_DATA_XFER_SIZE:
            raise _errno(VfioError(f"{self.name}: DMA_WRITE of {req.count} bytes with "
                                   f"{len(data)} data bytes"), errno.EINVAL)
        host = self._dma_window(req.address, req.count, p.DMA_FLAG_WRITE, "DMA_WRITE")
        ctypes.memmove(host, data, req.count)
        return bytes(req)

    def serve_requests(self, timeout: float) -> int:
        """Answer the commands the server sends while no call waits for a reply (a
        server's DMA when its own timer or engine fires), until none has come for
        `timeout` seconds; how many were answered."""
        served = 0
        while True:
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                msg = self._channel.buffered()
                if msg is None:
                    readable, _, _ = select.select([self.sock], [], [], timeout)
                    if not readable:
                        return served
                    try:
                        msg = self._channel.receive()
                    except EOFError:
                        raise VfioError(f"{self.name}: the vfio-user server hung up") \
                            from None
                if msg.is_reply:
                    raise p.ProtocolError(f"{self.name}: a reply to message "
                                          f"{msg.header.msg_id}, which nothing awaits")
                self._server_command(msg)
                served += 1

    def _negotiate(self) -> dict[str, Any]:
        caps_ = dict(CLIENT_CAPABILITIES)
        if self.asked:
            caps_[p.EXTENSIONS_KEY] = list(self.asked)
        body = json.dumps({"capabilities": caps_}).encode() + b"\0"
        reply = self._call(p.VERSION, bytes(p.VersionPayload(p.VERSION_MAJOR,
                                                            p.VERSION_MINOR)) + body)
        v = p.unpack(p.VersionPayload, reply.payload, "VERSION reply")
        if v.major != p.VERSION_MAJOR or v.minor > p.VERSION_MINOR:
            raise p.ProtocolError(f"{self.name}: server speaks {v.major}.{v.minor}")
        text = reply.payload[4:].split(b"\0", 1)[0]
        try:
            body = json.loads(text.decode()) if text else {}
        except (UnicodeDecodeError, ValueError):
            raise p.ProtocolError(f"{self.name}: the server's VERSION data is not JSON") \
                from None
        found = body.get("capabilities", {}) if isinstance(body, dict) else None
        if not isinstance(found, dict):
            raise p.ProtocolError(f"{self.name}: the server's capabilities are not an object")
        return found

    # ---------------------------------------------------------------- VfioDevice
    def get_info(self) -> DeviceInfo:
        size = ctypes.sizeof(p.WireDeviceInfo)
        reply = self._call(p.DEVICE_GET_INFO, bytes(p.WireDeviceInfo(argsz=size)))
        info = p.unpack(p.WireDeviceInfo, reply.payload, "DEVICE_GET_INFO reply")
        return DeviceInfo(info.flags, info.num_regions, info.num_irqs)

    def get_region_info(self, index: int) -> RegionInfo:
        argsz = caps.REGION_INFO_SIZE
        for _ in range(2):  # ask again when the reply needs more than was asked for
            reply = self._call(p.DEVICE_GET_REGION_INFO,
                               bytes(p.WireRegionInfo(argsz=argsz, index=index)))
            fixed = p.unpack(p.WireRegionInfo, reply.payload, "DEVICE_GET_REGION_INFO reply")
            if fixed.argsz > argsz:  # with or without the CAPS flag (the spec's argsz)
                argsz = fixed.argsz
                for fd in reply.fds:
                    os.close(fd)
                if argsz > p.MAX_DATA_XFER_SIZE:
                    break
                continue
            info = caps.decode_region_info(reply.payload)
            for fd in reply.fds[1:]:
                os.close(fd)
            if reply.fds:
                old = self._region_fds.pop(index, None)
                if old is not None and old not in self._region_fds.values():
                    self._drop_region_fd(old)
                self._region_fds[index] = reply.fds[0]
            return info
        raise p.ProtocolError(f"{self.name}: region {index} info keeps growing "
                              f"(argsz {argsz})")

    def read(self, region: int, offset: int, size: int) -> int:
        value_layout = _VALUE.get(size)
        if value_layout is None:  # not a register's size: the general path
            return self._value_of(self._call(p.REGION_READ,
                                             p.ACCESS.pack(offset, region, size)), size)
        with self._lock:
            if self._closed:
                raise self._closed_error()
            msg_id = self._msg_id = (self._msg_id + 1) & 0xFFFF
            reply = self._access(
                _ACCESS_MESSAGE.pack(msg_id, _READ, _WHOLE, _COMMAND, 0, offset, region, size),
                _ACCESS_MESSAGE.pack(msg_id, _READ, _WHOLE + size, _REPLY, 0, offset, region,
                                     size), _WHOLE + size, msg_id, _READ)
        if isinstance(reply, bytes):
            return value_layout.unpack_from(reply, _WHOLE)[0]
        return self._value_of(reply, size)

    def _value_of(self, reply: p.Message, size: int) -> int:
        payload = reply.payload
        if len(payload) != p.ACCESS.size + size or \
                p.ACCESS.unpack_from(payload)[2] != size:
            raise p.ProtocolError(f"{self.name}: REGION_READ of {size} returned "
                                  f"{len(payload) - p.ACCESS.size} bytes")
        return int.from_bytes(payload[p.ACCESS.size:], "little")

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        layout = _ACCESS_WITH_VALUE.get(size)
        if layout is None:  # not a register's size: the general path
            data = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
            self._call(p.REGION_WRITE, p.ACCESS.pack(offset, region, size) + data)
            return
        with self._lock:
            if self._closed:
                raise self._closed_error()
            msg_id = self._msg_id = (self._msg_id + 1) & 0xFFFF
            self._access(
                layout.pack(msg_id, _WRITE, _WHOLE + size, _COMMAND, 0, offset, region, size,
                            value & _VALUE_MASK[size]),
                _ACCESS_MESSAGE.pack(msg_id, _WRITE, _WHOLE, _REPLY, 0, offset, region, size),
                _WHOLE, msg_id, _WRITE)

    def write_many(self, stores: PostedStores,
                   exit_: Callable[[], None] | None = None) -> None:
        """Posted stores, in the guest's order, handed to the device as that many
        trapped writes: one REGION_WRITE_MULTI per MAX_POSTED_STORES where the server
        offers "write_multiple" (each store ticked, counted and priced there as a
        REGION_WRITE is) and this client may use it, else one REGION_WRITE each.
        `exit_`, where this process keeps a vCPU clock of its own (not so over
        vfio-user: the server keeps it), is called for each store as it is handed over.
        A refused store raises VfioError; those before it took effect."""
        if exit_ is not None:
            for _ in range(len(stores)):
                exit_()
        if not self.write_multiple:
            for region, offset, size, value in stores.rows():
                self.write(region, offset, size, value)
            return
        records = np.empty(len(stores), dtype=p.WRITE_MULTI_RECORDS)
        records["offset"], records["region"] = stores.offsets, stores.regions
        records["count"], records["value"] = stores.sizes, stores.values
        step = p.MAX_POSTED_STORES
        for at in range(0, len(records), step):
            chunk = records[at:at + step]
            reply = self._call(p.REGION_WRITE_MULTI,
                               _MULTI_COUNT.pack(len(chunk)) + chunk.tobytes())
            done = _MULTI_COUNT.unpack_from(reply.payload)[0] \
                if len(reply.payload) == _MULTI_COUNT.size else -1
            if done != len(chunk):
                raise VfioError(f"{self.name}: REGION_WRITE_MULTI of {len(chunk)} writes: "
                                f"the server did {done}")

    def set_mapping_listener(self, listener: MappingListener | None) -> None:
        """Grants come only from a server with the mapping extension; without it the
        listener is kept and hears nothing (the regions trap)."""
        with self._lock:
            if "mapping" not in self.extensions:
                self._listener = listener
            elif listener is None and self._listener is not None:
                self._call(p.GPUVM_MAPPING_LISTEN, bytes(p.MappingListen(0)))
                self._listener = None
            elif listener is not None:
                self._listener = listener
                self._call(p.GPUVM_MAPPING_LISTEN, bytes(p.MappingListen(1)))

    def share(self, address: int, size: int, fd: int) -> None:
        """Memory this client may DMA-map by handing over `fd` (see the docstring)."""
        self._shared.append(SharedMemory(address, size, fd))

    def dma_map(self, iova: int, memory: np.ndarray, flags: int) -> None:
        address, size = memory.ctypes.data, memory.nbytes
        for shared in self._shared:
            offset = shared.offset_of(address, size)
            if offset is not None:
                break
        else:
            raise VfioError(f"{self.name}: DMA map of memory at {address:#x} that has no "
                            f"fd to pass (share() it first)")
        wire = (p.DMA_FLAG_READ if flags & abi.VFIO_DMA_MAP_FLAG_READ else 0) | \
            (p.DMA_FLAG_WRITE if flags & abi.VFIO_DMA_MAP_FLAG_WRITE else 0)
        with self._lock:
            self._call(p.DMA_MAP, bytes(p.DmaMap(ctypes.sizeof(p.DmaMap), wire, offset,
                                                 iova, size)), [shared.fd])
            self._dma[iova] = (address, size, wire)

    def dma_unmap(self, iova: int, size: int) -> None:
        with self._lock:
            self._call(p.DMA_UNMAP, bytes(p.DmaUnmap(ctypes.sizeof(p.DmaUnmap), 0, iova,
                                                     min(size, (1 << 64) - 1))))
            for start in [s for s, (_, n, _) in self._dma.items()
                          if iova <= s and s + n <= iova + size]:
                del self._dma[start]

    def dma_unmap_all(self) -> None:
        """DMA_UNMAP with the unmap-all flag: every mapping goes."""
        with self._lock:
            self._call(p.DMA_UNMAP, bytes(p.DmaUnmap(ctypes.sizeof(p.DmaUnmap),
                                                     p.DMA_UNMAP_FLAG_ALL, 0, 0)))
            self._dma.clear()

    def get_irq_info(self, index: int) -> IrqInfo:
        reply = self._call(p.DEVICE_GET_IRQ_INFO,
                           bytes(p.WireIrqInfo(argsz=ctypes.sizeof(p.WireIrqInfo), index=index)))
        info = p.unpack(p.WireIrqInfo, reply.payload, "DEVICE_GET_IRQ_INFO reply")
        return IrqInfo(info.index, info.count, info.flags)

    def set_irqs(self, index: int, start: int, eventfds: list[int]) -> None:
        if eventfds:
            flags = abi.VFIO_IRQ_SET_DATA_EVENTFD | abi.VFIO_IRQ_SET_ACTION_TRIGGER
            count = len(eventfds)
        else:
            flags, start, count = abi.VFIO_IRQ_SET_DATA_NONE | \
                abi.VFIO_IRQ_SET_ACTION_TRIGGER, 0, 0
        self._call(p.DEVICE_SET_IRQS, bytes(p.IrqSet(ctypes.sizeof(p.IrqSet), flags, index,
                                                     start, count)), eventfds)

    def reset(self) -> None:
        self._call(p.DEVICE_RESET)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.sock.close()
            finally:
                for fd in set(self._region_fds.values()):
                    self._drop_region_fd(fd)
                self._region_fds.clear()

    # ---------------------------------------------------------------- DeviceStats
    def _stats(self, what: int) -> dict[str, Any]:
        """The server's answer, or what a server without the stats extension leaves:
        no device counters, no faults, no device clock, no server time."""
        if "stats" not in self.extensions:
            return {"counters": {}, "faults": [], "device_time_ns": 0,
                    "server_access_ns": 0, "server_engine_ns": 0}
        reply = self._call(p.GPUVM_DEVICE_STATS, bytes(p.DeviceStatsRequest(what)))
        return json.loads(reply.payload.decode())

    def counters(self) -> dict[str, int]:
        return self._with_memslots(dict(self._stats(p.STATS_COUNTERS)["counters"]))

    def _with_memslots(self, out: dict[str, int]) -> dict[str, int]:
        slots = getattr(self._listener, "slots_in_use", None)
        if slots is not None:  # the VMM's memslots, as the in-process vGPU reports them
            out["remap.memslots"] = slots()
        return out

    def counters_with_server_time(self) -> dict[str, int]:
        """counters() and the server's time so far -- answering this device's register
        accesses ("server.access_ns") and running its channels ("server.engine_ns") --
        in one round trip: what a recorded VM in its own process needs to tell the
        server's share of its time from its own."""
        body = self._stats(p.STATS_COUNTERS | p.STATS_SERVER_TIME)
        return self._with_memslots(dict(body["counters"])
                                   | {p.SERVER_ACCESS_COUNTER: int(body["server_access_ns"]),
                                      p.SERVER_ENGINE_COUNTER: int(body["server_engine_ns"])})

    def faults(self) -> list[ChannelFault]:
        return [ChannelFault(**f) for f in self._stats(p.STATS_FAULTS)["faults"]]

    def device_time_ns(self) -> int:
        return int(self._stats(p.STATS_DEVICE_TIME)["device_time_ns"])

    # ---------------------------------------------------------------- virtual clock
    def clock_op(self, op: int, arg: int = 0) -> p.ClockState:
        """One GPUVM_CLOCK op of this VM's vCPU on the server's virtual clock (extension
        "clock"; gpuvm/vfio/user/vcpu_clock.py) and the vCPU's state after it."""
        if "clock" not in self.extensions:
            raise VfioError(f"{self.name}: the server offers no virtual clock")
        reply = self._call(p.GPUVM_CLOCK, bytes(p.ClockRequest(op, 0, arg)))
        return p.unpack(p.ClockState, reply.payload, "GPUVM_CLOCK reply")

    # ---------------------------------------------------------------- BAR remap
    def _region_address(self, region: int) -> int:
        """Where this process sees byte 0 of `region`'s mmap fd (mapped once, whole)."""
        fd = self._region_fds.get(region)
        if fd is None:
            raise p.ProtocolError(f"{self.name}: a grant in region {region}, which came "
                                  f"with no fd")
        if fd not in self._region_maps:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(
                mmap, "MAP_NORESERVE", 0x4000), prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self._region_maps[fd] = (mapping, ctypes.addressof(
                ctypes.c_char.from_buffer(mapping)))
        return self._region_maps[fd][1]

    def _drop_region_fd(self, fd: int) -> None:
        entry = self._region_maps.pop(fd, None)
        if entry is not None:
            try:
                entry[0].close()
            except BufferError:
                pass
        os.close(fd)

    def _mapping_event(self, msg: p.Message) -> None:
        for fd in msg.fds:
            os.close(fd)
        ev = p.unpack(p.MappingEvent, msg.payload, "GPUVM_MAPPING_EVENT")
        if ev.kind == p.MAPPING_MAP:
            address = self._region_address(ev.region)
            limit = len(self._region_maps[self._region_fds[ev.region]][0])
            if ev.fd_offset + ev.size > limit or not ev.size:
                raise p.ProtocolError(f"{self.name}: grant of [{ev.fd_offset:#x}, "
                                      f"+{ev.size:#x}) outside the region's {limit:#x}-byte fd")
            self._grants[(ev.region, ev.offset)] = (ev.fd_offset, ev.size)
            if self._listener is not None:
                self._listener.map(ev.region, ev.offset, address + ev.fd_offset, ev.size)
        elif ev.kind in (p.MAPPING_POST, p.MAPPING_TRAP):
            if self._listener is not None:
                self._listener.post(ev.region, ev.offset, ev.size, ev.kind == p.MAPPING_POST)
        elif ev.kind == p.MAPPING_UNMAP:
            self._grants.pop((ev.region, ev.offset), None)
            if self._listener is not None:
                self._listener.unmap(ev.region, ev.offset, ev.size)
        else:
            raise p.ProtocolError(f"{self.name}: GPUVM_MAPPING_EVENT of unknown kind {ev.kind}")


def _errno(exc: VfioError, number: int) -> VfioError:
    exc.errno = number  # type: ignore[attr-defined]
    return exc
