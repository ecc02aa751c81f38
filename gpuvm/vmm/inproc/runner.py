"""InprocRunner: one guest as a host shared library on its own thread.

The guest's platform layer (guest_tools/platform/platform_host.c) calls four ctypes
callbacks for BAR reads/writes and port out/in; each call is one "exit" and is counted
under the names the KVM backend uses (exits.io, exits.mmio.bar<N>.read / .write), so
both backends report identical counts for the same guest.

Stopping: an exception in a callback never unwinds through C.  The callback records the
failure, sets the library's `gpuvm_host_abort` flag and returns a dummy value; the
platform layer checks the flag after every callback and jumps back to its entry, which
returns (PLAT_ABORTED).  stop() uses the same flag, so a guest stops at its next
callback; one spinning in pure C, or blocked inside a wait callback, stops when that
returns.

BAR remap: `memslots` is the same MemslotTable the KVM runner has, backed by per-BAR page
tables the platform layer consults before calling back (see bar_pages.py); a remapped
page is a plain load/store, not an exit, exactly as with a KVM memslot.
"""

from __future__ import annotations

import ctypes
import logging
import time
from pathlib import Path

from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestFailed, GuestOutcome, GuestSession
from gpuvm.vmm.guest_thread import GuestThread
from gpuvm.vmm.inproc import bar_pages
from gpuvm.vmm.inproc.loader import GuestLibraryError, PrivateLibrary

log = logging.getLogger(__name__)

MMIO_READ_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64,
                                ctypes.c_uint32)
MMIO_WRITE_FN = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32,
                                 ctypes.c_uint64)
PORT_OUT_FN = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32)
PORT_IN_FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32)

MMIO_SIZES = (1, 2, 4, 8)


class ExitCounts:
    """Callback counts as list slots (cheap on the hot path), read as a dict."""

    def __init__(self, bars: list[int]) -> None:
        self.names = ["exits.io"]
        self.slot: dict[int, int] = {}
        for bar in bars:
            self.slot[bar] = len(self.names)
            self.names += [f"exits.mmio.bar{bar}.read", f"exits.mmio.bar{bar}.write"]
        self.slots = [0] * len(self.names)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.names, self.slots))


class InprocRunner(GuestThread):
    """Runs one guest library in-process (see the module docstring)."""

    backend = "inproc"

    def __init__(self, name: str, shared_lib: Path, ram: GuestRam, session: GuestSession,
                 bar_sizes: dict[int, int]) -> None:
        self.name = name
        self.ram = ram
        self.session = session
        self.bar_sizes = dict(bar_sizes)
        for bar, size in self.bar_sizes.items():
            if not 0 <= bar < abi.BOOT_NUM_BARS or size <= 0:
                raise ValueError(f"{name}: BAR{bar} of size {size:#x} is not a valid BAR")
        self.memslots, self._pages = bar_pages.bar_memslots(self.bar_sizes, ram.size)
        self.lib = PrivateLibrary(shared_lib, name)
        self.counts = ExitCounts(sorted(self.bar_sizes))
        session.add_extra_counters(self.exit_counters)
        # Keep the callback objects alive as long as the guest can call them.
        self._callbacks = (MMIO_READ_FN(self._mmio_read), MMIO_WRITE_FN(self._mmio_write),
                           PORT_OUT_FN(self._port_out), PORT_IN_FN(self._port_in))
        self._init_thread()
        self._failure: str | None = None
        self._exited = False

    # ---------------------------------------------------------------- public
    def exit_counters(self) -> dict[str, int]:
        return self.counts.as_dict()

    def stop(self, reason: str) -> None:
        """Make the guest stop at its next callback; `reason` becomes the failure."""
        self.session.request_stop()
        self._fail(reason)

    def _not_returned(self) -> str:
        return (f"{self._failure}; the guest thread has not returned (it is in C code or in "
                f"a wait) and is left running")

    # ---------------------------------------------------------------- callbacks
    def _fail(self, reason: str) -> None:
        if self._failure is None:
            self._failure = reason
        flag = self.lib.abort_flag
        if flag is not None:
            flag.value = 1

    def _bar_check(self, bar: int, offset: int, size: int, kind: str) -> None:
        bar_size = self.bar_sizes.get(bar)
        if bar_size is None:
            raise GuestFailed(f"MMIO {kind} on BAR{bar}, which the VM does not have")
        if size not in MMIO_SIZES or offset + size > bar_size:
            raise GuestFailed(f"MMIO {kind} of {size} bytes at BAR{bar}+{offset:#x}, "
                              f"outside the BAR ({bar_size:#x} bytes)")

    def _mmio_read(self, bar: int, offset: int, size: int) -> int:
        if self._failure is not None:
            return 0
        try:
            self._bar_check(bar, offset, size, "read")
            self.counts.slots[self.counts.slot[bar]] += 1
            self.session.tick()
            return self.session.device.read(bar, offset, size) & ((1 << (8 * size)) - 1)
        except BaseException as exc:  # never unwind into C
            self._callback_failed(exc)
            return 0

    def _mmio_write(self, bar: int, offset: int, size: int, value: int) -> None:
        if self._failure is not None:
            return
        try:
            self._bar_check(bar, offset, size, "write")
            self.counts.slots[self.counts.slot[bar] + 1] += 1
            self.session.tick()
            self.session.device.write(bar, offset, size, value & ((1 << (8 * size)) - 1))
        except BaseException as exc:
            self._callback_failed(exc)

    def _port_out(self, port: int, value: int) -> None:
        if self._failure is not None or self._exited:
            return
        try:
            self.counts.slots[0] += 1
            self.session.tick()
            if self.session.port_out(port, value):
                self._exited = True
        except BaseException as exc:
            self._callback_failed(exc)

    def _port_in(self, port: int) -> int:
        if self._failure is not None:
            return 0
        try:
            self.counts.slots[0] += 1
            self.session.tick()
            return self.session.port_in(port) & 0xFFFFFFFF
        except BaseException as exc:
            self._callback_failed(exc)
            return 0

    def _callback_failed(self, exc: BaseException) -> None:
        if isinstance(exc, GuestFailed):
            self._fail(str(exc))
        else:
            log.error("%s: VMM error in a guest callback", self.name, exc_info=exc)
            self._fail(f"VMM error: {type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------- guest thread
    def _write_host_pointers(self) -> int:
        """Fill the in-process fields of the boot parameters; returns their host address."""
        bp = self.ram.struct_at(abi.GUEST_BOOT_PARAMS, abi.BootParams)
        try:
            if bp.magic != abi.BOOT_MAGIC:
                raise GuestFailed("no boot parameters in guest RAM (write them before start)")
            bp.phys_offset = self.ram.host_address
            bar_pages.install(bp, self._pages)
            for field, cb in zip(("host_mmio_read", "host_mmio_write", "host_port_out",
                                  "host_port_in"), self._callbacks):
                setattr(bp, field, ctypes.cast(cb, ctypes.c_void_p).value)
        finally:
            del bp  # the view pins the RAM mapping
        return self.ram.host_address + abi.GUEST_BOOT_PARAMS

    def _main(self) -> None:
        t0 = time.perf_counter_ns()
        started = False
        try:
            bp_address = self._write_host_pointers()
            self.session.start()
            started = True
            self.lib.entry(bp_address)
            if not self._exited and self._failure is None:
                self._failure = "guest returned without reporting an exit"
        except GuestFailed as exc:
            self._failure = self._failure or str(exc)
        except Exception as exc:
            log.exception("%s: VMM error", self.name)
            self._failure = self._failure or f"VMM error: {type(exc).__name__}: {exc}"
        finally:
            if started:
                try:
                    self.session.finish()
                except Exception:
                    log.exception("%s: closing the last phase failed", self.name)
            self.lib.close()
            if self._failure is not None:
                self.session.failure = self._failure
            self._outcome = GuestOutcome(self.name, self.backend, self.session,
                                         failure=self._failure,
                                         wall_ns=time.perf_counter_ns() - t0)


__all__ = ["InprocRunner", "GuestLibraryError", "ExitCounts"]
