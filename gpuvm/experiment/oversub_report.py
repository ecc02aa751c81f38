"""The oversubscription report (issue 17): VMs whose vGPUs together have more VRAM than
the GPU, under an exclusive time quantum (QUANTUM) and fine-grained fair share (BAND),
in the emulator and in the model.

Emulator: each run's makespan (virtual time, first VM start to last VM end) and the
mediator's residency counters summed over its VMs, read from the rows by the names the
mediator counts them under (residency_pages_in, residency_pages_out, residency_bytes,
residency_switches, residency_switch_ns).  A build of the emulator without residency
switching has none of them: the table says so instead of showing zeros.

Model: each VM's event stream alone (gpuvm.sim.traces: one run of its benchmark on the
virtual clock, recorded once) replayed together on a GPU of the experiment's VRAM less
what the mediator keeps for itself, each VM with its working set (`working_set_mib`, else
its partition's framebuffer), under the same policy and scheduler parameters, with
switches priced by the cost profile's residency_* keys (gpuvm.sim.residency).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuvm.device import regs
from gpuvm.device.profile import load_profile
from gpuvm.experiment.config import Experiment, ScenarioConfig, VmConfig
from gpuvm.experiment.costs import CostProfile, load_costs
from gpuvm.experiment.execute import VmRow, makespan_ms
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mediator import HYP_GLOBAL
from gpuvm.sim.figure import pyplot
from gpuvm.sim.stream_replay import VmStream, replay
from gpuvm.sim.traces import TraceKey, load_trace
from gpuvm.sim.residency import COUNTER_NAMES, residency_for
from scheduler import SchedulerConfig

EMULATOR, MODEL = "emulator", "model"
TraceLoader = Callable[[VmConfig, str, str], VmStream]


@dataclass
class Point:
    """One policy and mode of one scenario, from one source."""

    policy: str
    mode: str
    source: str  # EMULATOR | MODEL
    makespan_ms: float | None  # None: no passed run
    counts: dict[str, int] | None  # residency counters summed over VMs; None: not counted
    passed: str = ""  # "2/2" (emulator), "" (model)
    note: str = ""

    @property
    def pages_moved(self) -> int | None:
        if self.counts is None:
            return None
        return self.counts["residency_pages_in"] + self.counts["residency_pages_out"]


def gpu_vram_bytes(exp: Experiment) -> int:
    """The emulated GPU's VRAM in this experiment."""
    return exp.vram_mib * regs.MiB if exp.vram_mib else load_profile().vram_size


def working_set_bytes(vm: VmConfig, exp: Experiment) -> int:
    """The model's working set of a VM: what the config says, else its whole framebuffer
    (its partition's, or its type's on this GPU; ValueError for a type the GPU does not
    offer)."""
    if vm.working_set_mib is not None:
        return vm.working_set_mib * regs.MiB
    if "vram_size" in vm.partition:
        return int(vm.partition["vram_size"])
    profile = load_profile()
    if exp.vram_mib:
        profile = profile.with_vram(exp.vram_mib * regs.MiB)
    types = mdev_types.profile_types(profile)
    type_id = vm.mdev_type or mdev_types.default_type_id(types)
    if type_id not in types:
        raise ValueError(f"{vm.name}: this GPU has no mdev type {type_id!r} to take the "
                         f"model's working set from (give working_set_mib)")
    return types[type_id].partition.vram_size


def _vgpu_text(vm: VmConfig, exp: Experiment) -> str:
    if vm.partition:
        vgpu = f"framebuffer {int(vm.partition.get('vram_size', 0)) // regs.MiB} MiB"
    else:
        vgpu = f"type {vm.mdev_type or 'default'}"
    try:
        ws = f"{working_set_bytes(vm, exp) // regs.MiB} MiB"
    except ValueError:
        ws = "unknown"
    return f"{vm.name}: {vm.benchmark} {list(vm.params)}, {vgpu}, model working set {ws}"


def row_residency(row: VmRow) -> dict[str, int] | None:
    """The row's residency counters (by their names, or under a dotted prefix such as
    "mediator.residency_bytes"); None when the row has none of them."""
    found: dict[str, int] = {}
    for key, value in row.counters.items():
        name = key.rsplit(".", 1)[-1]
        if name in COUNTER_NAMES:
            found[name] = found.get(name, 0) + int(value)
    if not found:
        return None
    return {name: found.get(name, 0) for name in COUNTER_NAMES}


def emulator_point(rows: list[VmRow], policy: str, mode: str) -> Point:
    if not rows:
        return Point(policy, mode, EMULATOR, None, None, "0/0", "no run")
    reps = sorted({r.rep for r in rows})
    passed = f"{sum(r.passed for r in rows) // len(reps)}/{len(rows) // len(reps)}"
    ok = [r for r in rows if r.passed]
    failed_reps = {r.rep for r in rows if not r.passed}
    good = [r for r in ok if r.rep not in failed_reps]
    if not good:
        first = next(r.error for r in rows if not r.passed) or "failed"
        return Point(policy, mode, EMULATOR, None, None, passed, first.splitlines()[0])
    per_rep = [row_residency(r) for r in good]
    counts = None
    if any(c is not None for c in per_rep):
        counts = {name: sum((c or {}).get(name, 0) for c in per_rep) // len(
            {r.rep for r in good}) for name in COUNTER_NAMES}
    note = "" if counts is not None else \
        "no residency counters: this emulator build does not switch residency"
    return Point(policy, mode, EMULATOR, makespan_ms(good), counts, passed, note)


def default_trace_loader(backend: str, profile: str) -> TraceLoader:
    def load(vm: VmConfig, mode: str, _policy: str) -> VmStream:
        return load_trace(TraceKey(vm.benchmark, vm.params, mode, profile), backend)
    return load


def model_streams(exp: Experiment, scenario: ScenarioConfig, mode: str, load: TraceLoader,
                  policy: str) -> list[VmStream]:
    return [load(vm, mode, policy).placed(vm.name, round(vm.start_s * 1e9), vm.share,
                                          working_set_bytes(vm, exp))
            for vm in scenario.vms]


def model_point(exp: Experiment, scenario: ScenarioConfig, policy: str, mode: str,
                costs: CostProfile, load: TraceLoader) -> Point:
    streams = model_streams(exp, scenario, mode, load, policy)
    config = SchedulerConfig.from_dict({**exp.scheduler, "policy": policy})
    residency = residency_for(costs, gpu_vram_bytes(exp) - HYP_GLOBAL)
    result = replay(streams, scheduler=config, residency=residency)
    counts = {name: sum(c[name] for c in result.residency.values()) for name in COUNTER_NAMES}
    return Point(policy, mode, MODEL, result.makespan_ns / 1e6, counts)


def points_for(exp: Experiment, scenario: ScenarioConfig, rows: list[VmRow], costs: CostProfile,
               load: TraceLoader) -> list[Point]:
    by: dict[tuple[str, str], list[VmRow]] = defaultdict(list)
    for r in rows:
        if r.scenario == scenario.name:
            by[(r.policy, r.mode)].append(r)
    points = []
    for mode in exp.modes:
        for policy in exp.policies:
            points.append(emulator_point(by.get((policy, mode), []), policy, mode))
            try:
                points.append(model_point(exp, scenario, policy, mode, costs, load))
            except (ValueError, RuntimeError) as exc:  # a trace not recorded, a set too big
                points.append(Point(policy, mode, MODEL, None, None, note=str(exc)))
    return points


def _cell(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _figure(scenario: str, points: list[Point], path: Path) -> Path:
    """Makespan per policy from each source on its own axis, and the pages moved side by
    side."""
    plt = pyplot()
    import matplotlib.ticker  # with pyplot, lazily: see gpuvm.sim.figure.pyplot

    labels = list(dict.fromkeys((p.policy, p.mode) for p in points))
    names = [p.upper() if len({m for _, m in labels}) == 1 else f"{p.upper()}\n{m}"
             for p, m in labels]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))

    def bars(ax, xs, vals, width, **kw) -> None:
        drawn = ax.bar(xs, [v or 0 for v in vals], width, **kw)
        ax.bar_label(drawn, labels=["n/a" if v is None else f"{v:,.0f}" for v in vals],
                     fontsize=7)

    for i, (ax, source, what) in enumerate(((axes[0], EMULATOR, "virtual"),
                                            (axes[1], MODEL, "modelled"))):
        got = {(p.policy, p.mode): p.makespan_ms for p in points if p.source == source}
        bars(ax, range(len(labels)), [got.get(k) for k in labels], 0.6, color=f"C{i}")
        ax.set_title(f"{scenario}: {source} makespan", fontsize=10)
        ax.set_ylabel(f"{what} ms, first VM start to last VM end", fontsize=9)
    width = 0.38
    for i, source in enumerate((EMULATOR, MODEL)):
        got = {(p.policy, p.mode): p.pages_moved for p in points if p.source == source}
        bars(axes[2], [j + (i - 0.5) * width for j in range(len(labels))],
             [got.get(k) for k in labels], width, label=source, color=f"C{i}")
    axes[2].set_title(f"{scenario}: pages moved in + out", fontsize=10)
    axes[2].set_ylabel("pages, all VMs summed", fontsize=9)
    axes[2].legend(fontsize=8, loc="upper left")
    for ax in axes:
        ax.set_ylim(0, 1.15 * ax.get_ylim()[1])  # headroom: the labels stay inside
        ax.set_xticks(range(len(labels)), names)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _verdict(points: list[Point], source: str) -> str | None:
    """Whether BAND moved more pages and took longer than QUANTUM, for one source."""
    got = {p.policy: p for p in points if p.source == source and p.counts is not None
           and p.makespan_ms is not None}
    if not {"band", "quantum"} <= set(got):
        return None
    b, q = got["band"], got["quantum"]
    pages = "more" if (b.pages_moved or 0) > (q.pages_moved or 0) else "NOT more"
    slower = "longer" if b.makespan_ms > q.makespan_ms else "NOT longer"
    ratio = f"{b.pages_moved / q.pages_moved:,.1f}x" if q.pages_moved else "all"
    return (f"**{source}**: BAND moved {pages} pages than QUANTUM ({b.pages_moved:,} vs "
            f"{q.pages_moved:,}, {ratio}; {b.counts['residency_switches']:,} vs "
            f"{q.counts['residency_switches']:,} switches) and its makespan is {slower} "
            f"({b.makespan_ms:,.1f} vs {q.makespan_ms:,.1f} ms).")


def oversubscription_report(exp: Experiment, rows: list[VmRow], out: Path,
                            load: TraceLoader | None = None) -> list[str]:
    costs = load_costs(exp.cost_profile)
    load = load or default_trace_loader(exp.backend, exp.cost_profile)
    vram = gpu_vram_bytes(exp)
    usable = vram - HYP_GLOBAL
    md = []
    for scenario in exp.scenarios:
        points = points_for(exp, scenario, rows, costs, load)
        fig = _figure(scenario.name, points, out / f"oversubscription-{scenario.name}.png")
        sets = "; ".join(_vgpu_text(vm, exp) for vm in scenario.vms)
        try:
            total = sum(working_set_bytes(vm, exp) for vm in scenario.vms)
            together = f"; the model's working sets together {total / usable:.0%} of it"
        except ValueError:
            together = ""
        md += [f"## {scenario.name}", "",
               f"GPU VRAM {vram // regs.MiB} MiB, {usable // regs.MiB} MiB of it for vGPUs "
               f"(the model's physical VRAM); VMs: {sets}{together}.  Model: "
               f"priced by `{costs.name}` (copies {costs.residency_byte_ns:g} ns/byte, "
               f"{costs.residency_page_ns:g} ns per page moved, {costs.residency_switch_ns:g} "
               f"ns per switch), {regs.SMALL_PAGE // 1024} KiB pages.", "",
               "| policy | mode | source | VMs pass | makespan ms | pages in | pages out "
               "| MiB moved | switches | switch ms | note |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in points:
            c = p.counts
            md.append(
                f"| {p.policy.upper()} | {p.mode} | {p.source} | {p.passed or '-'} "
                f"| {_cell(p.makespan_ms, ',.1f')} "
                f"| {_cell(c and c['residency_pages_in'], ',')} "
                f"| {_cell(c and c['residency_pages_out'], ',')} "
                f"| {_cell(c and c['residency_bytes'] / regs.MiB, ',.1f')} "
                f"| {_cell(c and c['residency_switches'], ',')} "
                f"| {_cell(c and c['residency_switch_ns'] / 1e6, ',.1f')} | {p.note} |")
        md.append("")
        for source in (EMULATOR, MODEL):
            line = _verdict(points, source)
            if line:
                md.append(line)
        md += ["", f"![oversubscription]({fig.name})", "",
               "Pages are counted once each way: a switch that evicts another VM's pages "
               "counts them as that VM's pages out and its own evicted pages as pages in; "
               "MiB moved = both.  Makespan: emulator = its virtual time (first VM start "
               "to last VM end); model = the replay of each VM's stream on the cost "
               "profile's platform.", ""]
    return md
