"""How long a thread takes to run Python again once woken, by how long it slept.

VMs run as threads of one process take turns holding the interpreter lock: a vCPU
thread back from KVM_RUN that finds it held sleeps until the holder lets it go and
wakes it.  What that wake-up costs depends on how long the thread slept.  On a virtual
machine (the lent 16-core machines are) an idle vCPU first polls for a while before it
halts (Linux's cpuidle-haltpoll driver, `guest_halt_poll_ns`, 200 us by default); a
thread woken within that window runs again in a few microseconds, one woken after it
waits for its halted vCPU to be brought back by the hypervisor.  Measured there
(2026-11-25): on one machine, three times, 20-29 us after sleeps of up to 200 us, 31-35
at 300, 33-38 at 400, 41-48 at 800, 56-65 at 2 ms; on another 15-19 us up to 200 us,
then 20, 22, 25, 32; on a third (medians, twice) 6-9 us up to 150 us, 16-18 at
200-300, 19-25 at 400-800, 37 at 2 ms.  With two fv VMs a thread waits for the other's
handler (~50 us), inside the window; with eight it waits for seven (~400 us), past it --
so a hand-off fitted on 2-VM runs is too cheap for 8, and the model
(CostProfile.wake_extra_ns, gpuvm.sim.replay) adds what this curve says.

A thread woken after a long sleep also works slower for a while: its core went idle,
and its caches cold.  On the lent machine (2026-11-25) an fv-opt exit handled after
0.6-1 ms asleep took 5-11 us more than one after 50-300 us (its handler and the exit
loop, 28-32 us), and a fixed piece of Python work over 20,000 small objects 65-76 us
after 5-150 us, 85-98 after 600 us, 108-124 after 1-2 ms.  So the curve is measured on
this emulator's own exits where it can be (`measure_on_exits`, `ExitProbe`: one VM
whose vCPU thread sleeps after every KVM_RUN, woken like a hand-off, then times the
exit it handles), and the model adds both differences.

The measurement: one process busy-waits a given time while a thread of another sleeps
in a blocking read; it stamps the clock and writes to it; the sleeper stamps when it
runs Python again (`measure`: this process waits, the sleeper is spawned;
`measure_on_exits`: a spawned waker, and a VM's vCPU thread sleeps, then handles its
exit).  The mean of the wake-ups per sleep (less the slowest TRIM): a second or two on
a pipe alone, ~4 s on an fv-opt VM.

`gpuvm calibrate --emulator` keeps this curve's exit times, and takes the latency from
threads passing the interpreter lock itself (gpuvm.calibrate.lock_turns): a pipe
between processes did not show the knee the emulator's own hand-offs have.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Mapping, Sequence

from gpuvm.experiment.costs import CostProfile

SLEPT_US = (5, 20, 50, 100, 150, 200, 300, 400, 800, 2000)
# whose exits measure_on_exits times in `gpuvm calibrate --emulator`: trapped accesses and
# shadow syncs, the kinds most exits of the validated modes are of
WAKE_MODE = "fv-opt"
SAMPLES = 200
TRIM = 0.05  # the slowest share of the samples left out (the host's preemptions)
_STAMP = 8  # bytes of a clock stamp sent back
_WAKE = b"x"


@dataclass(frozen=True)
class WakeCurve:
    """Mean wake-up latency (ns) after each sleep (ns), ascending in the sleep."""

    slept_ns: tuple[int, ...]
    latency_ns: tuple[int, ...]
    # the mean time the exit handled after each sleep took (ns; empty: not measured)
    work_ns: tuple[int, ...] = ()

    def to_about(self) -> dict[str, list[int]]:
        """As kept in a validation bundle's "about" (gpuvm.calibrate.validation)."""
        return {"slept_ns": list(self.slept_ns), "latency_ns": list(self.latency_ns)} \
            | ({"work_ns": list(self.work_ns)} if self.work_ns else {})

    @classmethod
    def from_about(cls, about: Mapping[str, Any]) -> WakeCurve | None:
        """The curve a bundle kept under "wake"; None for a bundle from before it was
        measured (its model then charges every hand-off alike)."""
        wake = about.get("wake")
        if not wake:
            return None
        try:
            curve = cls(tuple(int(v) for v in wake["slept_ns"]),
                        tuple(int(v) for v in wake["latency_ns"]),
                        tuple(int(v) for v in wake.get("work_ns", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"wake curve unreadable ({exc!r})") from None
        if len(curve.slept_ns) != len(curve.latency_ns) or not curve.slept_ns:
            raise ValueError("wake curve: needs one latency per sleep, and a sleep")
        if curve.work_ns and len(curve.work_ns) != len(curve.slept_ns):
            raise ValueError("wake curve: needs one exit's work per sleep")
        return curve

    def priced_in(self, profile: CostProfile) -> CostProfile:
        """`profile` with this curve: its hand-offs after long waits cost what it says
        (CostProfile.wake_extra_ns)."""
        return replace(profile, wake_slept_ns=tuple(float(v) for v in self.slept_ns),
                       wake_latency_ns=tuple(float(v) for v in self.latency_ns),
                       wake_work_ns=tuple(float(v) for v in self.work_ns))

    def text(self) -> str:
        """One line, microseconds asleep: microseconds to wake, and where measured the
        exit's work then ('5 us: 7.7, ...' or '5 us: 7.7 + 31.0, ...')."""
        work = self.work_ns or (None,) * len(self.slept_ns)
        return ", ".join(f"{s / 1e3:.0f} us: {w / 1e3:.1f}"
                         + (f" + {x / 1e3:.1f}" if x is not None else "")
                         for s, w, x in zip(self.slept_ns, self.latency_ns, work))


def _sleeper(conn: Connection) -> None:
    """The sleeping side, in a process of its own: answer every wake-up with the time
    it ran again, until told to quit."""
    while conn.recv_bytes() == _WAKE:
        conn.send_bytes(time.perf_counter_ns().to_bytes(_STAMP, "little"))


def measure(slept_us: Sequence[int] = SLEPT_US, samples: int = SAMPLES) -> WakeCurve:
    """The wake-up latency after each sleep in `slept_us` (see the module).  The sleeper
    is another process (spawned), not a thread: a thread of this one would wake and
    then find the interpreter lock still held by this busy side -- a second sleep and
    wake-up the emulator's hand-off does not have (measured with a thread on the lent
    machine: 19 us after 5 us asleep, 13-15 at 150-200, 25 at 2 ms -- no knee at the
    poll window).  Both sides read CLOCK_MONOTONIC (time.perf_counter_ns on Linux), one
    clock for every process."""
    if samples < 1 or not slept_us:
        raise ValueError("measure needs at least one sleep and one sample")
    sleeps = sorted(slept_us)
    waits: list[list[int]] = [[] for _ in sleeps]
    with _partner(_sleeper, "wake-sleeper", _WAKE) as ours:
        for _ in range(samples):  # rounds over every sleep: a slow moment hits them all
            for us, out in zip(sleeps, waits):
                spin_us(us)  # the sleeper's core idles
                sent = time.perf_counter_ns()
                ours.send_bytes(_WAKE)
                out.append(int.from_bytes(ours.recv_bytes(), "little") - sent)
    return WakeCurve(tuple(us * 1000 for us in sleeps), tuple(_trimmed_mean(w) for w in waits))


@contextmanager
def _partner(target: Callable[[Connection], None], name: str, hello: bytes
             ) -> Iterator[Connection]:
    """A spawned process running `target` on the other end of a pipe: up (its imports
    done) once it has answered `hello`, when this yields; told to quit ("q") after."""
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    process = ctx.Process(target=target, args=(theirs,), name=name, daemon=True)
    process.start()
    theirs.close()
    try:
        ours.send_bytes(hello)
        ours.recv_bytes()
        yield ours
    finally:
        ours.send_bytes(b"q")
        process.join(timeout=10)
        ours.close()


def spin_us(us: float) -> None:
    """Spin `us` microseconds on this core: a sleep would let this core idle too, where
    only the other side's should (here, and gpuvm.calibrate.wake_cost)."""
    end = time.perf_counter_ns() + us * 1000
    while time.perf_counter_ns() < end:
        pass


def _trimmed_mean(values: Sequence[int]) -> int:
    """The mean without the slowest TRIM of the samples.  A mean, not a median: past
    the poll window a wake-up is fast or slow by chance (on a 2-core VM: 10 us or 165),
    and the model charges the expected cost of each; the slowest few are the host
    preempting the sleeper, which the model does not charge per hand-off."""
    kept = sorted(values)[:max(1, int(len(values) * (1 - TRIM)))]
    return int(statistics.fmean(kept))


class ExitProbe:
    """Puts a VM's vCPU thread to sleep after every KVM_RUN, before it handles the exit,
    and times the wake-up and then the exit's work (RunOptions.after_kvm_run).  The
    sleeps take turns over `slept_us`, so every kind of exit is handled after each.  A
    waker process (spawned) busy-waits the sleep, stamps the clock and writes to the
    pipe the thread sleeps in, as another VM's thread hands over the interpreter lock.
    An exit's work runs from the wake-up to the next KVM_RUN: its handler and the exit
    loop, the part of an exit that holds the lock."""

    def __init__(self, slept_us: Sequence[int] = SLEPT_US) -> None:
        self.slept_us = tuple(sorted(slept_us))
        self.waits: list[list[int]] = [[] for _ in self.slept_us]
        self.work: list[list[int]] = [[] for _ in self.slept_us]
        self._turn = 0
        self._woke_at: int | None = None
        self._slot = 0
        self._conn: Connection | None = None
        self._waker: AbstractContextManager[Connection] | None = None

    def __enter__(self) -> ExitProbe:
        self._waker = _partner(_waker, "wake-waker", (0).to_bytes(_STAMP, "little"))
        self._conn = self._waker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._waker is not None
        self._waker.__exit__(*exc)

    def after_run(self, entered_ns: int) -> None:
        """KVM_RUN (entered at `entered_ns`) returned: the exit before it was handled
        since the last wake-up; sleep the next turn's time, then handle this one."""
        assert self._conn is not None, "ExitProbe.after_run outside `with`"
        if self._woke_at is not None:
            self.work[self._slot].append(entered_ns - self._woke_at)
        self._slot = self._turn % len(self.slept_us)
        self._turn += 1
        self._conn.send_bytes(self.slept_us[self._slot].to_bytes(_STAMP, "little"))
        sent = int.from_bytes(self._conn.recv_bytes(), "little")
        self._woke_at = time.perf_counter_ns()
        self.waits[self._slot].append(self._woke_at - sent)

    def curve(self) -> WakeCurve | None:
        """The measured curve; None where no exit came (a backend without KVM_RUN)."""
        if not all(self.work):
            return None
        return WakeCurve(tuple(us * 1000 for us in self.slept_us),
                         tuple(_trimmed_mean(w) for w in self.waits),
                         tuple(_trimmed_mean(w) for w in self.work))


def _waker(conn: Connection) -> None:
    """The waking side, in a process of its own: for each request busy-wait its
    microseconds (the requester's core idles), then send the time, until told to quit."""
    while (msg := conn.recv_bytes()) != b"q":
        spin_us(int.from_bytes(msg, "little"))
        conn.send_bytes(time.perf_counter_ns().to_bytes(_STAMP, "little"))


def measure_on_exits(benchmark: str, params: tuple[int, ...], mode: str,
                     slept_us: Sequence[int] = SLEPT_US, backend: str = "auto"
                     ) -> WakeCurve | None:
    """The curve measured on one VM of this emulator (ExitProbe): how long its vCPU
    thread takes to wake after each sleep, and how long the exit it then handles
    takes.  None where the VM does not run on KVM (no KVM_RUN to sleep after)."""
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions

    with ExitProbe(slept_us) as probe:
        run_alike(benchmark, params, 1, RunOptions(
            mode=mode, backend=backend, record_events=True, after_kvm_run=probe.after_run),
            f"measuring wake-ups on {mode}")
    return probe.curve()
