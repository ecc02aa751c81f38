"""The model of the whole system: simulated VMs replay what a real VM did, competing for
what is really shared.

A VM's trace here is built from the exact per-phase counts of a run (runs.jsonl): each
phase becomes a sequence of steps, and each step needs one shared resource:

- `cpu`: work on the VM's own path -- a trap's exit and device-model round trip, a
  hypercall, a native MMIO access -- which needs one of the N host cores;
- `mediator`: work the mediator does for the VM while holding its lock -- a shadow sync
  with the entries it scans, the mediator's share of a trap, PV table allocation -- so
  other VMs' traps and doorbells wait (GPUvm: "page shadowing locks GPU resources");
- `engine`: kernels and copies on the one non-preemptive engine, dispatched through the
  real scheduler classes (scheduler.Dispatcher + the FIFO / CREDIT / BAND policy).

- `free`: time on a host core that holds no lock -- the guest running between exits and
  the KVM exit itself (on this emulator most of a trap's wall time);
- `sleep`: a port wait's latency beyond the engine time (a thread asleep holds nothing).

Where the profile says the VMs' Python work shares one interpreter lock (this emulator:
VMs are threads of one process), `cpu` and `mediator` steps also hold that lock: host
CPU for the VMM's own work is then the lock, not the N cores; so does the engine thread
running each VM's channels, where the trace says how long ("server.engine_ns").  A
thread that finds the lock held sleeps, and pays a hand-off when it gets it -- more
after a long sleep, where the profile measured how waking depends on that.  A
trace of a VM in its own VMM process (vfio-user; it carries the server's time) holds
that lock only for the server's share -- answering its accesses, running its channels
-- since one server thread serves every VM; the VMM's own work is its process's, on its
own core.

A trace recorded per event (gpuvm.vmm.event_trace) is replayed in its order: each run
of equal events is priced by the profile and cut into steps of at most CHUNK_NS, so VMs
interleave at that grain (runs of equal events stay compressed: a run of 40,000 stores
is a few hundred steps, not 40,000).  A trace of per-phase counts only (a row of
runs.jsonl) is replayed as before: each phase's steps interleaved in as many rounds as
it has shadow syncs or doorbells (at most MAX_ROUNDS).  The prices are a cost profile's: the
paper-platform profile (xen-2014) predicts the paper's orderings; a profile measured on
this emulator (`gpuvm calibrate --emulator`) predicts the emulator's own wall time.
Everything is integer ns and deterministic: the same rows give the same makespan.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterable, Mapping, Sequence

import numpy as np
import simpy

from gpuvm.experiment.costs import CostProfile
from gpuvm.sim.model import EngineModel, Kernel
from gpuvm.sim.residency import Residency
from gpuvm.vfio.user.protocol import SERVER_ACCESS_COUNTER, SERVER_ENGINE_COUNTER
from gpuvm.vmm.event_trace import LOCK_RELEASES, EventTrace
from scheduler.config import SchedulerConfig

PHASES = ("Init", "HtoD", "Launch", "DtoH", "Close")
MAX_ROUNDS = 64
CPU, MEDIATOR, ENGINE, FREE, SLEEP = "cpu", "mediator", "engine", "free", "sleep"
CHUNK_NS = 1_000_000  # replay grain of a per-event trace
# At most this many waiting threads race a releasing thread for the interpreter lock
# (_System.holding): a release wakes one waiter, and one woken by the release before may
# still be waking.  Over 24 lent-machine bundles (2026-11-26/27), 2 put 238 of 288
# points within 10% (mean |error| 6.5%); 1, 3 and every waiter 228, 232 and 228, the
# runs' pv at 4 and 8 VMs -8.5/-5.0%, +0.7/+4.3% and +0.4/+8.4% on average against
# 2's -1.9/+1.3% (scratch .scratch/ab_bundles.py; docs/model-validation.md).
RACING_WAITERS = 2


def served(events: EventTrace) -> bool:
    """Whether `events` is of a VM in its own process: it carries the server's time."""
    return SERVER_ACCESS_COUNTER in events.names


def server_ns(events: EventTrace) -> int:
    """The server's whole time on the traced VM (its accesses and its channels)."""
    return int(events.counter(SERVER_ACCESS_COUNTER).sum()
               + events.counter(SERVER_ENGINE_COUNTER).sum())


@dataclass(frozen=True)
class Step:
    resource: str  # CPU | MEDIATOR | ENGINE
    ns: int
    phase: str
    # the exits it stands for: each takes the interpreter lock when the step begins (a
    # take again after a release inside a handler is decided in the replay: `releases`)
    events: int = 0
    # the times the step's handlers let the interpreter lock go inside its work (evenly
    # spaced): each may cost the lock where other VMs want it (_System.holding)
    releases: int = 0


@dataclass(frozen=True)
class VmTrace:
    """What one VM did, as steps, and when it started (ns after the run's start)."""

    name: str
    steps: tuple[Step, ...]
    start_ns: int = 0
    share: float = 1.0
    working_set_bytes: int = 0  # VRAM it needs resident to run (an oversubscribed GPU)

    @property
    def alone_ns(self) -> int:
        """Its time with nothing to wait for: the sum of its steps."""
        return sum(s.ns for s in self.steps)


def phase_steps(phase: str, counts: Mapping[str, int], costs: CostProfile,
                mediated: bool) -> list[Step]:
    """One phase's counts as interleaved cpu / mediator / engine steps."""
    engine = int(counts.get("engine.busy_ns", 0))
    mediator = int(round(costs.mediator_ns(counts, mediated)))
    cpu = max(0, int(round(costs.modelled_ns(counts, mediated))) - engine - mediator)
    rounds = max(1, min(MAX_ROUNDS, counts.get("shadow.syncs", 0)
                        + counts.get("shadow.bar_syncs", 0) + counts.get("pfifo.doorbells", 0)))
    steps: list[Step] = []
    for i in range(rounds):
        for resource, total in ((CPU, cpu), (MEDIATOR, mediator), (ENGINE, engine)):
            # integer split that sums exactly to the total
            part = total * (i + 1) // rounds - total * i // rounds
            if part:
                steps.append(Step(resource, part, phase))
    return steps


def trace_from_row(row: Mapping, costs: CostProfile, mediated: bool) -> VmTrace:
    """A VM's trace from one row of runs.jsonl (a dict or an execute.VmRow)."""
    get = row.get if isinstance(row, Mapping) else lambda k, d=None: getattr(row, k, d)
    phases = get("phase_counters") or {}
    steps: list[Step] = []
    for phase in PHASES:
        if phase in phases:
            steps.extend(phase_steps(phase, phases[phase], costs, mediated))
    return VmTrace(str(get("vm")), tuple(steps), int(float(get("start_s", 0.0)) * 1e9),
                   float(get("share", 1.0)))


@dataclass(frozen=True)
class ReplayResult:
    makespan_ns: int
    finish_ns: dict[str, int]  # per VM, from the run's start
    alone_ns: dict[str, int]
    events: int  # simpy events processed
    # per VM, residency.COUNTER_NAMES (only when the GPU was oversubscribed)
    residency: dict[str, dict[str, int]] = field(default_factory=dict)
    # exits that found the interpreter lock held or wanted and slept for it, all VMs:
    # each paid a hand-off (the emulator's vCPU threads count these as sleeps)
    lock_sleeps: int = 0
    # time the VMs spent on host cores, all VMs: their guests, their work under the lock
    # and the hand-offs they paid (beside the emulator's vCPU threads' CPU time)
    core_ns: int = 0

    @property
    def mean_vm_ns(self) -> float:
        """Mean time from the run's start to each VM's end."""
        return sum(self.finish_ns.values()) / max(1, len(self.finish_ns))


def _mmio_exits(names: Sequence[str], deltas: np.ndarray) -> np.ndarray:
    cols = [i for i, n in enumerate(names) if n.startswith("exits.mmio.")]
    return deltas[:, cols].sum(axis=1) if cols else np.zeros(len(deltas), dtype=np.int64)


def _share(total: int, i: int, parts: int) -> int:
    """The i-th of `parts` integer shares of `total`: they sum to it exactly."""
    return total * (i + 1) // parts - total * i // parts


def _channels_on_lock(channels: int, cpu: int, sleep: int, free: int
                      ) -> tuple[int, int, int]:
    """(cpu, sleep, free) with `channels` -- the device's host time running the VM's
    channels meanwhile, which holds the lock (the server's, or the one interpreter lock
    of VMs as threads) -- moved into cpu: taken from the time the VM waited, else from
    its time between events (it cannot have run while the VM's own Python did)."""
    from_sleep = min(channels, sleep)
    from_free = min(channels - from_sleep, free)
    return cpu + from_sleep + from_free, sleep - from_sleep, free - from_free


def event_steps(events: EventTrace, costs: CostProfile, mediated: bool,
                record_event_ns: float | None = None) -> list[Step]:
    """A per-event trace as steps, in its order (see the module docstring).
    `record_event_ns`: what recording it cost per event (default: costs.record_event_ns;
    trace_from_events gives the trace's mode's)."""
    if record_event_ns is None:
        record_event_ns = costs.record_event_ns
    names = events.names
    exits = _mmio_exits(names, events.deltas) + events.counter("exits.io")
    steps: list[Step] = []
    pending = [0, 0, 0]  # free, mediator, cpu not yet emitted
    pending_events = pending_releases = 0
    phase = PHASES[0]
    per_event = costs.lock_handoff_ns > 0

    def flush() -> None:
        nonlocal pending_events, pending_releases
        total = sum(pending)
        if not total:
            return
        pieces = max(1, pending_events if per_event else -(-total // CHUNK_NS))
        for i in range(pieces):
            n = _share(pending_events, i, pieces)
            # the releases inside the piece's handlers: each a chance for a waiting VM
            # to take the lock (only where takes are priced: elsewhere it changes nothing)
            releases = _share(pending_releases, i, pieces) if per_event else 0
            for resource, amount in zip((FREE, MEDIATOR, CPU), pending):
                part = _share(amount, i, pieces)
                if not part:
                    continue
                if resource == FREE:
                    steps.append(Step(resource, part, phase))
                    continue
                # the piece's exits take the lock at its first step that holds it
                steps.append(Step(resource, part, phase, n,
                                  releases if resource == CPU else 0))
                n = 0
        pending[:] = [0, 0, 0]
        pending_events = pending_releases = 0

    isolated = served(events)
    for r in range(len(events)):
        phase = PHASES[int(events.phase[r])] if events.phase[r] < len(PHASES) else phase
        counts = {n: int(v) for n, v in zip(names, events.deltas[r]) if v}
        engine = counts.get("engine.busy_ns", 0)
        mediator = int(costs.mediator_ns(counts, mediated))
        # the recorder's own time around the run's exits (taken off where the times
        # are replayed as recorded)
        recorder_ns = int(events.events[r] * record_event_ns)
        if isolated:
            # a VM in its own process: its handlers are round trips to the server, one
            # thread that answers every VM -- the server's part holds it (the lock);
            # the rest (the VMM's own Python, the socket) and the time between events
            # are the VM's own process on its own core, except a wait's, which sleeps.
            # The server running the VM's channels meanwhile holds the lock too: it
            # is taken from the time the VM waited, else from its time between events
            handler = max(0, int(events.handler_ns[r]) - engine)
            mediator = 0
            cpu = min(handler, counts.get(SERVER_ACCESS_COUNTER, 0))
            own = handler - cpu
            gap = int(events.gap_ns[r])
            gap -= min(recorder_ns, max(0, gap))
            waited = engine or counts.get("port.wait", 0)
            sleep = own if waited else 0
            free = gap + (0 if waited else own)
            cpu, sleep, free = _channels_on_lock(counts.get(SERVER_ENGINE_COUNTER, 0),
                                                 cpu, sleep, free)
        elif costs.recorded_times:
            # a handler's time beyond what its counted work costs is time blocked on
            # another thread (a wait on the engine, a BAR0 write that waits for the
            # scheduler): asleep, holding nothing
            handler = max(0, int(events.handler_ns[r]) - engine)
            mediator = min(mediator, handler)
            work = int(costs.modelled_ns(counts, mediated)) - engine - mediator \
                - int(counts.get("port.wait", 0) * costs.wait_ns) \
                - int(exits[r] * costs.exit_free_ns)
            cpu = min(handler - mediator, max(0, work))
            sleep = handler - mediator - cpu
            # between handlers: the guest inside KVM_RUN holds nothing but a core; the
            # VMM's exit loop around it is Python, on the lock like a handler -- less what
            # the recorder spent there, which an unrecorded run does not
            free = int(events.guest_ns[r])
            loop = int(events.gap_ns[r]) - free
            cpu += loop - min(recorder_ns, max(0, loop))
            # the engine thread running the VM's channels holds the lock too (traces
            # from before it was recorded have none)
            cpu, sleep, free = _channels_on_lock(counts.get(SERVER_ENGINE_COUNTER, 0),
                                                 cpu, sleep, free)
        else:
            sleep = int(counts.get("port.wait", 0) * costs.wait_ns)
            priced = int(costs.modelled_ns(counts, mediated)) - engine - sleep - mediator
            free = min(max(0, priced), int(exits[r] * costs.exit_free_ns))
            cpu = max(0, priced - free)
            if costs.guest_time:  # the guest's own time between exits, as recorded
                free += max(0, int(events.gap_ns[r]) - int(exits[r] * costs.exit_free_ns))
        pending[0] += free
        pending[1] += mediator
        pending[2] += cpu
        pending_events += int(events.events[r])
        # the handlers' releases of the lock (a VM in its own process carries none: its
        # lock is not the server's)
        pending_releases += counts.get(LOCK_RELEASES, 0)
        if engine or sleep:
            flush()
            if engine:
                steps.append(Step(ENGINE, engine, phase))
            if sleep:
                steps.append(Step(SLEEP, sleep, phase))
        elif per_event or sum(pending) >= CHUNK_NS:
            flush()
    flush()
    return steps


def trace_from_events(name: str, trace: Mapping, costs: CostProfile, mediated: bool,
                      start_ns: int = 0, share: float = 1.0) -> VmTrace:
    """A VM's trace from a recorded per-event trace (gpuvm.sim.traces.load_trace), less
    what recording it cost per event in its mode (its key's)."""
    mode = trace.get("key", {}).get("mode")
    return VmTrace(name, tuple(event_steps(trace["events"], costs, mediated,
                                           costs.record_event_ns_of(mode))), start_ns, share)


class _Holders:
    """`capacity` holders at once, the rest served first come first served -- what
    simpy.Resource is, without its events where nothing waits.

    A replay takes a lock or a core for nearly every step, and nearly always finds it
    free: simpy.Resource still schedules a Request and a Release event each time, which
    were two thirds of a replay's events and most of its time.  Here taking a free one
    schedules nothing (`take` returns None) and giving it back to nobody schedules
    nothing; a taker that finds none free gets an event, succeeded when a holder hands
    it over (in the order they asked, as simpy.Resource grants).  One tie goes the
    other way: a free one is taken at once, where a Resource's taker resumed a turn
    later, so of two VMs acting at the same instant the one whose step came first now
    gets the core first (a 1 ns mediator step and a 1 ns cpu step on one core: the
    mediator's VM, where Resource let the other in between).  On recorded traces the
    replays come out the same (tests/test_sim_replay.py)."""

    def __init__(self, env: simpy.Environment, capacity: int) -> None:
        self.env = env
        self.free = capacity
        self.waiting: deque[simpy.Event] = deque()

    def take(self) -> simpy.Event | None:
        """None: taken now; else the event to wait for (it is taken when it fires)."""
        if self.free:
            self.free -= 1
            return None
        asked = self.env.event()
        self.waiting.append(asked)
        return asked

    @property
    def waiters(self) -> int:
        """How many takers wait for one now."""
        return len(self.waiting)

    def give(self) -> None:
        """Hand it to the first waiting taker, or free it."""
        if self.waiting:
            self.waiting.popleft().succeed()
        else:
            self.free += 1


class _System:
    def __init__(self, env: simpy.Environment, cores: int, scheduler: SchedulerConfig,
                 residency: Residency | None, interpreter_lock: bool = False,
                 lock_handoff_ns: int = 0,
                 wake_extra_ns: Callable[[float], float] | None = None,
                 lock_work_factor: float = 1.0, lock_release_takes: float = 1.0) -> None:
        self.env = env
        self.cores = _Holders(env, cores)
        self.mediator = _Holders(env, 1)
        self.gil = _Holders(env, 1) if interpreter_lock else None
        self.lock_handoff_ns = lock_handoff_ns
        self.wake_extra_ns = wake_extra_ns
        self.lock_work_factor = lock_work_factor
        self.lock_release_takes = lock_release_takes
        self.release_due: dict[str, float] = {}  # per VM: lost releases owed, fractional
        self.lock_sleeps = 0
        self.core_ns = 0
        self.engine = EngineModel(env, scheduler, residency)
        # guests on a core now: VM -> when their stretch ends (a lock holder preempts one)
        self.guests_ending: dict[str, int] = {}
        self.preempted_ns: dict[str, int] = {}  # per VM: time a lock holder took from it
        # taken from a core handed to a guest that has not started on it yet (the same
        # instant): that guest's stretch pays it
        self.preempted_starting_ns = 0

    def on_core(self, ns: int) -> Generator:
        """Spend `ns` on one of the host cores."""
        wait = self.cores.take()
        if wait is not None:
            yield wait
        try:
            self.core_ns += ns
            yield self.env.timeout(ns)
        finally:
            self.cores.give()

    def guest_on_core(self, ns: int, vm: str) -> Generator:
        """Spend `ns` of `vm`'s guest on a host core, and then what lock holders took
        from it meanwhile (`holder_on_core`)."""
        wait = self.cores.take()
        if wait is not None:
            yield wait
        # the holder counted the time it took in core_ns: the guest only waits it out
        owed, self.preempted_starting_ns = self.preempted_starting_ns, 0
        try:
            self.core_ns += ns
            self.guests_ending[vm] = self.env.now + ns + owed
            yield self.env.timeout(ns + owed)
            while self.preempted_ns.get(vm):
                owed = self.preempted_ns.pop(vm)
                self.guests_ending[vm] = self.env.now + owed
                yield self.env.timeout(owed)
        finally:
            self.guests_ending.pop(vm, None)
            self.cores.give()

    def holder_on_core(self, ns: int) -> Generator:
        """Spend `ns` holding the interpreter lock on a host core -- without queueing for
        one: where none is free, it preempts the guest whose stretch ends last, which
        then runs that much longer (its core's time is the same, only later).

        Why: a thread back from KVM_RUN is on its core already when it takes the lock,
        and one woken with it is let in at once (Linux's wake-up preemption); queued
        behind the guests instead, it held the lock through their stretches and every
        thread behind it slept for the lock.  With 4 fv VMs on 2 cores the model had
        nearly every exit sleep (+49,570 a VM beyond one VM's) where the run's threads
        slept at one exit in four (+11,531 of 49,409) (docs/model-validation.md,
        "The lock's holder does not queue for a core")."""
        if self.cores.free:
            yield from self.on_core(ns)
            return
        if self.guests_ending:
            victim = max(self.guests_ending, key=lambda vm: (self.guests_ending[vm], vm))
            self.preempted_ns[victim] = self.preempted_ns.get(victim, 0) + ns
        else:  # the core is being handed to a guest at this instant
            self.preempted_starting_ns += ns
        self.core_ns += ns
        yield self.env.timeout(ns)

    def holding(self, step: Step, vm: str) -> Generator:
        """Spend the step on a core holding the interpreter lock (or on a core alone
        when there is none).  The lock is taken first: a thread waiting for it sleeps,
        and leaves the cores to the guests in KVM_RUN; holding it, the thread does not
        queue for a core but preempts a guest (holder_on_core).  Where another VM holds
        or wants the lock, each of the step's exits pays a hand-off
        (CostProfile.lock_handoff_ns) while holding it: it slept, and waking it takes
        that long -- longer the longer it slept, where the profile measured how waking
        depends on that (CostProfile.wake_extra_ns: a vCPU idle past its halt-poll
        window wakes late, and a thread whose core idled that long works cold for a
        while).  The work itself takes lock_work_factor times what the trace says
        (CostProfile.lock_work_factor: Python under the lock runs slower with more
        threads taking turns at it).

        Each of the step's releases inside its handlers (Step.releases) lets the lock
        go for a moment (a numpy loop, an ioctl).  A waiting thread takes it then with
        the share CostProfile.lock_release_takes (fitted on 2 VMs: one waiter), and of
        `k` waiting, 1 - (1 - share)^min(k, RACING_WAITERS): the one this release woke,
        and the one the release before woke, still waking.  The VM then waits for the
        lock again.  A fixed share of every release, as the model had it before, gave
        4 pv VMs 367 sleeps a VM beyond one VM's where the run had 425, and a makespan
        16-18% short (run 20261127-043954).  Owed as a fraction per VM: deterministic."""
        if self.gil is None:
            yield from self.on_core(step.ns)
            return
        stretches = step.releases + 1
        work = int(step.ns * self.lock_work_factor)
        events = step.events
        done = 0  # stretches of the work done
        while done < stretches:
            handoff = yield from self._take_lock(events)
            events = 1  # a take after a release is one more, not the step's exits'
            try:
                yield from self.holder_on_core(_share(work, done, stretches) + handoff)
                done += 1
                while done < stretches and not self._release_lost(vm):
                    yield from self.holder_on_core(_share(work, done, stretches))
                    done += 1
            finally:
                self.gil.give()

    def _release_lost(self, vm: str) -> bool:
        """Whether a release inside `vm`'s handler now costs it the lock (holding)."""
        due = self.release_due.get(vm, 0.0) + \
            1.0 - (1.0 - self.lock_release_takes) ** min(self.gil.waiters, RACING_WAITERS)
        lost = due >= 1.0
        self.release_due[vm] = due - 1.0 if lost else due
        return lost

    def _take_lock(self, events: int) -> Generator:
        """Take the interpreter lock; the hand-off its `events` exits pay (ns)."""
        wait = self.gil.take()
        if wait is None:
            return 0
        asked = self.env.now
        yield wait
        waited = self.env.now - asked
        if not waited:
            return 0
        self.lock_sleeps += events
        late = self.wake_extra_ns(waited) if self.wake_extra_ns is not None else 0
        return events * (self.lock_handoff_ns + int(late))


def _vm(env: simpy.Environment, system: _System, trace: VmTrace,
        finish: dict[str, int]) -> Generator[simpy.Event, None, None]:
    if trace.start_ns:
        yield env.timeout(trace.start_ns)
    dispatcher = system.engine.dispatcher
    dispatcher.add_vm(trace.name, trace.share, env.now)
    residency = system.engine.residency
    if residency is not None:
        residency.add_vm(trace.name, trace.working_set_bytes)
    for step in trace.steps:
        if step.resource == ENGINE:
            kernel = Kernel(trace.name, step.ns, env.event())
            dispatcher.submit(trace.name, kernel, env.now)
            yield kernel.done
            continue
        if step.resource == SLEEP:
            yield env.timeout(step.ns)
            continue
        if step.resource == FREE:
            # only a lock's holder preempts a guest: without one, no guest is tracked
            yield from (system.on_core(step.ns) if system.gil is None
                        else system.guest_on_core(step.ns, trace.name))
        elif step.resource == MEDIATOR:
            wait = system.mediator.take()
            if wait is not None:
                yield wait
            try:
                yield from system.holding(step, trace.name)
            finally:
                system.mediator.give()
        else:
            yield from system.holding(step, trace.name)
    dispatcher.remove_vm(trace.name, env.now)
    if residency is not None:
        residency.remove_vm(trace.name)
    finish[trace.name] = env.now


def replay(traces: Sequence[VmTrace], cores: int = 2,
           policy: str | SchedulerConfig = "fifo",
           residency: Residency | None = None,
           interpreter_lock: bool = False, lock_handoff_ns: int = 0,
           wake_extra_ns: Callable[[float], float] | None = None,
           lock_work_factor: float = 1.0, lock_release_takes: float = 1.0
           ) -> ReplayResult:
    """Run the traces together; the makespan is when the last VM finishes.

    `policy` is a policy name or a whole SchedulerConfig (its parameters: a quantum, a
    period).  With a `residency` the GPU has that much VRAM and each trace's
    working_set_bytes must be resident while its kernels run (gpuvm.sim.residency);
    a trace whose working set alone does not fit raises ResidencyError.
    `interpreter_lock`: cpu and mediator steps also hold one lock shared by every VM;
    `lock_handoff_ns`: what each exit pays to take it from another thread;
    `wake_extra_ns`: what it pays beyond that, by how long it waited (ns -> ns);
    `lock_work_factor`: how much longer the work under the lock takes than traced;
    `lock_release_takes`: the share of a step's releases inside handlers that one
    waiting VM takes the lock at (_System.holding)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if residency is not None:
        for trace in traces:  # before anything runs
            residency.check(trace.name, trace.working_set_bytes)
    env = simpy.Environment()
    config = SchedulerConfig(policy) if isinstance(policy, str) else policy
    system = _System(env, cores, config, residency, interpreter_lock, lock_handoff_ns,
                     wake_extra_ns, lock_work_factor, lock_release_takes)
    finish: dict[str, int] = {}
    for trace in traces:
        env.process(_vm(env, system, trace, finish))
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    counters = {} if residency is None else \
        {str(vm): c.as_dict() for vm, c in residency.counters.items()}
    return ReplayResult(max(finish.values(), default=0), finish,
                        {t.name: t.alone_ns for t in traces}, events, counters,
                        system.lock_sleeps, system.core_ns)


def replay_priced(traces: Sequence[VmTrace], costs: CostProfile, cores: int,
                  policy: str | SchedulerConfig = "fifo", mode: str = "fv") -> ReplayResult:
    """`replay` under all that `costs` says of the interpreter lock: whether the VMs
    share one, its hand-off and waking, its work's growth with the VM count (`mode`'s
    own where measured) and the share of releases lost -- one place for the validation
    and the sweeps to read a profile alike."""
    return replay(traces, cores=cores, policy=policy,
                  interpreter_lock=bool(costs.interpreter_lock),
                  lock_handoff_ns=int(costs.lock_handoff_ns),
                  wake_extra_ns=costs.wake_extra_ns if costs.wake_slept_ns else None,
                  lock_work_factor=costs.lock_work_factor(len(traces), mode),
                  lock_release_takes=costs.lock_release_takes)


def replicate(trace: VmTrace, count: int) -> list[VmTrace]:
    """`count` VMs of one kind (a scenario may say "1,024 VMs of this kind")."""
    return [VmTrace(f"{trace.name}{i}", trace.steps, trace.start_ns, trace.share,
                    trace.working_set_bytes) for i in range(count)]


def traces_for_run(rows: Iterable[Mapping], costs: CostProfile, mediated: bool
                   ) -> list[VmTrace]:
    return [trace_from_row(r, costs, mediated) for r in rows]
