"""How long the interpreter lock sits free when it passes to a thread that waited for
it, by how long that thread waited -- measured through the lock itself.

VMs run as threads hand the interpreter lock from one vCPU thread to the next at
nearly every exit (gpuvm.sim.replay prices each hand-off).  The model charges a
hand-off fitted on 2-VM runs, plus what a longer wait adds (CostProfile.wake_extra_ns);
the second part comes from a curve of wake-up latency by time asleep.  Measured
across two processes through a pipe (gpuvm.calibrate.wake.measure_on_exits), that
curve did not show what the emulator's own threads do.  Timed inside N-VM runs on the
lent 16-core machine (2026-11-26; each thread's KVM_RUN wall and CPU time, and its CPU
outside it), the lock sat free about 8 us per hand-off with four fv VMs, whose threads
waited ~100 us each time, and 22-24 us with eight, waiting ~400 us -- while the pipe's
curve rose by 2-11 us between those sleeps on seven such machines.  Threads that take
turns at the lock the way vCPU threads do show the same rise (10-13 us up to ~180 us,
16-28 us from ~260 us; on one machine 9.6 and 16.1 us after 103 and 388 us, where the
emulator's own hand-offs in the same lease left the lock free 9.3-10.8 us at 4 VMs and
16.6-17.8 us at 8): a thread blocked on the lock past its core's idle poll window is
woken late, however the waker reaches it.

So `measure` runs N threads shaped like vCPU threads -- each lets the lock go for a
stretch of CPU work (hashing a buffer: hashlib releases the lock for it, as KVM_RUN
does for the guest), then holds it for a stretch of Python over objects of its own (a
handler) -- for several N, so their waits span the ones N VMs have.  Per N it reports
how long a take that slept had waited (from the thread's wall and CPU time in the
unlocked stretch) and how long the lock sat free per take (the run's span less the
time every thread held it).  `through_lock` makes that the wake curve's latency; the
exit's work after each wait stays as measured on the emulator's exits.
"""

from __future__ import annotations

import hashlib
import os
import resource
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from gpuvm.calibrate.wake import WakeCurve

THREADS = (2, 3, 4, 6, 8, 12)  # threads taking turns: their waits ~30-600 us
TAKES = 1500  # takes of the lock per thread, per count
ROUNDS = 3  # rounds over every count: the median round of each is kept
FREE_BYTES = 16384  # hashed without the lock: 12-20 us on the lent machines
HELD_OBJECTS = 400  # walked under the lock: 27-55 us there, an fv exit's handler
# a count whose takes slept less often than this did not always find the lock held: its
# idle time is partly nobody wanting it, not a hand-off
MIN_SLEEPS_PER_TAKE = 0.9


@dataclass(frozen=True)
class Turns:
    """N threads taking turns at the lock, per take: how long one that slept had waited,
    and how long the lock sat free."""

    threads: int
    waited_ns: int
    idle_ns: int
    sleeps_per_take: float

    @property
    def handed_over(self) -> bool:
        """Whether nearly every take slept: the lock's idle time is then its hand-offs'
        (MIN_SLEEPS_PER_TAKE)."""
        return self.sleeps_per_take >= MIN_SLEEPS_PER_TAKE

    @classmethod
    def from_about(cls, about: Mapping[str, Any]) -> Turns:
        return cls(int(about["threads"]), int(about["waited_ns"]), int(about["idle_ns"]),
                   float(about["sleeps_per_take"]))


@dataclass
class _ThreadTimes:
    held_ns: int = 0  # from getting the lock back to letting it go again
    slept_ns: int = 0  # wall less CPU time in the unlocked stretch: waiting for the lock
    sleeps: int = 0  # voluntary context switches
    begin_ns: int = 0
    end_ns: int = 0


def handler_objects(count: int) -> list[list[int]]:
    """A thread's own objects for `held_work` to walk."""
    return [[i, 7 * i] for i in range(count)]


def held_work(objects: list[list[int]]) -> int:
    """A handler's worth of Python over the thread's own objects."""
    total = 0
    for pair in objects:
        total += pair[0] ^ pair[1]
        pair[1] = total & 0xFFFF
    return total


def _take_turns(times: _ThreadTimes, start: threading.Barrier, takes: int,
                buffer: bytes) -> None:
    objects = handler_objects(HELD_OBJECTS)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    start.wait()
    times.begin_ns = clock()
    for _ in range(takes):
        t0, c0 = clock(), cpu_clock()
        hashlib.sha256(buffer).digest()  # the lock let go, as for KVM_RUN
        c1, t1 = cpu_clock(), clock()
        times.slept_ns += (t1 - t0) - (c1 - c0)
        held_work(objects)
        times.held_ns += clock() - t1
    times.end_ns = clock()
    times.sleeps = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches


def take_turns(threads: int, takes: int = TAKES) -> Turns:
    """`threads` threads, `takes` turns each at the lock (see the module)."""
    if threads < 2 or takes < 1:
        raise ValueError(f"take_turns needs 2 threads and a take, got {threads}, {takes}")
    buffer = os.urandom(FREE_BYTES)
    start = threading.Barrier(threads)
    times = [_ThreadTimes() for _ in range(threads)]
    workers = [threading.Thread(target=_take_turns, args=(t, start, takes, buffer),
                                name=f"lock-turns-{i}") for i, t in enumerate(times)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    span = max(t.end_ns for t in times) - min(t.begin_ns for t in times)
    count = threads * takes
    sleeps = sum(t.sleeps for t in times)
    return Turns(threads, sum(t.slept_ns for t in times) // max(1, sleeps),
                 max(0, span - sum(t.held_ns for t in times)) // count, sleeps / count)


def measure(threads: Sequence[int] = THREADS, takes: int = TAKES,
            rounds: int = ROUNDS) -> list[Turns]:
    """Per thread count, the round with the median idle time (rounds go over every
    count in turn, so a slow moment of the host hits them all), by the wait."""
    if rounds < 1 or not threads:
        raise ValueError("measure needs a thread count and a round")
    seen: dict[int, list[Turns]] = {n: [] for n in threads}
    for _ in range(rounds):
        for n in threads:
            seen[n].append(take_turns(n, takes))
    kept = [sorted(runs, key=lambda t: t.idle_ns)[(len(runs) - 1) // 2]
            for runs in seen.values()]
    return sorted(kept, key=lambda t: t.waited_ns)


def through_lock(on_exits: WakeCurve, turns: Sequence[Turns]) -> WakeCurve:
    """The wake curve whose latency is the lock's idle time per take by the wait before
    it (counts whose takes did not nearly all sleep left out), with the work of the
    exit after such a wait read off `on_exits` at those waits (linear between its
    sleeps, flat beyond).  `on_exits` alone where no count qualifies."""
    kept = [t for t in sorted(turns, key=lambda t: t.waited_ns) if t.handed_over]
    if not kept:
        return on_exits
    slept = tuple(t.waited_ns for t in kept)
    work = ()
    if on_exits.work_ns:
        work = tuple(int(w) for w in np.interp(slept, on_exits.slept_ns, on_exits.work_ns))
    return WakeCurve(slept, tuple(t.idle_ns for t in kept), work)


def to_about(turns: Sequence[Turns]) -> list[dict[str, Any]]:
    """As kept in a validation bundle's "about" (beside the curve made from them)."""
    return [asdict(t) for t in turns]


def text(turns: Sequence[Turns]) -> str:
    """One line: per count, the wait (us) -> the lock's idle time per take (us)."""
    return ", ".join(f"{t.threads} threads: {t.waited_ns / 1e3:.0f} -> {t.idle_ns / 1e3:.1f}"
                     + ("" if t.handed_over else " (not kept)")
                     for t in turns)
