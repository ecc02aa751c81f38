"""Parameter sweeps of the model: scenario x mode x policy x VM count x cost profile,
run one after another or on a Dask cluster (a local one, or an existing scheduler).

Each point is a pure function of its parameters and the traces it replays (recorded
once, in the calling process, before anything is sent out), and the replay is integer
ns with no randomness, so the rows are identical whichever runs them and in whatever
order the workers finish: they are returned in the points' order.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from gpuvm.experiment.config import Experiment, Scenario
from gpuvm.experiment.costs import load_costs
from gpuvm.mediator.modes import MODES
from gpuvm.sim.replay import replay, trace_from_row
from gpuvm.sim.traces import TraceKey, load_trace


@dataclass(frozen=True)
class SweepPoint:
    scenario: str
    mode: str
    policy: str
    vms: int  # 0: the scenario's own VMs
    profile: str


def points_for(exp: Experiment, vm_counts: Sequence[int] = (0,),
               profiles: Sequence[str] = ()) -> list[SweepPoint]:
    return [SweepPoint(s.name, m, p, n, prof)
            for s in exp.scenarios for m in exp.modes
            for p in (exp.policies if MODES[m].mediated else exp.policies[:1])
            for n in vm_counts for prof in (profiles or (exp.cost_profile,))]


def _vms_of(scenario: Scenario, count: int) -> list:
    vms = list(scenario.vms)
    return vms if not count else [vms[i % len(vms)] for i in range(count)]


def distinct_points(exp: Experiment, points: Sequence[SweepPoint]
                    ) -> tuple[list[SweepPoint], dict[str, str]]:
    """The points that replay different VMs, and for each scenario dropped, the one it
    repeats.  Why: `--vms N` makes every scenario N VMs of its kind, so scenarios of one
    kind (scaling's 1, 2, 4 and 8 mmul VMs) become the same point -- replayed once, not
    once per scenario (at 1,024 VMs, minutes each) and printed as identical rows."""
    scenarios = {s.name: s for s in exp.scenarios}
    first: dict[tuple, SweepPoint] = {}
    kept, same_as = [], {}
    for p in points:
        vms = tuple((v.benchmark, v.params, v.start_s, v.share)
                    for v in _vms_of(scenarios[p.scenario], p.vms))
        key = (vms, p.mode, p.policy, p.vms, p.profile)
        if key in first:
            same_as[p.scenario] = first[key].scenario
            continue
        first[key] = p
        kept.append(p)
    return kept, same_as


def traces_for(exp: Experiment, point: SweepPoint) -> list[str]:
    """The trace files (by name) a point replays."""
    scenario = next(s for s in exp.scenarios if s.name == point.scenario)
    return [TraceKey(vm.benchmark, vm.params, point.mode).file_name for vm in scenario.vms]


def traces_needed(exp: Experiment, points: Sequence[SweepPoint], backend: str = "auto",
                  refresh: bool = False, progress: Callable[[str], None] = lambda key: None
                  ) -> dict[str, dict[str, Any]]:
    """Every trace the points replay, recorded here if not cached (by file name); each
    named to `progress` before it is loaded or recorded."""
    scenarios = {s.name: s for s in exp.scenarios}
    out: dict[str, dict[str, Any]] = {}
    for point in points:
        for vm in scenarios[point.scenario].vms:
            key = TraceKey(vm.benchmark, vm.params, point.mode)
            if key.file_name not in out:
                progress(key.file_name)
                out[key.file_name] = load_trace(key, backend, refresh)
    return out


def run_point(point: SweepPoint, vms: list[dict[str, Any]],
              traces: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One row: the point's parameters and what the model gives for them."""
    costs = load_costs(point.profile)
    mediated = MODES[point.mode].mediated
    built = []
    for i, vm in enumerate(vms):
        key = TraceKey(vm["benchmark"], tuple(vm["params"]), point.mode)
        trace = traces[key.file_name]
        built.append(trace_from_row({"vm": f"{vm['name']}.{i}", "start_s": vm["start_s"],
                                     "share": vm["share"], **trace}, costs, mediated))
    result = replay(built, point.policy)
    return {**asdict(point), "vms": len(built),
            "alone_ns": max(t.alone_ns for t in built),
            "makespan_ns": result.makespan_ns, "events": result.events}


def run_sweep(exp: Experiment, points: Sequence[SweepPoint],
              traces: dict[str, dict[str, Any]], dask: str | None = None,
              progress: Callable[[str], None] = lambda line: None,
              done: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Rows in the points' order; `dask`: None (here, serially), "local" (a local
    cluster of one single-threaded worker process per core) or a scheduler address.
    `done` is called as each point is finished (a progress bar's step)."""
    scenarios = {s.name: s for s in exp.scenarios}
    tasks = [(p, [{"name": v.name, "benchmark": v.benchmark, "params": list(v.params),
                   "start_s": v.start_s, "share": v.share}
                  for v in _vms_of(scenarios[p.scenario], p.vms)]) for p in points]
    t0 = time.monotonic()
    if dask is None:
        rows = []
        for p, vms in tasks:
            rows.append(run_point(p, vms, traces))
            done()
    else:
        from distributed import Client, LocalCluster, as_completed

        if dask == "local":
            cluster = LocalCluster(n_workers=os.cpu_count() or 1, threads_per_worker=1,
                                   processes=True, dashboard_address=":0")
            client = Client(cluster)
        else:
            cluster, client = None, Client(dask)
        try:
            shared = client.scatter(traces, broadcast=True)
            futures = [client.submit(run_point, p, vms, shared, pure=False)
                       for p, vms in tasks]
            for _ in as_completed(futures):
                done()
            rows = client.gather(futures)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    progress(f"{len(rows)} point(s) in {time.monotonic() - t0:.1f} s"
             + (f" on Dask ({dask})" if dask else " serially"))
    return rows
