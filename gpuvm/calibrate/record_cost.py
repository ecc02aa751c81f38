"""What recording a per-event trace costs per event, timed apart from any guest.

The model replays a VM's recorded trace (gpuvm.sim.replay, `recorded_times`): its
handlers' time and the exit loop's time between events, as the recording measured them.
But the recorder (gpuvm.vmm.event_trace) is itself Python on the vCPU thread: each exit
goes through `EventRecorder.timed_run` around KVM_RUN and a `RecordingDevice` around the
handler, four clock reads and a few attribute updates -- time a run that records nothing
does not spend, and which lands in the trace as exit-loop time under the interpreter
lock.  On the lent 16-core machines one VM's fastest trace took 7-11% longer than the
fastest unrecorded run beside it (bundle 20261127-134445: fv 2.96 us more per event,
fv-opt 2.31, over 49,409 and 7,381 events), and over fourteen bundles the model put
every mode's 1-VM point 6.7-7.4% long on average -- the recorder's own time, predicted
as the guest's.

So `gpuvm calibrate --emulator` (and a paper run that keeps traces) times the
recorder's hot path the way cProfile's `Profile.calibrate` times its own: the exit
loop's shape -- an ioctl standing in for KVM_RUN, then a BAR write handled -- run
`EVENTS` times through a recorder installed as a run installs it, against the same loop
without one; the difference per event is kept (CostProfile.record_event_ns) and a
replay takes it off each run's exit-loop time.  Rounds alternate the two loops and the
fastest of each is kept.  It is a lower bound: a loop this small runs with warm caches,
where a guest's exit does not.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

from gpuvm.vmm.event_trace import EventRecorder

EVENTS = 20_000  # events a round (0.04-0.06 s a recorded round on the 2-core host)
ROUNDS = 5
ABOUT_KEY = "record_event_ns"  # in a bundle's "about" and a paper run's traces/about.json


class _NullDevice:
    """A device whose accesses do nothing: what is timed is the path around them."""

    def read(self, region: int, offset: int, size: int) -> int:
        return 0

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        return None


class _NullSession:
    """What EventRecorder.install wraps: a device, the port handler, the counters."""

    def __init__(self) -> None:
        self.device = _NullDevice()
        self.port_out = lambda port, value: False

    def snapshot(self) -> dict[str, int]:
        return {}


def _null_ioctl(fd: int, request: int) -> int:
    return 0


def _exit_loop(ioctl: Callable[[int, int], int], write: Callable[[int, int, int, int], None],
               events: int, clock: Callable[[], int]) -> int:
    """`events` exits of the vCPU loop's shape (gpuvm.vmm.kvm.vcpu): enter the guest,
    handle a BAR write; the time they took (ns)."""
    t0 = clock()
    for i in range(events):
        ioctl(0, 0)
        write(0, i & 0xFFC, 4, i)
    return clock() - t0


def measure(events: int = EVENTS, rounds: int = ROUNDS,
            clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """The recorder's own time per event (ns): the fastest of `rounds` recorded exit
    loops less the fastest plain one, over `events` -- the fastest, as `timeit` keeps
    it: what other work on the host adds to a round is no part of the cost.  `clock` is
    the recorder's clock (a slower one costs more: the tests use that); the loops are
    timed with time.perf_counter_ns."""
    if events < 1 or rounds < 1:
        raise ValueError(f"events and rounds must be >= 1, got {events} and {rounds}")
    plain_ns: list[int] = []
    recorded_ns: list[int] = []
    for _ in range(rounds):
        plain = _NullSession()
        plain_ns.append(_exit_loop(_null_ioctl, plain.device.write, events,
                                   time.perf_counter_ns))
        recorded = _NullSession()
        recorder = EventRecorder(recorded.snapshot, clock=clock)
        recorder.install(recorded)
        recorder.begin()
        # as the vCPU loop wraps KVM_RUN when its session records (gpuvm.vmm.kvm.vcpu)
        ioctl = functools.partial(recorder.timed_run, _null_ioctl)
        recorded_ns.append(_exit_loop(ioctl, recorded.device.write, events,
                                      time.perf_counter_ns))
    return max(0.0, (min(recorded_ns) - min(plain_ns)) / events)


def from_about(about: dict) -> float:
    """The cost a bundle (or a run's traces) kept; 0 where it kept none (measured before
    it was: its traces are replayed as recorded)."""
    value = about.get(ABOUT_KEY, 0.0)
    if not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{ABOUT_KEY} must be a non-negative number, got {value!r}")
    return float(value)
