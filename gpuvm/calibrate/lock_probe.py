"""CPython's interpreter lock on this host without KVM, and the model's lock on the same
loops, side by side.

The model's threaded-VM predictions stand or fall with how it has threads take turns at
the interpreter lock (gpuvm.sim.replay, _System).  Read off the validation
bundles, every VM count mixes that lock with KVM, the guests, the recorder and the host
cores, and each change to the lock moved some points and not others
(docs/model-validation.md, "One hand-off for 4 and 8 VMs on two cores").  This probe
takes KVM out: N Python threads each loop `held` us of Python under the lock (a
handler) and then `free` us of C work with the lock let go (hashing a buffer: hashlib
lets the lock go for it, as a vCPU thread does around KVM_RUN) -- an fv exit is about
12 us held and 28 us free.  Per thread count and free stretch it reports the wall time
per loop and how often a thread slept per loop (its voluntary context switches), and
beside them the model's replay of the same loops on this host's cores, with the lock's
hand-off as `lock_turns` measures it (its idle time per take where nearly every take
slept).

On this 2-core host (2026-11-29: docs "The lock apart from KVM") two threads with 12 us
held and 28 us free kept in step and slept at 0.02-0.13 of their loops, where the model,
handing the lock over at the 17.5 us `lock_turns` measured beside them, made every loop a
sleep; and at 4 and 8 threads with 14 us or more free the model's copies never waited
where the threads slept at 0.2-1.1 of their loops.  The host also has slow spells, in
which the same two threads took 102-112 us a loop, asleep at nearly every one, for
several runs in a row: each (threads, free) is run ROUNDS times by turns and the fastest
kept, as the validation keeps each point's fastest run (validation.fastest).
"""

from __future__ import annotations

import hashlib
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from gpuvm.bench.timing import best_of
from gpuvm.calibrate.lock_turns import handler_objects, held_work

THREADS = (2, 4, 8)  # threads taking turns
FREE_US = (4.0, 8.0, 14.0, 20.0, 28.0, 40.0)  # the stretch with the lock let go
HELD_US = 12.0  # the stretch holding it (an fv exit's handler and exit loop)
LOOPS = 5000  # loops per thread per run
ROUNDS = 3  # runs of each (threads, free) by turns: the fastest is kept (see the module)
SIZING_RUNS = 7  # single-thread timings of a stretch: the fastest is its size
# threads of lock_turns whose idle time per take is the model's hand-off unless one is
# given: with 4, nearly every take sleeps, so the idle time is the hand-offs'
HANDOFF_THREADS = 4
# hashlib lets the lock go only for data of this many bytes or more (CPython's
# HASHLIB_GIL_MINSIZE): a shorter free stretch would hold the lock throughout
GIL_FREE_MIN_BYTES = 2048


@dataclass(frozen=True)
class ProbeRun:
    """N threads looping `held_us` under the lock and `free_us` off it: per loop and
    thread, the wall time and the sleeps."""

    threads: int
    free_us: float
    held_us: float
    loop_ns: float
    sleeps_per_loop: float


@dataclass(frozen=True)
class Stretches:
    """How much work makes each stretch: bytes hashed (free) and objects walked (held)."""

    free_bytes_per_us: float
    held_objects_per_us: float

    def free_bytes(self, us: float) -> int:
        return max(GIL_FREE_MIN_BYTES, round(us * self.free_bytes_per_us))

    def held_objects(self, us: float) -> int:
        return max(1, round(us * self.held_objects_per_us))


def size_stretches() -> Stretches:
    """Each stretch's work per microsecond on this host, one thread alone (the fastest
    of SIZING_RUNS timings of a large piece, so a slow moment does not size it)."""
    buffer = os.urandom(1 << 20)
    objects = handler_objects(20_000)
    hashed_s = best_of(lambda: hashlib.sha256(buffer).digest(), SIZING_RUNS)
    walked_s = best_of(lambda: held_work(objects), SIZING_RUNS)
    return Stretches(len(buffer) / (hashed_s * 1e6), len(objects) / (walked_s * 1e6))


def _loop(start: threading.Barrier, loops: int, buffer: bytes, objects: list[list[int]],
          out: list[tuple[int, int, int]]) -> None:
    switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
    start.wait()
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        held_work(objects)  # a handler, holding the lock
        hashlib.sha256(buffer).digest()  # the lock let go, as around KVM_RUN
    t1 = time.perf_counter_ns()
    out.append((t0, t1, resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches))


def run_probe(threads: int, free_us: float, held_us: float, stretches: Stretches,
              loops: int = LOOPS) -> ProbeRun:
    """One run of `threads` threads, `loops` loops each (see the module)."""
    if threads < 1 or loops < 1:
        raise ValueError(f"run_probe needs a thread and a loop, got {threads}, {loops}")
    buffer = os.urandom(stretches.free_bytes(free_us))
    start = threading.Barrier(threads)
    out: list[tuple[int, int, int]] = []
    workers = [threading.Thread(
        target=_loop, name=f"lock-probe-{i}",
        args=(start, loops, buffer,
              handler_objects(stretches.held_objects(held_us)), out))
        for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    span = max(t1 for _, t1, _ in out) - min(t0 for t0, _, _ in out)
    return ProbeRun(threads, free_us, held_us, span / loops,
                    sum(s for _, _, s in out) / (loops * threads))


def measure(threads: Sequence[int] = THREADS, free_us: Sequence[float] = FREE_US,
            held_us: float = HELD_US, loops: int = LOOPS, rounds: int = ROUNDS,
            stretches: Stretches | None = None) -> list[ProbeRun]:
    """Per (threads, free), the fastest of `rounds` runs (rounds go over every pair in
    turn, so a slow spell of the host hits them all), in the order asked."""
    if rounds < 1 or not threads or not free_us:
        raise ValueError("measure needs a thread count, a free stretch and a round")
    stretches = stretches or size_stretches()
    seen: dict[tuple[int, float], list[ProbeRun]] = {}
    for _ in range(rounds):
        for n in threads:
            for free in free_us:
                seen.setdefault((n, free), []).append(
                    run_probe(n, free, held_us, stretches, loops))
    return [min(runs, key=lambda r: r.loop_ns) for runs in seen.values()]


def modelled(run: ProbeRun, cores: int, handoff_ns: int, loops: int = 1000,
             signal_ns: int = 0) -> ProbeRun:
    """The model's replay of `run`'s loops (gpuvm.sim.replay): each thread a VM whose
    steps are `free_us` on a core and `held_us` under the interpreter lock, one exit
    each, on `cores` host cores with the lock's hand-off at `handoff_ns` and a wake-up
    costing the waker `signal_ns`."""
    from gpuvm.sim.replay import CPU, FREE, Step, VmTrace, replay, replicate

    loop = (Step(FREE, round(run.free_us * 1e3), "Init"),
            Step(CPU, round(run.held_us * 1e3), "Init", 1))
    result = replay(replicate(VmTrace("thread", loop * loops), run.threads), cores=cores,
                    interpreter_lock=True, lock_handoff_ns=handoff_ns,
                    lock_signal_ns=signal_ns)
    return ProbeRun(run.threads, run.free_us, run.held_us, result.makespan_ns / loops,
                    result.lock_sleeps / (loops * run.threads))
