"""Parameter sweeps of the model: scenario x mode x policy x VM count x cost profile,
run one after another or on a Dask cluster (a local one, or an existing scheduler).

Each point is a pure function of its parameters and the event streams it replays
(recorded once, in the calling process, before anything is sent out), and the replay is
integer ns with no randomness, so the rows are identical whichever runs them and in
whatever order the workers finish: they are returned in the points' order.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

from gpuvm.experiment.config import Experiment, ScenarioConfig
from gpuvm.mediator.modes import MODES
from gpuvm.sim.stream_replay import VmStream, replay
from gpuvm.sim.traces import TraceKey, load_trace
from scheduler import SchedulerConfig

EXACT_UP_TO = 16  # VMs replayed exit by exit
COARSE_GRAIN_NS = 1_000_000
# the policies' parameters as the experiments give them (Gdev's defaults)
SCHEDULER_DEFAULTS = {"period_ms": 30, "band_wait_us": 500}


@dataclass(frozen=True)
class SweepPoint:
    """One point of a model sweep: scenario, mode, policy, VM count and cost profile, a pure
    function of which is its row."""

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


def _vms_of(scenario: ScenarioConfig, count: int) -> list:
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
    return [TraceKey(vm.benchmark, vm.params, point.mode, point.profile).file_name
            for vm in scenario.vms]


def traces_needed(exp: Experiment, points: Sequence[SweepPoint], backend: str = "auto",
                  refresh: bool = False, progress: Callable[[str], None] = lambda key: None
                  ) -> dict[str, VmStream]:
    """Every stream the points replay, recorded here if not cached (by file name); each
    named to `progress` before it is loaded or recorded."""
    scenarios = {s.name: s for s in exp.scenarios}
    out: dict[str, VmStream] = {}
    for point in points:
        for vm in scenarios[point.scenario].vms:
            key = TraceKey(vm.benchmark, vm.params, point.mode, point.profile)
            if key.file_name not in out:
                progress(key.file_name)
                out[key.file_name] = load_trace(key, backend, refresh)
    return out


def grain_for(vms: int) -> int:
    """The replay's grain at this VM count: exit by exit, as the emulator, up to the
    counts it can run; past them, each run of exits in steps of up to 1 ms of time (a
    1,024-VM fv point is then ~10^6 steps, not 5 x 10^7)."""
    return 0 if vms <= EXACT_UP_TO else COARSE_GRAIN_NS


def run_point(point: SweepPoint, vms: list[dict[str, Any]],
              traces: dict[str, VmStream]) -> dict[str, Any]:
    """One row: the point's parameters and what the model gives for them."""
    config = SchedulerConfig.from_dict({**SCHEDULER_DEFAULTS, "policy": point.policy})
    streams = []
    for i, vm in enumerate(vms):
        key = TraceKey(vm["benchmark"], tuple(vm["params"]), point.mode, point.profile)
        streams.append(traces[key.file_name].placed(
            f"{vm['name']}.{i}", round(vm["start_s"] * 1e9), vm["share"]))
    result = replay(streams, grain_for(len(streams)), config)
    own = [result.end_ns[s.name] - s.start for s in streams]
    return {**asdict(point), "vms": len(streams),
            "alone_ns": max(s.alone_ns for s in streams),
            "mean_vm_ns": round(sum(own) / len(own)),
            "makespan_ns": result.makespan_ns,
            "lock_wait_ns": round(sum(result.lock_wait_ns.values()) / len(streams)),
            "events": result.events}


def run_sweep(exp: Experiment, points: Sequence[SweepPoint],
              traces: dict[str, VmStream], dask: str | None = None,
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
        # heavy (a second or so), and needed only for a sweep on a cluster
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
