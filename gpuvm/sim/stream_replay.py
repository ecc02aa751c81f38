"""The model of the whole system: each VM's priced event stream, replayed under the
emulator's own rules for what is shared.

Why: the emulator states its results in virtual time, where every event a VM causes
takes its price (gpuvm/device/clock.py) and the mediator's lock is held in virtual time
(`VirtualLock`).  A VM's stream -- recorded once, alone, per benchmark, size, mode and
driver (`record_stream`) -- holds everything that VM does in that time, in order, and
nothing that depends on its neighbours: so several VMs replayed together under the same
lock rule give what the emulator gives when it runs them together (checked by a test at
1-8 VMs), and the replay then goes where the emulator cannot: 1,024 VMs, sweeps.

The rules, as the emulator applies them:
- an exit that does not take the mediator's lock just takes its price;
- one that does asks for the lock at its start; asks are granted in virtual-time order
  (ties: the VM that joined first); it gets the lock when the lock is free, holds it
  for its priced part under the lock, and ends its price after the grant;
- a doorbell queues its submission -- the engine time it took when recorded -- on the
  one non-preemptive engine, through the same Dispatcher and policy classes the
  mediator drives (FIFO / CREDIT / BAND / QUANTUM, with each VM's share); a wait on the
  GPU lasts until every submission the VM rang has completed.

`grain_ns` trades exactness for speed at scales the emulator cannot reach: consecutive
exits of a run are merged into steps of up to that much time, each asking once for the
lock and holding it for the merged part (0: exit by exit, as the emulator does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Iterator, Sequence

import simpy

from gpuvm.sim.model import EngineModel, KernelRun
from gpuvm.sim.residency import ResidencyModel
from scheduler.config import SchedulerConfig
from scheduler.metrics import VmMetrics

# an entry of a stream, as gpuvm.device.clock.EventStream keeps it
Entry = Sequence


@dataclass(frozen=True)
class VmStream:
    """One VM's priced events (EventStream.entries) and when it joined."""

    name: str
    entries: tuple[tuple, ...]
    start: int = 0
    share: float = 1.0  # its scheduler weight
    working_set_bytes: int = 0  # what must be resident while its work runs (oversubscribed)

    @property
    def alone_ns(self) -> int:
        """Its time with nothing shared: every exit's price and every wait."""
        return sum(e[1] * e[2] if e[0] == "x" else e[1] for e in self.entries
                   if e[0] in ("x", "w"))

    def placed(self, name: str, start: int = 0, share: float = 1.0,
               working_set_bytes: int = 0) -> VmStream:
        """This stream as VM `name` of a scenario: its arrival, weight and working set."""
        return VmStream(name, self.entries, start, share, working_set_bytes)

    def to_json(self) -> dict:
        return {"name": self.name, "entries": [list(e) for e in self.entries]}

    @classmethod
    def from_json(cls, data: dict) -> VmStream:
        entries = tuple(tuple(e) for e in data["entries"])
        for e in entries:
            if not e or e[0] not in ("x", "w", "d") or \
                    any(not isinstance(v, int) for v in e[1:]):
                raise ValueError(f"stream {data.get('name')!r}: bad entry {list(e)!r}")
        return cls(str(data["name"]), entries)


@dataclass
class ReplayResult:
    """Per-VM end times (ns, from 0), lock waits and what the GPU scheduler saw."""

    end_ns: dict[str, int]
    lock_wait_ns: dict[str, int]
    metrics: dict[str, VmMetrics] = field(default_factory=dict)
    events: int = 0
    # per VM, residency.COUNTER_NAMES (only when the GPU was oversubscribed)
    residency: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def makespan_ns(self) -> int:
        return max(self.end_ns.values(), default=0)


class LockModel:
    """The mediator's lock as the emulator holds it in virtual time (VirtualLock): the
    asks of one time are granted once every VM has asked what it will at that time, in
    the order the VMs joined; each gets the lock when it is free."""

    GRANT_PRIORITY = 2  # after every ordinary event of the same time (simpy: 0 and 1)

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.free_at = 0
        self._asks: list[tuple[int, int, simpy.Event]] = []

    def ask(self, rank: int, locked_ns: int) -> simpy.Event:
        """An exit of VM `rank` asks now; the event's value is when it gets the lock."""
        granted = self.env.event()
        if not self._asks:
            round_ = self.env.event()
            round_.callbacks.append(self._grant)
            round_._ok, round_._value = True, None  # triggered, at a later priority
            self.env.schedule(round_, self.GRANT_PRIORITY)
        self._asks.append((rank, locked_ns, granted))
        return granted

    def _grant(self, _event: simpy.Event) -> None:
        asks, self._asks = sorted(self._asks, key=lambda a: a[0]), []
        now = self.env.now
        for _, locked_ns, granted in asks:
            start = max(now, self.free_at)
            self.free_at = max(self.free_at, start + locked_ns)
            granted.succeed(start)


_ASK, _GPU, _WAIT = 0, 1, 2


def _steps(entries: Sequence[Entry], grain_ns: int) -> Iterator[tuple[int, int, int]]:
    """(kind, ns, locked_ns) steps of a stream: an _ASK step is an exit (or, with a
    grain, several merged) that takes the lock (locked_ns >= 0) or not (-1); a _GPU step
    is a doorbell whose submission holds the engine ns; _WAIT waits for the VM's GPU work."""
    for e in entries:
        if e[0] == "x":
            _, count, ns, locked = e
            if locked < 0 or grain_ns <= 0 or ns == 0:
                if locked < 0:
                    yield _ASK, ns * count, -1
                else:
                    for _ in range(count):
                        yield _ASK, ns, locked
                continue
            per = max(1, grain_ns // ns)
            done = 0
            while done < count:
                m = min(per, count - done)
                yield _ASK, ns * m, locked * m
                done += m
        elif e[0] == "d":
            yield _GPU, e[1], -1
        elif e[0] == "w":
            yield _WAIT, e[1], -1


def _vm(env: simpy.Environment, lock: LockModel, engine: EngineModel, stream: VmStream,
        rank: int, grain_ns: int, end: dict[str, int], waits: dict[str, int]
        ) -> Generator[simpy.Event, Any, None]:
    yield env.timeout(stream.start)
    engine.dispatcher.add_vm(stream.name, stream.share, env.now)
    if engine.residency is not None:
        engine.residency.add_vm(stream.name, stream.working_set_bytes)
    outstanding: list[simpy.Event] = []
    ahead = 0  # time of unlocked exits not yet slept: they need nothing shared
    for kind, ns, locked in _steps(stream.entries, grain_ns):
        if kind == _ASK and locked < 0:
            ahead += ns
            continue
        if ahead:
            yield env.timeout(ahead)
            ahead = 0
        if kind == _ASK:
            asked = env.now
            start = yield lock.ask(rank, locked)
            waits[stream.name] += start - asked
            yield env.timeout(start + ns - env.now)
        elif kind == _GPU:
            done = env.event()
            engine.dispatcher.submit(stream.name, KernelRun(stream.name, ns, done), env.now)
            outstanding.append(done)
        elif outstanding:
            yield env.all_of(outstanding)
            outstanding = []
    if ahead:
        yield env.timeout(ahead)
    end[stream.name] = env.now
    if engine.residency is not None:
        engine.residency.remove_vm(stream.name)


def replay(streams: Sequence[VmStream], grain_ns: int = 0,
           scheduler: SchedulerConfig | None = None,
           residency: ResidencyModel | None = None) -> ReplayResult:
    """Replay `streams` together (see the module docstring), the GPU scheduled by
    `scheduler` (default FIFO) with each VM's share; with a `residency` the GPU has that
    much VRAM and each VM's working set must be resident while its work runs
    (gpuvm.sim.residency).  Deterministic: the same streams give the same result."""
    if residency is not None:
        for s in streams:
            residency.check(s.name, s.working_set_bytes)
    env = simpy.Environment()
    lock = LockModel(env)
    engine = EngineModel(env, scheduler or SchedulerConfig("fifo"), residency)
    end: dict[str, int] = {}
    waits = {s.name: 0 for s in streams}
    for rank, stream in enumerate(streams):
        env.process(_vm(env, lock, engine, stream, rank, grain_ns, end, waits))
    events = 0
    while env.peek() != simpy.core.Infinity:
        env.step()
        events += 1
    counters = {} if residency is None else \
        {str(vm): c.as_dict() for vm, c in residency.counters.items()}
    return ReplayResult(end, waits, dict(engine.dispatcher.metrics), events, counters)


def replicate(stream: VmStream, count: int) -> list[VmStream]:
    """`count` VMs running the same stream from the same start (vm0, vm1, ...)."""
    return [stream.placed(f"vm{i}", stream.start) for i in range(count)]
