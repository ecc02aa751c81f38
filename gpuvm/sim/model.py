"""The simpy model: simulated VMs submit kernels to one non-preemptive engine through
the same Dispatcher and policy classes the mediator uses.

Time is integer ns (`env.now`), the policies' own unit.  Every random draw comes from a
per-VM numpy Generator spawned from one seed, so a run is reproducible and adding a VM
does not change the draws of the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generator

import numpy as np
import simpy

from gpuvm.sim.residency import ResidencyModel
from gpuvm.sim.results import SimResult
from gpuvm.sim.scenarios import Scenario
from gpuvm.sim.workload import WorkloadSpec
from scheduler.config import SchedulerConfig
from scheduler.dispatcher import Dispatcher


@dataclass
class KernelRun:
    """One submission: how long it holds the engine, and the event its VM waits on."""

    vm: str
    duration_ns: int
    done: simpy.Event


class EngineModel:
    """Wires a Dispatcher into simpy: the engine is a process per running kernel, and
    BAND's "ask again at t" is a process that sleeps until t.

    With a `residency` (an oversubscribed GPU), a kernel first waits, on the engine,
    for its VM's working set to be made resident; the VM is charged only its kernel's
    time, so the policy sees the same work as on a GPU with room for everyone."""

    def __init__(self, env: simpy.Environment, scheduler: SchedulerConfig,
                 residency: ResidencyModel | None = None) -> None:
        self.env = env
        self.policy = scheduler.build()
        self.residency = residency
        self.dispatcher: Dispatcher[KernelRun] = Dispatcher(self.policy, self._start,
                                                            self._request_wakeup)

    def _start(self, vm: object, kernel: KernelRun) -> None:
        switch = self.residency.make_resident(vm) if self.residency is not None else 0
        self.env.process(self._run(kernel, switch))

    def _run(self, kernel: KernelRun, switch_ns: int) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(switch_ns + kernel.duration_ns)
        self.dispatcher.complete(self.env.now, used=kernel.duration_ns)
        kernel.done.succeed()

    def _request_wakeup(self, at: int) -> None:
        self.env.process(self._wake(at))

    def _wake(self, at: int) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(at - self.env.now)
        self.dispatcher.wake(self.env.now)


def _vm(env: simpy.Environment, engine: EngineModel, spec: WorkloadSpec,
        rng: np.random.Generator) -> Generator[simpy.Event, None, None]:
    """A closed loop: keep up to `depth` kernels outstanding, think before each one."""
    yield env.timeout(spec.start_ns)
    dispatcher = engine.dispatcher
    dispatcher.add_vm(spec.name, spec.share, env.now)
    outstanding: list[simpy.Event] = []

    def stopped() -> bool:
        return spec.stop_ns is not None and env.now >= spec.stop_ns

    while not stopped():
        if len(outstanding) >= spec.depth:
            yield env.any_of(outstanding)
            outstanding = [e for e in outstanding if not e.triggered]
        think = spec.think.sample(rng)
        if think:
            yield env.timeout(think)
        if stopped():
            break
        kernel = KernelRun(spec.name, max(1, spec.kernel.sample(rng)), env.event())
        dispatcher.submit(spec.name, kernel, env.now)
        outstanding.append(kernel.done)
    if outstanding:
        yield env.all_of(outstanding)
    dispatcher.remove_vm(spec.name, env.now)


def simulate(scenario: Scenario, scheduler: SchedulerConfig | str = "band",
             seed: int = 0, count_events: bool = False) -> SimResult:
    """Run `scenario` under one policy; deterministic for a given seed."""
    config = SchedulerConfig(scheduler) if isinstance(scheduler, str) else scheduler
    env = simpy.Environment()
    engine = EngineModel(env, config)
    seeds = np.random.SeedSequence(seed).spawn(len(scenario.vms))
    for spec, child in zip(scenario.vms, seeds):
        env.process(_vm(env, engine, spec, np.random.default_rng(child)))
    events = _run_counting(env, scenario.duration_ns) if count_events else None
    if events is None:
        env.run(until=scenario.duration_ns)
    return SimResult(scenario=scenario, policy=config.policy, seed=seed,
                     end_ns=scenario.duration_ns,
                     metrics=dict(engine.dispatcher.metrics),
                     counters=dict(engine.policy.counters), events=events)


def _run_counting(env: simpy.Environment, until: int) -> int:
    """env.run(until) that also counts the events processed (for `gpuvm bench sim`)."""
    events = 0
    while env.peek() < until:
        env.step()
        events += 1
    env.run(until=until)  # lands exactly on `until`, as env.run does
    return events
