"""The per-event traces a scaling run keeps beside its rows, for the model's validation.

A scaling experiment runs 1, 2, 4 and 8 VMs of one benchmark per mode; the model of the
whole system predicts those makespans by replaying one VM's per-event trace
(gpuvm.sim.replay).  The shared trace cache (gpuvm.sim.traces.CACHE) holds whichever
recording was made first -- hours or sessions before, under another load -- and on this
host a cached fv-opt trace ran 40% slower than the runs it was to predict (make paper,
2026-11-27).  So one VM of each (benchmark, mode) is recorded beside the scaling run's
1-VM runs (BesideRuns) and kept in the run directory (`traces/`), with the host's
core count, what recording cost per event there (gpuvm.calibrate.record_cost) and what
a wake-up cost the thread that woke another (gpuvm.calibrate.wake_cost: the replay's
lock prices each drop that wakes a sleeper by it) and, for VMs as threads, how late a
thread woken for the interpreter lock runs again (gpuvm.calibrate.lock_turns: the
replay's hand-off, which the validation would otherwise fit on the 2-VM runs -- and on
this host fitted it at its most, 200 us, leaving pv at 4 VMs 50% short) and, where the
experiment asks (`lock_rounds`), the lock's timed rounds (gpuvm.calibrate.lock_use: how
the guests' and the lock's work grow with the VMs, without which the model's 8-VM
points came out 28-48% short on this host, 2026-11-29), made among the runs' rounds
(`rounds_beside_runs`); the report's
validation replays those (`gpuvm.experiment.paper`), and a report rebuilt later replays
the same ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from gpuvm.calibrate import lock_turns, lock_use, record_cost, untimed_growth, wake, wake_cost
from gpuvm.calibrate.lock_rounds import LockRounds
from gpuvm.calibrate.lock_use import LockUse
from gpuvm.calibrate.untimed_growth import UntimedRun
from gpuvm.calibrate.wake import WakeCurve
from gpuvm.calibrate.wake_cost import WakeCost
from gpuvm.experiment.config import Experiment
from gpuvm.experiment.rundir import RunKey
from gpuvm.sim.traces import Fastest, TraceKey, read_trace, record_fastest, record_run

TRACES = "traces"  # in the run directory
ABOUT = "about.json"  # the host they were recorded on: {"cpus": N, "record_event_ns": ns,
#                       "wake_cost": {...}, "wake": {...} (VMs as threads),
#                       "lock_use": [...], "untimed_use": [...] (where the
#                       experiment asks: lock_rounds)}
COUNTS = "recordings.json"  # {trace file: of how many recordings it is the fastest}
AMONG_RUNS = "lock_rounds_among_runs"  # in ABOUT: of the lock's rounds, how many were
#                                         made before a round of runs (the rest after)
FIT = "fit"  # under TRACES: the single VMs the per-event prices are fitted on (fit_traces)


@dataclass(frozen=True)
class KeptTraces:
    """What a run kept for its validation."""

    trace_of: Callable[[str, str], Mapping]  # (mode, scenario) -> one VM's trace
    cpus: int  # the host's cores
    record_event_ns: float  # the recorder's own time per event there (0: not measured)
    woken: WakeCost | None = None  # what waking a thread cost the waker (None: not measured)
    wake_curve: WakeCurve | None = None  # how late a woken thread ran again (None: not measured)
    lock_rounds: tuple[LockUse, ...] = ()  # the lock's timed runs (none: not timed)
    untimed: tuple[UntimedRun, ...] = ()  # the same VMs untimed (none: not run)
    rounds_among_runs: int = 0  # of the lock's rounds, how many before a round of runs
    # per trace file, of how many recordings it is the fastest (empty: runs from before)
    recordings: Mapping[str, int] = field(default_factory=dict)
    # (mode, trace) of the single VMs the prices are fitted on besides the 1-VM traces
    # (none: the run recorded none -- fit_traces unset, or runs from before)
    fit: tuple[tuple[str, Mapping], ...] = ()


def keys(exp: Experiment) -> dict[tuple[str, str], TraceKey]:
    """Per (mode, scenario) the TraceKey of one VM of the scenario's benchmark (a
    scaling scenario's VMs all run one benchmark), in its own VMM process where the
    experiment's VMs are (`isolated`)."""
    return {(mode, s.name): TraceKey(s.vms[0].benchmark, s.vms[0].params, mode, exp.isolated)
            for mode in exp.modes for s in exp.scenarios if s.vms}


def one_vm_scenario(exp: Experiment) -> str:
    """The scenario whose point a mode's trace is the one VM of: the fewest VMs'."""
    return min((s for s in exp.scenarios if s.vms), key=lambda s: len(s.vms)).name


def record_trace(exp: Experiment, run_path: Path, key: TraceKey, count: int, backend: str,
                 progress: Callable[[str], None] = lambda line: None,
                 so_far: Fastest | None = None) -> bool:
    """Record `key`'s trace into the run's traces/, the fastest of `count` recordings
    (with those `so_far` made), unless it is there already; whether it was recorded."""
    directory = run_path / TRACES
    directory.mkdir(exist_ok=True)
    if (directory / key.file_name).is_file():
        return False
    fastest = so_far if so_far is not None else Fastest()
    if fastest.made < count:
        progress(f"recording one VM's trace for the validation: {key.file_name}"
                 + (f" (the fastest of {count})" if count > 1 else ""))
    # as many recordings as the point's runs, the fastest kept: the validation keeps
    # each point's fastest run, and a single recording of one fv-opt VM came out 14%
    # slower than the fastest of its three runs
    record_fastest(key, count, backend, cache=directory, so_far=fastest)
    made = _counts(directory)
    made[key.file_name] = fastest.made
    (directory / COUNTS).write_text(json.dumps(made))
    return True


@dataclass
class BesideRuns:
    """Records each mode's trace beside the runs of the point it is the one VM of: one
    recording right after each of that point's runs (gpuvm.experiment.execute calls
    `after_run` after every run), the fastest kept once the point has all its runs
    (`after_point`) -- as many recordings as the point had runs, `repetitions` or more
    where it ran again (rundir.wants_another), and made when they were.  Why: the
    validation prices that point from the trace, so the trace should meet the host's
    cores as those runs did.  Recorded after all the runs instead, a pv trace (the
    fastest of 12) priced one pv VM at 1.20x the fastest of its 12 runs, made minutes
    before (make paper, 2026-11-29); and the runs of a point are spread over the
    experiment's rounds (rundir.plan), so recordings made back to back once the point was
    done would land in one stretch of the host where its runs did not.  A resumed run
    that lost the recordings made so far makes the rest when the point is done."""

    exp: Experiment
    run_path: Path
    backend: str
    progress: Callable[[str], None] = lambda line: None
    _so_far: dict[TraceKey, Fastest] = field(default_factory=dict)

    def _key(self, point: RunKey) -> TraceKey | None:
        """The trace `point` is the one VM of (None: not a 1-VM point)."""
        if point.scenario != one_vm_scenario(self.exp):
            return None
        return keys(self.exp)[(point.mode, point.scenario)]

    def after_run(self, run: RunKey) -> None:
        key = self._key(run)
        if key is None or (self.run_path / TRACES / key.file_name).is_file():
            return  # (kept already: a run resumed after its point was done)
        fastest = self._so_far.setdefault(key, Fastest())
        self.progress(f"recording one VM's trace for the validation: {key.file_name} "
                      f"(beside {run.scenario} {run.mode} rep {run.rep}; "
                      f"{fastest.made + 1} so far)")
        fastest.add(record_run(key, self.backend))

    def after_point(self, point: RunKey, runs: int) -> None:
        key = self._key(point)
        if key is not None:
            record_trace(self.exp, self.run_path, key, max(runs, self.exp.repetitions),
                         self.backend, self.progress, self._so_far.pop(key, None))


def record(exp: Experiment, run_path: Path, backend: str,
           progress: Callable[[str], None] = lambda line: None,
           rounds: LockRounds | None = None) -> None:
    """Record each trace `exp`'s scenarios need that `run_path` has not got yet (those
    BesideRuns recorded are there; any other, the fastest of `repetitions`) and the
    single VMs of its fit_traces file (record_fits); then, where any was recorded or it
    was not yet, what the host's lock and wake-ups cost (about.json), with the lock's
    `rounds` made among the runs and those they left (all of them where none were
    made: a resumed run's)."""
    directory = run_path / TRACES
    directory.mkdir(exist_ok=True)
    recorded = False
    for key in dict.fromkeys(keys(exp).values()):
        recorded |= record_trace(exp, run_path, key, exp.repetitions, backend, progress)
    recorded |= record_fits(exp, run_path, backend, progress)
    if recorded or not (directory / ABOUT).is_file():  # the host as it was recording
        about = {"cpus": os.cpu_count(),
                 record_cost.ABOUT_KEY: round(record_cost.measure(), 1),
                 wake_cost.ABOUT_KEY: wake_cost.measure().to_about()}
        if not exp.isolated:  # VMs in processes of their own pass no interpreter lock
            progress("measuring how late a thread woken for the interpreter lock runs again")
            about["wake"] = lock_turns.through_lock(wake.measure(),
                                                    lock_turns.measure()).to_about()
            rounds = rounds or rounds_beside_runs(exp, backend, progress)
            if rounds is not None and rounds.times_the_lock:
                rounds.after()
                about["lock_use"] = lock_use.to_about(rounds.uses)
                about[untimed_growth.ABOUT_KEY] = untimed_growth.to_about(rounds.untimed)
                about[AMONG_RUNS] = rounds.among
        (directory / ABOUT).write_text(json.dumps(about))


def fit_keys(exp: Experiment) -> list[TraceKey]:
    """The single VMs of `exp`'s fit_traces file under each of its modes (none where
    the experiment names no such file): what `gpuvm calibrate --emulator` records
    first and fits its per-event prices on."""
    if not exp.fit_traces:
        return []
    from gpuvm.experiment.config import load as load_experiment
    fit = load_experiment(exp.fit_traces)
    return list(dict.fromkeys(
        TraceKey(s.vms[0].benchmark, s.vms[0].params, mode, exp.isolated)
        for s in fit.scenarios if len(s.vms) == 1 for mode in fit.modes))


def record_fits(exp: Experiment, run_path: Path, backend: str,
                progress: Callable[[str], None] = lambda line: None) -> bool:
    """Record each of `fit_keys` not yet in the run's traces/fit/, once (as
    `gpuvm calibrate --emulator --trace-reps 1`); whether any was recorded.  Why: the
    validation's per-event prices decide how much of a handler's recorded time is work
    holding the interpreter lock and how much is blocked, which the 1-VM traces of
    three modes of one benchmark pin down poorly: fitted on these eighteen VMs as well
    (calibrate's own fit traces, read into three of this 2-core host's runs of
    2026-11-29, a what-if), pv's 2- to 8-VM points moved up by 4-18 points, out of a
    7-26% shortfall, and the 1-VM points not at all (docs/model-validation.md)."""
    missing = [key for key in fit_keys(exp)
               if not (run_path / TRACES / FIT / key.file_name).is_file()]
    if missing:
        progress(f"recording {len(missing)} single VMs of {Path(exp.fit_traces).name} to "
                 f"fit the per-event prices on, as `gpuvm calibrate --emulator` does")
    for key in missing:
        record_fastest(key, 1, backend, cache=run_path / TRACES / FIT)
    return bool(missing)


def _fits(directory: Path) -> tuple[tuple[str, Mapping], ...]:
    """(mode, trace) of each readable trace in `directory` (none: no such directory)."""
    found = []
    for path in sorted(directory.glob("*.npz")) if directory.is_dir() else ():
        trace = read_trace(path)
        if trace is not None:
            found.append((str(trace["key"]["mode"]), trace))
    return tuple(found)


def _counts(directory: Path) -> dict[str, int]:
    """Per trace file in `directory`, of how many recordings it is the fastest ({}:
    none noted -- runs from before)."""
    try:
        made = json.loads((directory / COUNTS).read_text())
        return {str(k): int(v) for k, v in made.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def rounds_beside_runs(exp: Experiment, backend: str, progress: Callable[[str], None]
                       ) -> LockRounds | None:
    """The lock's rounds for `exp`'s modes at its VM counts, to be made before its first
    GROWTH_REPS rounds of runs (execute's `before_round`: LockRounds.before_rep) and
    the rest in `record`; None where it asks for none (`lock_rounds` unset, VMs in
    processes of their own, or not on KVM).  Why among the runs: made after them they
    can meet another host than the runs did -- a run of `make paper` slow throughout
    came out 23% short at fv's 8 VMs, and on the lent machines the growth they measure
    was most of what the model missed by (2026-11-29, docs/model-validation.md)."""
    if not exp.lock_rounds or exp.isolated or backend == "inproc":
        return None
    counts = sorted({len(s.vms) for s in exp.scenarios})
    return LockRounds(exp.isolated, exp.modes, counts, progress,
                      untimed_benchmark=runs_benchmark(exp))


def runs_benchmark(exp: Experiment) -> untimed_growth.Benchmark | None:
    """The one benchmark (name, parameters) every VM of `exp` runs, which its untimed
    runs then run too; None where its VMs run more than one.  Why the runs' own: the
    growth measured on the timed rounds' VMs (fv's of idle, pv's of vecadd) did not
    carry to the validated VMs of mmul by as much as the model missed -- on a lent
    machine idle fv VMs grew 1.41x in CPU to two VMs where mmul's grew 1.13x, and over
    four lent bundles fv at 2 VMs came out long as far as idle's growth went (+1% at
    1.08x, +24% at 1.31x); here pv at 2 VMs came out -15 to -8% where vecadd's growth
    was 1.02-1.06x (docs/model-validation.md, 2026-11-29)."""
    kinds = {(vm.benchmark, tuple(vm.params)) for s in exp.scenarios for vm in s.vms}
    return kinds.pop() if len(kinds) == 1 else None


def load(exp: Experiment, run_path: Path) -> KeptTraces | None:
    """The traces `run_path` kept, with the host they were recorded on; None where the
    run kept none (runs from before, or an incomplete set).  Runs from before the
    recorder's cost was measured replay their traces as recorded; runs from before the
    wake cost or the wake-up curve was, have it None."""
    directory = run_path / TRACES
    try:
        about = json.loads((directory / ABOUT).read_text())
        cpus = int(about["cpus"])
        recorder = record_cost.from_about(about)
        woken = WakeCost.from_about(about)
        curve = WakeCurve.from_about(about)
        uses = tuple(lock_use.from_about(about))
        untimed = tuple(untimed_growth.from_about(about))
        among = int(about.get(AMONG_RUNS, 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    by_point = keys(exp)
    traces = {key: read_trace(directory / key.file_name) for key in set(by_point.values())}
    if any(trace is None for trace in traces.values()):
        return None
    return KeptTraces(lambda mode, scenario: traces[by_point[(mode, scenario)]], cpus,
                      recorder, woken, curve, uses, untimed, among, _counts(directory),
                      _fits(directory / FIT))
