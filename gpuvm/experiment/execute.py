"""Running an experiment: every scenario under every mode, policy and repetition.

Each finished run's rows are appended to runs.jsonl at once, so a failure later (a VM
that faults, a crash, Ctrl-C) loses nothing already measured; each invocation writes a
new time-stamped directory, so no earlier experiment is overwritten.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from gpuvm.experiment.config import REPO, Experiment, Scenario
from gpuvm.experiment.costs import CostProfile, load_costs
from gpuvm.mediator.modes import MODES
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.run import VmResult, run_vms
from gpuvm.device import regs


@dataclass
class VmRow:
    """One VM of one run: what it is, whether it passed, its times and exact counts."""

    experiment: str
    scenario: str
    mode: str
    policy: str
    rep: int
    vm: str
    benchmark: str
    backend: str
    passed: bool
    error: str | None
    share: float  # normalised over the scenario's VMs
    start_s: float
    wall_ns: dict[str, int]  # per phase
    device_ns: dict[str, int]
    modelled_ns: dict[str, float]
    counters: dict[str, int]  # all phases together
    phase_counters: dict[str, dict[str, int]]
    record: dict[str, str]
    sched: dict[str, int | float] = field(default_factory=dict)
    busy: list[tuple[int, int]] = field(default_factory=list)  # device-time engine intervals

    @property
    def total_wall_ns(self) -> int:
        return sum(self.wall_ns.values())

    @property
    def total_modelled_ns(self) -> float:
        return sum(self.modelled_ns.values())


def specs_for(scenario: Scenario) -> list[VmSpec]:
    return [VmSpec(vm.name, vm.benchmark, list(vm.params), vm.inject, share=vm.share,
                   start_delay=vm.start_s, partition=dict(vm.partition),
                   ram_size=vm.ram_mib * regs.MiB) for vm in scenario.vms]


def rows_for(exp: Experiment, scenario: Scenario, mode: str, policy: str, rep: int,
             results: list[VmResult], costs: CostProfile) -> list[VmRow]:
    total_share = sum(vm.share for vm in scenario.vms)
    mediated = MODES[mode].mediated
    rows = []
    for vm, r in zip(scenario.vms, results):
        phases = r.session.phases
        totals: dict[str, int] = {}
        for p in phases:
            for k, v in p.counters.items():
                totals[k] = totals.get(k, 0) + v
        sched: dict[str, int | float] = {}
        busy: list[tuple[int, int]] = []
        if r.scheduler is not None:
            m = r.scheduler
            sched = {"gpu_time_ns": m.gpu_time_ns, "dispatches": m.dispatches,
                     "completions": m.completions, "submitted": m.submitted,
                     "mean_queue_delay_ns": m.mean_queue_delay_ns,
                     "max_queue_delay_ns": m.queue_delay_max_ns, "added_at": m.added_at,
                     "removed_at": m.removed_at if m.removed_at is not None else -1}
            busy = list(m.busy)
        rows.append(VmRow(
            exp.name, scenario.name, mode, policy, rep, vm.name, vm.benchmark,
            r.outcome.backend, r.passed, r.error(), vm.share / total_share, vm.start_s,
            {p.name: p.wall_ns for p in phases}, {p.name: p.device_ns for p in phases},
            {p.name: costs.modelled_ns(p.counters, mediated) for p in phases},
            totals, {p.name: dict(p.counters) for p in phases}, dict(r.record), sched, busy))
    return rows


def run_directory(exp: Experiment) -> Path:
    base = exp.output if exp.output.is_absolute() else REPO / exp.output
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = base / stamp
    n = 1
    while out.exists():
        n += 1
        out = base / f"{stamp}-{n}"
    out.mkdir(parents=True)
    latest = base / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(out.name)
    return out


Progress = Callable[[str], None]


def execute(exp: Experiment, out: Path, progress: Progress = lambda line: None) -> list[VmRow]:
    """Run everything; returns all rows (also appended to out/runs.jsonl as they come)."""
    costs = load_costs(exp.cost_profile)
    rows: list[VmRow] = []
    plan = [(s, m, p, r) for s in exp.scenarios for m in exp.modes
            for p in (exp.policies if MODES[m].mediated else exp.policies[:1])
            for r in range(exp.repetitions)]
    with (out / "runs.jsonl").open("a") as sink:
        for i, (scenario, mode, policy, rep) in enumerate(plan, 1):
            label = f"[{i}/{len(plan)}] {scenario.name} {mode} {policy} rep {rep}"
            options = RunOptions(mode=mode, backend=exp.backend, timeout=exp.timeout_s,
                                 time_scale=exp.time_scale,
                                 scheduler={**exp.scheduler, "policy": policy})
            t0 = time.monotonic()
            try:
                results = run_vms(specs_for(scenario), options)
            except RunError as exc:
                progress(f"{label}: not run: {exc}")
                continue
            new = rows_for(exp, scenario, mode, policy, rep, results, costs)
            for row in new:
                sink.write(json.dumps(asdict(row)) + "\n")
            sink.flush()
            rows.extend(new)
            verdict = "PASS" if all(r.passed for r in new) else \
                "FAIL: " + "; ".join(r.error or "failed" for r in new if not r.passed)
            progress(f"{label}: {verdict} ({time.monotonic() - t0:.1f} s)")
    return rows


def load_rows(path: Path) -> list[VmRow]:
    rows = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        d["busy"] = [tuple(b) for b in d.get("busy", [])]
        rows.append(VmRow(**d))
    return rows

