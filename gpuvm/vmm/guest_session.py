"""The port protocol every guest speaks (console, results, phases, waits, exit).

Both backends hand `port_out`/`port_in` the values their guests wrote; this class turns
them into a guest's log, result records, per-phase counters and wall/device times, and
implements the "sleep until the GPU signals this VM" wait.  Nothing here knows whether a
KVM exit or an in-process call delivered the access.
"""

from __future__ import annotations

import ctypes
import logging
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpuvm.vmm import abi
from gpuvm.vfio.device import VfioError
from gpuvm.vmm.guest_ram import GuestMemoryError, GuestRam
from gpuvm.vmm.hostmem import HostMemTracker
from gpuvm.vmm.vfio_attach import AttachedDevice

log = logging.getLogger(__name__)


VIRTUAL_WAIT_SLICES = 10


class GuestFailed(Exception):
    """The guest did something that ends it (bad port use, bad record)."""


@dataclass
class PhaseRecord:
    name: str
    wall_ns: int = 0
    device_ns: int = 0
    counters: dict[str, int] = field(default_factory=dict)


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    keys = after.keys() | before.keys()
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(keys)
            if after.get(k, 0) != before.get(k, 0)}


def parse_record(text: str) -> dict[str, str]:
    """'a=1 b=two' -> {'a': '1', 'b': 'two'}; a bare word becomes {word: ''}."""
    out: dict[str, str] = {}
    for item in text.split():
        key, _, value = item.partition("=")
        out[key] = value
    return out


class GuestSession:
    """One guest's side of the port protocol."""

    def __init__(self, name: str, ram: GuestRam, attached: AttachedDevice,
                 wait_timeout: float = 120.0,
                 extra_counters: Callable[[], dict[str, int]] | None = None,
                 hostmem: HostMemTracker | None = None) -> None:
        self.name = name
        # host-memory reports (PORT_HOSTMEM): counted only when the guest sends them
        self.hostmem = hostmem if hostmem is not None else HostMemTracker(ram)
        self.ram = ram
        self.attached = attached
        self.device = attached.device  # where the backends send trapped BAR accesses
        self.stats = attached.stats
        self.wait_timeout = wait_timeout
        self._extra_counters = extra_counters
        self.console: list[str] = []
        self.results: list[dict[str, str]] = []
        self.phases: list[PhaseRecord] = []
        self.exit_code: int | None = None
        self.failure: str | None = None
        self.port_counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # the VMM stops the guest: its wait ends now
        self._phase_start: tuple[int, int, dict[str, int]] | None = None
        self._faults_reported = 0
        self._current: str | None = None
        # the vCPU's party of a virtual device clock (gpuvm/device/clock.py; a
        # RemoteVcpu in a VMM process of its own), or None
        self.clock_party: Any = None
        self.leaving: Any = None  # its timer at its last time, once the guest ended

    def use_clock(self, party: Any) -> None:
        """Run on a virtual device clock as `party`: every exit the backends report
        through `tick` is guest time, and a wait sleeps in that clock until the GPU
        signals -- any signal of its GPU wakes the wait to look (another VM's completion
        too)."""
        self.clock_party = party
        party.waker = self.attached.look_again

    def request_stop(self) -> None:
        """The VMM is stopping this guest (any thread): a wait it sleeps in ends at once,
        whatever the clock (a stopped run's device time may never reach its fence)."""
        self._stopping.set()
        self.attached.look_again()

    def tick(self) -> None:
        """One exit of this guest's vCPU (backends call it on every exit)."""
        party = self.clock_party
        if party is not None:
            party.tick()

    def exit_ticker(self) -> Callable[[], None] | None:
        """`tick` as the KVM exit loop binds it once per entry: the clock party's own
        method, or None off a virtual clock (nothing to call) -- a forwarding call on
        every exit is a measurable share of a trap."""
        party = self.clock_party
        return party.tick if party is not None else None

    # ---------------------------------------------------------------- accounting
    def add_extra_counters(self, source: Callable[[], dict[str, int]]) -> None:
        """Add counts from a part built after the session (e.g. the KVM runner's exits)."""
        previous = self._extra_counters
        self._extra_counters = source if previous is None else \
            (lambda: {**previous(), **source()})

    def snapshot(self, counters: Callable[[], dict[str, int]] | None = None
                 ) -> dict[str, int]:
        """Every count the session reports; `counters` reads the device's in place of
        stats.counters (a recorded VM over vfio-user adds the server's time)."""
        counts = dict((counters or self.stats.counters)())
        if self._extra_counters is not None:
            counts.update(self._extra_counters())
        for key, value in self.port_counts.items():
            counts[f"port.{key}"] = value
        party = self.clock_party
        if party is not None:  # on a virtual clock its waits for the mediator's lock
            counts["mediator_lock.waits"] = party.lock_waits
            counts["mediator_lock.wait_ns"] = party.lock_wait_ns
        counts.update(self.hostmem.counters)
        return counts

    def _cut_phase(self, next_phase: str | None) -> None:
        now_wall = time.perf_counter_ns()
        # on a virtual clock a phase lasts what its vCPU's own virtual time says
        now_dev = self.clock_party.v if self.clock_party is not None \
            else self.stats.device_time_ns()
        counts = self.snapshot()
        if self._current is not None and self._phase_start is not None:
            wall0, dev0, counts0 = self._phase_start
            self.phases.append(PhaseRecord(self._current, now_wall - wall0, now_dev - dev0,
                                           _diff(counts, counts0)))
        self._current = next_phase
        self._phase_start = (now_wall, now_dev, counts)

    def start(self) -> None:
        """Begin accounting; anything before the guest's first phase mark is 'Init'.
        Called on the vCPU's own thread: doorbells it rings carry its virtual time."""
        if self.clock_party is not None:
            self.clock_party.bind()
        self._cut_phase(abi.PHASE_NAMES[abi.PHASE_INIT])

    def finish(self) -> None:
        party = self.clock_party
        if party is not None:
            party.settle()
        self._cut_phase(None)
        self.hostmem.finish()
        if party is not None:
            # The vCPU leaves the clock as its guest ends, on its own thread: a timer
            # holds device time at its last time until the VMM has removed its vGPU
            # there (gpuvm/run/execute.py).  Left for the VMM to notice, an ended vCPU
            # behind another VM's removal held that removal back until it timed out.
            self.leaving = party.retire()

    # ---------------------------------------------------------------- ports
    def _count(self, name: str) -> None:
        self.port_counts[name] = self.port_counts.get(name, 0) + 1

    def port_out(self, port: int, value: int) -> bool:
        """Handle a guest `out`; True when the guest has exited."""
        if self.clock_party is not None and port != abi.PORT_HYPERCALL:
            self.clock_party.unseen_exit()  # the hypercall is a device access
        try:
            if port == abi.PORT_CONSOLE:
                self._count("console")
                line = self.ram.read_cstring(value)
                self.console.append(line)
                log.info("[%s] %s", self.name, line)
            elif port == abi.PORT_RESULT:
                self._count("result")
                self.results.append(parse_record(self.ram.read_cstring(value)))
            elif port == abi.PORT_PHASE:
                self._count("phase")
                if not 0 <= value < len(abi.PHASE_NAMES):
                    raise GuestFailed(f"phase mark {value} is not a known phase")
                self._cut_phase(abi.PHASE_NAMES[value])
            elif port == abi.PORT_WAIT:
                self._count("wait")
                self._wait(value)
            elif port == abi.PORT_HYPERCALL:
                self._count("hypercall")
                if not self.attached.port_write(port, value):
                    raise GuestFailed("hypercall from a guest that is not paravirtualized")
            elif port == abi.PORT_HOSTMEM:
                self._count("hostmem")
                rec = self.ram.struct_at(value, abi.HostmemEvent)
                event = abi.HostmemEvent.from_buffer_copy(rec)
                del rec  # release the view on guest memory
                try:
                    self.hostmem.handle(event)
                except ValueError as exc:
                    raise GuestFailed(str(exc)) from exc
            elif port == abi.PORT_EXIT:
                self._count("exit")
                self.exit_code = value
                return True
            else:
                raise GuestFailed(f"write of {value:#x} to unknown port {port:#x}")
        except (GuestMemoryError, VfioError) as exc:
            raise GuestFailed(f"port {port:#x}: {exc}") from exc
        return False

    def port_in(self, port: int) -> int:
        raise GuestFailed(f"read from port {port:#x}, which no device answers")

    def _wait(self, gpa: int) -> None:
        rec = self.ram.struct_at(gpa, abi.WaitRecord)
        addr, value = int(rec.addr), int(rec.value)
        self.ram.check(addr, 4)
        timeout = rec.timeout_ns / 1e9 if rec.timeout_ns else self.wait_timeout
        # Faults are reported once, to the first wait that follows them -- including a
        # fault that landed before this wait began (between the doorbell and the wait).
        reported = self._faults_reported

        def fence_reached() -> bool:
            return ((self.ram.read_u32(addr) - value) & 0xFFFFFFFF) < 0x80000000

        def done() -> bool:
            return fence_reached() or len(self.stats.faults()) > reported \
                or self._stopping.is_set()

        party = self.clock_party
        if party is not None:
            plain = done
            since = party.wait_starts()

            def done() -> bool:  # noqa: F811 -- asleep in virtual time while not done
                generation = party.generation()  # read before looking (see block)
                if plain():
                    return True
                party.block(generation)
                return False

        ok = self.attached.wait_event(done, timeout)
        if party is not None and not rec.timeout_ns:
            # On the virtual clock a wall-time slice says nothing about the guest's wait:
            # other VMs may take their turns at the mediator's lock for long, in wall
            # time, before device time reaches this guest's completion.  Ending the wait
            # there made the driver wait again -- one more exit on a loaded host than on
            # an idle one.  It goes on (a hung GPU ends it in virtual time: the watchdog
            # faults the submission), up to VIRTUAL_WAIT_SLICES slices in all.
            for _ in range(VIRTUAL_WAIT_SLICES - 1):
                if ok:
                    break
                ok = self.attached.wait_event(done, timeout)
        if party is not None:
            party.unblock()
            party.wait_ends(since)
        faults = len(self.stats.faults())
        if fence_reached():
            rec.status = abi.WAIT_OK
        elif faults > reported:
            rec.status = abi.WAIT_FAULT
            self._faults_reported = faults
        else:
            rec.status = abi.WAIT_TIMEOUT if not ok or self._stopping.is_set() \
                else abi.WAIT_OK
        del rec  # release the view on guest memory

    # ---------------------------------------------------------------- outcome
    def passed(self) -> bool:
        """Exit code 0, no failure, and every check the guest reported says PASS."""
        if self.failure or self.exit_code != 0:
            return False
        checks = [r.get("check") for r in self.results if "check" in r]
        return bool(checks) and all(c == "PASS" for c in checks)


def boot_params_for(ram: GuestRam, bench: str, params: list[int], flags: int,
                    bar_base: dict[int, int], bar_size: dict[int, int],
                    phys_offset: int = 0) -> abi.BootParams:
    """Write the boot parameters into guest RAM at GUEST_BOOT_PARAMS and return the view."""
    if len(params) > abi.BOOT_NUM_PARAMS:
        raise ValueError(f"at most {abi.BOOT_NUM_PARAMS} benchmark parameters, got {len(params)}")
    name = bench.encode()
    if len(name) >= abi.BOOT_BENCH_NAME_LEN:
        raise ValueError(f"benchmark name {bench!r} is too long")
    bp = ram.struct_at(abi.GUEST_BOOT_PARAMS, abi.BootParams)
    ctypes.memset(ctypes.addressof(bp), 0, ctypes.sizeof(bp))
    bp.magic = abi.BOOT_MAGIC
    bp.version = abi.BOOT_VERSION
    bp.ram_size = ram.size
    bp.phys_offset = phys_offset
    bp.heap_start = abi.GUEST_HEAP_BASE
    for bar, base in bar_base.items():
        bp.bar_base[bar] = base
    for bar, size in bar_size.items():
        bp.bar_size[bar] = size
    bp.flags = flags
    for i, p in enumerate(params):
        bp.params[i] = p
    bp.bench = name
    return bp


@dataclass(frozen=True)
class ThreadUsage:
    """What one thread used over an interval (getrusage RUSAGE_THREAD): its CPU time and
    how often it slept.  For a vCPU thread of VMs run as threads a voluntary switch is a
    wait -- for the interpreter lock another VM holds, for a fence, for a kick;
    preemptions are the host's cores running short."""

    cpu_ns: int
    voluntary_switches: int
    involuntary_switches: int

    @classmethod
    def now(cls) -> ThreadUsage:
        """This thread's usage so far.  CPU time from the thread's clock: getrusage's is
        sampled at the scheduler tick, and reads 0 for a guest of a few milliseconds."""
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return cls(time.thread_time_ns(), usage.ru_nvcsw, usage.ru_nivcsw)

    def since(self, before: ThreadUsage) -> ThreadUsage:
        """The usage from `before` to this one (both of one thread)."""
        return ThreadUsage(self.cpu_ns - before.cpu_ns,
                           self.voluntary_switches - before.voluntary_switches,
                           self.involuntary_switches - before.involuntary_switches)


@dataclass
class GuestOutcome:
    """How one guest ended, whichever backend ran it."""

    name: str
    backend: str  # "kvm" or "inproc"
    session: GuestSession
    failure: str | None = None  # None when the guest exited by itself
    rip: int | None = None  # guest instruction pointer at a crash (KVM)
    wall_ns: int = 0
    vcpu: ThreadUsage | None = None  # the vCPU thread's, from the guest's start (KVM)

    @property
    def passed(self) -> bool:
        return self.failure is None and self.session.passed()

    def describe_failure(self) -> str | None:
        """One line saying why this guest did not pass, or None."""
        if self.failure:
            where = f" at rip {self.rip:#x}" if self.rip is not None else ""
            return f"{self.name}: {self.failure}{where}"
        s = self.session
        if s.exit_code not in (0, None):
            reason = next((r.get("reason") for r in reversed(s.results) if "reason" in r), None)
            return f"{self.name}: guest exited with code {s.exit_code}" + \
                (f" ({reason.replace('_', ' ')})" if reason else "")
        if not s.passed():
            return f"{self.name}: checks did not pass"
        return None
