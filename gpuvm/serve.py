"""`gpuvm serve`: the mediator as its own process, each vGPU served over vfio-user.

The daemon owns the emulated GPU and the mediator.  For every mdev defined on the host
(gpuvm/mdevctl.py, `gpuvm mdev create`) it listens on
$GPUVM_STATE_DIR/vfio-user/<uuid>.sock -- the directory is 0700 and each socket 0600, so
only the owner's VMMs reach them, and a VMM reaches only the vGPU it names.  One VMM at a
time may hold an mdev: a connection creates the vGPU (its partition, its channels, its
scheduler share, in the mdev's mode), and when the VMM goes away -- it exits, is killed,
or breaks the protocol -- the vGPU is removed: its channels stopped, its partition given
back; the daemon and every other VM keep running.  The log is
$GPUVM_STATE_DIR/vfio-user/serve.log.  SIGTERM or SIGINT stops the daemon.

`--no-extensions` offers none of gpuvm's extensions (gpuvm/vfio/user/__init__.py): a
VMM then attaches with the spec's commands alone, as a standard client would -- every BAR
traps, and the lab's device counters stay in the daemon.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import stat
import threading
from dataclasses import replace
from pathlib import Path

from gpuvm.errors import UserError
from gpuvm.mdevctl import MdevDefinition, MdevStore, parent_index
from gpuvm.state import state_dir
from gpuvm.mediator.modes import MODES
from gpuvm.run.isolated import device_memory
from gpuvm.run.mediated import MediatedMachine
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.vfio.user import protocol
from gpuvm.vfio.user.server import DeviceServer

log = logging.getLogger("gpuvm.serve")
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL


def socket_dir(root: Path | None = None) -> Path:
    return (root or state_dir()) / "vfio-user"


def socket_path(uuid: str, root: Path | None = None) -> Path:
    return socket_dir(root) / f"{uuid}.sock"


def mdev_spec(d: MdevDefinition) -> VmSpec:
    """The VM request an mdev stands for (its type, UUID and mode, on its parent's GPU)."""
    return VmSpec(d.uuid[:8], "idle", mdev_type=d.type_id, mdev_uuid=d.uuid, mode=d.mode,
                  paravirtual=MODES[d.mode].pv, gpu=parent_index(d.parent))


class MdevServer:
    """Serves every mdev of `definitions` on its own socket (see the module docstring)."""

    def __init__(self, definitions: list[MdevDefinition], root: Path | None = None,
                 options: RunOptions | None = None,
                 extensions: tuple[str, ...] = protocol.EXTENSIONS) -> None:
        if not definitions:
            raise UserError("no mdevs are defined (create one with `gpuvm mdev create`)")
        self.root = root
        self.extensions = extensions  # the gpuvm extensions offered to every VMM
        self.specs = {d.uuid: mdev_spec(d) for d in definitions}
        options = options or RunOptions(mode=definitions[0].mode)
        gpus = 1 + max(spec.gpu or 0 for spec in self.specs.values())
        if options.gpus < gpus:  # one emulated GPU per parent up to the last one used
            options = replace(options, gpus=gpus)
        try:
            self.machine = MediatedMachine(options, list(self.specs.values()))
        except RunError as exc:
            raise UserError(str(exc)) from None
        self.listeners: dict[str, socket.socket] = {}
        self.active: dict[str, DeviceServer] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def start(self) -> "MdevServer":
        directory = socket_dir(self.root)
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, stat.S_IRWXU)
        for uuid in self.specs:
            path = socket_path(uuid, self.root)
            if path.exists():
                path.unlink()  # left by a daemon that died; nobody can be listening
            if len(os.fsencode(path)) > MAX_SOCKET_PATH:
                raise UserError(f"socket path {path} is longer than a UNIX socket allows "
                                f"({MAX_SOCKET_PATH} bytes); set GPUVM_STATE_DIR shorter")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(path))
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
            listener.listen(4)
            self.listeners[uuid] = listener
            threading.Thread(target=self._accept, args=(uuid, listener), daemon=True,
                             name=f"accept {uuid[:8]}").start()
            log.info("mdev %s (%s, %s) on %s", uuid, self.specs[uuid].mdev_type,
                     self.specs[uuid].mode, path)
        return self

    def _accept(self, uuid: str, listener: socket.socket) -> None:
        spec = self.specs[uuid]
        while not self.stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                if uuid in self.active:
                    log.warning("mdev %s: refused a second VMM (one holds it)", uuid)
                    conn.close()
                    continue
                try:
                    device = self.machine.attach(spec)
                except RunError as exc:
                    log.error("mdev %s: %s", uuid, exc)
                    conn.close()
                    continue
                server = DeviceServer(conn, device, device, device_memory(device),
                                      spec.name, on_disconnect=self._gone,
                                      extensions=self.extensions)
                self.active[uuid] = server
            log.info("mdev %s: VMM attached", uuid)
            server.start()

    def _gone(self, server: DeviceServer) -> None:
        with self._lock:
            uuid = next((u for u, s in self.active.items() if s is server), None)
            if uuid is None:
                return
            try:  # the mdev reads as free only once its vGPU and partition are gone
                self.machine.detach(self.specs[uuid])
            finally:
                del self.active[uuid]
        log.info("mdev %s: VMM gone (%s); vGPU removed, partition reclaimed", uuid,
                 server.disconnect_reason or "closed")

    def stop(self) -> None:
        self.stopping.set()
        for uuid, listener in self.listeners.items():
            listener.close()
            socket_path(uuid, self.root).unlink(missing_ok=True)
        with self._lock:
            servers = list(self.active.values())
        for server in servers:
            try:
                server.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            server.closed.wait(10)
        self.machine.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mdev", action="append", metavar="UUID",
                        help="serve only these mdevs (default: every defined mdev)")
    parser.add_argument("--scheduler", default="", help="GPU scheduler policy "
                        "(fifo, credit, band; default fifo)")
    parser.add_argument("--no-extensions", action="store_true",
                        help="offer none of gpuvm's vfio-user extensions (BAR remap, "
                        "lab counters): VMMs attach with the spec's commands alone")


def main(args: argparse.Namespace) -> int:
    store = MdevStore()
    defs = store.list()
    if args.mdev:
        known = {d.uuid: d for d in defs}
        missing = [u for u in args.mdev if u not in known]
        if missing:
            raise UserError(f"no mdev {missing[0]} (see `gpuvm mdev list`)")
        defs = [known[u] for u in args.mdev]
    options = RunOptions(mode=defs[0].mode if defs else "fv-opt",
                         scheduler={"policy": args.scheduler} if args.scheduler else {})
    directory = socket_dir()
    directory.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(directory / "serve.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger("gpuvm").setLevel(logging.INFO)
    server = MdevServer(defs, options=options,
                        extensions=() if args.no_extensions else protocol.EXTENSIONS).start()
    print(f"gpuvm serve: {len(defs)} vGPU(s) on {directory} (log: {directory / 'serve.log'})",
          flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stopping.set())
    try:
        server.stopping.wait()
    finally:
        server.stop()
        log.info("stopped")
    return 0
