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
running each VM's channels, where the trace says how long ("server.engine_ns").  The
lock and the cores then follow CPython and Linux as they are written (_System): each VM
is a thread that keeps its core until it blocks, a running thread takes a free lock, and
a thread woken for it lands a hand-off later and may find it taken again.  A
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

import random
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
# How much a woken thread's landing on a core varies around the hand-off (a gamma's
# coefficient of variation): fitted with the lock's other rules to
# `gpuvm calibrate --lock-probe` on the development host (0.29 over 54 points;
# docs/model-validation.md).  Without it identical threads keep in step, and at 14 us
# free a loop they convoyed where the probe's threads did not.
WAKE_JITTER_CV = 0.3
WAKE_SEED = 1
PREEMPT_SEED = 2  # of the cores taken (_System.run_preemptible): a replay repeats itself


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
    # cores the host's scheduler took from a running thread for a waiting one, all VMs
    # (_System.run_preemptible; the emulator's vCPU threads count these as involuntary
    # context switches)
    cores_taken: int = 0

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

    def give(self) -> None:
        """Hand it to the first waiting taker, or free it."""
        if self.waiting:
            self.waiting.popleft().succeed()
        else:
            self.free += 1


class _System:
    """What the VMs share: the host cores, the mediator, the engine, and -- where the
    VMs are threads of one process -- the interpreter lock.

    Without that lock every cpu, mediator and guest step takes a core for itself
    (`on_core`) and gives it back.  With it, each VM is one thread, as it is in the
    emulator, and the cores and the lock follow CPython 3.11 and Linux as they are
    written (`Python/ceval_gil.h`: take_gil, drop_gil):

    - a thread runs on a core from when it becomes runnable until it blocks -- asleep
      for the lock or the mediator, waiting for a kernel or a port: it keeps its core
      through its guest's stretches and its handlers, and queues for one (first come,
      first served) when it wakes.  Nothing preempts it but the host's scheduler (below);
    - a running thread that finds the lock free takes it, even where a thread woken for
      it is on its way (barging); one that finds it held sleeps, off its core;
    - letting the lock go frees it and wakes one sleeper (first asleep, first woken); the
      thread that lets it go pays for that wake-up on its own core, off the lock
      (lock_signal_ns);
    - the woken thread lands on an idle core after the hand-off (lock_handoff_ns, plus
      wake_extra_ns for a long sleep, varied by WAKE_JITTER_CV), holding that core
      meanwhile; where no core is idle it queues for one.  Running, it takes the lock if
      it is free, and otherwise sleeps again, until the next drop wakes it;
    - a release inside a handler (Step.releases) is a drop and a take;
    - where threads outnumber cores the host's scheduler takes a running thread's core
      now and then, at the rates the lock's timed runs counted (guest_preempt_per_ns
      inside its guest's stretches, held_preempt_per_ns while it holds the lock; drawn
      as a Poisson process over its time on the core): where another thread waits for a
      core it gets this one, and the thread taken from queues behind it, still holding
      the lock if it held it (`run_preemptible`).

    The lock's queue handing it to the next sleeper, with the hand-off paid while
    holding it and a fitted share of the releases handing it over, put 70 of 96 points
    of eight of this host's bundles within 10%; these rules, with nothing about the lock
    fitted, 90 (docs/model-validation.md, "CPython's lock as it is written").  Without
    the cores taken, two threads on two cores took turns at the lock in lock-step and
    almost never met it held where the emulator's met it at a fifth of their exits at 4
    VMs ("Cores taken at the measured rates")."""

    def __init__(self, env: simpy.Environment, cores: int, scheduler: SchedulerConfig,
                 residency: Residency | None, interpreter_lock: bool = False,
                 lock_handoff_ns: int = 0,
                 wake_extra_ns: Callable[[float], float] | None = None,
                 lock_work_factor: float = 1.0, lock_signal_ns: int = 0,
                 guest_work_factor: float = 1.0, guest_preempt_per_ns: float = 0.0,
                 held_preempt_per_ns: float = 0.0) -> None:
        self.env = env
        self.cores = _Holders(env, cores)
        self.mediator = _Holders(env, 1)
        self.interpreter_lock = interpreter_lock
        self.lock_held = False
        self.lock_sleepers: deque[simpy.Event] = deque()
        self.lock_handoff_ns = lock_handoff_ns
        self.wake_extra_ns = wake_extra_ns
        self.lock_work_factor = lock_work_factor
        self.lock_signal_ns = lock_signal_ns
        self.guest_work_factor = guest_work_factor
        # seeded: the same traces replay to the same makespan
        self.wake_jitter = random.Random(WAKE_SEED)
        self.guest_preempt_per_ns = guest_preempt_per_ns
        self.held_preempt_per_ns = held_preempt_per_ns
        self.preempt_draws = random.Random(PREEMPT_SEED)
        self.cores_taken = 0  # ReplayResult.cores_taken
        self.lock_sleeps = 0
        self.core_ns = 0
        self.engine = EngineModel(env, scheduler, residency)

    def on_core(self, ns: int) -> Generator:
        """Spend `ns` on one of the host cores (without the lock: a step at a time)."""
        yield from self.get_core()
        try:
            yield from self.run_on_core(ns)
        finally:
            self.cores.give()

    def run_on_core(self, ns: int) -> Generator:
        """Spend `ns` on the core the thread holds already."""
        self.core_ns += ns
        yield self.env.timeout(ns)

    def run_preemptible(self, ns: int, per_ns: float) -> Generator:
        """Spend `ns` on the core the thread holds, where the scheduler takes the core
        `per_ns` times a ns on average (exponential gaps): at each take a thread waiting
        for a core runs, and this one queues for a core behind the threads waiting; with
        none waiting it runs on.  Holding the lock, it keeps it meanwhile."""
        while per_ns > 0 and ns > 0:
            gap = int(self.preempt_draws.expovariate(per_ns))
            if gap >= ns:
                break
            yield from self.run_on_core(gap)
            ns -= gap
            if self.cores.waiting:
                self.cores_taken += 1
                self.cores.give()
                yield from self.get_core()
        yield from self.run_on_core(ns)

    def get_core(self) -> Generator:
        """Queue for a core (the thread was blocked) and hold it."""
        wait = self.cores.take()
        if wait is not None:
            yield wait

    def take_lock(self, events: int) -> Generator:
        """On a core: take the lock, or sleep off the core until a drop wakes this
        thread, land on a core and try again.  `events`: the exits the first sleep
        stands for (later sleeps of the same take are one each)."""
        if not self.lock_held:
            self.lock_held = True
            return
        while True:
            asked = self.env.now
            woken = self.env.event()
            self.lock_sleepers.append(woken)
            self.lock_sleeps += events
            events = 1
            self.cores.give()
            yield woken
            if self.cores.free:  # an idle core: the wake-up lands there, held meanwhile
                self.cores.take()
                yield self.env.timeout(self._landing_ns(self.env.now - asked))
            else:
                yield from self.get_core()
            if not self.lock_held:
                self.lock_held = True
                return

    def _landing_ns(self, slept_ns: int) -> int:
        """How long a woken thread takes to be running on an idle core: the hand-off,
        more after a long sleep (wake_extra_ns), varied around that (a gamma of
        coefficient of variation WAKE_JITTER_CV)."""
        late = self.wake_extra_ns(slept_ns) if self.wake_extra_ns is not None else 0
        land = self.lock_handoff_ns + late
        if WAKE_JITTER_CV > 0 and land > 0:
            shape = 1 / (WAKE_JITTER_CV * WAKE_JITTER_CV)
            land = self.wake_jitter.gammavariate(shape, land / shape)
        return int(land)

    def drop_lock(self) -> bool:
        """Let the lock go; whether that woke a sleeper (the dropper pays the signal)."""
        self.lock_held = False
        if self.lock_sleepers:
            self.lock_sleepers.popleft().succeed()
            return True
        return False

    def holding(self, step: Step) -> Generator:
        """On a core: the step's work holding the lock (lock_work_factor times what the
        trace says: Python under the lock runs slower with more threads taking turns at
        it), let go at each of its releases and taken again, and let go at its end --
        each drop that wakes a sleeper costing this thread the signal on its core."""
        stretches = step.releases + 1
        work = int(step.ns * self.lock_work_factor)
        yield from self.take_lock(step.events)
        for done in range(stretches):
            yield from self.run_preemptible(_share(work, done, stretches),
                                            self.held_preempt_per_ns)
            if self.drop_lock() and self.lock_signal_ns:
                yield from self.run_on_core(self.lock_signal_ns)
            if done + 1 < stretches:
                yield from self.take_lock(1)

    def take_mediator(self) -> Generator:
        """On a core: take the mediator, or sleep off the core until it is handed over
        and then queue for a core."""
        wait = self.mediator.take()
        if wait is not None:
            self.cores.give()
            yield wait
            yield from self.get_core()


def _vm(env: simpy.Environment, system: _System, trace: VmTrace,
        finish: dict[str, int]) -> Generator[simpy.Event, None, None]:
    if trace.start_ns:
        yield env.timeout(trace.start_ns)
    dispatcher = system.engine.dispatcher
    dispatcher.add_vm(trace.name, trace.share, env.now)
    residency = system.engine.residency
    if residency is not None:
        residency.add_vm(trace.name, trace.working_set_bytes)
    yield from (_thread(env, system, trace) if system.interpreter_lock
                else _steps_apart(env, system, trace))
    dispatcher.remove_vm(trace.name, env.now)
    if residency is not None:
        residency.remove_vm(trace.name)
    finish[trace.name] = env.now


def _blocked(env: simpy.Environment, system: _System, trace: VmTrace, step: Step
             ) -> Generator:
    """An engine or sleep step: the VM waits, holding nothing."""
    if step.resource == ENGINE:
        kernel = Kernel(trace.name, step.ns, env.event())
        system.engine.dispatcher.submit(trace.name, kernel, env.now)
        yield kernel.done
    else:
        yield env.timeout(step.ns)


def _steps_apart(env: simpy.Environment, system: _System, trace: VmTrace) -> Generator:
    """The VM's steps where nothing but the mediator serialises them: each cpu, mediator
    or guest step takes a core for itself."""
    guest = system.guest_work_factor
    for step in trace.steps:
        if step.resource in (ENGINE, SLEEP):
            yield from _blocked(env, system, trace, step)
        elif step.resource == FREE:
            yield from system.on_core(int(step.ns * guest))
        elif step.resource == MEDIATOR:
            wait = system.mediator.take()
            if wait is not None:
                yield wait
            try:
                yield from system.on_core(step.ns)
            finally:
                system.mediator.give()
        else:
            yield from system.on_core(step.ns)


def _thread(env: simpy.Environment, system: _System, trace: VmTrace) -> Generator:
    """The VM's steps as one thread of the process whose interpreter lock every VM
    shares (_System): it holds a core from when it is runnable until it blocks."""
    guest = system.guest_work_factor
    on_core = False
    for step in trace.steps:
        if step.resource in (ENGINE, SLEEP):
            if on_core:
                system.cores.give()
                on_core = False
            yield from _blocked(env, system, trace, step)
            continue
        if not on_core:
            yield from system.get_core()
            on_core = True
        if step.resource == FREE:
            yield from system.run_preemptible(int(step.ns * guest),
                                              system.guest_preempt_per_ns)
        elif step.resource == MEDIATOR:
            yield from system.take_mediator()
            yield from system.holding(step)
            system.mediator.give()
        else:
            yield from system.holding(step)
    if on_core:
        system.cores.give()


def replay(traces: Sequence[VmTrace], cores: int = 2,
           policy: str | SchedulerConfig = "fifo",
           residency: Residency | None = None,
           interpreter_lock: bool = False, lock_handoff_ns: int = 0,
           wake_extra_ns: Callable[[float], float] | None = None,
           lock_work_factor: float = 1.0, lock_signal_ns: int = 0,
           guest_work_factor: float = 1.0, guest_preempt_per_ns: float = 0.0,
           held_preempt_per_ns: float = 0.0) -> ReplayResult:
    """Run the traces together; the makespan is when the last VM finishes.

    `policy` is a policy name or a whole SchedulerConfig (its parameters: a quantum, a
    period).  With a `residency` the GPU has that much VRAM and each trace's
    working_set_bytes must be resident while its kernels run (gpuvm.sim.residency);
    a trace whose working set alone does not fit raises ResidencyError.
    `interpreter_lock`: the VMs are threads of one process and cpu and mediator steps
    hold its one lock (_System);
    `lock_handoff_ns`: how long a thread woken for the lock takes to land on a core;
    `wake_extra_ns`: what it takes beyond that, by how long it slept (ns -> ns);
    `lock_work_factor`: how much longer the work under the lock takes than traced;
    `lock_signal_ns`: what waking a sleeper costs the thread that lets the lock go;
    `guest_work_factor`: how much longer the guests' stretches take than traced;
    `guest_preempt_per_ns`, `held_preempt_per_ns`: how often the host's scheduler takes
    a thread's core in its guest's stretches and holding the lock (_System)."""
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    if residency is not None:
        for trace in traces:  # before anything runs
            residency.check(trace.name, trace.working_set_bytes)
    env = simpy.Environment()
    config = SchedulerConfig(policy) if isinstance(policy, str) else policy
    system = _System(env, cores, config, residency, interpreter_lock, lock_handoff_ns,
                     wake_extra_ns, lock_work_factor, lock_signal_ns, guest_work_factor,
                     guest_preempt_per_ns, held_preempt_per_ns)
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
                        system.lock_sleeps, system.core_ns, system.cores_taken)


def replay_priced(traces: Sequence[VmTrace], costs: CostProfile, cores: int,
                  policy: str | SchedulerConfig = "fifo", mode: str = "fv") -> ReplayResult:
    """`replay` under all that `costs` says of the interpreter lock and the cores:
    whether the VMs share one lock, its hand-off, waking and signal, its work's and the
    guests' growth with the VM count and how often the host takes their cores (`mode`'s
    own where measured) -- one place for the validation and the sweeps to read a
    profile alike."""
    return replay(traces, cores=cores, policy=policy,
                  interpreter_lock=bool(costs.interpreter_lock),
                  lock_handoff_ns=int(costs.lock_handoff_ns),
                  wake_extra_ns=costs.wake_extra_ns if costs.wake_slept_ns else None,
                  lock_work_factor=costs.lock_work_factor(len(traces), mode),
                  lock_signal_ns=int(costs.lock_signal_ns),
                  guest_work_factor=costs.guest_work_factor(len(traces), mode),
                  guest_preempt_per_ns=costs.guest_preempts_per_ns(len(traces), mode),
                  held_preempt_per_ns=costs.held_preempts_per_ns(len(traces), mode))


def replicate(trace: VmTrace, count: int) -> list[VmTrace]:
    """`count` VMs of one kind (a scenario may say "1,024 VMs of this kind")."""
    return [VmTrace(f"{trace.name}{i}", trace.steps, trace.start_ns, trace.share,
                    trace.working_set_bytes) for i in range(count)]


def traces_for_run(rows: Iterable[Mapping], costs: CostProfile, mediated: bool
                   ) -> list[VmTrace]:
    return [trace_from_row(r, costs, mediated) for r in rows]
