"""KvmRunner: one guest on one real vCPU, in its own thread.

The VM and vCPU are created inside the thread that runs them (a VM created before a
fork is unusable in the child, and keeping every KVM object on one thread keeps
teardown simple).  KVM_RUN releases the GIL, so several runners run guests in parallel;
a guest that crashes, misbehaves or times out ends only its own VM: the outcome carries
a one-line reason and the guest's RIP, and the thread releases its fds and mappings.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import ContextManager

from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.vmm import abi
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.env_switch import env_switch
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestFailed, GuestOutcome, GuestSession, ThreadUsage
from gpuvm.vmm.guest_thread import GuestThread
from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm import long_mode
from gpuvm.vmm.kvm.kick import ensure_kick_handler, kick
from gpuvm.vmm.kvm.memslots import MemslotError, MemslotTable
from gpuvm.vmm.kvm.vcpu import BarRange, DirectAccesses, ExitCounters, ExitLoop
from gpuvm.vmm.kvm.vm import KvmError, KvmVm

log = logging.getLogger(__name__)

COALESCE_ENV = "GPUVM_COALESCE"  # 0: every access exits (before/after comparisons)


def coalescing_default() -> bool:
    """Whether KVM guests make fewer exits -- their posted stores queued in the
    coalesced ring, a passed-through GPU's apertures mapped as memory (native mode) --
    for the same counts: yes unless $GPUVM_COALESCE is 0."""
    value = os.environ.get(COALESCE_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise UserError(f"{COALESCE_ENV}={value!r}: must be 0 (off) or 1 (on)")
    return value != "0"


def coalescing(on: bool) -> ContextManager[None]:
    """KVM runners made inside (and VMM processes started inside) use the coalesced ring
    or not: $GPUVM_COALESCE, restored after (benchmarks' before/after comparisons)."""
    return env_switch(COALESCE_ENV, on)


def coalesced_zones(windows: tuple[BarRange, ...], apertures_mapped: bool = False
                    ) -> list[tuple[int, int]]:
    """The guest-physical ranges whose stores take effect only at a later trapped access,
    as (gpa, size): the PRAMIN window of BAR0 (plain VRAM stores; PRAMIN's base is a
    register that exits) and the whole BAR3 aperture (instance memory: page tables,
    instance blocks, the runlist -- read by the GPU at a TLB flush, a channel's
    programming or a runlist submit, all BAR0 stores that exit).  BAR1 is left trapping:
    its pages the driver writes are USERD, whose GP_PUT is the doorbell.  Where the
    device maps BAR3's pages as memory once touched (`apertures_mapped`: native mode),
    BAR3 is left out: the first store to a page must exit so that it is mapped at once,
    not queue behind others to the same page."""
    zones = []
    for w in windows:
        if w.bar == regs.BAR0 and regs.PRAMIN_WINDOW + regs.PRAMIN_WINDOW_SIZE <= w.size:
            zones.append((w.base + regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE))
        elif w.bar == regs.BAR3 and not apertures_mapped:
            zones.append((w.base, w.size))
    return zones


class GuestImageError(ValueError):
    """The flat image cannot be loaded (missing, too big for the layout or the RAM)."""


def bar_windows(bar_sizes: dict[int, int], ram_size: int) -> tuple[BarRange, ...]:
    """The guest-physical BAR windows for `bar_sizes`, checked against the layout."""
    windows = []
    for bar, size in sorted(bar_sizes.items()):
        if bar not in BAR_BASES:
            raise ValueError(f"BAR{bar} has no guest-physical window on KVM "
                             f"(windows exist for BARs {sorted(BAR_BASES)})")
        base = BAR_BASES[bar]
        limit = min([b for b in BAR_BASES.values() if b > base]
                    + [abi.GUEST_IDENTITY_MAP_TOP])
        if size <= 0 or base + size > limit:
            raise ValueError(f"BAR{bar} size {size:#x} does not fit its window at "
                             f"{base:#x} (at most {limit - base:#x})")
        windows.append(BarRange(bar, base, size))
    if ram_size > min(BAR_BASES.values()):
        raise ValueError(f"guest RAM of {ram_size:#x} bytes overlaps the BAR windows")
    return tuple(windows)


def load_image(path: Path, ram: GuestRam, name: str) -> bytes:
    """Read a flat image and check it fits the layout and this VM's RAM."""
    try:
        image = Path(path).read_bytes()
    except OSError as exc:
        raise GuestImageError(f"{name}: cannot read guest image {path}: {exc.strerror}") \
            from exc
    if not image:
        raise GuestImageError(f"{name}: guest image {path} is empty")
    if len(image) > abi.GUEST_IMAGE_MAX:
        raise GuestImageError(f"{name}: guest image {path} is {len(image):#x} bytes, over "
                              f"the {abi.GUEST_IMAGE_MAX:#x} the layout allows")
    if abi.GUEST_IMAGE_BASE + len(image) > ram.size:
        raise GuestImageError(f"{name}: guest image {path} does not fit in "
                              f"{ram.size:#x} bytes of RAM")
    return image


class KvmRunner(GuestThread):
    """Runs one flat guest image on a KVM vCPU (see the module docstring)."""

    thread_prefix = "vcpu"

    backend = "kvm"
    loop_class: type[ExitLoop] = ExitLoop  # the exit bench swaps in a raw-mode loop

    def __init__(self, name: str, flat_image: Path, ram: GuestRam, session: GuestSession,
                 bar_sizes: dict[int, int], coalesce: bool | None = None) -> None:
        self.name = name
        # posted stores through the coalesced ring (None: as $GPUVM_COALESCE says)
        self.coalesce = coalescing_default() if coalesce is None else coalesce
        self.ram = ram
        self.session = session
        self.windows = bar_windows(bar_sizes, ram.size)
        self.image = load_image(flat_image, ram, name)
        self.counters = ExitCounters(self.windows)
        # BAR remap: usable before start() (applied when the VM exists) and while it runs
        self.memslots = MemslotTable(first_slot=1, reserved=((0, ram.size),))
        # the same switch: without it a passed-through GPU's apertures trap too
        self.memslots.accepts_direct = self.coalesce
        session.add_extra_counters(self.exit_counters)
        ensure_kick_handler()
        self._init_thread()
        self._lock = threading.Lock()  # guards _vm and _stop against the vCPU thread
        self._vm: KvmVm | None = None
        self._stop: str | None = None

    # ---------------------------------------------------------------- public
    def exit_counters(self) -> dict[str, int]:
        """Exit counts by kind: exits.io, exits.mmio.bar<N>.read / .write."""
        return self.counters.as_dict()

    def stop(self, reason: str) -> None:
        """Ask the vCPU to stop at once (from any thread); `reason` becomes the failure."""
        self.session.request_stop()
        with self._lock:
            if self._stop is None:
                self._stop = reason
            vm = self._vm
            if vm is not None and vm.run is not None:
                vm.run[api.RUN_IMMEDIATE_EXIT] = 1  # every KVM_RUN now returns EINTR
                if self._thread is not None and self._thread.ident is not None:
                    kick(self._thread.ident)

    def _not_returned(self) -> str:
        return (f"{self._stop}; the vCPU thread is still busy in a handler and will release "
                f"the VM when it returns")

    @property
    def coalescing_safe(self) -> bool:
        """Whether the posted stores may wait in the ring: not where a device remaps BAR
        pages as it judges from the guest's trapped accesses (a mediated vGPU in a remap
        mode: a BAR3 or PRAMIN store can make it map or unmap pages, which the guest's
        next access must already see), unless those mappings are the passed-through
        GPU's own apertures, which no queued store changes (`coalesced_zones`).  Such a
        device says itself which zones may queue, and when (MemslotTable.post)."""
        return self.coalesce and (self.direct_counting or not self.memslots.device_maps)

    @property
    def direct_counting(self) -> bool:
        """Whether the device maps pages that stand for counted accesses (see
        MemslotTable.direct_counter)."""
        return self.memslots.direct_counter is not None

    def _direct_accesses(self) -> DirectAccesses | None:
        counter = self.memslots.direct_counter
        if counter is None:
            return None
        start = abi.GUEST_BOOT_PARAMS + abi.BootParams.bar_reads.offset
        end = abi.GUEST_BOOT_PARAMS + abi.BootParams.bar_writes.offset + \
            abi.BootParams.bar_writes.size
        return DirectAccesses(memoryview(self.ram.array[start:end]).cast("Q"), counter)

    # ---------------------------------------------------------------- vCPU thread
    def _stop_reason(self) -> str | None:
        return self._stop

    def _setup(self) -> KvmVm:
        vm = KvmVm.create()
        try:
            vm.set_memory_region(0, 0, self.ram.size, self.ram.host_address)
            cr3 = long_mode.write_identity_page_tables(self.ram)
            self.ram.write(abi.GUEST_IMAGE_BASE, self.image)
            sregs = vm.get_sregs()
            long_mode.configure_sregs(sregs, cr3)
            vm.set_sregs(sregs)
            vm.set_regs(long_mode.entry_regs(abi.GUEST_IMAGE_BASE, abi.GUEST_STACK_TOP - 8,
                                             abi.GUEST_BOOT_PARAMS))
            # a remapping device may still say which of its zones can queue (`post`)
            self.memslots.accepts_posting = self.coalesce and bool(vm.coalesced_ring)
            self.memslots.bind(vm)
            if self.coalescing_safe and vm.coalesced_ring:
                for gpa, size in coalesced_zones(self.windows, self.direct_counting):
                    vm.coalesce(gpa, size)
        except BaseException:
            self.memslots.unbind()
            vm.close()
            raise
        return vm

    def _main(self) -> None:
        t0 = time.perf_counter_ns()
        failure: str | None = None
        rip: int | None = None
        vm: KvmVm | None = None
        loop: ExitLoop | None = None
        vcpu: ThreadUsage | None = None
        started = False
        try:
            vm = self._setup()
            with self._lock:
                self._vm = vm
                if self._stop is not None:
                    vm.run[api.RUN_IMMEDIATE_EXIT] = 1  # stopped before it began
            loop = self.loop_class(vm, self.session, self.windows, self.counters,
                                   self._stop_reason,
                                   coalesced=self.coalesce and bool(vm.coalesced_ring),
                                   direct=self._direct_accesses())
            self.session.start()
            started = True
            usage = ThreadUsage.now()
            try:
                failure = loop.run()
            finally:
                vcpu = ThreadUsage.now().since(usage)
        except GuestFailed as exc:
            failure = str(exc)
        except (KvmError, MemslotError) as exc:
            failure = str(exc)
        except Exception as exc:  # a bug in a handler must not take other VMs down
            log.exception("%s: VMM error", self.name)
            failure = f"VMM error: {type(exc).__name__}: {exc}"
        finally:
            if vm is not None and failure is not None:
                try:
                    rip = vm.get_regs().rip
                except KvmError:
                    rip = None
            if started:
                try:
                    self.session.finish()
                except Exception:
                    log.exception("%s: closing the last phase failed", self.name)
            with self._lock:
                self._vm = None
            self.memslots.unbind()
            if loop is not None:
                loop.release()
            if vm is not None:
                vm.close()
            if failure is not None:
                self.session.failure = failure
            self._outcome = GuestOutcome(self.name, self.backend, self.session,
                                         failure=failure, rip=rip,
                                         wall_ns=time.perf_counter_ns() - t0, vcpu=vcpu)
