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

And it is: on the lent machine of bundle 20261127-161919 it timed 0.68 us while that
bundle's fastest 1-VM traces were 2.1-2.4 us an event over its fastest plain runs, and
on this 2-core host 1.9 us against 3.8-7.2 (each exit enters the guest, which leaves the
interpreter's caches cold for the Python after it).  So `in_situ` also measures it in
place, per mode: VMs of IN_SITU_BENCHMARK run plainly and recorded by turns, the fastest
trace's own time over the fastest plain run, per event -- the quantity the model's
1-VM point leaned by, on a benchmark the validation does not run.  Where a bundle has
it and `--recorder-cost in-place` asks, the model takes each mode's own
(CostProfile.record_event_ns_of).  It is not the default: on five bundles of four lent
machines (docs/model-validation.md, 2026-11-27) it never brought the points closer than
the timed-apart cost and once moved them well away -- timed on idle VMs it scattered
(fv-opt 1.05-3.45 us, pv's 132 events 0-52 us) and did not follow what mmul's own runs
implied.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Sequence

from gpuvm.vmm.event_trace import EventRecorder

EVENTS = 20_000  # events a round (0.04-0.06 s a recorded round on the 2-core host)
ROUNDS = 5
ABOUT_KEY = "record_event_ns"  # in a bundle's "about" and a paper run's traces/about.json
IN_SITU_KEY = "record_event_in_situ_ns"  # {mode: ns} in a bundle's "about"
# What `in_situ` runs: a guest that initialises the GPU and closes it, launching nothing
# (experiments/calibrate-emulator.toml's idle-1vm) -- the driver's exits that make most
# of every benchmark's time under fv and fv-opt, and not the benchmark the model is
# validated on (experiments/scaling.toml's mmul).
IN_SITU_BENCHMARK = "idle"
# Plain and recorded runs of each mode, by turns, the fastest of each kept: as many pairs
# as fit IN_SITU_S by the mode's first (unmeasured) run, as validation.measure takes its
# 1-VM samples -- pv's 132 events in ~35 ms give a difference of a few ms, which one
# pair does not tell from the run's own noise (one pair here: 0 us; four: 23 us an event)
IN_SITU_S = 12.0


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


def in_situ(modes: Sequence[str], budget_s: float = IN_SITU_S, backend: str = "auto",
            isolated: bool = False, benchmark: str = IN_SITU_BENCHMARK,
            params: tuple[int, ...] = (),
            progress: Callable[[str], None] = lambda line: None) -> dict[str, float]:
    """Per mode, what recording a VM's trace costs per event where it runs: plain runs
    of one VM of `benchmark` and as many recorded, by turns (as many pairs as fit
    `budget_s`, at least one), the fastest recorded trace's own time (its handlers and
    between-event time, what a replay of one VM adds up) less the fastest plain run's,
    over the trace's events (ns; never below 0).  The fastest of each, as `measure`
    keeps them: load only ever adds time.  Each mode runs once first, unmeasured: a
    first run after another mode's is slower (validation.measure)."""
    from gpuvm.calibrate.stats import run_samples
    from gpuvm.calibrate.validation import trace_ns
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions
    from gpuvm.sim.traces import TraceKey, record_run

    out: dict[str, float] = {}
    for mode in modes:
        def plain_run() -> int:
            (result,) = run_alike(benchmark, params, 1, RunOptions(
                mode=mode, backend=backend, isolated=isolated),
                f"the recorder's cost in place ({mode}, {benchmark})")
            return result.wall_ns
        key = TraceKey(benchmark, params, mode, isolated)
        started = time.monotonic()
        plain_run()
        samples = run_samples(2 * (time.monotonic() - started), budget_s)
        plain_ns: list[int] = []
        traces = []
        for _ in range(samples):
            plain_ns.append(plain_run())
            traces.append(record_run(key, backend))
        fastest = min(traces, key=trace_ns)
        events = int(fastest["events"].events.sum())
        out[mode] = max(0.0, (trace_ns(fastest) - min(plain_ns)) / max(1, events))
        progress(f"recording {mode} in place: {out[mode] / 1e3:.2f} us an event "
                 f"({events:,} events, fastest of {samples})")
    return out


def in_situ_from_about(about: dict) -> dict[str, float]:
    """The per-mode cost a bundle kept (`in_situ`); empty where it kept none."""
    value = about.get(IN_SITU_KEY, {})
    if not isinstance(value, dict) or not all(
            isinstance(v, (int, float)) and v >= 0 for v in value.values()):
        raise ValueError(f"{IN_SITU_KEY} must map modes to non-negative numbers, "
                         f"got {value!r}")
    return {str(k): float(v) for k, v in value.items()}
