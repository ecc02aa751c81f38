"""The paper report of a suite (`gpuvm experiment experiments/paper.toml`): every number
beside the one GPUvm states, and where they differ, the counted mechanism that says why.

It reads the included experiments' rows (overhead: kind "benchmarks", scaling: kind
"scaling", isolation: kind "isolation"), all in virtual time, runs the model of the
whole system (gpuvm.sim.stream_replay) beside the scaling part, and writes report.md
with figures into the suite's run directory.  The paper's statements come from the
shared reference on GPUvm (ATC'14 abstract, TC'16, and a reading note marked [note]).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpuvm.experiment.config import Experiment
from gpuvm.experiment.costs import CostProfile, load_costs, mmio_exits
from gpuvm.experiment.execute import VmRow
from gpuvm.experiment.oversub_report import oversubscription_report
from gpuvm.experiment.report import PHASES, reprice, shares_in_window
from gpuvm.experiment.rundir import write_atomically
from gpuvm.sim.figure import pyplot
from gpuvm.sim.stream_replay import VmStream, replay, replicate


@dataclass
class SuitePart:
    """One included experiment: its configuration, run directory and rows."""

    exp: Experiment
    path: Path
    rows: list[VmRow]


@dataclass(frozen=True)
class Claim:
    """What the paper states for a mode, as a range a reproduced value is checked against."""

    text: str
    low: float
    high: float


# x native (modelled), per mode; see ../shared/reference/gpuvm.md
OVERHEAD_CLAIMS = {
    "fv": Claim("~100x native (FV naive, nine benchmarks) [note]", 30.0, 300.0),
    "pv-naive": Claim("3-10x native (PV naive) [note]", 3.0, 10.0),
    "pv": Claim("2-3x native (PV multicall) [abstract, note]", 2.0, 3.0),
}
INIT_CLOSE_CLAIM = Claim("Init+Close > 90% of FV time [note]", 90.0, 100.0)
LAZY_SYNCS_CLAIM = Claim("about 7 shadow page-table updates per benchmark [note]", 3.0, 12.0)
BAND_CLAIM_PP = 7.0  # Gdev (ATC'12): BAND keeps utilisation within 7% of the shares


def _verdict(value: float, claim: Claim) -> str:
    if claim.low <= value <= claim.high:
        return "matches"
    return "below" if value < claim.low else "above"


def _total(rows: list[VmRow], key: str) -> int:
    return sum(r.counters.get(key, 0) for r in rows)


def _pct_init_close(r: VmRow) -> float:
    total = r.total_modelled_ns
    return 100 * (r.modelled_ns.get("Init", 0) + r.modelled_ns.get("Close", 0)) / total \
        if total else 0.0


# ------------------------------------------------------------------------- overhead
def overhead_section(part: SuitePart, costs: CostProfile) -> list[str]:
    rows = [r for r in part.rows if r.passed]
    by = {(r.scenario, r.mode): r for r in rows}
    scenarios = [s.name for s in part.exp.scenarios]
    modes = list(part.exp.modes)
    md = ["## Overhead: each benchmark alone, per mode", "",
          f"Modelled (virtual) time -- each event at its `{costs.name}` price, GPU work at "
          f"the device profile's -- as a multiple of native; Init+Close as a share of the "
          f"modelled time.  Rows: "
          f"`{part.path}`.", "",
          "| benchmark | " + " | ".join(modes) + " | FV Init+Close % |",
          "|---|" + "---|" * (len(modes) + 1)]
    ratios: dict[str, list[float]] = defaultdict(list)
    for s in scenarios:
        native = by.get((s, "native"))
        cells = []
        for m in modes:
            r = by.get((s, m))
            if r is None or native is None or not native.total_modelled_ns:
                cells.append("-")
                continue
            x = r.total_modelled_ns / native.total_modelled_ns
            ratios[m].append(x)
            cells.append(f"{x:.2f}x" if x < 10 else f"{x:.0f}x")
        fv = by.get((s, "fv"))
        md.append(f"| {s} | " + " | ".join(cells) + f" | {_pct_init_close(fv):.0f} |"
                  if fv else f"| {s} | " + " | ".join(cells) + " | - |")
    md += ["", "Phase split (modelled ms, Init / HtoD / Launch / DtoH / Close):", "",
           "| benchmark | mode | " + " | ".join(PHASES) + " | total ms |",
           "|---|---|" + "---|" * (len(PHASES) + 1)]
    for s in scenarios:
        for m in modes:
            r = by.get((s, m))
            if r:
                md.append(f"| {s} | {m} | " + " | ".join(
                    f"{r.modelled_ns.get(p, 0) / 1e6:.2f}" for p in PHASES)
                    + f" | {r.total_modelled_ns / 1e6:.2f} |")
    md += ["", "### Beside the paper", "",
           "| what | reproduced (median over benchmarks, range) | paper | verdict |",
           "|---|---|---|---|"]
    for mode, claim in OVERHEAD_CLAIMS.items():
        if ratios.get(mode):
            v = ratios[mode]
            md.append(f"| {mode} x native | {statistics.median(v):.2f}x ({min(v):.2f}-"
                      f"{max(v):.2f}) | {claim.text} | {_verdict(statistics.median(v), claim)} |")
    if ratios.get("fv-opt"):
        v = ratios["fv-opt"]
        md.append(f"| fv-opt x native | {statistics.median(v):.1f}x ({min(v):.1f}-{max(v):.1f}) "
                  f"| between FV naive and PV (not stated) | - |")
    fv_ic = [_pct_init_close(r) for r in rows if r.mode == "fv"]
    if fv_ic:
        med = statistics.median(fv_ic)
        md.append(f"| FV Init+Close share | {med:.0f}% ({min(fv_ic):.0f}-{max(fv_ic):.0f}) "
                  f"| {INIT_CLOSE_CLAIM.text} | {_verdict(med, INIT_CLOSE_CLAIM)} |")
    lazy = [r.counters.get("shadow.syncs", 0) for r in rows if r.mode == "fv+lazy"]
    if lazy:
        med = statistics.median(lazy)
        md.append(f"| fv+lazy channel shadow syncs | {med:.0f} ({min(lazy)}-{max(lazy)}) "
                  f"| {LAZY_SYNCS_CLAIM.text} | {_verdict(med, LAZY_SYNCS_CLAIM)} |")
    md += [""] + _mechanisms(by, scenarios, costs) + [""]
    return md


def _mechanisms(by: dict[tuple[str, str], VmRow], scenarios: list[str],
                costs: CostProfile) -> list[str]:
    """Where the reproduction differs from (or agrees with) the paper, and the counts
    that explain it."""
    md = ["### Why, from the counts", ""]
    s = next((s for s in scenarios if (s, "pv") in by and (s, "native") in by), None)
    if s:
        n, p = by[(s, "native")], by[(s, "pv")]
        zero_native = int(n.record.get("pt_zero_words", 0) or 0)
        zero_pv = CostProfile.pv_zero_words(p.counters)
        md.append(
            f"- **PV vs native** ({s}): {p.total_modelled_ns / n.total_modelled_ns:.2f}x.  "
            f"Native zeroes its page tables itself, {zero_native:,} 64-bit stores through "
            f"BAR3/PRAMIN (nouveau's nouveau_vm_map_pgt allocates each page table with "
            f"NVOBJ_FLAG_ZERO_ALLOC, which writes every word; Gdev's kernel runtime gets its "
            f"address spaces from nouveau), at {costs.aperture_native_ns:g} ns each; "
            f"under PV the hypervisor allocates whole tables and zeroes {zero_pv:,} words "
            f"({p.counters.get('pv.pts_allocated', 0)} tables, "
            f"{p.counters.get('hcall.set_pgd', 0)} directories) at "
            f"{costs.pt_zero_word_ns:g} ns each, and the guest pays "
            f"{p.counters.get('hcall.calls', 0):,} hypercalls "
            f"({p.counters.get('hcall.entries', 0):,} entries) and "
            f"{mmio_exits(p.counters):,} "
            f"remaining traps.  "
            + ("This is below the paper's 2-3x (optimised PV \"two or three times slower "
               "than native\").  Likely reasons, none priced here: the prototype's "
               "mediator reads a guest's whole BAR1 table back over PCIe when the guest "
               "maps it (32,768 entries, about 52 ms at the cited PCIe read latency), and "
               "the paper's runs may count driver work this model does not; the per-word "
               "prices come from the prototype's code, which clears only a quarter of each "
               "new table (docs/costs.md, \"Why PV is not 2-3x\")."
               if p.total_modelled_ns < 2 * n.total_modelled_ns else
               "The paper's 2-3x also includes Xen's event-channel and QEMU-dm round trips "
               "per hypercall, priced here as one `hypercall_ns`."))
    pg, pn = by.get(("memcpy-pageable", "native")), by.get(("memcpy-pinned", "native"))
    if pg and pn:
        md.append(
            f"- **Pageable vs pinned** (memcpy, native): {pg.total_modelled_ns / 1e6:.2f} vs "
            f"{pn.total_modelled_ns / 1e6:.2f} ms modelled.  Both move "
            f"{pg.counters.get('copy.bytes', 0):,} bytes on the copy engine; the pageable "
            f"one also stages {pg.counters.get('copy.bounce_bytes', 0):,} bytes through the "
            f"runtime's bounce buffer -- a guest memcpy, computation the VMM does not see, "
            f"which the virtual clock does not charge (the profile's "
            f"{costs.bounce_byte_ns:g} ns/byte would add "
            f"{pg.counters.get('copy.bounce_bytes', 0) * costs.bounce_byte_ns / 1e6:.2f} ms).")
    s = next((s for s in scenarios if (s, "fv") in by and (s, "fv+lazy") in by), None)
    if s:
        fv, lz = by[(s, "fv")], by[(s, "fv+lazy")]
        md.append(
            f"- **Lazy vs eager shadowing** ({s}): channel syncs {fv.counters.get('shadow.syncs', 0)} "
            f"-> {lz.counters.get('shadow.syncs', 0)}, BAR-window syncs "
            f"{fv.counters.get('shadow.bar_syncs', 0)} -> {lz.counters.get('shadow.bar_syncs', 0)}, "
            f"PTEs scanned {fv.counters.get('shadow.ptes_scanned', 0):,} -> "
            f"{lz.counters.get('shadow.ptes_scanned', 0):,}; modelled "
            f"{fv.total_modelled_ns / 1e6:.1f} -> {lz.total_modelled_ns / 1e6:.1f} ms: the "
            f"scans it skips read each entry back over PCIe ({costs.pte_scanned_ns:g} ns "
            f"an entry); what stays is FV's traps ({mmio_exits(fv.counters):,} at "
            f"{costs.trap_ns:g} ns).")
    s = next((s for s in scenarios if (s, "fv") in by and (s, "native") in by), None)
    if s:
        fv = by[(s, "fv")]
        traps = mmio_exits(fv.counters)
        md.append(
            f"- **FV naive** ({s}): {traps:,} trapped accesses, "
            f"{fv.counters.get('exits.mmio.bar3.write', 0):,} of them BAR3 stores of the "
            f"driver zeroing and filling page tables in Init -- which is why Init+Close "
            f"dominate, as the paper says.")
    return md


# ------------------------------------------------------------------------- scaling
@dataclass
class ScalePoint:
    """One mode at one VM count: the emulator's own virtual times beside the model's
    replay of the mode's 1-VM stream as that many VMs."""

    mode: str
    vms: int
    vm_ms: float          # the emulator: mean per-VM virtual time
    makespan_ms: float    # the emulator: the last VM's end
    model_makespan_ms: float  # the model (gpuvm.sim.stream_replay): its last VM's end
    lock_wait_ms: float   # the emulator: mean per-VM wait for the mediator's lock

    @property
    def error_pct(self) -> float:
        """The model's makespan against the emulator's, in percent."""
        return (self.model_makespan_ms / self.makespan_ms - 1) * 100


def _vm_ns(r: VmRow) -> int:
    return sum(r.device_ns.values())


def scale_points(part: SuitePart) -> list[ScalePoint]:
    runs: dict[tuple[str, str], list[VmRow]] = defaultdict(list)
    for r in part.rows:
        if r.passed and r.rep == 0:
            runs[(r.scenario, r.mode)].append(r)
    alone = {mode: rows[0] for (_, mode), rows in runs.items() if len(rows) == 1}
    points = []
    for (scenario, mode), rows in runs.items():
        if mode not in alone or not alone[mode].stream:
            continue
        one = VmStream("vm", tuple(tuple(e) for e in alone[mode].stream))
        model = replay(replicate(one, len(rows)))
        ends = [round(r.start_s * 1e9) + _vm_ns(r) for r in rows]
        points.append(ScalePoint(
            mode, len(rows), statistics.mean(_vm_ns(r) for r in rows) / 1e6, max(ends) / 1e6,
            model.makespan_ns / 1e6,
            statistics.mean(r.counters.get("mediator_lock.wait_ns", 0) for r in rows) / 1e6))
    return sorted(points, key=lambda p: (p.mode, p.vms))


def _scaling_figure(points: list[ScalePoint], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for i, mode in enumerate(sorted({p.mode for p in points})):
        ps = [p for p in points if p.mode == mode]
        ax.plot([p.vms for p in ps], [p.makespan_ms / ps[0].makespan_ms for p in ps], "o-",
                color=f"C{i}", label=f"{mode} emulator")
        ax.plot([p.vms for p in ps], [p.model_makespan_ms / ps[0].makespan_ms for p in ps],
                "x", color=f"C{i}", markersize=9, label=f"{mode} model")
    ax.plot([1, 8], [1, 8], ":", color="grey", label="serial (N x one VM)")
    ax.set_xlabel("VMs")
    ax.set_ylabel("virtual makespan / makespan of 1 VM")
    ax.set_title("modelled (virtual) time, paper platform", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling_section(part: SuitePart, costs: CostProfile, out: Path) -> list[str]:
    points = scale_points(part)
    if not points:
        return ["## Scaling", "", "No run completed.", ""]
    fig = _scaling_figure(points, out / "scaling.png")
    md = ["## Scaling: 1, 2, 4, 8 VMs at once", "",
          f"The emulator's own virtual times (`{costs.name}` prices; the mediator's lock "
          f"held in virtual time), beside the model (gpuvm.sim.stream_replay) replaying "
          f"the mode's 1-VM event stream as N VMs under the same lock rule.  VM ms: mean "
          f"per-VM time; lock ms: mean per-VM wait for the mediator's lock.  Rows: "
          f"`{part.path}`.", "",
          "| mode | VMs | VM ms | makespan ms | / 1 VM | lock ms | model makespan | error |",
          "|---|---|---|---|---|---|---|---|"]
    base = {p.mode: p for p in points if p.vms == min(q.vms for q in points if q.mode == p.mode)}
    for p in points:
        md.append(f"| {p.mode} | {p.vms} | {p.vm_ms:,.2f} | {p.makespan_ms:,.2f} "
                  f"| {p.makespan_ms / base[p.mode].makespan_ms:.2f} | {p.lock_wait_ms:,.2f} "
                  f"| {p.model_makespan_ms:,.2f} | {p.error_pct:+.2f}% |")
    worst = max(abs(p.error_pct) for p in points)
    md += ["", f"The model is within {worst:.2f}% of the emulator at every point "
           f"({'within' if worst <= 1 else 'OUTSIDE'} the 1% it must keep).", "",
           f"![scaling]({fig.name})", ""]
    eight = {p.mode: p for p in points if p.vms == 8}
    if {"fv", "pv"} <= set(eight):
        fv = eight["fv"].makespan_ms / base["fv"].makespan_ms
        pv = eight["pv"].makespan_ms / base["pv"].makespan_ms
        md.append(f"Paper: \"FV incurs large overhead in the 4- and 8-VM case since page "
                  f"shadowing locks GPU resources\"; PV stays near pass-through.  Here, at 8 "
                  f"VMs, FV's makespan is {fv:.2f}x its 1-VM time and PV's {pv:.2f}x: the "
                  f"emulator " + ("shows" if fv > 1.5 * pv else "does NOT show")
                  + " the paper's statement.  FV's VMs wait in virtual time for the mediator's "
                  "lock, which each shadow scan holds for the entries it reads; PV's "
                  "hypercalls fill each VM's own tables and hardly take it.")
        md.append("")
    return md


# ------------------------------------------------------------------------- isolation
def isolation_section(part: SuitePart) -> list[str]:
    md = ["## Isolation: FIFO / CREDIT / BAND", "",
          f"Mean |utilisation - share| while every VM competes (device time).  Rows: "
          f"`{part.path}`.", "",
          "| scenario | policy | mean error pp | worst pp | paper (Gdev ATC'12, reused by GPUvm) |",
          "|---|---|---|---|---|"]
    claims = {"fifo": "does not respect isolation", "credit": "does not really work",
              "band": f"within {BAND_CLAIM_PP:g}% on average"}
    for scenario in part.exp.scenarios:
        for policy in part.exp.policies:
            runs: dict[tuple[str, int], list[VmRow]] = defaultdict(list)
            for r in part.rows:
                if r.scenario == scenario.name and r.policy == policy and r.sched:
                    runs[(r.mode, r.rep)].append(r)
            errors = []
            for run in runs.values():
                _, shares = shares_in_window(run)
                errors += [abs(s.error_pp) for s in shares]
            if not errors:
                continue
            mean = sum(errors) / len(errors)
            verdict = ""
            if policy == "band":
                verdict = " -- matches" if mean <= BAND_CLAIM_PP else " -- above"
            md.append(f"| {scenario.name} | {policy.upper()} | {mean:.1f} | {max(errors):.1f} "
                      f"| {claims.get(policy, '')}{verdict} |")
    return md + [""]


def write_paper_report(exp: Experiment, parts: list[SuitePart], out: Path) -> Path:
    """report.md (and figures) in `out` over every included experiment's rows."""
    md = [f"# {exp.name}", "", exp.description, "",
          "Every time is modelled virtual time (each event at its price, GPU work at the "
          "device profile's, the mediator's lock held in virtual time): the same on any "
          "host, run after run.", ""]
    md += ["| part | run directory | VM runs | passed |", "|---|---|---|---|"]
    for part in parts:
        md.append(f"| {part.exp.name} ({part.exp.kind}) | `{part.path}` | {len(part.rows)} "
                  f"| {sum(r.passed for r in part.rows)} |")
    md.append("")
    for part in parts:
        reprice(part.exp, part.rows)
        costs = load_costs(part.exp.cost_profile)
        if part.exp.kind == "benchmarks":
            md += overhead_section(part, costs)
        elif part.exp.kind == "scaling":
            md += scaling_section(part, costs, out)
        elif part.exp.kind == "isolation":
            md += isolation_section(part)
        elif part.exp.kind == "oversubscription":
            md += ["## Oversubscription: QUANTUM vs BAND", "", f"Rows: `{part.path}`.", ""]
            md += [line.replace("## ", "### ", 1) if line.startswith("## ") else line
                   for line in oversubscription_report(part.exp, part.rows, out)]
    path = out / "report.md"
    write_atomically(path, "\n".join(md) + "\n")
    return path
