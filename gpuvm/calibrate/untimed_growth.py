"""How much more CPU each threaded VM takes with more VMs beside it, in runs that time
nothing: what the model prices the work under the lock and the guests' stretches
with, where a sitting measured it (gpuvm.calibrate.validation.priced_growth).

Why untimed: the lock's timed rounds (gpuvm.calibrate.lock_use) read two clocks and
getrusage twice around every KVM_RUN, holding the interpreter lock -- ~5 us an exit on
the 2-core development host -- and that is enough to tip its VMs into queueing for the
lock: timed, 4 fv VMs of `idle` slept at 0.69-0.80 of their exits and their CPU per
exit grew 1.25-1.31x over one VM's; untimed, the same VMs slept at 0.27-0.35 and grew
1.15x, as the validated runs (untimed too) did, 1.10-1.13x (docs/model-validation.md,
"The lock rounds time themselves into their growth").  Priced with the timed growth
the model came out 10-17% long at fv's 4-VM point in four of five sittings there.
What an untimed run still gives without a clock around each exit: its vCPU threads'
CPU time and context switches, summed at the end (ThreadUsage).  The exits are the
benchmark's own, the same at every count, so CPU per VM over one VM's is the growth
per exit.  The timed rounds still say how the threads' time splits at KVM_RUN and how
often the host took their cores (lock_use.preempt_rates).

The runs are a scaling run's own benchmark where its VMs all run one (mmul in
`experiments/scaling.toml`: a growth measured on other VMs did not carry to them,
run_traces.runs_benchmark), else the timed rounds' own VMs -- fv and fv-opt VMs of
`idle`, pv VMs of `vecadd` -- at the same counts, UNTIMED_RUNS of each count a round
by mode, and the counts between one VM and the most MIDDLE_TRIES times at least: a
run can land in a lock convoy, 2-VM fv runs most of all (here 1.9-2.0 s, or 3.2-4.9 s
in a convoy: both of one sitting's two were, and fv came out 34% long at 2 VMs,
20261129-125115), so each count's fastest run is kept, as the validation keeps its
points' (validation.fastest)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from gpuvm.calibrate.lock_use import (ALONE_VMS, BESIDE_MODES, GROWTH_BENCHMARK,
                                      GROWTH_MODE, PV_GROWTH_BENCHMARK, PV_GROWTH_MODE,
                                      PV_GROWTH_PARAMS, fastest_of_each)

ABOUT_KEY = "untimed_use"  # where a bundle's "about" keeps the runs
# runs of each count a round, by mode: fv's take 2-11 s at 2-8 VMs on the 2-core host,
# fv-opt's and pv's a tenth of that, so theirs are tried more often
UNTIMED_RUNS = {GROWTH_MODE: 1, **{mode: 2 for mode in BESIDE_MODES}, PV_GROWTH_MODE: 3}
MIDDLE_TRIES = 3  # runs a round at least of each count between one VM and the most


@dataclass(frozen=True)
class UntimedRun:
    """One run of `vms` VMs of one mode, nothing timed around its exits: its vCPU
    threads' times summed."""

    mode: str
    vms: int
    rep: int
    benchmark: str
    makespan_ns: int
    cpu_ns: int  # the vCPU threads' CPU time
    sleeps: int  # their voluntary context switches
    preemptions: int  # their involuntary ones

    @property
    def cpu_per_vm_ns(self) -> float:
        return self.cpu_ns / max(1, self.vms)


def benchmark_of(mode: str) -> tuple[str, tuple[int, ...]]:
    """The benchmark and parameters `mode`'s runs take: the timed rounds' own."""
    return (PV_GROWTH_BENCHMARK, PV_GROWTH_PARAMS) if mode == PV_GROWTH_MODE \
        else (GROWTH_BENCHMARK, ())


def round_counts(counts: Sequence[int], runs: int) -> list[int]:
    """The VM counts one round runs a mode at, in order: `runs` passes over the distinct
    `counts`, then the counts between the first and the last again until each has run
    MIDDLE_TRIES times."""
    distinct = sorted(set(counts))
    middle = distinct[1:-1]
    return distinct * runs + [n for n in middle for _ in range(MIDDLE_TRIES - runs)]


Benchmark = tuple[str, tuple[int, ...]]  # a benchmark's name and parameters


def measure(mode: str, counts: Sequence[int], rep: int,
            progress: Callable[[str], None] = lambda line: None,
            benchmark: Benchmark | None = None) -> list[UntimedRun]:
    """A run of each of `counts` VMs of `mode` on KVM, in order, nothing timed, each VM
    running `benchmark` (default: the timed rounds' own, benchmark_of); RuntimeError
    where a VM fails."""
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions

    benchmark, params = benchmark or benchmark_of(mode)
    out = []
    for n in counts:
        results = run_alike(benchmark, params, n, RunOptions(mode=mode, backend="kvm"),
                            f"{mode} x{n} untimed")
        vcpus = [r.outcome.vcpu for r in results]
        if None in vcpus:
            raise RuntimeError(f"{mode} x{n}: no vCPU thread's times")
        run = UntimedRun(mode, n, rep, benchmark, max(r.wall_ns for r in results),
                         sum(u.cpu_ns for u in vcpus),
                         sum(u.voluntary_switches for u in vcpus),
                         sum(u.involuntary_switches for u in vcpus))
        out.append(run)
        progress(f"rep {rep} {mode} x{n} untimed: {run.makespan_ns / 1e6:,.1f} ms")
    return out


def untimed_round(modes: Sequence[str], counts: Sequence[int], rep: int,
                  progress: Callable[[str], None] = lambda line: None,
                  benchmark: Benchmark | None = None) -> list[UntimedRun]:
    """One round of untimed runs for a sitting of `modes` beside the lock's timed round:
    each mode the timed rounds time that `modes` has (fv always), at each distinct
    count of `counts` (`round_counts`), labelled repetition `rep` -- VMs of `benchmark`
    where given (a scaling run's own: see `measure`), else the timed rounds' own."""
    timed = [GROWTH_MODE, *(m for m in (*BESIDE_MODES, PV_GROWTH_MODE) if m in modes)]
    progress(f"running " + (f"VMs of {benchmark[0]} {list(benchmark[1])}" if benchmark
                            else "the same VMs") + " untimed, for their CPU's growth ("
             + "; ".join(f"{m}: {', '.join(map(str, round_counts(counts, UNTIMED_RUNS[m])))}"
                         for m in timed) + ")")
    return [run for mode in timed
            for run in measure(mode, round_counts(counts, UNTIMED_RUNS[mode]), rep, progress,
                               benchmark)]


def growths(runs: Sequence[UntimedRun]
            ) -> dict[str, tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per mode run alone (ALONE_VMS) too, the VM counts from one up and each count's
    CPU per VM over one VM's, each count's fastest run (lock_use.fastest_of_each)."""
    best = fastest_of_each(runs)
    out = {}
    for mode in sorted({m for m, n in best if n == ALONE_VMS}):
        base = best[(mode, ALONE_VMS)].cpu_per_vm_ns
        if not base:
            continue
        counts = sorted(n for m, n in best if m == mode and n >= ALONE_VMS)
        out[mode] = (tuple(float(n) for n in counts),
                     tuple(best[(mode, n)].cpu_per_vm_ns / base for n in counts))
    return out


def to_about(runs: Sequence[UntimedRun]) -> list[dict[str, Any]]:
    """As kept in a validation bundle's "about" (ABOUT_KEY)."""
    return [asdict(run) for run in runs]


def from_about(about: Mapping[str, Any]) -> list[UntimedRun]:
    """The runs a bundle kept under ABOUT_KEY (none in bundles from before)."""
    return [UntimedRun(**row) for row in about.get(ABOUT_KEY, ())]
