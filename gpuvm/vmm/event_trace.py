"""Per-event traces: the timed sequence of what one VM did, kept as runs of equal events.

Per-phase counts say how much a VM did, not when: a model that replays them cannot tell
the stretch where the mediator is held (a TLB flush's shadow sync) from the one where the
guest runs alone, nor which time holds the interpreter lock (a trap's handler) and which
does not (the guest in KVM_RUN, a wait on the engine).  The recorder keeps that order.

Every trapped BAR access and every port write the VMM handles is an event of a class
(BAR n read/write, port p).  Consecutive events of one class form a run; a run keeps how
many events it had, the time spent in their handlers (on the vCPU thread, in the VMM:
the interpreter lock is held there, except while a port wait sleeps), the time between
them, and how much of that was spent inside KVM_RUN (the guest running and the kernel's
exit and entry: the only part off the interpreter lock -- the rest is the VMM's exit
loop, Python that holds it; a backend without KVM_RUN reports none), and, when it
closes, the difference of every counter the session reports -- shadow syncs and the
entries they scanned, hypercalls and their entries, doorbells, engine time -- so the
trace carries whatever counters exist without knowing their names.  Port writes (phase
marks, waits, hypercalls) each close their run: they are where the guest's work changes.

The cost when recording: two clock reads and a few integer operations per event, and one
counter snapshot per run (counted as the run's handler time: it can wait for the device
lock, which is then the guest's wait).  A VM in its own process (vfio-user) reads its
counters from the server, with the server's own time for this VM ("server.access_ns",
"server.engine_ns": what the model serialises); a read is a round trip there, of which
only what it took beyond the run's median read is counted.  Nothing is recorded
unless a run asks for it (RunOptions.record_events).

Where the recorder is asked to (`count_lock_releases`, VMs as threads of one process)
and the host lets it (gpuvm.vmm.lock_releases: a uprobe, root), a run also carries how
often its handlers and exit loop let the interpreter lock go beyond the one release an
exit makes entering KVM_RUN again (LOCK_RELEASES): beside other VMs each is one more
wait for the lock.  The count is read with the counters, once per run.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gpuvm.vfio.user.protocol import SERVER_ENGINE_COUNTER
from gpuvm.vmm import abi
from gpuvm.vmm.lock_releases import ReleaseCounter

# event classes: BAR n read = 2n, write = 2n + 1; port writes = PORT_BASE + port
PORT_BASE = 1 << 16
# a run's releases of the interpreter lock on the vCPU thread, beyond its KVM_RUNs'
LOCK_RELEASES = "lock.releases"

PORT_LABELS = {abi.PORT_CONSOLE: "console", abi.PORT_RESULT: "result", abi.PORT_WAIT: "wait",
               abi.PORT_HYPERCALL: "hypercall", abi.PORT_EXIT: "exit",
               abi.PORT_PHASE: "phase", abi.PORT_HOSTMEM: "hostmem"}


def _exit_counter(code: int) -> str | None:
    """The exit counter an event of class `code` bumps (None: no event, code -1)."""
    if code < 0:
        return None
    if code >= PORT_BASE:
        return "exits.io"
    return f"exits.mmio.bar{code // 2}.{'write' if code & 1 else 'read'}"


def class_name(code: int) -> str:
    """'bar3.write', 'port.wait', ..."""
    if code >= PORT_BASE:
        port = code - PORT_BASE
        return f"port.{PORT_LABELS.get(port, hex(port))}"
    return f"bar{code // 2}.{'write' if code & 1 else 'read'}"


@dataclass(frozen=True, eq=False)
class EventTrace:
    """One VM's runs, as columns (one entry per run)."""

    code: np.ndarray        # int64: the event class
    phase: np.ndarray       # int64: index into abi.PHASE_NAMES of the phase it ran in
    events: np.ndarray      # int64: events in the run
    handler_ns: np.ndarray  # int64: time in the VMM's handlers
    gap_ns: np.ndarray      # int64: time between them (the guest, the exit path)
    guest_ns: np.ndarray    # int64: the part of gap_ns inside KVM_RUN (off the lock)
    names: tuple[str, ...]  # counter names, the columns of `deltas`
    deltas: np.ndarray      # int64 [runs x names]: counter differences over the run

    def __len__(self) -> int:
        return int(self.code.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventTrace):
            return NotImplemented
        return self.names == other.names and all(
            np.array_equal(a, b) for a, b in zip(self._columns(), other._columns()))

    __hash__ = None  # type: ignore[assignment]

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (self.code, self.phase, self.events, self.handler_ns, self.gap_ns,
                self.guest_ns, self.deltas)

    def counter(self, name: str) -> np.ndarray:
        """One counter's difference per run (zeros if no run changed it)."""
        if name not in self.names:
            return np.zeros(len(self), dtype=np.int64)
        return self.deltas[:, self.names.index(name)]

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns by name, for np.savez."""
        return {"code": self.code, "phase": self.phase, "events": self.events,
                "handler_ns": self.handler_ns, "gap_ns": self.gap_ns,
                "guest_ns": self.guest_ns,
                "names": np.array(self.names, dtype=str), "deltas": self.deltas}

    def packed(self) -> str:
        """The trace as text (a base64 .npz): how a VM in its own process sends it."""
        buf = io.BytesIO()
        np.savez_compressed(buf, **self.arrays())
        return base64.b64encode(buf.getvalue()).decode("ascii")

    @classmethod
    def unpacked(cls, text: str) -> EventTrace:
        with np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False) as a:
            return cls.from_arrays(a)

    def without_counter(self, name: str) -> EventTrace:
        """This trace without one counter (unchanged where it has none)."""
        keep = [i for i, n in enumerate(self.names) if n != name]
        return EventTrace(self.code, self.phase, self.events, self.handler_ns,
                          self.gap_ns, self.guest_ns, tuple(self.names[i] for i in keep),
                          self.deltas[:, keep])

    def with_counter(self, name: str, values: np.ndarray) -> EventTrace:
        """This trace with one more counter's change per run (replacing one so named)."""
        rest = self.without_counter(name)
        return EventTrace(rest.code, rest.phase, rest.events, rest.handler_ns,
                          rest.gap_ns, rest.guest_ns, rest.names + (name,),
                          np.column_stack([rest.deltas, np.asarray(values, dtype=np.int64)]))

    @classmethod
    def from_arrays(cls, a) -> EventTrace:
        return cls(np.asarray(a["code"], dtype=np.int64), np.asarray(a["phase"], dtype=np.int64),
                   np.asarray(a["events"], dtype=np.int64),
                   np.asarray(a["handler_ns"], dtype=np.int64),
                   np.asarray(a["gap_ns"], dtype=np.int64),
                   np.asarray(a["guest_ns"], dtype=np.int64),
                   tuple(str(n) for n in a["names"]),
                   np.asarray(a["deltas"], dtype=np.int64).reshape(len(a["code"]), -1))


class EventRecorder:
    """Records one VM's events (see the module docstring); install() before the vCPU
    starts, trace() after it ended."""

    def __init__(self, snapshot: Callable[[], dict[str, int]],
                 clock: Callable[[], int] = time.perf_counter_ns,
                 cpu_clock: Callable[[], int] = time.thread_time_ns,
                 remote_counters: bool = False,
                 after_run: Callable[[int], None] | None = None,
                 count_lock_releases: bool = False) -> None:
        self._snapshot = snapshot
        # the vCPU thread's releases of the interpreter lock (opened at its first
        # KVM_RUN, on that thread), the count at the last read, the KVM_RUNs since, and
        # the releases beyond them so far
        self._count_releases = count_lock_releases
        self._releases: ReleaseCounter | None = None
        self._releases_thread = 0
        self._releases_read = self._runs_since_read = self._releases_beyond = 0
        # called after each KVM_RUN returns, with when it was entered (RunOptions
        # .after_kvm_run); its time counts as the guest's, not the exit's
        self._after_run = after_run
        # counters read from a server in another process (a VM over vfio-user): the
        # read is a round trip the unrecorded run never makes; only what it took beyond
        # the run's typical (median) read can be the guest's -- the server was busy
        # (its engine thread holds the server's interpreter lock while it runs this
        # VM's kernel) and the guest's next access would have waited for it: trace()
        # adds that, up to the server's time on the VM's channels during the run.  Not
        # beyond the quickest: measured on 2 cores, the reads' spread is wake-up jitter
        # (as slow early in a run as late, with fewer counters), 20-35% more time.  Nor
        # beyond the channels' time: the rest is jitter too -- uncapped, it made pv
        # traces on the lent 16-core machine 13-15% longer than the runs they predict
        # (5-7 ms of 43-54, measured 2026-11-23), fv-opt's 2%.
        self._remote_counters = remote_counters
        self._remote_read_ns: list[int] = []
        self._clock = clock
        self._cpu_clock = cpu_clock  # this thread's CPU time: the counter read's own cost
        self._rows: list[tuple[int, int, int, int, int]] = []
        self._deltas: list[dict[str, int]] = []
        self._code = -1
        self._n = self._handler = self._gap = self._guest = 0
        self.in_kvm_run_ns = 0  # the vCPU's time inside KVM_RUN so far (timed_run adds)
        self._guest_mark = 0  # in_kvm_run_ns when the last event's handler ended
        self._phase = abi.PHASE_INIT
        self._last_end = 0
        self._before: dict[str, int] = {}

    # ------------------------------------------------------------------ the hot path
    def _switch(self, code: int) -> None:
        """An event of another class comes: close the run (its counters are read before
        the new event's handler changes them).  Both backends count an exit before
        handing it over, so the new event's own exit is already counted: it is moved to
        the run it opens."""
        if self._n:
            self._close(_exit_counter(code))
        self._code = code

    def _close(self, counted_ahead: str | None = None) -> None:
        """Close the run.  Reading the counters, and taking their differences, is the
        recorder's own work, which a run that records nothing does not do: its CPU time
        is left out of the trace (the read made a recorded pv run 20-35% slower than an
        unrecorded one; the differences were left in until 2026-11-26).  The rest of the
        read is waiting -- for the device lock, held by the engine thread while it runs
        a kernel -- and that the guest would have waited at its next access: it is
        added to the run's handler time (a replay takes a handler's time beyond its
        priced work as blocked).

        A run closes when the next event has already arrived: the time from the run's
        last event to now is the guest running before that next event, so it opens the
        next run's gap (dropping it lost the guest's time at every change of class --
        a fifth of a pv run's wall time)."""
        if self._n:
            t = self._clock()
            ahead = t - self._last_end
            cpu0 = self._cpu_clock()
            releases = self._releases_beyond_runs() if self._releases is not None else 0
            after = self._snapshot()
            if self._releases is not None:
                after[LOCK_RELEASES] = releases
                self._releases_read = self._releases.read()  # the snapshot's are ours
            if counted_ahead is not None and after.get(counted_ahead):
                after[counted_ahead] -= 1
            before = self._before
            self._deltas.append({k: v - before.get(k, 0) for k, v in after.items()
                                 if v != before.get(k, 0)})
            own = self._cpu_clock() - cpu0
            self._last_end = self._clock()
            if self._remote_counters:
                self._remote_read_ns.append(self._last_end - t)
            else:
                self._handler += max(0, self._last_end - t - own)
            self._rows.append((self._code, self._phase, self._n, self._handler, self._gap,
                               self._guest))
            self._before = after
            self._n = self._handler = 0
            self._gap = ahead
            self._guest = self.in_kvm_run_ns - self._guest_mark
            self._guest_mark = self.in_kvm_run_ns

    def _releases_beyond_runs(self) -> int:
        """The releases so far that no KVM_RUN made, nor the recorder (its reads of the
        counter and of the counters)."""
        assert self._releases is not None
        now = self._releases.read()
        own_read = 1 if threading.get_ident() == self._releases_thread else 0
        beyond = now - self._releases_read - self._runs_since_read - own_read
        self._releases_beyond += max(0, beyond)
        self._releases_read, self._runs_since_read = now, 0
        return self._releases_beyond

    # ------------------------------------------------------------------ wiring
    def _add(self, t0: int, t1: int) -> None:
        self._n += 1
        self._handler += t1 - t0
        self._gap += t0 - self._last_end
        self._last_end = t1
        self._guest += self.in_kvm_run_ns - self._guest_mark
        self._guest_mark = self.in_kvm_run_ns

    def timed_run(self, ioctl: Callable, fd: int, request: int) -> None:
        """`ioctl(fd, request)` (KVM_RUN), its time added to in_kvm_run_ns: the KVM
        backend's exit loop enters the guest through this while recording."""
        if self._count_releases and self._releases is None:
            self._count_releases = False  # one try: where it fails, it fails every time
            self._releases = ReleaseCounter.for_this_thread()
            self._releases_thread = threading.get_ident()
        self._runs_since_read += 1
        t0 = self._clock()
        try:
            ioctl(fd, request)
            if self._after_run is not None:
                self._after_run(t0)
        finally:
            self.in_kvm_run_ns += self._clock() - t0

    def begin(self) -> None:
        """The guest starts now: time before this (building the VM) is not between
        events."""
        self._last_end = self._clock()

    def install(self, session) -> None:
        """Put the recorder between the session's VMM loop and its device and ports."""
        device, port_out = session.device, session.port_out
        recorder = self
        clock = self._clock

        class RecordingDevice:
            """The attached device, timed (everything else passes through)."""

            def __getattr__(self, name):
                return getattr(device, name)

            def read(self, region: int, offset: int, size: int) -> int:
                if 2 * region != recorder._code:
                    recorder._switch(2 * region)
                t0 = clock()
                value = device.read(region, offset, size)
                recorder._add(t0, clock())
                return value

            def write(self, region: int, offset: int, size: int, value: int) -> None:
                if 2 * region + 1 != recorder._code:
                    recorder._switch(2 * region + 1)
                t0 = clock()
                device.write(region, offset, size, value)
                recorder._add(t0, clock())

        def recording_port_out(port: int, value: int) -> bool:
            recorder._switch(PORT_BASE + port)  # a port write is a run of its own
            t0 = clock()
            done = port_out(port, value)
            recorder._add(t0, clock())
            recorder._switch(-1)
            if port == abi.PORT_PHASE and 0 <= value < len(abi.PHASE_NAMES):
                recorder._phase = value
            return done

        self._before = session.snapshot()
        self._last_end = clock()
        session.device = RecordingDevice()
        session.port_out = recording_port_out

    def trace(self) -> EventTrace:
        self._close()
        if self._releases is not None:
            self._releases.close()
            self._releases = None
        names = tuple(sorted({k for d in self._deltas for k in d}))
        index = {n: i for i, n in enumerate(names)}
        deltas = np.zeros((len(self._rows), len(names)), dtype=np.int64)
        for r, d in enumerate(self._deltas):
            for k, v in d.items():
                deltas[r, index[k]] = v
        cols = np.array(self._rows, dtype=np.int64).reshape(-1, 6)
        trace = EventTrace(*(cols[:, i].copy() for i in range(6)), names, deltas)
        if self._remote_read_ns:
            reads = np.array(self._remote_read_ns, dtype=np.int64)
            trace.handler_ns[:] += np.minimum(np.maximum(0, reads - int(np.median(reads))),
                                              trace.counter(SERVER_ENGINE_COUNTER))
        return trace
