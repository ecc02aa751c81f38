"""Running an experiment: every scenario under every mode, policy and repetition.

Each finished run's rows are appended to runs.jsonl at once, so a failure later (a VM
that faults, a crash, Ctrl-C) loses nothing already measured, and a resumed experiment
makes only the runs that have no rows yet (rundir.py keeps the directory's state).
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection

from gpuvm.experiment.config import Experiment, Scenario
from gpuvm.calibrate.footprint import vm_pt_footprint
from gpuvm.experiment.costs import CostProfile, HostMemCosts, load_costs, load_hostmem_costs
from gpuvm.experiment.rundir import RunDir, RunKey, plan, write_atomically
from gpuvm.device.profile import load_profile
from gpuvm.mediator import mdev_types
from gpuvm.mediator.host_port import work_counters
from gpuvm.mediator.modes import MODES
from gpuvm.run.mediated import gpu_types
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.run import VmResult, run_vms
from gpuvm.run.observe import StatusWriter
from gpuvm.device import regs
from gpuvm.vmm.hostmem import hot_mask
from gpuvm.vmm.kvm.vcpu import COALESCED_STORES, DIRECT_ACCESSES


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
    # host memory (issue 16): the VMM's summary of the guest's reports, the modelled ns
    # per host-memory profile and the GPU page-table footprint of its peak pinned memory
    hostmem: dict[str, Any] = field(default_factory=dict)
    # the VM's priced event stream on the virtual clock (gpuvm.device.clock.EventStream):
    # what the model replays (gpuvm.sim.stream_replay)
    stream: list[list] = field(default_factory=list)
    # how KVM delivered the counted accesses (through its coalesced ring, to pages mapped
    # as memory): the emulator's own mechanism, timed by when the ring drains, so like
    # wall_ns not a result and kept out of `counters`, which repeat bit for bit
    delivery: dict[str, int] = field(default_factory=dict)

    @property
    def total_wall_ns(self) -> int:
        return sum(self.wall_ns.values())

    @property
    def total_modelled_ns(self) -> float:
        return sum(self.modelled_ns.values())


DEFAULT_TYPE = mdev_types.default_type_id(gpu_types(load_profile()))


def specs_for(scenario: Scenario, hot_masks: dict[str, int] | None = None) -> list[VmSpec]:
    """The scenario's VMs; one that names no partition gets the GPU's default vGPU type
    (so native VMs see that type's GPU and ×native compares like with like).  A VM in
    `hot_masks` gets that mask as params[3] (smart pinning's use run)."""
    specs = []
    for vm in scenario.vms:
        params = list(vm.params)
        if hot_masks and vm.name in hot_masks:
            params += [0] * (4 - len(params))
            params[3] = hot_masks[vm.name]
        specs.append(VmSpec(vm.name, vm.benchmark, params, vm.inject, share=vm.share,
                            start_delay=vm.start_s, partition=dict(vm.partition),
                            mdev_type=None if vm.partition else vm.mdev_type or DEFAULT_TYPE,
                            ram_size=vm.ram_mib * regs.MiB, ram_backing=vm.ram_backing,
                            ram_alloc=vm.ram_alloc,
                            hostmem_report=vm.hostmem_report, pin_chunks=vm.pin_chunks,
                            pin_chunk_bytes=vm.pin_chunk_kib * 1024,
                            nohugepage_pinned=vm.nohugepage_pinned))
    return specs


def hot_masks_for(scenario: Scenario, key: RunKey, rows: list[dict[str, Any]]
                  ) -> dict[str, int]:
    """Smart pinning: each VM with pin_hot_from gets the hot mask of that VM's history in
    the same mode, policy and repetition (allocations transferred > hot_threshold times)."""
    masks = {}
    for vm in scenario.vms:
        if not vm.pin_hot_from:
            continue
        src_scenario, src_vm = vm.pin_hot_from.split("/")
        found = [r for r in rows if r.get("scenario") == src_scenario and r.get("vm") == src_vm
                 and r.get("mode") == key.mode and r.get("policy") == key.policy
                 and r.get("rep") == key.rep and r.get("hostmem")]
        if not found:
            raise RunError(f"{vm.name}: pin_hot_from {vm.pin_hot_from!r}: no history of that "
                           f"VM in this run (it must be an earlier scenario that reports)")
        transfers = {int(k): v for k, v in
                     found[-1]["hostmem"].get("transfers_per_alloc", {}).items()}
        masks[vm.name] = hot_mask(transfers, vm.hot_threshold)
    return masks


def hostmem_of(result: VmResult, profiles: list[HostMemCosts], counters: dict[str, int]
               ) -> dict[str, Any]:
    """The row's host-memory part: empty when the guest reported nothing."""
    tracker = result.session.hostmem
    if not tracker.events:
        return {}
    out = tracker.summary()
    out["modelled_ns"] = {p.name: p.breakdown_ns(counters) for p in profiles}
    out["pt_footprint"] = vm_pt_footprint(tracker.pinned_peak_bytes)
    return out


BOUNCED_PHASES = ("HtoD", "DtoH")


def with_bounce_bytes(phase: str, counters: dict[str, int], record: dict[str, str]
                      ) -> dict[str, int]:
    """A pageable benchmark's (record pinned=0) HtoD/DtoH copies are staged by the guest
    runtime through its pinned bounce buffer (rt_memcpy_htod/dtoh), a CPU copy the device
    never sees: counted here as copy.bounce_bytes so the cost model can price it."""
    counters = dict(counters)
    if record.get("pinned") == "0" and phase in BOUNCED_PHASES and counters.get("copy.bytes"):
        counters["copy.bounce_bytes"] = counters["copy.bytes"]
    return counters


DELIVERY = (COALESCED_STORES, DIRECT_ACCESSES)  # counted accesses that had no KVM exit


def without_delivery(counters: dict[str, int]) -> dict[str, int]:
    """The counts a row states: how KVM delivered the accesses is left out (VmRow.delivery)."""
    return {k: v for k, v in counters.items() if k not in DELIVERY}


def rows_for(exp: Experiment, scenario: Scenario, mode: str, policy: str, rep: int,
             results: list[VmResult], costs: CostProfile,
             hostmem_costs: list[HostMemCosts] = ()) -> list[VmRow]:
    total_share = sum(vm.share for vm in scenario.vms)
    rows = []
    for vm, r in zip(scenario.vms, results):
        vm_mode = r.spec.mode or mode  # a vGPU's own mode, where the VM named one
        mediated = MODES[vm_mode].mediated
        party = r.session.clock_party
        phases = r.session.phases
        record = dict(r.record)
        phase_counts = {p.name: with_bounce_bytes(p.name, without_delivery(p.counters),
                                                  record) for p in phases}
        totals: dict[str, int] = {}
        delivery: dict[str, int] = {}
        for p in phases:
            for k, v in phase_counts[p.name].items():
                totals[k] = totals.get(k, 0) + v
            for k, v in p.counters.items():
                if k in DELIVERY:
                    delivery[k] = delivery.get(k, 0) + v
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
            exp.name, scenario.name, vm_mode, policy, rep, vm.name, vm.benchmark,
            r.outcome.backend, r.passed, r.error(), vm.share / total_share, vm.start_s,
            {p.name: p.wall_ns for p in phases}, {p.name: p.device_ns for p in phases},
            # modelled time is the virtual time each phase took; a wall-clock run has
            # none, and its counts are priced alone instead
            {p.name: p.device_ns if party is not None
             else costs.modelled_ns(phase_counts[p.name], mediated) for p in phases},
            totals, phase_counts, record, sched, busy,
            hostmem_of(r, list(hostmem_costs), totals),
            [list(e) for e in party.stream.entries] if party is not None else [],
            delivery))
    return rows


def not_run_rows(exp: Experiment, scenario: Scenario, key: RunKey, error: str) -> list[VmRow]:
    """A run that could not be made (a RunError) is recorded as failed VM runs, so the
    report says so and the command fails, instead of a report of zero runs."""
    total_share = sum(vm.share for vm in scenario.vms)
    return [VmRow(exp.name, scenario.name, key.mode, key.policy, key.rep, vm.name,
                  vm.benchmark, exp.backend, False, f"not run: {error}",
                  vm.share / total_share, vm.start_s, {}, {}, {}, {}, {}, {})
            for vm in scenario.vms]


Progress = Callable[[str], None]


def execute(exp: Experiment, run: RunDir, progress: Progress = lambda line: None,
            skip: Collection[RunKey] = (),
            deferred: Callable[[], AbstractContextManager[object]] = nullcontext
            ) -> list[VmRow]:
    """Make every planned run not in `skip`, in plan order (rundir.plan).  Returns the
    new rows.

    Each run's rows are appended to runs.jsonl (one write and fsync each) as soon as the
    run ends, inside `deferred()`, so that a stop signal lands between runs' rows, never
    in the middle of them.  A KeyboardInterrupt leaves runs.jsonl holding whole runs only.
    """
    costs = load_costs(exp.cost_profile)
    hostmem_costs = [load_hostmem_costs(p) for p in exp.hostmem_profiles]
    earlier = run.read_rows().rows if skip else []  # histories of runs already recorded
    scenarios = {s.name: s for s in exp.scenarios}
    keys = plan(exp)
    rows: list[VmRow] = []

    def make(key: RunKey, label: str, sink: Any) -> None:
        scenario = scenarios[key.scenario]
        options = RunOptions(mode=key.mode, backend=exp.backend, timeout=exp.timeout_s,
                             time_scale=exp.time_scale, isolated=exp.isolated,
                             clock=exp.clock, prices=costs.event_prices(MODES[key.mode].mediated),
                             scheduler={**exp.scheduler, "policy": key.policy},
                             vram_size=exp.vram_mib * regs.MiB if exp.vram_mib else None,
                             confined=exp.kind == "isolation")
        t0 = time.monotonic()
        try:
            masks = hot_masks_for(scenario, key, earlier + [asdict(r) for r in rows])
            status = StatusWriter(key.mode, key.policy, label=f"experiment {exp.name}: "
                                  f"{scenario.name} rep {key.rep}")  # for `gpuvm smi`
            results = run_vms(specs_for(scenario, masks), options, observers=[status])
        except RunError as exc:
            new = not_run_rows(exp, scenario, key, str(exc))
            verdict = f"NOT RUN: {exc}"
        else:
            new = rows_for(exp, scenario, key.mode, key.policy, key.rep, results, costs,
                           hostmem_costs)
            write_histories(run.path, key, results)
            verdict = "PASS" if all(r.passed for r in new) else \
                "FAIL: " + "; ".join(r.error or "failed" for r in new if not r.passed)
        with deferred():
            for row in new:
                sink.append(asdict(row))
            rows.extend(new)
        progress(f"{label}: {verdict} ({time.monotonic() - t0:.1f} s)")

    with run.appender() as sink:
        for i, key in enumerate(keys, 1):
            if key not in skip:
                make(key, f"[{i}/{len(keys)}] {key.scenario} {key.mode} {key.policy} "
                          f"rep {key.rep}", sink)
    return rows


def write_histories(out: Path, key: RunKey, results: list[VmResult]) -> None:
    """Each reporting VM's transfer history as JSON: history/<scenario>-<mode>-<policy>-
    <rep>-<vm>.json (the profile a smart-pinning run is planned from)."""
    for r in results:
        tracker = r.session.hostmem
        if tracker.events:
            path = out / "history" / f"{key.scenario}-{key.mode}-{key.policy}-{key.rep}-" \
                f"{r.spec.name}.json"
            path.parent.mkdir(exist_ok=True)
            write_atomically(path, json.dumps(tracker.history(), indent=1) + "\n")


def row_from_dict(d: dict[str, Any]) -> VmRow:
    d = dict(d)
    d["busy"] = [tuple(b) for b in d.get("busy", [])]
    return VmRow(**d)


# What depends on the wall clock (a wall device clock follows it; a virtual one does not,
# but comparing without these fields holds for both): everything else in a row
# -- counts (but the waits for the mediator's lock, host_port.WALL_CLOCK_COUNTERS),
# records, modelled time, verdicts -- is the same on every rerun.
WALL_CLOCK_FIELDS = ("wall_ns", "device_ns", "busy")
WALL_CLOCK_SCHED = ("gpu_time_ns", "mean_queue_delay_ns", "max_queue_delay_ns", "added_at",
                    "removed_at")


def without_wall_clock(row: VmRow | dict[str, Any]) -> dict[str, Any]:
    """A row with its wall-clock-dependent fields left out, to compare runs."""
    d = dict(asdict(row) if isinstance(row, VmRow) else row)
    for name in WALL_CLOCK_FIELDS:
        d.pop(name, None)
    d["sched"] = {k: v for k, v in d.get("sched", {}).items() if k not in WALL_CLOCK_SCHED}
    d["phase_counters"] = {phase: work_counters(c)
                           for phase, c in d.get("phase_counters", {}).items()}
    if "counters" in d:
        d["counters"] = work_counters(d["counters"])
    return d
