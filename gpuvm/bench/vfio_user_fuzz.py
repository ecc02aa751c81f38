"""`gpuvm bench vfio-user-fuzz`: a hostile vfio-user client against `gpuvm serve`, beside a
VM that runs a benchmark on another vGPU of the same daemon.

The daemon is `gpuvm serve`'s own MdevServer, in this process so that the reference
monitor (gpuvm/mediator/monitor.py) judges every device access the hostile messages
cause and an exception on any server thread is seen.  Two mdevs are defined: the hostile
client takes one, and a co-runner -- `gpuvm vm start` in a process of its own, over the
other socket -- runs its benchmark again and again for as long as the fuzzing lasts.

Each message is drawn from a seeded generator (`HostileClient.step`): accesses of any
region, offset and count; device, region, IRQ and io-fd queries with wild argsz and
indices; payloads cut short; unknown commands, replies, no-reply and reserved flags;
server-to-client commands sent the wrong way; replays of the last message; a second
VERSION; DMA_MAP/UNMAP of windows and flags good and bad, with fds of every kind (memfds
too short or long enough, eventfds, pipes, sockets, /dev/null) and fds riding on commands
that take none; SET_IRQS with counts that disagree with the fds; resets;
REGION_WRITE_MULTI whole, cut short, miscounted and out of bounds; gpuvm's extension
commands with and without having negotiated them.  Now and then a message
ends the connection as the spec allows -- a header that cannot be framed (too short, too
long), a hang-up inside a message, a command before VERSION -- and the client connects
again (a fresh vGPU each time).

What the client checks of every message: a command that wants a reply gets exactly one,
with its id and command (or an error reply); a message that wants none gets none; the
connection closes only for the messages that end it; a read's reply carries exactly the
bytes asked for and a query's no more than its argsz; an fd that comes back is that
vGPU's own VRAM partition.  After the run: the monitor saw no access outside its owner,
no server thread raised, the daemon holds no more fds than before (every fd sent was
closed or kept for a live mapping that went with its connection), a fresh client still
attaches, and every co-runner run passed.
"""

from __future__ import annotations

import argparse
import array
import errno
import json
import logging
import os
import random
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpuvm.errors import UserError
from gpuvm.mdevctl import MdevStore
from gpuvm.mediator import monitor
from gpuvm.run.isolated import device_memory
from gpuvm.serve import MdevServer, socket_path
from gpuvm.vfio.user import protocol as p

HEADER = struct.Struct("<HHIII")
REPLY_TIMEOUT_S = 30.0
TYPE = "gpuvm-Q6000-2Q"
CO_RUNNER = ("mmul", "32")
DMA_PAGE = 4096


@dataclass
class Tally:
    """What the hostile client saw; `failures` must stay empty."""

    messages: int = 0
    replies: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    by_case: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    closed_as_expected: int = 0
    fds_sent: int = 0
    fds_received: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, text: str) -> None:
        if len(self.failures) < 50:
            self.failures.append(text)


class PeerClosed(Exception):
    """The server hung up."""


class HostileClient:
    """One hostile VMM on `path`; `step(rng)` sends one message and checks its answer."""

    def __init__(self, path: str, daemon: "DaemonView", tally: Tally) -> None:
        self.path = path
        self.daemon = daemon
        self.own_inode: tuple[int, int] | None = None  # the connection's vGPU memfd
        self.tally = tally
        self.sock: socket.socket | None = None
        self.msg_id = 0
        self.last: bytes | None = None
        self.negotiated = False
        self.buf = b""

    # ---------------------------------------------------------------- connection
    def connect(self, rng: random.Random) -> None:
        """A new connection.  The daemon lets one VMM hold an mdev and turns the next
        away until the last connection's vGPU is removed: the client waits for that."""
        self.close()
        self.daemon.wait_idle()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        self.sock, self.buf, self.negotiated, self.last = sock, b"", False, None
        self.tally.connections += 1
        self.own_inode = self.daemon.inode()
        if rng.random() < 0.01:  # a command before VERSION: refused, then closed
            self._expect_close("before VERSION", self._command(
                p.DEVICE_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0)), error=True)
            self.connect(rng)
            return
        caps: dict = {"max_msg_fds": rng.choice([1, 8, 253, -1]),
                      "max_data_xfer_size": rng.choice([4096, 1 << 20])}
        if rng.random() < 0.5:
            caps["gpuvm"] = rng.choice([["mapping", "stats"], ["stats"], ["bogus"], "x"])
        body = json.dumps({"capabilities": caps}).encode() + b"\0"
        reply = self._exchange("VERSION", self._command(p.VERSION, struct.pack(
            "<HH", 0, rng.choice([0, 1, 7])) + body))
        if reply is not None and not reply[0][3] & p.FLAG_ERROR:
            self.negotiated = True
        elif reply is not None:  # refused (capabilities it cannot read): start again
            self.connect(rng)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # ---------------------------------------------------------------- wire
    def _command(self, command: int, payload: bytes = b"", flags: int = 0,
                 size: int | None = None) -> bytes:
        self.msg_id = (self.msg_id + 1) & 0xFFFF
        return HEADER.pack(self.msg_id, command, 16 + len(payload) if size is None else size,
                           flags, 0) + payload

    def _send(self, data: bytes, fds: list[int] = ()) -> None:
        if self.sock is None:  # closed after a failure earlier in this case
            raise BrokenPipeError("the connection ended earlier in this case")
        if fds:
            self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", fds))])
            self.tally.fds_sent += len(fds)
        else:
            self.sock.sendall(data)
        self.tally.messages += 1

    def _read_message(self, timeout: float) -> tuple[tuple, bytes, list[int]]:
        """The next message from the server: (header, payload, fds); PeerClosed on EOF,
        TimeoutError when nothing came."""
        assert self.sock is not None
        fds: list[int] = []
        deadline = time.monotonic() + timeout
        while len(self.buf) < 16 or len(self.buf) < HEADER.unpack_from(self.buf)[2]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise TimeoutError
            try:
                data, anc, _, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(64 * 4))
            except ConnectionResetError:  # it closed with our bytes unread
                data, anc = b"", []
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(raw[:len(raw) - len(raw) % 4])
                    fds.extend(got)
            if not data:
                for fd in fds:
                    os.close(fd)
                raise PeerClosed
            self.buf += data
        header = HEADER.unpack_from(self.buf)
        payload = self.buf[16:header[2]]
        self.buf = self.buf[header[2]:]
        return header, payload, fds

    def _reply_to(self, data: bytes, what: str) -> tuple[tuple, bytes] | None:
        """The reply to the command `data`, skipping the server's own commands (mapping
        events); None (a failure recorded) when none came or the server hung up."""
        msg_id, command = struct.unpack_from("<HH", data)
        while True:
            try:
                header, payload, fds = self._read_message(REPLY_TIMEOUT_S)
            except TimeoutError:
                self.tally.fail(f"{what}: no reply in {REPLY_TIMEOUT_S:g} s")
                self.close()
                return None
            except PeerClosed:
                self.tally.fail(f"{what}: the server hung up instead of answering")
                self.close()
                return None
            self._check_fds(fds, what)
            if header[3] & p.TYPE_MASK == p.TYPE_COMMAND and header[1] == \
                    p.GPUVM_MAPPING_EVENT:
                continue
            if header[:2] != (msg_id, command) or header[3] & p.TYPE_MASK != p.TYPE_REPLY:
                self.tally.fail(f"{what}: answered by {header} (expected the reply to "
                                f"{msg_id}/{command})")
                self.close()
                return None
            self.tally.replies += 1
            if header[3] & p.FLAG_ERROR:
                if payload:
                    self.tally.fail(f"{what}: an error reply with {len(payload)} bytes")
                self.tally.errors[errno.errorcode.get(header[4], str(header[4]))] += 1
            return header, payload

    def _check_fds(self, fds: list[int], what: str) -> None:
        for fd in fds:
            self.tally.fds_received += 1
            st = os.fstat(fd)
            if self.own_inode is None or (st.st_dev, st.st_ino) != self.own_inode:
                self.tally.fail(f"{what}: the server passed an fd that is not this vGPU's "
                                f"partition (inode {st.st_ino})")
            os.close(fd)

    def _exchange(self, what: str, data: bytes, fds: list[int] = ()
                  ) -> tuple[tuple, bytes] | None:
        self._send(data, fds)
        self.last = data
        return self._reply_to(data, what)

    def _expect_none(self, what: str, data: bytes, fds: list[int] = ()) -> None:
        """A message that wants no answer: a GET_INFO after it must be answered next."""
        self._send(data, fds)
        self._exchange(f"{what} (then GET_INFO)",
                       self._command(p.DEVICE_GET_INFO, struct.pack("<IIII", 16, 0, 0, 0)))

    def _expect_close(self, what: str, data: bytes, error: bool,
                      hang_up: bool = False) -> None:
        """A message after which the server closes (an error reply first if `error`)."""
        self._send(data)
        if hang_up:
            self.close()
            self.tally.closed_as_expected += 1
            return
        try:
            while True:
                header, payload, fds = self._read_message(REPLY_TIMEOUT_S)
                self._check_fds(fds, what)
                if error and header[3] & p.FLAG_ERROR:
                    error = False
                    continue
                self.tally.fail(f"{what}: answered by {header} instead of closing")
                break
        except (PeerClosed, ConnectionResetError):
            self.tally.closed_as_expected += 1
        except TimeoutError:
            self.tally.fail(f"{what}: the server neither answered nor closed")
        self.close()

    # ---------------------------------------------------------------- one message
    def step(self, rng: random.Random) -> str:
        """Send one hostile message (connecting first if needed); the case's name."""
        if self.sock is None:
            self.connect(rng)
        case = rng.choices(CASES, WEIGHTS)[0]
        self.tally.by_case[case] += 1
        try:
            getattr(self, "_" + case)(rng)
        except OSError as exc:  # the server hung up where it should have answered
            self.tally.fail(f"{case}: {exc} (after {self.last[:32].hex() if self.last else '-'})")
            self.close()
        return case

    def _access(self, rng: random.Random) -> None:
        region = rng.choice([0, 0, 1, 2, 3, 4, 7, 7, 7, 8, 9, 0xFFFFFFFF, rng.getrandbits(32)])
        count = rng.choice([1, 2, 4, 8, 3, 64, 256, rng.randrange(1, 4097), 0,
                            p.MAX_DATA_XFER_SIZE + 1])
        offset = rng.choice([0, 0x40, rng.randrange(0, 256), rng.randrange(0, 1 << 25),
                             (1 << 64) - count if count else 0, rng.getrandbits(64)])
        write = rng.random() < 0.3 and region in (7, 1, 3) or rng.random() < 0.02
        if write:
            count = min(count, 4096)
            data = rng.randbytes(count)
            msg = self._command(p.REGION_WRITE, struct.pack("<QII", offset, region, count) + data)
        else:
            msg = self._command(p.REGION_READ, struct.pack("<QII", offset, region, count))
        got = self._exchange("REGION_WRITE" if write else "REGION_READ", msg)
        if got is not None and not got[0][3] & p.FLAG_ERROR:
            want = 16 if write else 16 + count
            if len(got[1]) != want or got[1][:16] != msg[16:32]:
                self.tally.fail(f"region access {offset:#x}/{region}/{count}: a reply of "
                                f"{len(got[1])} bytes (expected {want}, the echo first)")

    def _query(self, rng: random.Random) -> None:
        command = rng.choice([p.DEVICE_GET_INFO, p.DEVICE_GET_REGION_INFO,
                              p.DEVICE_GET_IRQ_INFO, p.DEVICE_GET_REGION_IO_FDS])
        argsz = rng.choice([0, 8, 16, 32, 40, 64, 4096, rng.getrandbits(32)])
        index = rng.choice([0, 1, 3, 7, 8, 9, 4, 5, rng.getrandbits(32)])
        body = {p.DEVICE_GET_INFO: struct.pack("<IIII", argsz, 0, 0, 0),
                p.DEVICE_GET_REGION_INFO: struct.pack("<IIIIQQ", argsz, 0, index, 0, 0, 0),
                p.DEVICE_GET_IRQ_INFO: struct.pack("<IIII", argsz, 0, index, 0),
                p.DEVICE_GET_REGION_IO_FDS: struct.pack("<IIII", argsz, 0, index, 0)}[command]
        got = self._exchange(p.COMMAND_NAMES[command], self._command(command, body))
        if got is not None and not got[0][3] & p.FLAG_ERROR and \
                len(got[1]) > max(argsz, 32):
            self.tally.fail(f"{p.COMMAND_NAMES[command]}: {len(got[1])} bytes for argsz "
                            f"{argsz}")

    def _truncated(self, rng: random.Random) -> None:
        command = rng.choice([p.DMA_MAP, p.DMA_UNMAP, p.DEVICE_GET_INFO,
                              p.DEVICE_GET_REGION_INFO, p.DEVICE_GET_IRQ_INFO,
                              p.DEVICE_SET_IRQS, p.REGION_READ, p.REGION_WRITE,
                              p.DEVICE_GET_REGION_IO_FDS, p.GPUVM_DEVICE_STATS])
        self._exchange("a cut payload", self._command(command,
                                                      rng.randbytes(rng.randrange(0, 12))))

    def _garbage(self, rng: random.Random) -> None:
        command = rng.choice([0, 14, 19, 0x7FFF, 0x8000, 0x8002, 0x8004,
                              rng.getrandbits(16)])
        flags = rng.choice([0, 0, p.TYPE_REPLY, p.FLAG_NO_REPLY, 2, 0xF, p.FLAG_ERROR,
                            rng.getrandbits(32)])
        data = self._command(command, rng.randbytes(rng.randrange(0, 64)), flags)
        if flags & p.TYPE_MASK != p.TYPE_COMMAND or flags & p.FLAG_NO_REPLY:
            self._expect_none("a reply or no-reply message", data)
        else:
            self._exchange(f"command {command}", data)

    def _wrong_way(self, rng: random.Random) -> None:
        command = rng.choice([p.DMA_READ, p.DMA_WRITE, p.GPUVM_MAPPING_EVENT,
                              p.REGION_WRITE_MULTI, p.DEVICE_FEATURE, p.MIG_DATA_READ,
                              p.MIG_DATA_WRITE])
        self._exchange(p.COMMAND_NAMES[command],
                       self._command(command, rng.randbytes(rng.randrange(0, 48))))

    def _replay(self, rng: random.Random) -> None:
        if self.last is None:
            self._query(rng)
            return
        self._exchange("a replayed message", self.last)

    def _version(self, rng: random.Random) -> None:
        body = rng.choice([b"", b"{}\0", b"not json\0", b"[1]\0", rng.randbytes(20),
                           b'{"capabilities": 5}\0'])
        self._exchange("VERSION again", self._command(
            p.VERSION, struct.pack("<HH", rng.choice([0, 1, 9]), 1) + body))

    def _fds(self, rng: random.Random) -> None:
        fds = [self._hostile_fd(rng) for _ in range(rng.choice([1, 1, 2, 3, 8]))]
        try:
            kind = rng.random()
            if kind < 0.5:
                size = rng.choice([DMA_PAGE, 1 << 20, rng.randrange(1, 1 << 22),
                                   rng.getrandbits(64)])
                msg = self._command(p.DMA_MAP, struct.pack(
                    "<IIQQQ", 32, rng.choice([0, 1, 2, 3, 4, 0xFF]),
                    rng.choice([0, DMA_PAGE, rng.getrandbits(64)]),
                    rng.choice([0, 1 << 20, 1 << 30, rng.getrandbits(64)]) & ~0xFFF, size))
                self._exchange("DMA_MAP with fds", msg, fds)
            elif kind < 0.8:
                count = rng.choice([len(fds), 0, 1, 2, 1 << 31])
                msg = self._command(p.DEVICE_SET_IRQS, struct.pack(
                    "<IIIII", 20, rng.choice([0b100100, 0b100001, 0b1001, 0b10100, 0xFF]),
                    rng.choice([0, 1, 2, 4, 5, 99]), rng.choice([0, 1, 1 << 31]), count))
                self._exchange("SET_IRQS with fds", msg, fds)
            else:
                msg = self._command(rng.choice([p.DEVICE_GET_INFO, p.DEVICE_RESET,
                                                p.REGION_READ]),
                                    struct.pack("<IIII", 16, 0, 0, 0))
                self._exchange("fds on a command that takes none", msg, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _hostile_fd(self, rng: random.Random) -> int:
        kind = rng.randrange(6)
        if kind == 0:  # a memfd, maybe shorter than the window it comes with
            fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, rng.choice([0, DMA_PAGE, 1 << 20, 4 << 20]))
            return fd
        if kind == 1:
            return os.eventfd(0, os.EFD_CLOEXEC)
        if kind == 2:
            r, w = os.pipe()
            os.close(w)
            return r
        if kind == 3:
            a, b = socket.socketpair()
            b.close()
            return a.detach()
        if kind == 4:
            return os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        fd = os.memfd_create("hostile-sealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 2 << 20)
        return fd

    def _dma(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            fd = os.memfd_create("hostile-ram", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, 1 << 20)
                address = rng.randrange(0, 64) * DMA_PAGE * 16
                self._exchange("DMA_MAP", self._command(p.DMA_MAP, struct.pack(
                    "<IIQQQ", 32, 3, 0, address, rng.choice([DMA_PAGE, 1 << 20]))), [fd])
            finally:
                os.close(fd)
            return
        flags = rng.choice([0, 0, p.DMA_UNMAP_FLAG_ALL, p.DMA_UNMAP_FLAG_GET_DIRTY_BITMAP,
                            4, 0xFFFFFFFF])
        address = rng.choice([0, rng.randrange(0, 64) * DMA_PAGE * 16, rng.getrandbits(64)])
        size = rng.choice([0, DMA_PAGE, 1 << 20, 1 << 30, rng.getrandbits(64)])
        self._exchange("DMA_UNMAP", self._command(p.DMA_UNMAP, struct.pack(
            "<IIQQ", 24, flags, address, size)))

    def _reset(self, rng: random.Random) -> None:
        self._exchange("DEVICE_RESET", self._command(
            p.DEVICE_RESET, b"" if rng.random() < 0.8 else b"\0"))

    def _extension(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            self._exchange("GPUVM_DEVICE_STATS", self._command(
                p.GPUVM_DEVICE_STATS, struct.pack("<I", rng.getrandbits(32))))
        else:
            self._exchange("GPUVM_MAPPING_LISTEN", self._command(
                p.GPUVM_MAPPING_LISTEN, struct.pack("<I", rng.choice([0, 1, 7]))))

    def _write_multi(self, rng: random.Random) -> None:
        """REGION_WRITE_MULTI, now and then malformed: cut short, no write, a wr_cnt
        that is not the writes that follow, a count outside 1..8, a write outside its
        region or in one that does not exist."""
        writes = []
        for _ in range(rng.choice([0, 1, 3, 170, 1000])):
            writes.append(p.WRITE_MULTI_RECORD.pack(
                rng.choice([0x40, 0x140, rng.randrange(0, 1 << 24), rng.getrandbits(64)]),
                rng.choice([1, 3, 7, 7, 8, rng.getrandbits(32)]),
                rng.choice([1, 2, 4, 8, 4, 4, 3, 0, 9, rng.getrandbits(32)]),
                rng.getrandbits(64)))
        count = len(writes) if rng.random() < 0.9 else rng.getrandbits(64)
        payload = p.WRITE_MULTI_COUNT.pack(count) + b"".join(writes)
        if rng.random() < 0.1:
            payload = payload[:rng.randrange(len(payload))]
        got = self._exchange("REGION_WRITE_MULTI", self._command(p.REGION_WRITE_MULTI,
                                                                 payload))
        if got is not None and not got[0][3] & p.FLAG_ERROR and \
                (len(got[1]) != 8 or not 0 < struct.unpack("<Q", got[1])[0] <= len(writes)):
            self.tally.fail(f"REGION_WRITE_MULTI of {len(writes)} writes: a reply of "
                            f"{got[1].hex()} (expected wr_cnt 1..{len(writes)})")

    def _ending(self, rng: random.Random) -> None:
        """A message after which the connection must end; then a fresh one."""
        kind = rng.randrange(3)
        if kind == 0:
            self._expect_close("an oversized header", self._command(
                p.DEVICE_GET_INFO, b"", size=p.MAX_MESSAGE_SIZE + rng.randrange(1, 1 << 20)),
                error=True)
        elif kind == 1:
            self._expect_close("an undersized header", self._command(
                p.DEVICE_GET_INFO, b"", size=rng.randrange(0, 16)), error=True)
        else:
            self._expect_close("a hang-up inside a message", self._command(
                p.REGION_WRITE, b"\0" * 8, size=64), error=False, hang_up=True)
        self.connect(rng)


CASE_WEIGHTS = {"access": 40, "query": 12, "truncated": 8, "garbage": 6, "wrong_way": 4,
                "replay": 8, "version": 2, "fds": 8, "dma": 6, "reset": 1, "extension": 4,
                "write_multi": 3,
                "ending": 0.1}
CASES = list(CASE_WEIGHTS)
WEIGHTS = list(CASE_WEIGHTS.values())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class FuzzReport:
    """What the hostile vfio-user client campaign came to: the tally of what it sent, escapes
    and server thread errors (both must be none), whether the server leaked fds, and whether
    a VM on another vGPU ran through it and the server still serves."""

    tally: Tally
    seconds: float
    escapes: list[str]
    thread_errors: list[str]
    fds_before: int
    fds_after: int
    co_runs: int
    co_failures: list[str]
    still_serves: bool


class CoRunner:
    """`gpuvm vm start` on the other mdev, its benchmark run again until stopped."""

    def __init__(self, uuid: str, env: dict[str, str]) -> None:
        self.uuid, self.env = uuid, env
        self.runs = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="co-runner", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run([sys.executable, "-m", "gpuvm", "vm", "start", "--mdev",
                                   self.uuid, "--backend", "inproc", "-b", CO_RUNNER[0],
                                   "-p", CO_RUNNER[1]], capture_output=True, text=True,
                                  env=self.env, timeout=600)
            self.runs += 1
            if done.returncode != 0 or "PASS" not in done.stdout:
                self.failures.append((done.stdout + done.stderr)[-800:])

    def start(self) -> "CoRunner":
        self.thread.start()
        return self

    def stop(self) -> None:
        """Let the run under way finish (a benchmark is not cut short), then stop."""
        self._stop.set()
        self.thread.join(900)


def fuzz(messages: int, seed: int, co_runner: bool = True) -> FuzzReport:
    """Run `messages` hostile messages against a fresh daemon (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="gpuvm-fuzz-", dir="/tmp"))  # short socket paths
    env = dict(os.environ, GPUVM_STATE_DIR=str(root))
    saved = os.environ.get("GPUVM_STATE_DIR")
    os.environ["GPUVM_STATE_DIR"] = str(root)
    quiet = logging.getLogger("gpuvm")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # refusals are the point here, not news
    was_on = monitor.enabled()
    monitor.enable()
    monitor.take()
    thread_errors: list[str] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda a: thread_errors.append(
        f"{a.thread.name if a.thread else '?'}: {a.exc_type.__name__}: {a.exc_value}")
    store = MdevStore()
    hostile, other = store.create(TYPE, mode="fv-opt"), store.create(TYPE, mode="fv-opt")
    server = MdevServer([hostile, other]).start()
    fds_before = open_fds()  # the daemon with no VMM attached
    runner = CoRunner(other.uuid, env).start() if co_runner else None
    try:
        tally = Tally()
        rng = random.Random(seed)
        client = HostileClient(str(socket_path(hostile.uuid)),
                               DaemonView(server, hostile.uuid), tally)
        start = time.perf_counter()
        while tally.messages < messages:
            client.step(rng)
        client.close()
        seconds = time.perf_counter() - start
        if runner is not None:
            runner.stop()
        for uuid in (hostile.uuid, other.uuid):
            _wait_detached(server, uuid)
        fds_after = open_fds()  # ... and again, every VMM gone
        still = _still_serves(str(socket_path(hostile.uuid)))
    finally:
        if runner is not None:
            runner.stop()
        server.stop()
        threading.excepthook = old_hook
        quiet.setLevel(level)
        escapes = [str(e) for e in monitor.take()]
        monitor.enable(was_on)
        if saved is None:
            os.environ.pop("GPUVM_STATE_DIR", None)
        else:
            os.environ["GPUVM_STATE_DIR"] = saved
        shutil.rmtree(root, ignore_errors=True)
    return FuzzReport(tally, seconds, escapes, thread_errors, fds_before, fds_after,
                      runner.runs if runner else 0, runner.failures if runner else [], still)


class DaemonView:
    """What the hostile client learns from the daemon's side (it runs in this process):
    when the mdev is free again, and the inode of its connection's vGPU partition memfd
    -- the only fd the server may pass it."""

    def __init__(self, server: MdevServer, uuid: str) -> None:
        self.server, self.uuid = server, uuid

    def wait_idle(self) -> None:
        _wait_detached(self.server, self.uuid)

    def inode(self) -> tuple[int, int] | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            served = self.server.active.get(self.uuid)
            if served is not None and served.memory is not None:
                st = os.fstat(served.memory.fd)
                return st.st_dev, st.st_ino
            time.sleep(0.001)
        return None


def _wait_detached(server: MdevServer, uuid: str) -> None:
    deadline = time.monotonic() + 30
    while uuid in server.active and time.monotonic() < deadline:
        time.sleep(0.01)


def _still_serves(path: str) -> bool:
    """A fresh standard client attaches and gets the device info."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = b'{"capabilities": {}}\0'
        sock.sendall(HEADER.pack(1, p.VERSION, 20 + len(body), 0, 0) +
                     struct.pack("<HH", 0, 1) + body)
        sock.sendall(HEADER.pack(2, p.DEVICE_GET_INFO, 32, 0, 0) +
                     struct.pack("<IIII", 16, 0, 0, 0))
        data = b""
        sock.settimeout(30)
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return False
            data += chunk
            first = HEADER.unpack_from(data)[2] if len(data) >= 16 else 1 << 30
            if len(data) >= first + 32:
                header = HEADER.unpack_from(data, first)
                return header[:2] == (2, p.DEVICE_GET_INFO) and not header[3] & p.FLAG_ERROR
    except OSError:
        return False
    finally:
        sock.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=100_000,
                        help="hostile messages to send (default 100,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-co-runner", action="store_true",
                        help="no VM on the other vGPU (the protocol alone)")


def main_vfio_user_fuzz(args: argparse.Namespace) -> int:
    if args.messages <= 0:
        raise UserError(f"--messages {args.messages}: must be positive")
    r = fuzz(args.messages, args.seed, not args.no_co_runner)
    t = r.tally
    print(f"messages sent        {t.messages:,} on {t.connections:,} connections "
          f"(seed {args.seed})")
    print(f"time                 {r.seconds:.1f} s ({t.messages / r.seconds:,.0f} messages/s)")
    print(f"replies              {t.replies:,} ({sum(t.errors.values()):,} errors: "
          + ", ".join(f"{k} {n:,}" for k, n in t.errors.most_common()) + ")")
    print(f"closed as expected   {t.closed_as_expected:,}")
    print(f"fds sent / received  {t.fds_sent:,} / {t.fds_received:,}")
    print("by case              " + ", ".join(f"{k} {n:,}" for k, n in sorted(t.by_case.items())))
    print(f"daemon's open fds    {r.fds_before} before, {r.fds_after} after (no VMM "
          f"attached either time)")
    print(f"server failures      {len(t.failures) + len(r.thread_errors)} "
          f"(client checks {len(t.failures)}, server thread exceptions "
          f"{len(r.thread_errors)})")
    print(f"leaks                {len(r.escapes)} monitor escapes")
    print(f"still serves         {'yes' if r.still_serves else 'NO'}")
    if args.no_co_runner:
        print("co-runner            none")
    else:
        print(f"co-runner            {r.co_runs - len(r.co_failures)} of {r.co_runs} "
              f"{CO_RUNNER[0]} runs passed")
    for text in (t.failures + r.thread_errors + r.escapes + r.co_failures)[:5]:
        print("\n" + text)
    ok = not t.failures and not r.thread_errors and not r.escapes and r.still_serves and \
        not r.co_failures and r.fds_after <= r.fds_before
    return 0 if ok else 1
