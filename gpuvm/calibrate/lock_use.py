"""Where N threaded VMs' time goes: each vCPU thread's work under the interpreter lock,
its time inside KVM_RUN, and how long the lock sat free -- per exit, at each VM count.

The model (gpuvm.sim.replay) prices an exit of VMs run as threads as the work its trace
recorded with one VM alone, held under the lock, plus a hand-off when the thread had to
wait for it.  Where its makespans fall short at 8 VMs, these are the numbers that say
which part grew: timed in the runs themselves, each vCPU thread's CPU time inside
KVM_RUN (guest, KVM, and taking the lock back) and outside it (its Python: the exit's
handler and the exit loop, all under the lock).  The lock's free time per exit is the
makespan less the vCPU threads' held time, over their exits -- a hand-off's cost where
nearly every exit waited (sleeps per exit near 1), and where the lock is the
bottleneck; it also holds the engine thread's time on the VMs' channels.

The timing (RunOptions.time_kvm_run: two thread-clock and two getrusage reads per
timed exit, made holding the lock) costs ~3 us an exit on a lent machine and ~5 us on
the 2-core host; timing every exit slowed 4 and 8 VMs by a quarter to a half, and the
growth those runs timed was partly the timing's own (docs/model-validation.md, "The
lock rounds time themselves into their growth").  Timing one exit in N and scaling
the sums (KvmRunTime.every, `measure(sample_every=)`) slows them less, but did not
bring the sittings closer (SAMPLE_EVERY); either way these are not validation runs.

`gpuvm calibrate --emulator` measures with it how much slower that work gets with the
VMs beside it (`growth`): on the lent machines fv's grew a fifth from 2 VMs to 8, which
a model pricing every exit at one VM's work leaves out (CostProfile.lock_work_scale).
It times fv VMs (one take of the lock per exit, and the most exits: their held time
per exit is the work per take) of the `idle` benchmark (the driver's init and close
alone: no kernel or copy among the exits; not the benchmark the validation runs).

And apart, pv VMs (`growth` of PV_GROWTH_MODE, CostProfile.pv_lock_work_scale): their
exits are a few hundred hypercalls, each a hundred microseconds of page-table work, and
between them the VMs' kernels and copies run on the engine thread beside the lock's
holder.  On two lent machines pv's work at 8 VMs grew 1.28-1.40x in VMs running kernels
(vecadd, madd, mmul) where fv's idle VMs grew 1.15-1.17x, and the model, pricing pv with
fv's growth, came out 12-16% short at 4 and 8 pv VMs (runs 20261127-021655 .. -023145),
where on the machines of the day before those points averaged -4% and -1% with fv's.
So it is timed on each machine, on pv VMs of `vecadd` -- running kernels like the
validated benchmark, but not it.  A pv VM takes 166 exits, and the held time per exit
of one run varies by 10-15%: each round times PV_GROWTH_ROUNDS runs of every count
against fv's one.

Each round also times one VM alone of each of those modes, and fv-opt VMs of `idle`
beside fv's (`growths_beside_one`): the model replays a trace of ONE VM, and where it
priced the growth beside two VMs' the hand-off fitted on two VMs held whatever the work
grew from one VM to two -- as much for fv-opt as for fv, where on one lent machine
(2026-11-27, scratch) fv's held time per exit grew 1.33x from one VM to two and
fv-opt's 1.17x (22.4 -> 29.9 us, 22.4 -> 26.1 us): about the 4 us more per exit that
the hand-off fitted on fv's 2-VM runs alone needs over fv-opt's, bundle after bundle.
So where a bundle has them, each of these modes is priced with its own growth beside
one VM (gpuvm.calibrate.validation.priced_growth; CostProfile.lock_work_scale,
pv_lock_work_scale, fv_opt_lock_work_scale), and the hand-off fitted on two VMs is the
lock's passing alone.

Since 2026-11-29 each round also runs the same VMs untimed
(gpuvm.calibrate.untimed_growth), and where a bundle has those runs a mode's growth is
their CPU per VM's instead, these runs giving how often the host took the threads'
cores (`preempt_rates`): the timing here is part of the growth it measures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from gpuvm.calibrate.lock_turns import MIN_SLEEPS_PER_TAKE
from gpuvm.calibrate.wake import WakeCurve

GROWTH_BENCHMARK = "idle"  # the VMs `growth` is measured on (see the module)
GROWTH_MODE = "fv"
PV_GROWTH_BENCHMARK = "vecadd"  # and pv's (see the module)
PV_GROWTH_PARAMS = (65536,)
PV_GROWTH_MODE = "pv"
# timed beside GROWTH_MODE's runs, on the same benchmark, for `growths_beside_one`
BESIDE_MODES = ("fv-opt",)
ALONE_VMS = 1  # the count `growths_beside_one` divides by: the traces' own
PV_GROWTH_ROUNDS = 5  # runs of each count a round, against fv's one (3 s a run here)
# The rounds time every KVM_RUN (KvmRunTime.every = 1).  Timing every exit holds the
# lock ~5 us longer an exit on the 2-core host and makes 4 fv-opt VMs' CPU per VM grow
# 1.20x where untimed runs' grow 1.10x; one exit in 8 gave 1.17x.  But four sittings
# here and three on lent machines with the idle VMs' rounds timed one exit in 8 came
# within 10% at 37 of 48 and 19 of 36 points, against 54 of 60 and 56 of 84 for the
# sittings before with every exit timed: no better within the sittings' noise, so the
# rounds stay as they were (docs/model-validation.md, "Sampled timing";
# `gpuvm calibrate --lock-use --sample-every N` times that way).
SAMPLE_EVERY = 1
GROWTH_REPS = 2  # rounds over the counts a sitting (command._LockRounds); each count's fastest run kept
# runs of the base count (2 VMs) a round: every other count's time per exit is divided by
# its, and it is the noisiest -- on one lent machine 2-VM fv runs of one lease took 34.5
# and 44.0 us per exit, and one round's growth at 8 VMs was 1.14x in one round and 1.39x
# in the next (2026-11-26)
BASE_RUNS = 2
# runs of each count a round for BESIDE_MODES (at least; the alone and base counts have
# BASE_RUNS already).  Their runs of 4 and 8 VMs land in the convoy (`fastest_runs`)
# about half the time: over 17 sittings on the 2-core host (2026-11-28/29) 18 of 34 runs
# of 4 fv-opt VMs held 1.14-1.24x one VM's time per exit, the rest 1.28-1.80x, and
# the six sittings whose two runs were both convoys priced fv-opt at 4 VMs 13-25% long
# -- every fv-opt 4-VM miss outside a slow-core stretch -- where the eleven with one
# run outside it came within 10% but for one on slow cores.  A run is 0.3-3 s there.
BESIDE_TRIES = 3


@dataclass(frozen=True)
class LockUse:
    """One run of `vms` VMs of one mode, its vCPU threads' times summed."""

    mode: str
    vms: int
    rep: int
    makespan_ns: int
    exits: int  # KVM_RUN calls of every vCPU thread
    cpu_ns: int  # the vCPU threads' CPU time
    in_run_cpu_ns: int  # of which inside KVM_RUN
    in_run_wall_ns: int  # their wall time inside KVM_RUN
    sleeps: int  # their voluntary context switches
    benchmark: str = GROWTH_BENCHMARK  # what the VMs ran (rows from before: idle)
    # their involuntary context switches: the scheduler took a runnable thread's core
    # (rows from before: not counted, 0)
    preemptions: int = 0
    # of the switches, those inside KVM_RUN, and the threads' wall and CPU time from
    # their first KVM_RUN to their last, summed (guest_session.KvmRunTime; rows from
    # before: not split, 0): what is outside KVM_RUN befell a thread holding the lock
    in_run_sleeps: int = 0
    in_run_preemptions: int = 0
    span_ns: int = 0
    span_cpu_ns: int = 0
    # one KVM_RUN in this many was timed, the sums scaled to all (KvmRunTime.every; rows
    # from before: every one)
    sample_every: int = 1

    @property
    def held_ns(self) -> int:
        """The vCPU threads' CPU time outside KVM_RUN: their work under the lock."""
        return self.cpu_ns - self.in_run_cpu_ns

    def per_exit_us(self, ns: float) -> float:
        return ns / max(1, self.exits) / 1e3

    @property
    def waited_us(self) -> float:
        """Mean wall time inside KVM_RUN that was not the thread's CPU, per sleep: the
        wait for the lock back where nearly every exit slept for it."""
        return (self.in_run_wall_ns - self.in_run_cpu_ns) / max(1, self.sleeps) / 1e3

    @property
    def lock_share(self) -> float:
        """The share of the makespan some vCPU thread held the lock."""
        return self.held_ns / max(1, self.makespan_ns)

    @property
    def split(self) -> bool:
        """Whether the run split its switches and time at KVM_RUN (rows from before not)."""
        return self.span_ns > 0

    @property
    def held_preemptions(self) -> int:
        """Cores lost outside KVM_RUN: by a thread holding the lock (or taking it back
        inside a handler), so every thread wanting it meanwhile waited."""
        return self.preemptions - self.in_run_preemptions

    @property
    def held_sleeps(self) -> int:
        """Sleeps outside KVM_RUN: for the lock back after a release inside a handler."""
        return self.sleeps - self.in_run_sleeps

    @property
    def held_off_core_ns(self) -> int:
        """Wall time outside KVM_RUN that was not the threads' CPU: holders off their
        cores (preempted, or asleep for the lock back inside a handler)."""
        outside_wall = self.span_ns - self.in_run_wall_ns
        outside_cpu = self.span_cpu_ns - self.in_run_cpu_ns
        return max(0, outside_wall - outside_cpu)

    @property
    def free_per_exit_us(self) -> float:
        """The makespan less the held time, per exit (see the module)."""
        return self.per_exit_us(max(0, self.makespan_ns - self.held_ns))


def measure(benchmark: str, params: tuple[int, ...], modes: Sequence[str],
            counts: Sequence[int], reps: int,
            progress: Callable[[str], None] = lambda line: None,
            sample_every: int = 1) -> list[LockUse]:
    """Per repetition, mode and VM count, one run of that many VMs as threads on KVM,
    each vCPU thread's KVM_RUN timed (one in `sample_every` of them, KvmRunTime).
    RuntimeError where a VM fails or the backend is not KVM (no KVM_RUN to time)."""
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions

    out: list[LockUse] = []
    for rep in range(reps):
        for mode in modes:
            for n in counts:
                results = run_alike(benchmark, params, n, RunOptions(
                    mode=mode, backend="kvm", time_kvm_run=True,
                    kvm_run_sample_every=sample_every), f"{mode} x{n}")
                timers = [r.session.kvm_run_time for r in results]
                vcpus = [r.outcome.vcpu for r in results]
                if any(t is None or not t.runs for t in timers) or None in vcpus:
                    raise RuntimeError(f"{mode} x{n}: no KVM_RUN was timed")
                use = LockUse(mode, n, rep,
                              max(r.wall_ns for r in results),
                              sum(t.runs for t in timers), sum(u.cpu_ns for u in vcpus),
                              sum(t.cpu_ns for t in timers), sum(t.wall_ns for t in timers),
                              sum(u.voluntary_switches for u in vcpus), benchmark,
                              sum(u.involuntary_switches for u in vcpus),
                              sum(t.sleeps for t in timers),
                              sum(t.preemptions for t in timers),
                              sum(t.span_ns for t in timers),
                              sum(t.span_cpu_ns for t in timers), sample_every)
                out.append(use)
                progress(f"rep {rep} {mode} x{n}: {use.makespan_ns / 1e6:,.1f} ms")
    return out


def round_counts(counts: Sequence[int], base_vms: int) -> list[int]:
    """The VM counts one round times, in order: one VM alone BASE_RUNS times (the runs
    `growths_beside_one` divides by), the base count BASE_RUNS times, then `counts`
    from the base up."""
    return [ALONE_VMS] * BASE_RUNS + [base_vms] * (BASE_RUNS - 1) + \
        [n for n in counts if n >= base_vms]


def more_tries(counts: Sequence[int], tries: int) -> list[int]:
    """The runs to add to a round of `counts` so that each count has `tries` at least:
    the counts timed fewer times, in order, each as often as it falls short."""
    return [n for n in dict.fromkeys(counts) for _ in range(tries - counts.count(n))]


def timed_round(modes: Sequence[str], counts: Sequence[int], rep: int,
                progress: Callable[[str], None] = lambda line: None) -> list[LockUse]:
    """One round of the lock's timed runs for a sitting of `modes` (GROWTH_MODE's VMs of
    GROWTH_BENCHMARK, and BESIDE_MODES' where `modes` has them; PV_GROWTH_MODE's of
    PV_GROWTH_BENCHMARK PV_GROWTH_ROUNDS times where it has pv) at `counts`
    (`round_counts`; BESIDE_MODES' each count BESIDE_TRIES times at least, `more_tries`),
    each run labelled repetition `rep`."""
    from dataclasses import replace
    beside = [m for m in BESIDE_MODES if m in modes]
    timed = [GROWTH_MODE, *beside]
    with_pv = PV_GROWTH_MODE in modes
    progress(f"timing how the work under the lock grows with the VMs "
             f"({'/'.join(timed)} VMs of {GROWTH_BENCHMARK}"
             + (f", {'/'.join(beside)} each count {BESIDE_TRIES} times" if beside else "")
             + (f", {PV_GROWTH_MODE} VMs of {PV_GROWTH_BENCHMARK} {PV_GROWTH_ROUNDS} times"
                if with_pv else "")
             + f": {', '.join(map(str, counts))})")
    uses = measure(GROWTH_BENCHMARK, (), timed, counts, 1, sample_every=SAMPLE_EVERY)
    if beside and (again := more_tries(counts, BESIDE_TRIES)):
        uses += measure(GROWTH_BENCHMARK, (), beside, again, 1, sample_every=SAMPLE_EVERY)
    if with_pv:
        uses += measure(PV_GROWTH_BENCHMARK, PV_GROWTH_PARAMS, [PV_GROWTH_MODE], counts,
                        PV_GROWTH_ROUNDS)
    return [replace(u, rep=rep) for u in uses]


def _pooled(uses: Sequence[LockUse], mode: str, *fields: Callable[[LockUse], int]
            ) -> dict[int, list[int]]:
    """Per VM count, the sums of `fields` over `mode`'s runs of that count: each figure
    here pools a count's runs before dividing, so a short run weighs as little as it
    counts."""
    pooled: dict[int, list[int]] = {}
    for u in uses:
        if u.mode == mode:
            sums = pooled.setdefault(u.vms, [0] * len(fields))
            for i, field in enumerate(fields):
                sums[i] += field(u)
    return pooled


def fastest_of_each(runs: Sequence[Any]) -> dict[tuple[str, int], Any]:
    """Per (mode, VM count) of `runs` (anything with mode, vms and makespan_ns: these
    timed runs, untimed_growth's), the run of the shortest makespan (the first of
    equals)."""
    best: dict[tuple[str, int], Any] = {}
    for run in runs:
        kept = best.get((run.mode, run.vms))
        if kept is None or run.makespan_ns < kept.makespan_ns:
            best[(run.mode, run.vms)] = run
    return best


def fastest_runs(uses: Sequence[LockUse]) -> list[LockUse]:
    """Of each mode's runs of one VM count, the one of the shortest makespan (the first
    of equals), in the order they came.

    Why: threads on a lock sit in one of two ways of taking turns -- nearly every exit
    finding the lock free, or a convoy where nearly every exit sleeps for it -- and a
    run can land in either.  Back to back on this 2-core host, two identical timed runs
    of 4 fv VMs slept at 0.38 and 0.89 of their exits (4.8 and 7.1 s), and one round's
    two runs of 2 fv-opt VMs both landed in the convoy (held 18.9 and 19.2 us an exit
    against 12.2 and 11.5 in the round before: 20261128-212734), which pooled made
    fv-opt's work 1.51x at 2 VMs, fitted the hand-off at 0 and left pv 25-32% short.
    The validation keeps each point's fastest run (validation.fastest), so the work's
    growth it is priced with comes from each count's fastest run alike."""
    best = fastest_of_each(uses)
    return [u for u in uses if best[(u.mode, u.vms)] is u]


def growth(uses: Sequence[LockUse], base_vms: int, mode: str = GROWTH_MODE,
           work: Callable[[LockUse], int] = lambda u: u.held_ns
           ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The VM counts from `base_vms` up and how much longer the work under the lock per
    exit took at each than at `base_vms`, in the runs of `mode` (each count's fastest
    run, `fastest_runs`: its held time over its exits; `work`: another of its times in
    place of the held one).  Empty where `base_vms` was not measured (or took none)."""
    pooled = _pooled(fastest_runs(uses), mode, work, lambda u: u.exits)
    if base_vms not in pooled or not pooled[base_vms][0]:
        return (), ()
    base = pooled[base_vms][0] / max(1, pooled[base_vms][1])
    counts = sorted(n for n in pooled if n >= base_vms)
    return (tuple(float(n) for n in counts),
            tuple(pooled[n][0] / max(1, pooled[n][1]) / base for n in counts))


def growths_beside_one(uses: Sequence[LockUse]
                       ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per mode timed alone (ALONE_VMS) too, `growth` beside one VM's work: the VM
    counts from one up and each one's held time per exit over one VM's (see the
    module)."""
    modes = sorted({u.mode for u in uses if u.vms == ALONE_VMS})
    return {mode: growth(uses, ALONE_VMS, mode) for mode in modes}


def guest_growths_beside_one(uses: Sequence[LockUse]
                             ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per mode timed alone (ALONE_VMS) too, the VM counts from one up and how much
    longer the guests' time on their cores inside KVM_RUN took per exit at each than
    with one VM (the vCPU threads' CPU there: in_run_cpu_ns), each count's fastest run
    -- what the guests' stretches between exits grow by (CostProfile.guest_work_scale)."""
    modes = sorted({u.mode for u in uses if u.vms == ALONE_VMS})
    return {mode: growth(uses, ALONE_VMS, mode, lambda u: u.in_run_cpu_ns)
            for mode in modes}


def preempt_rates(uses: Sequence[LockUse]
                  ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]]:
    """Per mode timed alone (ALONE_VMS) too, the VM counts from one up and how often its
    vCPU threads lost their core per ms of their CPU inside KVM_RUN and outside it
    (holding the lock), each count's fastest run (CostProfile.guest_preempts_per_ms,
    held_preempts_per_ms).  A mode with a run that did not split its switches at
    KVM_RUN (rows from before) has none."""
    out = {}
    for mode in sorted({u.mode for u in uses if u.vms == ALONE_VMS}):
        pooled = _pooled(fastest_runs(uses), mode,
                         lambda u: u.in_run_preemptions, lambda u: u.in_run_cpu_ns,
                         lambda u: u.held_preemptions, lambda u: u.held_ns,
                         lambda u: not u.split)
        if any(unsplit for *_, unsplit in pooled.values()):
            continue
        counts = sorted(n for n in pooled if n >= ALONE_VMS)
        out[mode] = (tuple(float(n) for n in counts),
                     tuple(pooled[n][0] / max(1, pooled[n][1]) * 1e6 for n in counts),
                     tuple(pooled[n][2] / max(1, pooled[n][3]) * 1e6 for n in counts))
    return out


def handoff_curve(uses: Sequence[LockUse]) -> WakeCurve | None:
    """The lock's free time per exit by the wait per sleep before it, one point per VM
    count (its runs pooled) whose exits nearly all slept (lock_turns.MIN_SLEEPS_PER_TAKE:
    the free time is then the hand-offs'), in ascending waits; None with fewer than two.

    This is the hand-off's rise with the wait as this emulator's own exits have it.  The
    curve from threads taking turns at the lock apart from any VM
    (gpuvm.calibrate.lock_turns) rose half as much on the lent machine: 12.0 -> 17.6 us
    from 58 to 341 us waits, where eight of these VMs' exits left the lock free 20.2 us
    after 370 us against 8.0 after 23 (two VMs) -- and fv at 8 VMs came out 17% short
    with it, 10% with this (run 20261126-115242).  The fv runs alone (GROWTH_MODE): a pv
    run's lock sits free mostly while its kernels run, not in hand-offs."""
    pooled = _pooled(uses, GROWTH_MODE,
                     lambda u: u.in_run_wall_ns - u.in_run_cpu_ns,  # waited
                     lambda u: u.sleeps,
                     lambda u: max(0, u.makespan_ns - u.held_ns),  # the lock free
                     lambda u: u.exits)
    points = sorted((waited / sleeps, free / exits)
                    for waited, sleeps, free, exits in pooled.values()
                    if sleeps and exits and sleeps / exits >= MIN_SLEEPS_PER_TAKE)
    if len(points) < 2:
        return None
    return WakeCurve(tuple(round(w) for w, _ in points), tuple(round(f) for _, f in points))


def switches_text(uses: Sequence[LockUse], mode: str = GROWTH_MODE) -> str:
    """`mode`'s runs per VM count (pooled): how often per exit its vCPU threads slept
    and how often the scheduler took their core -- '1 VM 0.00 / 0.00, 8 VMs 1.31 /
    0.48' -- and, where the runs split them at KVM_RUN, how much of that befell a
    thread holding the lock and how long holders sat off their cores per exit --
    '8 VMs 1.31 / 0.48 (holding 0.07 / 0.03, 12.0 us off core)'; empty where the
    runs did not count cores lost (bundles from before).

    Why: on a host with fewer cores than vCPU threads the threads sleep at more exits
    than the model's (on a 2-core host 1.2-1.3 per exit at 8 fv VMs, each 11-15 us of
    CPU, where the model slept at a few hundred exits a VM).  A thread that loses its
    core while it holds the lock makes every exit meanwhile sleep; one that loses it
    inside KVM_RUN delays only its guest.  The model's lock holder never loses its
    core; the split says whether the runs' did (docs/model-validation.md, "Where the
    2-core host's 4- and 8-VM time goes" and "Who loses a core")."""
    pooled = _pooled(uses, mode, lambda u: u.exits, lambda u: u.sleeps,
                     lambda u: u.preemptions, lambda u: u.held_sleeps,
                     lambda u: u.held_preemptions, lambda u: u.held_off_core_ns,
                     lambda u: not u.split)
    if not any(p[2] for p in pooled.values()):
        return ""
    parts = []
    for n, (exits, slept, lost, held_slept, held_lost, off_core, unsplit) \
            in sorted(pooled.items()):
        exits = max(1, exits)
        part = f"{n} VM{'s' if n > 1 else ''} {slept / exits:.2f} / {lost / exits:.2f}"
        if not unsplit:
            part += (f" (holding {held_slept / exits:.2f} / {held_lost / exits:.2f}, "
                     f"{off_core / exits / 1e3:.1f} us off core)")
        parts.append(part)
    return ", ".join(parts)


def to_about(uses: Sequence[LockUse]) -> list[dict[str, Any]]:
    """As kept in a validation bundle's "about"."""
    return [asdict(u) for u in uses]


def from_about(about: Mapping[str, Any]) -> list[LockUse]:
    """The runs a bundle kept under "lock_use" (none in bundles from before)."""
    return [LockUse(**row) for row in about.get("lock_use", ())]


def text(vms: Sequence[float], scale: Sequence[float]) -> str:
    """'4 VMs 1.04x, 8 VMs 1.22x' (the base count left out)."""
    return ", ".join(f"{n:.0f} VMs {x:.2f}x" for n, x in zip(vms[1:], scale[1:]))
