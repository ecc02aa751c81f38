"""The model against this emulator, measured so that host load cannot fake the result.

On a shared host the wall time of one VM moves by 2-3x within minutes (other processes'
load), so a profile calibrated at one moment and runs measured at another disagree for
reasons no model of the emulator can know.  Here every repetition records one VM's
per-event trace and then, at once, runs 2, 4 and 8 VMs of the same kind; each N-VM run
is predicted from the trace recorded just before it, by replaying N copies of it under
the contention the profile describes (the interpreter lock, the host cores, the
mediator lock, the engine).  The host cores the VMs effectively get are fitted on the
2-VM runs only (1 .. the machine's cores); the 4- and 8-VM runs are predictions.  Of
each (mode, VMs) the repetition with the fastest measured makespan is kept (host load
only ever adds time), with its own trace's prediction.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from gpuvm.calibrate.emulator import ValidationPoint, predicted_from_traces
from gpuvm.experiment.costs import CostProfile

FIT_VMS = 2  # the VM count the host cores are fitted on


@dataclass(frozen=True)
class Measured:
    mode: str
    vms: int
    rep: int
    makespan_ns: int
    trace: Mapping  # the 1-VM trace recorded just before (for 1 VM: this run's own)


def measure(benchmark: str, params: tuple[int, ...], modes: Sequence[str],
            counts: Sequence[int], reps: int, backend: str = "auto",
            progress: Callable[[str], None] = lambda line: None) -> list[Measured]:
    """Per repetition and mode: record one VM's trace, then run each VM count at once."""
    from gpuvm.experiment.config import Scenario, VmConfig
    from gpuvm.experiment.execute import specs_for
    from gpuvm.run import run_vms
    from gpuvm.run.spec import RunOptions
    from gpuvm.sim.traces import TraceKey, record_fastest

    out: list[Measured] = []
    for rep in range(reps):
        for mode in modes:
            key = TraceKey(benchmark, params, mode)
            trace = record_fastest(key, 1, backend)
            alone = sum(trace["wall_ns"].values())
            out.append(Measured(mode, 1, rep, alone, trace))
            for n in counts:
                if n == 1:
                    continue
                scenario = Scenario(f"{n}vm", tuple(VmConfig(f"vm{i}", benchmark, params)
                                                    for i in range(n)))
                t0 = time.monotonic()
                results = run_vms(specs_for(scenario), RunOptions(mode=mode, backend=backend))
                failed = [r.error() for r in results if not r.passed]
                if failed:
                    raise RuntimeError(f"{mode} x{n}: {failed[0]}")
                span = max(sum(p.wall_ns for p in r.session.phases) for r in results)
                out.append(Measured(mode, n, rep, span, trace))
                progress(f"rep {rep} {mode} x{n}: {span / 1e6:,.1f} ms "
                         f"({time.monotonic() - t0:.1f} s)")
    return out


def fastest(measured: Sequence[Measured]) -> list[Measured]:
    best: dict[tuple[str, int], Measured] = {}
    for m in measured:
        k = (m.mode, m.vms)
        if k not in best or m.makespan_ns < best[k].makespan_ns:
            best[k] = m
    return sorted(best.values(), key=lambda m: (m.mode, m.vms))


def predict(points: Sequence[Measured], profile: CostProfile) -> list[ValidationPoint]:
    return [ValidationPoint(m.mode, m.vms, m.makespan_ns / 1e6,
                            predicted_from_traces(m.mode, m.vms, m.trace, profile) / 1e6)
            for m in points]


TIE = 0.005  # predictions this close count as equal: the most cores among them is kept


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
        p = replace(profile, host_cores=float(cores))
        errors[cores] = sum(abs(predicted_from_traces(m.mode, m.vms, m.trace, p)
                                / m.makespan_ns - 1) for m in fit) / len(fit)
    least = min(errors.values())
    cores = max(c for c, e in errors.items() if e <= least + TIE)
    return replace(profile, host_cores=float(cores))
