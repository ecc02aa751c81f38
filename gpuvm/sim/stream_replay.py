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
- a wait on the GPU takes the GPU time the VM waited for alone, on one non-preemptive
  engine shared first come, first served (the scheduler's FIFO).  The scaling and
  overhead benchmarks never wait on a busy engine (their GPU work ends before their next
  trap); streams whose waits overlap other VMs' GPU work are modelled only this far.

`grain_ns` trades exactness for speed at scales the emulator cannot reach: consecutive
exits of a run are merged into steps of up to that much time, each asking once for the
lock and holding it for the merged part (0: exit by exit, as the emulator does).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterator, Sequence

# an entry of a stream, as gpuvm.device.clock.EventStream keeps it
Entry = Sequence


@dataclass(frozen=True)
class VmStream:
    """One VM's priced events (EventStream.entries) and when it joined."""

    name: str
    entries: tuple[tuple, ...]
    start: int = 0

    @property
    def alone_ns(self) -> int:
        """Its time with nothing shared: every exit's price and every wait."""
        return sum(e[1] * e[2] if e[0] == "x" else e[1] for e in self.entries
                   if e[0] in ("x", "w"))

    def to_json(self) -> dict:
        return {"name": self.name, "start": self.start, "entries": [list(e) for e in self.entries]}

    @classmethod
    def from_json(cls, data: dict) -> VmStream:
        entries = tuple(tuple(e) for e in data["entries"])
        for e in entries:
            if not e or e[0] not in ("x", "w", "d") or \
                    any(not isinstance(v, int) for v in e[1:]):
                raise ValueError(f"stream {data.get('name')!r}: bad entry {list(e)!r}")
        return cls(str(data["name"]), entries, int(data.get("start", 0)))


@dataclass
class ReplayResult:
    """Per-VM end times (ns, from 0) and lock waits of one replay."""

    end_ns: dict[str, int]
    lock_wait_ns: dict[str, int]
    events: int = 0

    @property
    def makespan_ns(self) -> int:
        return max(self.end_ns.values(), default=0)

    def vm_ns(self, starts: dict[str, int]) -> dict[str, int]:
        """Each VM's own time: its end less its start."""
        return {name: end - starts.get(name, 0) for name, end in self.end_ns.items()}


_ASK, _GPU = 0, 1


def _steps(entries: Sequence[Entry], grain_ns: int) -> Iterator[tuple[int, int, int, int]]:
    """(kind, ns, locked_ns, count) steps of a stream: _ASK steps need the lock
    (locked_ns >= 0) or not (-1); _GPU steps wait on the engine for ns."""
    for e in entries:
        if e[0] == "x":
            _, count, ns, locked = e
            if grain_ns <= 0 or count == 1 or ns == 0:
                for _ in range(count):
                    yield _ASK, ns, locked, 1
                continue
            per = max(1, grain_ns // ns)
            done = 0
            while done < count:
                m = min(per, count - done)
                yield _ASK, ns * m, locked * m if locked >= 0 else -1, m
                done += m
        elif e[0] == "w" and e[1] > 0:
            yield _GPU, e[1], -1, 0


def replay(streams: Sequence[VmStream], grain_ns: int = 0) -> ReplayResult:
    """Replay `streams` together (see the module docstring).  Deterministic: the same
    streams give the same result, exactly."""
    lock_free = 0
    engine_free = 0
    heap: list[tuple[int, int, int, int]] = []  # (time, kind, rank, seq)
    iters = [_steps(s.entries, grain_ns) for s in streams]
    now = [s.start for s in streams]
    step: list[tuple[int, int, int, int] | None] = [None] * len(streams)
    waits = [0] * len(streams)
    events = 0
    seq = 0

    def advance(i: int) -> None:
        """Run VM i through its steps until one that needs the lock or the engine."""
        nonlocal seq
        t = now[i]
        for st in iters[i]:
            kind, ns, locked, _ = st
            if kind == _ASK and locked < 0:
                t += ns
                continue
            now[i] = t
            step[i] = st
            seq += 1
            heapq.heappush(heap, (t, kind, i, seq))
            return
        now[i] = t
        step[i] = None

    for i in range(len(streams)):
        advance(i)
    while heap:
        t, kind, i, _ = heapq.heappop(heap)
        events += 1
        _, ns, locked, _ = step[i]
        if kind == _ASK:
            start = max(t, lock_free)
            waits[i] += start - t
            lock_free = max(lock_free, start + locked)
            now[i] = start + ns
        else:
            start = max(t, engine_free)
            engine_free = start + ns
            now[i] = start + ns
        advance(i)
    return ReplayResult({s.name: now[i] for i, s in enumerate(streams)},
                        {s.name: waits[i] for i, s in enumerate(streams)}, events)


def replicate(stream: VmStream, count: int) -> list[VmStream]:
    """`count` VMs running the same stream from the same start (vm0, vm1, ...)."""
    return [VmStream(f"vm{i}", stream.entries, stream.start) for i in range(count)]
