"""The model against this emulator, measured so that host load cannot fake the result.

On a shared host the wall time of one VM moves by 2-3x within minutes (other processes'
load), so a profile calibrated at one moment and runs measured at another disagree for
reasons no model of the emulator can know.  Here every repetition records one VM's
per-event trace and then, at once, runs 2, 4 and 8 VMs of the same kind; each N-VM run
(1 VM too, run again without recording: what recording costs shows as error) is
predicted from the trace recorded just before it, by replaying N copies of it under
the contention the profile describes (the interpreter lock, the host cores, the
mediator lock, the engine).  The host cores the VMs effectively get are fitted on the
2-VM runs only (1 .. the machine's cores); the 4- and 8-VM runs are predictions.  The
interpreter lock is not fitted but priced as measured with the runs (`price_lock`): how
late a woken thread lands, by how long it slept (gpuvm.calibrate.lock_turns and
lock_use), what waking it costs the waker (gpuvm.calibrate.wake_cost), and how the work
under the lock and the guests grow with the VMs (lock_use), all kept in the bundle's
"about" -- only a bundle from before one was measured has it fitted on 2 VMs.  Of
each (mode, VMs) the repetition with the fastest measured makespan is kept (host load
only ever adds time), predicted from the fastest of the mode's traces; where one VM's
run is short, a repetition's trace and 1-VM run are each the fastest of a few (`measure`).

With `isolated` every VM runs in its own VMM process over vfio-user: nothing shares an
interpreter lock there (no lock is priced), and the model serialises the server's
share of each trace instead (gpuvm.sim.replay).  The server's time on each run's VMs is
kept too (`Measured.served_ns`): per VM against the trace's, it says whether the one
thread they all wait for took longer per VM than one VM alone had it take.  VMs as
threads keep how often their vCPU threads slept and the CPU time they used
(`Measured.vcpu_sleeps`, `vcpu_cpu_ns`): beside the exits the model has wait for the
interpreter lock, and its VMs' time on host cores, they say whether the model charges
the lock as often as the VMs wait for it, and whether a VM's own work grows beside
others as the model's does.

Repetitions of one point minutes apart differ by 30-50% on the lent machines, so each
point is also shown against that noise (`spreads`): every repetition's run predicted
from its own trace, their median, and how far apart the runs were; and the even
repetitions against the odd ones (gpuvm.calibrate.halves): how close the emulator comes
to itself at each point, beside how close the model comes to it.

What was measured is kept as a bundle (`save` / `load`: the makespans, and every trace
as the .npz the model reads), so the analysis -- the fit, the cores, the predictions --
can be redone from it on any machine, without rerunning a guest: `gpuvm calibrate
--emulator --from DIR`.  tests/test_validation_bundle.py does that with a bundle
measured on the 16-core machine and holds the model's error on it to a bound.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from gpuvm.calibrate import halves
from gpuvm.calibrate.core_speed import PROBE_PERIOD_S, SLOW_FACTOR, CoreSamples, CoreSpeed
from gpuvm.calibrate.emulator import GOAL_ERROR_PCT, ValidationPoint, predicted_from_traces
from gpuvm.calibrate.halves import HalfPoint
from gpuvm.calibrate.lock_use import (BESIDE_MODES, GROWTH_MODE, PV_GROWTH_MODE, LockUse,
                                      growth, growths_beside_one, guest_growths_beside_one)
from gpuvm.calibrate.stats import (FIT_SAMPLES_FACTOR, MAX_REPS_FACTOR, RUN_SAMPLES_S,
                                  SHORT_MODE_S, run_samples, repeats)
from gpuvm.calibrate.untimed_growth import UntimedRun
from gpuvm.calibrate.wake import WakeCurve
from gpuvm.calibrate.wake_cost import WakeCost
from gpuvm.experiment.costs import (GUEST_PREEMPTS_OF, GUEST_WORK_SCALE_OF, HELD_PREEMPTS_OF,
                                   LOCK_WORK_SCALE_OF, CostProfile)

FIT_VMS = 2  # the VM count the host cores are fitted on


@dataclass(frozen=True)
class Measured:
    mode: str
    vms: int
    rep: int
    makespan_ns: int
    trace: Mapping  # the 1-VM trace recorded just before
    # VMs in processes of their own: the server thread's time on the run's VMs, summed
    # (gpuvm.run.spec.ServedTime) -- how busy the one thread they all wait for was
    served_ns: int = 0
    # VMs as threads: the times the run's vCPU threads slept, summed (voluntary context
    # switches, gpuvm.vmm.guest_session.ThreadUsage), and the CPU time they used; 0: not
    # measured
    vcpu_sleeps: int = 0
    vcpu_cpu_ns: int = 0
    # of how many runs of the repetition this is the fastest (stats.run_samples)
    samples: int = 1
    # when its runs started (time.time()) and how long they took together, s: where the
    # host's cores were sampled meanwhile (gpuvm.calibrate.core_speed), how fast they ran
    # then (0: not kept)
    at_s: float = 0.0
    took_s: float = 0.0
    # every run's makespan of the repetition, in the order run (ns; () where one ran, and
    # in bundles from before): `makespan_ns` is their fastest.  Kept to say how far one
    # point's runs differ inside a sitting (on one lent machine, 2026-11-28: two 3 s runs
    # of 8 fv-opt VMs by 1-3%, six 24-50 ms runs of 1 and 2 pv VMs by 19-83%) and to
    # compare points at equal run counts (which there added noise and removed no bias)
    runs_ns: tuple[int, ...] = ()


def measure(benchmark: str, params: tuple[int, ...], modes: Sequence[str],
            counts: Sequence[int], reps: int, backend: str = "auto",
            progress: Callable[[str], None] = lambda line: None,
            isolated: bool = False, short_mode_s: float = SHORT_MODE_S,
            run_samples_s: float = RUN_SAMPLES_S,
            trace_cache: Path | None = None,
            before_rep: Callable[[int], None] = lambda rep: None,
            first_rep: int = 0) -> list[Measured]:
    """Per repetition and mode: record one VM's trace, then run each VM count at once
    (`isolated`: every VM in its own VMM process, the trace too).

    A mode gets `reps` repetitions, and more while they took under `short_mode_s`
    together (at most MAX_REPS_FACTOR x `reps`): the fastest of a few is what is kept
    (`fastest`), and a short run is noisier than a long one -- one pv VM ran in 22-24 ms
    or 29-34 ms by turns on the lent machine (ten runs, 2026-11-26), so with two
    repetitions the fastest trace came from the slow kind and the fastest run from the
    fast one at 1.57x (run 20261126-113502).  A repetition of pv is a few seconds, of
    fv half a minute: the short modes get the samples at little cost.

    Within a repetition, where one VM's run is short (its unmeasured run took under
    half of `run_samples_s`), the trace is the fastest of a few recordings and the
    1-VM run the fastest of as many plain runs (stats.run_samples; 0: one each).
    Why: the lent machine's own cores run at one of two speeds, by turns, each for a
    second or so -- one fixed loop in ~9 ms or 15-22 ms, pinned to any of its 16 cores
    (`gpuvm bench host`, 2026-11-26) -- and one pv VM's vCPU thread used CPU time to
    match for the same work.  A run of 25 ms lands on one speed whole, so six plain runs
    can all come out slow while the traces beside them were fast (run 20261126-122547:
    -24%); a run of seconds averages the two.  So does a run of more VMs that is as
    short (pv at 4 and 8 VMs: 0.1-0.3 s): it is the fastest of as many runs as fit the
    budget by its first run's time -- with one run each, pv's 4- and 8-VM errors
    scattered by 9-12 points (standard deviation) over ten runs, its 1- and 2-VM ones by
    2-3 (`gpuvm calibrate --emulator --from` ten bundles of 2026-11-26;
    docs/model-validation.md).

    The traces are cached in `trace_cache` (default: gpuvm.sim.traces.CACHE);
    `before_rep(rep)` runs before each repetition (what else the model needs measured
    beside these runs: gpuvm.calibrate.command runs the lock's timed rounds there).
    Repetitions are numbered from `first_rep`: more of a bundle measured before
    (`gpuvm calibrate --emulator --more-of DIR`) go on from its last."""
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions
    from gpuvm.sim.traces import CACHE, TraceKey, record_fastest

    def makespan(mode: str, n: int) -> tuple[int, int, int, int]:
        """The run's makespan, the server's time on its VMs (isolated; else 0), and the
        times its vCPU threads slept and the CPU time they used (threads; else 0)."""
        results = run_alike(benchmark, params, n, RunOptions(
            mode=mode, backend=backend, isolated=isolated), f"{mode} x{n}")
        vcpus = [r.outcome.vcpu for r in results
                 if r.outcome.vcpu is not None and not isolated]
        return (max(r.wall_ns for r in results),
                sum(r.served.total_ns for r in results if r.served is not None),
                sum(u.voluntary_switches for u in vcpus), sum(u.cpu_ns for u in vcpus))

    out: list[Measured] = []
    spent = dict.fromkeys(modes, 0.0)
    for turn in range(reps * MAX_REPS_FACTOR):
        if not any(repeats(turn, reps, spent[m], short_mode_s) for m in modes):
            break
        rep = first_rep + turn
        before_rep(rep)
        for mode in modes:
            if not repeats(turn, reps, spent[mode], short_mode_s):
                continue
            started = time.monotonic()
            # a first run of a mode after another is slower (measured: a pv trace
            # recorded right after eight fv VMs took 1.8x the pv run after it), so one
            # VM runs once, unmeasured, before the trace
            makespan(mode, 1)
            samples = run_samples(time.monotonic() - started, run_samples_s)
            trace = record_fastest(TraceKey(benchmark, params, mode, isolated), samples,
                                   backend, trace_cache or CACHE)
            for n in counts:  # 1 VM too: a run that records nothing, like the others
                t0, at = time.monotonic(), time.time()
                runs = [makespan(mode, n)]
                # as many as the trace, where one run is that short; more VMs: as many
                # as fit the budget by the first's time
                taken = samples if n == 1 else runs_taken(n, time.monotonic() - t0,
                                                          run_samples_s)
                runs += [makespan(mode, n) for _ in range(taken - 1)]
                span, served, sleeps, cpu = min(runs)
                took = time.monotonic() - t0
                out.append(Measured(mode, n, rep, span, trace, served, sleeps, cpu, taken,
                                    at, took, tuple(r[0] for r in runs) if taken > 1 else ()))
                progress(f"rep {rep} {mode} x{n}: {span / 1e6:,.1f} ms "
                         + (f"(fastest of {taken}, " if taken > 1 else "(")
                         + f"{took:.1f} s)")
            spent[mode] += time.monotonic() - started
    return out


def runs_taken(vms: int, one_run_s: float, budget_s: float) -> int:
    """How many runs of `vms` VMs a repetition takes when the first took `one_run_s`:
    as many as fit `budget_s` (stats.run_samples), and FIT_SAMPLES_FACTOR times the
    budget from the VM count the cores and the hand-off are fitted on up -- a slow patch
    over all of its runs moves every 4- and 8-VM prediction, and those points, predicted
    from its fastest, are then the fastest of about as many runs (1 VM: as many as its
    trace, which records one VM, `measure`)."""
    factor = FIT_SAMPLES_FACTOR if vms >= FIT_VMS else 1
    return run_samples(one_run_s, budget_s * factor)


def measured_from_rows(rows: Sequence, trace_of: Callable[[str, str], Mapping]
                       ) -> list[Measured]:
    """An experiment's runs of one benchmark at several VM counts as measurements to
    validate on: each (scenario, mode, repetition) its makespan, with the trace
    `trace_of(mode, scenario)` of one VM of it -- the paper report's scaling runs and
    the traces recorded right after them (gpuvm.experiment.run_traces)."""
    from gpuvm.calibrate.emulator import measured_makespan_ns, runs_of
    return [Measured(mode, len(run), rep, measured_makespan_ns(run), trace_of(mode, scenario))
            for (scenario, mode, rep), run in runs_of(rows).items()]


def trace_ns(trace: Mapping) -> int:
    """A recorded trace's own time: its runs' handler and between-event time."""
    events = trace["events"]
    return int(events.handler_ns.sum() + events.gap_ns.sum())


def fastest(measured: Sequence[Measured]) -> list[Measured]:
    """Per (mode, VMs) the fastest measurement, with the fastest trace of its mode:
    host load only ever adds time, to a run as to a recording, and on the lent
    machines one repetition of a run can take 1.5-2x another a minute later."""
    best: dict[tuple[str, int], Measured] = {}
    best_trace: dict[str, Mapping] = {}
    for m in measured:
        k = (m.mode, m.vms)
        if k not in best or m.makespan_ns < best[k].makespan_ns:
            best[k] = m
        if m.mode not in best_trace or trace_ns(m.trace) < trace_ns(best_trace[m.mode]):
            best_trace[m.mode] = m.trace
    return sorted((replace(m, trace=best_trace[m.mode]) for m in best.values()),
                  key=lambda m: (m.mode, m.vms))


def predict(points: Sequence[Measured], profile: CostProfile) -> list[ValidationPoint]:
    return [ValidationPoint(m.mode, m.vms, m.makespan_ns / 1e6,
                            predicted_from_traces(m.mode, m.vms, m.trace, profile) / 1e6)
            for m in points]


TIE = 0.005  # predictions this close count as equal: the most cores among them is kept
HANDOFF_MAX_NS = 200_000  # a wake-up slower than this is not a hand-off but a stall
HANDOFF_RESOLUTION_NS = 500  # how close to its crossing a fitted or needed hand-off is


def price_lock(points: Sequence[Measured], profile: CostProfile,
               cores: int | None = None, signal_ns: float | None = None) -> CostProfile:
    """`profile` with the host cores set to `cores` (default: the machine's) and the
    interpreter lock priced as measured beside the runs: the hand-off is the wake-up
    curve's latency at its shortest sleep (wake_latency_ns[0]: the lock's own timed
    rounds, else the threads apart), the signal `signal_ns` (what a wake-up cost the
    waker, gpuvm.calibrate.wake_cost).  Nothing about the lock is fitted where both
    were measured.

    A bundle from before either was measured gets the one it lacks fitted on the
    FIT_VMS-VM points (their mean relative error 0; it grows with either cost): the
    signal where only the curve was measured, else the hand-off with no signal.
    VMs in processes of their own share no interpreter lock: only the cores then."""
    fit = [m for m in points if m.vms == FIT_VMS]
    profile = replace(profile, host_cores=float(cores or os.cpu_count() or 1))
    from gpuvm.sim.replay import served
    if not fit or any(served(m.trace["events"]) for m in fit):
        # each VM waits for the server's one thread, and the server's time is in the trace
        return profile

    def mean_error(p: CostProfile) -> float:
        return sum(relative_error(m, p) for m in fit) / len(fit)
    if profile.wake_latency_ns:
        profile = replace(profile, lock_handoff_ns=float(profile.wake_latency_ns[0]))
        if signal_ns is not None:
            return replace(profile, lock_signal_ns=float(signal_ns))
        return replace(profile, lock_signal_ns=_cost_where_zero(
            lambda ns: mean_error(replace(profile, lock_signal_ns=ns)),
            most=SIGNAL_MAX_NS))
    profile = replace(profile, lock_signal_ns=float(signal_ns or 0.0))
    return replace(profile, lock_handoff_ns=_cost_where_zero(
        lambda ns: mean_error(replace(profile, lock_handoff_ns=ns))))


SIGNAL_MAX_NS = 50_000  # a wake-up's cost to the waker beyond this is not a signal


def _cost_where_zero(error: Callable[[float], float], most: float = HANDOFF_MAX_NS
                     ) -> float:
    """The cost (ns) at which `error` (the predictions' relative error; it grows with
    the cost) crosses 0, to HANDOFF_RESOLUTION_NS: 0 where even none is too much,
    `most` where even that is too little.

    Each call of `error` is a replay (seconds for eight fv VMs), so the crossing is
    looked for where the line through the bracket's ends crosses 0 -- the error is
    nearly linear in the cost -- and the bracket closed one resolution beyond it; a
    step that did not halve the bracket is followed by a bisection, so a far from
    linear error costs at most what bisection would, three times over.  About six
    replays instead of bisection's twenty."""
    # 1 ns, not 0: a cost of 0 replays in coarse steps, where the lock is taken less
    low, high = 1.0, float(most)
    step = float(HANDOFF_RESOLUTION_NS)
    e_low = error(low)
    if e_low >= 0:
        return 0.0
    e_high = error(high)
    if e_high <= 0:
        return high

    def at(x: float) -> bool:
        """Evaluate at x, narrow the bracket; whether x was too cheap."""
        nonlocal low, high, e_low, e_high
        e = error(x)
        if e < 0:
            low, e_low = x, e
        else:
            high, e_high = x, e
        return e < 0

    while high - low > step:
        width = high - low
        guess = low + width * -e_low / (e_high - e_low)
        guess = min(max(guess, low + step / 2), high - step / 2)
        if at(guess):  # too cheap: close the bracket a resolution above it
            if high - low > step:
                at(min(guess + step, high - 1.0))
        elif high - low > step:  # too dear: a resolution below it
            at(max(guess - step, low + 1.0))
        if high - low > max(step, width / 2):
            at((low + high) / 2)
    return round((low + high) / 2)


PARALLEL_MIN_CORES = 4  # a host with fewer replays the report's points in this process


def in_parallel(fn: Callable[[Any], Any], items: Sequence[Any],
                min_cores: int = PARALLEL_MIN_CORES) -> list[Any]:
    """[fn(x) for x in items], in worker processes where the host has `min_cores` or
    more: the replays behind the report (every repetition's, and each point's needed
    hand-off) are independent and deterministic, so the results are the same either
    way -- on the lent 16-core machine they took 200 of `calibrate --emulator`'s 500-560
    s one after another, against its 600 s per-call limit.  Workers are forked (a
    spawned one would import the caller's __main__, which a script read from stdin
    has not got), and only while this process runs no other thread: one that held a
    lock at the fork would leave it held in the worker -- the VMs' threads have all
    ended by the time their runs are analysed.  `fn` must pickle (a top-level
    function, or a functools.partial of one)."""
    import threading
    cores = os.cpu_count() or 1
    workers = min(len(items), cores)
    if workers < 2 or cores < min_cores or threading.active_count() > 1:
        return [fn(x) for x in items]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(fn, items))


def _replayed(m: Measured, profile: CostProfile):
    from gpuvm.calibrate.emulator import replayed_from_traces
    return replayed_from_traces(m.mode, m.vms, m.trace, profile)


def relative_error(m: Measured, profile: CostProfile) -> float:
    """The model's makespan for point `m` under `profile` over the measured one, less 1
    (what every fit here drives to 0 or least)."""
    return predicted_from_traces(m.mode, m.vms, m.trace, profile) / m.makespan_ns - 1


def _needed_handoff(m: Measured, profile: CostProfile) -> float:
    return _cost_where_zero(
        lambda handoff: relative_error(m, replace(profile, lock_handoff_ns=handoff)))


def needed_handoffs(points: Sequence[Measured], profile: CostProfile,
                    min_cores: int = PARALLEL_MIN_CORES) -> dict[tuple[str, int], float]:
    """Per kept point of VMs as threads with more than one VM, the hand-off for which
    that point alone would come out right, beside the one measured (`price_lock`):
    where these differ -- by mode, or growing with the VM count -- the lock's turns
    depend on more than the rules the replay gives them (docs/model-validation.md).
    Replays each point about six times (`_cost_where_zero`): half a minute for fv's
    eight VMs, so the points go to worker processes where the host has the cores
    (`in_parallel`)."""
    from gpuvm.sim.replay import served
    threaded = [m for m in points if m.vms >= 2 and not served(m.trace["events"])]
    needed = in_parallel(partial(_needed_handoff, profile=profile), threaded, min_cores)
    return {(m.mode, m.vms): ns for m, ns in zip(threaded, needed)}


def fit_cores(points: Sequence[Measured], profile: CostProfile, most: int | None = None
              ) -> CostProfile:
    """The host cores (1 .. `most`, default the machine's) for which the FIT_VMS-VM
    points come closest: the least mean relative error, so a long mode (fv, seconds)
    does not outweigh a short one (pv, milliseconds).  Two VMs cannot tell 2 cores from
    16 (each VM uses at most one), so of counts that predict alike the largest is kept:
    fewer cores than the machine has are chosen only where the 2-VM runs show it."""
    fit = [m for m in points if m.vms == FIT_VMS]
    if not fit:
        return profile
    errors = {}
    for cores in range(1, (most or os.cpu_count() or 1) + 1):
        if cores > FIT_VMS:
            # a VM's steps run one after another, each on at most one core: FIT_VMS
            # VMs never keep more busy, so more cores replay exactly alike
            errors[cores] = errors[FIT_VMS]
            continue
        p = replace(profile, host_cores=float(cores))
        errors[cores] = sum(abs(relative_error(m, p)) for m in fit) / len(fit)
    least = min(errors.values())
    cores = max(c for c, e in errors.items() if e <= least + TIE)
    return replace(profile, host_cores=float(cores))


@dataclass(frozen=True)
class Spread:
    """How one (mode, VMs) point moved over the repetitions -- the noise its error is to
    be read against.  `rep_errors_pct`: each repetition's run predicted from the trace
    recorded just before it (a slow minute slows both, so the pair sees less of it);
    `measured_spread_pct`: the slowest repetition's makespan over the fastest's."""
    mode: str
    vms: int
    rep_errors_pct: tuple[float, ...]
    measured_spread_pct: float
    # VMs in processes of their own, the median over the repetitions of the server's
    # time per VM in the run over its time in the trace: above 1, the one thread every
    # VM waits for took longer per VM than one VM alone had it take (None: not measured)
    server_per_vm: float | None = None
    # VMs as threads, the median over the repetitions of the times each VM's vCPU thread
    # slept in the run, and of the exits per VM that slept for the interpreter lock in
    # the model (each pays the hand-off) -- beside the 1-VM point's, what the VMs beside
    # one add: the run's sleeps against the hand-offs the model charged (None: not
    # measured)
    sleeps_per_vm: float | None = None
    model_sleeps_per_vm: float | None = None
    # VMs as threads, the median over the repetitions of each VM's vCPU thread's CPU
    # time in the run, and of each model VM's time on host cores (ns) -- against the
    # 1-VM point's, how much a VM's own work grew beside others: in the model only by
    # the hand-offs it paid (None: not measured)
    cpu_per_vm_ns: float | None = None
    model_cpu_per_vm_ns: float | None = None
    # inside one repetition, the point's slowest run over its fastest, back to back
    # (Measured.runs_ns; median over the repetitions that ran more than one; None: each
    # ran one) -- the noise no model fitted apart can follow: on two lent machines
    # (2026-11-28, 44 and 53 blocks of runs over eight minutes each, scratch
    # .scratch/pair_state.py) single runs of 2 fv-opt VMs varied by 5.8 and 9.4% (CV)
    # with no correlation from one run to the next, and 8 VMs' over 2 VMs' makespan by
    # 6.1 and 9.2%
    runs_spread_pct: float | None = None

    @property
    def median_error_pct(self) -> float:
        """The typical error of one run predicted from its own trace: the table's other
        estimate, beside the fastest run against the fastest trace (`fastest`)."""
        return statistics.median(self.rep_errors_pct)


def replay_each(measured: Sequence[Measured], profile: CostProfile,
                min_cores: int = PARALLEL_MIN_CORES) -> dict[int, Any]:
    """Each repetition's run replayed from its own trace, by id(m): the model's side
    of `spreads` and of the halves (gpuvm.calibrate.halves)."""
    ordered = sorted(measured, key=lambda m: (m.mode, m.vms, m.rep))
    return dict(zip(map(id, ordered),
                    in_parallel(partial(_replayed, profile=profile), ordered, min_cores)))


def spreads(measured: Sequence[Measured], profile: CostProfile,
            min_cores: int = PARALLEL_MIN_CORES,
            replays: Mapping[int, Any] | None = None) -> list[Spread]:
    """Per point, its repetitions' spread (`replays`: replay_each's, where the caller
    has them already)."""
    from gpuvm.sim.replay import server_ns
    runs: dict[tuple[str, int], list[Measured]] = {}
    for m in measured:
        runs.setdefault((m.mode, m.vms), []).append(m)
    for reps in runs.values():
        reps.sort(key=lambda m: m.rep)
    if replays is None:
        replays = replay_each(measured, profile, min_cores)
    out = []
    for (mode, vms), reps in sorted(runs.items()):
        spans = [m.makespan_ns for m in reps]
        models = [replays[id(m)] for m in reps]
        traced = [(m.served_ns, server_ns(m.trace["events"])) for m in reps]
        ratios = [served / vms / alone for served, alone in traced if served and alone]
        sleeps = [m.vcpu_sleeps / vms for m in reps if m.vcpu_sleeps]
        cpu = [m.vcpu_cpu_ns / vms for m in reps if m.vcpu_cpu_ns]
        run_spreads = [_slowest_over_fastest_pct(m.runs_ns) for m in reps
                       if len(m.runs_ns) > 1]
        out.append(Spread(mode, vms,
                          tuple(ValidationPoint(mode, vms, m.makespan_ns / 1e6,
                                                r.makespan_ns / 1e6).error_pct
                                for m, r in zip(reps, models)),
                          _slowest_over_fastest_pct(spans),
                          statistics.median(ratios) if ratios else None,
                          statistics.median(sleeps) if sleeps else None,
                          statistics.median(r.lock_sleeps / vms for r in models)
                          if sleeps else None,
                          statistics.median(cpu) if cpu else None,
                          statistics.median(r.core_ns / vms for r in models)
                          if cpu else None,
                          statistics.median(run_spreads) if run_spreads else None))
    return out


def _slowest_over_fastest_pct(spans: Sequence[int]) -> float:
    """How much slower the slowest of these makespans was than the fastest, %."""
    return 100 * (max(spans) / min(spans) - 1)


def spread_summary(spread: Sequence[Spread]) -> str:
    """One line: how far apart repetitions of one point were, and runs inside one
    repetition (the emulator's own noise)."""
    moved = sorted(s.measured_spread_pct for s in spread if len(s.rep_errors_pct) > 1)
    runs = sorted(s.runs_spread_pct for s in spread if s.runs_spread_pct is not None)
    within_rep = (f"runs of one point back to back: the slowest {statistics.median(runs):.0f}% "
                  f"over the fastest (median over {len(runs)} points), {runs[-1]:.0f}% at most"
                  if runs else "")
    if not moved:
        return within_rep or "one repetition per point: no spread to show"
    errors = [abs(s.median_error_pct) for s in spread]
    within = sum(e <= GOAL_ERROR_PCT for e in errors)
    return (f"repetitions of one point: the slowest {statistics.median(moved):.0f}% over "
            f"the fastest (median), {moved[-1]:.0f}% at most; each repetition predicted "
            f"from its own trace, the median error is {statistics.mean(errors):.1f}% "
            f"(mean |error| over the points), {within}/{len(errors)} points within "
            f"{GOAL_ERROR_PCT:g}%" + (f"; {within_rep}" if within_rep else ""))


# ------------------------------------------------------------------ the analysis
@dataclass(frozen=True)
class Analysis:
    profile: CostProfile  # fitted prices, host cores fitted on FIT_VMS
    kept: list[Measured]  # the fastest repetition of each (mode, VMs)
    points: list[ValidationPoint]
    spread: list[Spread]  # per point, over every repetition (empty: not asked for)
    # per point and half of its repetitions, the other half and the model against it
    # (gpuvm.calibrate.halves; empty: not asked for, or one repetition each)
    halves: list[HalfPoint] = field(default_factory=list)


@dataclass(frozen=True)
class AsideMeasures:
    """What a bundle keeps in its "about" beside its runs, measured apart from them, that
    `analyse` takes: the host's wake-up curve, the lock's timed rounds, what recording a
    trace cost per event (timed apart; per mode in place, where measured), and what a
    wake-up costs the waker (None: not measured in the bundle)."""
    wake: WakeCurve | None
    lock_use: list[LockUse]
    record_event_ns: float
    record_event_in_situ: dict[str, float]
    wake_cost: WakeCost | None = None
    # the same VMs run untimed beside the timed rounds (gpuvm.calibrate.untimed_growth;
    # none in bundles from before)
    untimed: list[UntimedRun] = field(default_factory=list)

    @classmethod
    def from_about(cls, about: Mapping[str, Any]) -> "AsideMeasures":
        """ValueError naming the key a bundle got wrong."""
        from gpuvm.calibrate import lock_use, record_cost, untimed_growth
        return cls(WakeCurve.from_about(about), lock_use.from_about(about),
                   record_cost.from_about(about), record_cost.in_situ_from_about(about),
                   WakeCost.from_about(about), untimed_growth.from_about(about))

    def analyse(self, measured: Sequence[Measured],
                fit_traces: Sequence[tuple[str, Mapping]], cores: int | None,
                in_place: bool = False, **options: bool) -> "Analysis":
        """`analyse` with these (`options`: with_spread, with_halves).  The recorder's
        cost measured in place per mode is taken off the traces only when `in_place`:
        timed on idle VMs it did not carry over to the validated benchmark (on the
        lent machines of 2026-11-27 it moved points away, never closer), so the
        timed-apart cost is the default and the in-place one a choice to compare."""
        return analyse(measured, fit_traces, cores, self.wake, self.lock_use,
                       record_event_ns=self.record_event_ns,
                       record_event_in_situ=self.record_event_in_situ if in_place else None,
                       signal_ns=self.wake_cost.signal_ns if self.wake_cost else None,
                       untimed=self.untimed, **options)


def priced_growth(profile: CostProfile, lock_use: Sequence[LockUse],
                  untimed: Sequence[UntimedRun] = ()) -> CostProfile:
    """`profile` with the work under the lock growing with the VMs as the lock's timed
    rounds (gpuvm.calibrate.lock_use) had it: each mode's own, beside ONE VM's work,
    where the rounds timed one VM alone -- the trace the model replays is one VM's, so
    the hand-off fitted on 2 VMs is then the lock's passing alone; in bundles from
    before, fv's (and pv's where timed) beside the 2 VMs' the hand-off was fitted on,
    the hand-off holding every mode's growth to 2 VMs as fv's.  The timed work holds
    the exits' slowing after longer waits, so that is not priced twice
    (wake_work_ns).  Where the rounds timed one VM alone, the guests' time inside
    KVM_RUN grows as it did there too, each mode's own at fv's counts
    (CostProfile.guest_work_scale).

    Where the same VMs also ran `untimed` at those counts (gpuvm.calibrate.
    untimed_growth), a mode's work under the lock and its guests' stretches both grow
    as its CPU per VM did there instead -- the timed runs' own growth is partly their
    timing's -- and its threads lose their cores as often as in the timed runs
    (lock_use.preempt_rates; CostProfile.guest_preempts_per_ms): the timed growth held
    the queueing for the lock that the untimed growth leaves to those.  Over the 2-core
    host's seven newest sittings, what-if (the validated runs' own growth for the
    untimed runs'), 84 of 84 points came within 10%, against 73 as priced before
    (docs/model-validation.md, "Cores taken at the measured rates")."""
    own = growths_beside_one(lock_use)
    vms, scale = own.get(GROWTH_MODE) or growth(lock_use, FIT_VMS)
    if not vms:
        return profile
    profile = replace(profile, lock_work_vms=vms, lock_work_scale=scale, wake_work_ns=())
    for mode in (PV_GROWTH_MODE, *BESIDE_MODES):
        mode_vms, mode_scale = own.get(mode, ((), ())) if own else \
            growth(lock_use, FIT_VMS, mode)
        if mode_vms == vms:  # timed at fv's counts (bundles from before: not at all)
            profile = replace(profile, **{LOCK_WORK_SCALE_OF[mode]: mode_scale})
    for mode, (mode_vms, mode_scale) in guest_growths_beside_one(lock_use).items():
        if mode_vms == vms and mode in (GROWTH_MODE, PV_GROWTH_MODE, *BESIDE_MODES):
            profile = replace(profile, **{GUEST_WORK_SCALE_OF.get(mode, "guest_work_scale"):
                                          mode_scale})
    return untimed_priced(profile, lock_use, untimed)


def untimed_priced(profile: CostProfile, lock_use: Sequence[LockUse],
                   untimed: Sequence[UntimedRun]) -> CostProfile:
    """`profile` (its growth priced at lock_work_vms) with each mode that ran untimed at
    exactly those counts, and whose timed runs split their switches at KVM_RUN at them,
    priced from the untimed runs and the timed runs' cores taken (`priced_growth`).  A
    mode left with its timed growth takes no cores then, rather than fv's: the timed
    growth holds the queueing the cores taken would add."""
    from gpuvm.calibrate.lock_use import preempt_rates
    from gpuvm.calibrate.untimed_growth import growths as untimed_growths
    vms = profile.lock_work_vms
    rates = preempt_rates(lock_use)
    priced = set()
    for mode, (mode_vms, scale) in untimed_growths(untimed).items():
        if not vms or mode_vms != vms or mode not in rates or rates[mode][0] != vms:
            continue
        _, guest_per_ms, held_per_ms = rates[mode]
        priced.add(GUEST_PREEMPTS_OF.get(mode, "guest_preempts_per_ms"))
        profile = replace(profile, **{
            LOCK_WORK_SCALE_OF.get(mode, "lock_work_scale"): scale,
            GUEST_WORK_SCALE_OF.get(mode, "guest_work_scale"): scale,
            GUEST_PREEMPTS_OF.get(mode, "guest_preempts_per_ms"): guest_per_ms,
            HELD_PREEMPTS_OF.get(mode, "held_preempts_per_ms"): held_per_ms})
    if "guest_preempts_per_ms" in priced:
        none = tuple(0.0 for _ in vms)
        for mode in (PV_GROWTH_MODE, *BESIDE_MODES):
            if GUEST_PREEMPTS_OF[mode] not in priced:
                profile = replace(profile, **{GUEST_PREEMPTS_OF[mode]: none,
                                              HELD_PREEMPTS_OF[mode]: none})
    return profile


def analyse(measured: Sequence[Measured],
            fit_traces: Sequence[tuple[str, Mapping]] = (),
            cores: int | None = None, wake: WakeCurve | None = None,
            lock_use: Sequence[LockUse] = (), with_spread: bool = True,
            with_halves: bool = True, record_event_ns: float = 0.0,
            record_event_in_situ: Mapping[str, float] | None = None,
            signal_ns: float | None = None,
            untimed: Sequence[UntimedRun] = ()) -> Analysis:
    """Prices from every 1-VM trace (and `fit_traces`); the lock priced as measured
    (`price_lock`: the hand-off from the wake-up curve, the signal `signal_ns`), then
    the host cores (1 .. `cores`, default the machine's) from the 2-VM runs; then each
    kept point predicted from its mode's fastest trace (`fastest`), and every
    repetition from its own (`spreads`).  With the host's `wake` curve (measured with
    the runs, gpuvm.calibrate.wake) a hand-off after a long wait costs what it says on
    top of the shortest one; with `lock_use` (runs timed apart, gpuvm.calibrate.lock_use)
    the work under the lock grows with the VM count as it did there (`priced_growth`:
    each timed mode's own, from one VM where the runs timed one alone), and
    the hand-off rises with the wait as it did there (lock_use.handoff_curve: in place of
    `wake`'s latency, whose exits' work the timed growth holds already); with
    `untimed` (the same VMs run untimed beside them) each mode so run grows as its CPU
    did there, its cores taken as in the timed runs (`untimed_priced`).
    `record_event_ns`: what recording the traces cost per event (timed apart,
    gpuvm.calibrate.record_cost), taken off their exit loops' time;
    `record_event_in_situ`: the same per mode, measured in place (record_cost.in_situ),
    which each mode's traces take instead where it has one.  Without
    `with_spread` the repetitions are not replayed one by one: a third to a half of the
    replays, for a caller that wants the kept points alone.  `with_halves`: each point
    measured again by half of its repetitions against the other half, and the model
    from that half's trace (gpuvm.calibrate.halves) -- replays the spread has made
    already, else two per point."""
    from gpuvm.calibrate import emulator
    from gpuvm.calibrate.lock_use import handoff_curve
    traces = list(fit_traces) + [(m.mode, m.trace) for m in measured if m.vms == 1]
    profile = replace(emulator.trace_profile(emulator.fit_trace_costs(traces)),
                      recorded_times=1.0, record_event_ns=record_event_ns
                      ).with_record_costs(record_event_in_situ or {})
    wake = handoff_curve(lock_use) or wake
    if wake is not None:
        profile = wake.priced_in(profile)
    profile = priced_growth(profile, lock_use, untimed)
    kept = fastest(measured)
    profile = fit_cores(kept, price_lock(kept, profile, cores, signal_ns), most=cores)
    chosen = halves.picks(measured, trace_ns) if with_halves else []
    replays = replay_each(measured if with_spread else [p.replay for p in chosen],
                          profile) if with_spread or chosen else {}
    return Analysis(profile, kept, predict(kept, profile),
                    spreads(measured, profile, replays=replays) if with_spread else [],
                    halves.points(chosen, lambda m: replays[id(m)].makespan_ns))


# ------------------------------------------------------------------ bundles
def this_host() -> dict[str, str]:
    """Which machine measures, and since when it runs (its boot): kept in a bundle's
    "about", so more repetitions are added only on the machine, and the boot, that
    measured the first -- a lent machine given back and started again is another one,
    with cores of another speed."""
    import socket
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return {"name": socket.gethostname(), "boot": boot}


BUNDLE_RUNS = "runs.json"
BUNDLE_CORES = "cores.npz"  # gpuvm.calibrate.core_speed.CoreSamples


def save(directory: Path, measured: Sequence[Measured],
         fit_traces: Sequence[tuple[str, Mapping]] = (),
         about: Mapping[str, Any] | None = None,
         cores: CoreSamples | None = None) -> Path:
    """Write what was measured to `directory` (a new one): runs.json, one .npz per
    distinct trace, and the host's cores sampled meanwhile (BUNDLE_CORES)."""
    from gpuvm.sim.traces import write_trace
    directory.mkdir(parents=True, exist_ok=False)
    names: dict[int, str] = {}

    def stored(trace: Mapping) -> str:
        if id(trace) not in names:
            names[id(trace)] = f"trace{len(names):03d}.npz"
            write_trace(directory / names[id(trace)], dict(trace))
        return names[id(trace)]
    runs = [{"mode": m.mode, "vms": m.vms, "rep": m.rep, "makespan_ns": m.makespan_ns,
             "trace": stored(m.trace)} | ({"served_ns": m.served_ns} if m.served_ns else {})
            | ({"vcpu_sleeps": m.vcpu_sleeps} if m.vcpu_sleeps else {})
            | ({"vcpu_cpu_ns": m.vcpu_cpu_ns} if m.vcpu_cpu_ns else {})
            | ({"samples": m.samples} if m.samples > 1 else {})
            | ({"at_s": m.at_s, "took_s": m.took_s} if m.at_s else {})
            | ({"runs_ns": list(m.runs_ns)} if m.runs_ns else {})
            for m in measured]
    fits = [{"mode": mode, "trace": stored(t)} for mode, t in fit_traces]
    (directory / BUNDLE_RUNS).write_text(json.dumps(
        {"about": dict(about or {}), "runs": runs, "fit_traces": fits}, indent=1) + "\n")
    if cores is not None:
        cores.save(directory / BUNDLE_CORES)
    return directory


def load_cores(directory: Path) -> CoreSamples | None:
    """The host's cores as sampled while a bundle was measured (None: not sampled)."""
    try:
        return CoreSamples.load(directory / BUNDLE_CORES)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{directory / BUNDLE_CORES}: unreadable ({exc})") from None


def core_speeds(kept: Sequence[Measured], cores: CoreSamples | None
                ) -> dict[tuple[str, int], CoreSpeed]:
    """Per kept point, how fast the host's cores ran during its runs (none where the
    cores were not sampled or the run's time was not kept)."""
    if cores is None:
        return {}
    out = {}
    for m in kept:
        speed = cores.during(m.at_s, m.at_s + m.took_s) if m.at_s else None
        if speed is not None:
            out[(m.mode, m.vms)] = speed
    return out


def core_summary(cores: CoreSamples, speeds: Mapping[tuple[str, int], CoreSpeed],
                 points: Sequence[ValidationPoint]) -> str:
    """One line: the host's cores over the whole measurement, during the runs the model
    was fitted on, and during the points it missed by more than the goal."""
    whole = cores.during(float(cores.at_s.min()), float(cores.at_s.max()))
    assert whole is not None

    def pct(keys) -> str:
        shares = [speeds[k].slow_share for k in keys if k in speeds]
        return f"{100 * statistics.mean(shares):.0f}%" if shares else "-"
    missed = [(p.mode, p.vms) for p in points if abs(p.error_pct) > GOAL_ERROR_PCT]
    return (f"the host's cores while measured ({len(np.unique(cores.cpu))} probes, every "
            f"{PROBE_PERIOD_S:g} s; gpuvm.calibrate.core_speed): {100 * whole.slow_share:.0f}% "
            f"of samples slow (over {SLOW_FACTOR}x their core's fastest), "
            f"{whole.slowdown:.2f}x on average; during the kept {FIT_VMS}-VM runs "
            f"the model was fitted on {pct(k for k in speeds if k[1] == FIT_VMS)}, "
            f"the points off by more than {GOAL_ERROR_PCT:g}% {pct(missed)}")


def load(directory: Path) -> tuple[list[Measured], list[tuple[str, Mapping]], dict]:
    """(measured, fit traces, about) of a bundle written by `save`; ValueError naming
    what is missing or unreadable."""
    from gpuvm.sim.traces import BUNDLE_FORMATS, read_trace
    path = directory / BUNDLE_RUNS
    try:
        data = json.loads(path.read_text())
        runs, fits = data["runs"], data.get("fit_traces", [])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a validation bundle ({exc})") from None
    cache: dict[str, Mapping] = {}

    def trace(name: str) -> Mapping:
        if name not in cache:
            t = read_trace(directory / name, BUNDLE_FORMATS)
            if t is None:
                raise ValueError(f"{directory / name}: missing, unreadable or of another "
                                 f"trace format")
            cache[name] = t
        return cache[name]
    try:
        measured = [Measured(str(r["mode"]), int(r["vms"]), int(r["rep"]),
                             int(r["makespan_ns"]), trace(str(r["trace"])),
                             int(r.get("served_ns", 0)), int(r.get("vcpu_sleeps", 0)),
                             int(r.get("vcpu_cpu_ns", 0)), int(r.get("samples", 1)),
                             float(r.get("at_s", 0.0)), float(r.get("took_s", 0.0)),
                             tuple(int(ns) for ns in r.get("runs_ns", ())))
                    for r in runs]
        fit = [(str(f["mode"]), trace(str(f["trace"]))) for f in fits]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: a run lacks {exc}") from None
    return measured, fit, dict(data.get("about", {}))
