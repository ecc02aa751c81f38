"""The model of the whole system: simulated VMs replay what a real VM did, competing for
what is really shared.

A VM's trace here is built from the exact per-phase counts of a run (runs.jsonl): each
phase becomes a sequence of steps, and each step needs one resource:

- `cpu`: work on the VM's own path -- a trap's exit and device-model round trip, a
  hypercall, a native MMIO access -- which every VM does on its own vCPU;
- `mediator`: work the mediator does for the VM while holding its lock -- a shadow sync
  with the entries it scans, the mediator's share of a trap -- so other VMs' mediator
  work waits (GPUvm: "page shadowing locks GPU resources");
- `engine`: kernels and copies on the one non-preemptive engine, dispatched through the
  real scheduler classes (scheduler.Dispatcher + the FIFO / CREDIT / BAND policy).

Each phase's steps are interleaved in as many rounds as it has shadow syncs or
doorbells (at most MAX_ROUNDS).  The prices are a cost profile's (xen-2014: the paper's
platform).  Everything is integer ns and deterministic: the same rows give the same
makespan.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generator, Iterable, Mapping, Sequence

import simpy

from gpuvm.experiment.costs import CostProfile
from gpuvm.sim.model import EngineModel, Kernel
from gpuvm.sim.residency import Residency
from scheduler.config import SchedulerConfig

PHASES = ("Init", "HtoD", "Launch", "DtoH", "Close")
MAX_ROUNDS = 64
CPU, MEDIATOR, ENGINE = "cpu", "mediator", "engine"


@dataclass(frozen=True)
class Step:
    resource: str  # CPU | MEDIATOR | ENGINE
    ns: int
    phase: str


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

    @property
    def mean_vm_ns(self) -> float:
        """Mean time from the run's start to each VM's end."""
        return sum(self.finish_ns.values()) / max(1, len(self.finish_ns))


class _Holders:
    """`capacity` holders at once, the rest served first come first served -- what
    simpy.Resource is, without its events where nothing waits: taking a free one
    schedules nothing (`take` returns None), and giving it back to nobody schedules
    nothing, so a replay whose VMs rarely meet at the mediator stays cheap."""

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
    """What the VMs share: the mediator's lock and the engine (each VM's own work runs
    on its own vCPU and waits for nothing)."""

    def __init__(self, env: simpy.Environment, scheduler: SchedulerConfig,
                 residency: Residency | None) -> None:
        self.mediator = _Holders(env, 1)
        self.engine = EngineModel(env, scheduler, residency)


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
        elif step.resource == MEDIATOR:
            wait = system.mediator.take()
            if wait is not None:
                yield wait
            yield env.timeout(step.ns)
            system.mediator.give()
        else:
            yield env.timeout(step.ns)
    dispatcher.remove_vm(trace.name, env.now)
    if residency is not None:
        residency.remove_vm(trace.name)
    finish[trace.name] = env.now


def replay(traces: Sequence[VmTrace], policy: str | SchedulerConfig = "fifo",
           residency: Residency | None = None) -> ReplayResult:
    """Run the traces together; the makespan is when the last VM finishes.

    `policy` is a policy name or a whole SchedulerConfig (its parameters: a quantum, a
    period).  With a `residency` the GPU has that much VRAM and each trace's
    working_set_bytes must be resident while its kernels run (gpuvm.sim.residency);
    a trace whose working set alone does not fit raises ResidencyError."""
    if residency is not None:
        for trace in traces:  # before anything runs
            residency.check(trace.name, trace.working_set_bytes)
    env = simpy.Environment()
    config = SchedulerConfig(policy) if isinstance(policy, str) else policy
    system = _System(env, config, residency)
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
                        {t.name: t.alone_ns for t in traces}, events, counters)


def replicate(trace: VmTrace, count: int) -> list[VmTrace]:
    """`count` VMs of one kind (a scenario may say "1,024 VMs of this kind")."""
    return [VmTrace(f"{trace.name}{i}", trace.steps, trace.start_ns, trace.share,
                    trace.working_set_bytes) for i in range(count)]


def traces_for_run(rows: Iterable[Mapping], costs: CostProfile, mediated: bool
                   ) -> list[VmTrace]:
    return [trace_from_row(r, costs, mediated) for r in rows]
