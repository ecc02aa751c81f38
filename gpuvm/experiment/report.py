"""Turning an experiment's rows into a CSV, figures and a Markdown report.

Two kinds of report:
- benchmarks: per scenario, one line per mode -- modelled (virtual) time per VM and the
  run's makespan, x native, the share spent in Init+Close, and the exact counts that
  explain them -- next to the paper's reference ratios (the emulator's own wall seconds
  only in a footnote: they are its speed, not a result);
- isolation: per scenario, each VM's GPU utilisation while all VMs ran, against its
  share, under each policy, with utilisation-over-time figures.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpuvm.experiment.config import Experiment
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import VmRow, makespan_ms
from gpuvm.experiment.hostmem_report import hostmem_report
from gpuvm.experiment.oversub_report import oversubscription_report
from gpuvm.experiment.rundir import (REPORT_RECORD, config_hash, planned_vm_runs,
                                     write_atomically)
from gpuvm.mediator.modes import MODES
from gpuvm.sim.figure import UtilisationPanel, pyplot, render_panels
from scheduler.metrics import VmMetrics

REPORT = "report.md"
PHASES = ("Init", "HtoD", "Launch", "DtoH", "Close")
BAND_TOLERANCE_PP = 5.0

# What the paper (and a reading note of it) reports; see shared reference gpuvm.md.
PAPER_REFERENCE = {
    "fv": "~100x slower than native (FV naive, nine benchmarks) [note]",
    "pv-naive": "3-10x slower than native [note]",
    "pv": "within 2-3x of native (PV multicall) [abstract, note]",
    "fv+lazy": "about 7 shadow page-table updates per benchmark [note]",
    "init+close": "> 90% of the time under FV [note]",
}

CSV_COUNTERS = ("exits.io", "trap.bar0.pramin.write", "shadow.syncs", "shadow.bar_syncs",
                "shadow.ptes_scanned", "shadow.ptes_refused", "hcall.calls", "hcall.entries",
                "remap.maps", "copy.bytes", "compute.kernels", "pfifo.doorbells",
                "engine.busy_ns")


def _sum(counters: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in counters.items() if k.startswith(prefix))


def write_csv(rows: list[VmRow], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["scenario", "mode", "policy", "rep", "vm", "benchmark", "backend", "passed",
                    "error", "share", "wall_ms", "modelled_ms", "init_close_pct", "exits_mmio",
                    "traps", *CSV_COUNTERS, "gpu_time_ms", "dispatches", "mean_queue_ms"])
        for r in rows:
            w.writerow([r.scenario, r.mode, r.policy, r.rep, r.vm, r.benchmark, r.backend,
                        r.passed, r.error or "", f"{r.share:.4f}", f"{r.total_wall_ns / 1e6:.3f}",
                        f"{r.total_modelled_ns / 1e6:.3f}", f"{_init_close(r):.1f}",
                        _sum(r.counters, "exits.mmio."), _sum(r.counters, "trap.bar"),
                        *(r.counters.get(k, 0) for k in CSV_COUNTERS),
                        f"{r.sched.get('gpu_time_ns', 0) / 1e6:.3f}", r.sched.get("dispatches", 0),
                        f"{r.sched.get('mean_queue_delay_ns', 0) / 1e6:.3f}"])
    return path


def _init_close(r: VmRow) -> float:
    """The share of the VM's modelled time spent in Init and Close, in percent."""
    total = r.total_modelled_ns
    return 100 * (r.modelled_ns.get("Init", 0) + r.modelled_ns.get("Close", 0)) / total \
        if total else 0.0


# ------------------------------------------------------------------------- benchmarks
@dataclass
class ModeLine:
    """One mode's line of a benchmarks report: the means over repetitions of its VMs' modelled
    time and counts, which say where the time went."""

    mode: str
    vms: int
    passed: int
    modelled_ms: float
    init_close_pct: float
    exits: int
    traps: int
    syncs: int
    ptes_scanned: int
    hypercalls: int
    phase_modelled_ms: dict[str, float]
    makespan_ms: float = 0.0  # first VM start to last VM end of a run (mean over reps)


def mode_lines(rows: list[VmRow]) -> list[ModeLine]:
    """Per mode: means over repetitions of the sums over a run's VMs."""
    by_mode: dict[str, list[VmRow]] = defaultdict(list)
    for r in rows:
        by_mode[r.mode].append(r)
    out = []
    for mode, rs in by_mode.items():
        reps = len({r.rep for r in rs}) or 1

        def per_run(f) -> float:
            return sum(f(r) for r in rs) / reps
        out.append(ModeLine(
            mode, len(rs) // reps, sum(r.passed for r in rs) // reps,
            per_run(lambda r: r.total_modelled_ns) / 1e6,
            sum(_init_close(r) for r in rs) / len(rs),
            int(per_run(lambda r: _sum(r.counters, "exits."))),
            int(per_run(lambda r: _sum(r.counters, "trap.bar"))),
            int(per_run(lambda r: r.counters.get("shadow.syncs", 0))),
            int(per_run(lambda r: r.counters.get("shadow.ptes_scanned", 0))),
            int(per_run(lambda r: r.counters.get("hcall.calls", 0))),
            {p: per_run(lambda r: r.modelled_ns.get(p, 0)) / 1e6 for p in PHASES},
            makespan_ms(rs)))
    return out


def _mode_figure(scenario: str, lines: list[ModeLine], path: Path) -> Path:
    """Stacked modelled time by phase per mode: per VM run where the scenario has one VM,
    else the run's VMs summed (as the report's table sums them), each bar's total (and
    its ratio to native, where native ran) written inside the frame."""
    plt = pyplot()
    import matplotlib.ticker  # matplotlib: heavy, loaded with the first figure (sim.figure)

    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    names = [l.mode for l in lines]
    bottom = [0.0] * len(lines)
    for i, phase in enumerate(PHASES):
        values = [l.phase_modelled_ms[phase] for l in lines]
        bars = ax.bar(names, values, bottom=bottom, label=phase, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, values)]
    # linear, with each bar's total written on it: a log scale made stacked segments
    # unreadable; the totals are the table's modelled ms
    native = next((b for l, b in zip(lines, bottom) if l.mode == "native"), 0.0)
    ax.bar_label(bars, labels=[f"{b:,.1f}" + (f"\n×{b / native:.1f}" if native else "")
                               for b in bottom], fontsize=7)
    ax.set_ylim(0, 1.2 * max(bottom, default=0.0) or 1.0)  # headroom: labels stay inside
    vms = max((l.vms for l in lines), default=1)
    per = "per VM run" if vms == 1 else f"per run, its {vms} VMs summed"
    ax.set_ylabel(f"modelled (virtual) ms\n{per}")
    ax.set_title(f"{scenario}: modelled (virtual) time by phase, {per}"
                 + (", ×native" if native else ""), fontsize=10)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # off the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def benchmarks_report(exp: Experiment, rows: list[VmRow], out: Path) -> list[str]:
    md = []
    for scenario in exp.scenarios:
        srows = [r for r in rows if r.scenario == scenario.name]
        if not srows:
            md += [f"## {scenario.name}", "", "No run completed.", ""]
            continue
        lines = mode_lines(srows)
        native = next((l for l in lines if l.mode == "native"), None)
        fig = _mode_figure(scenario.name, lines, out / f"modes-{scenario.name}.png")
        benches = ", ".join(sorted({v.benchmark for v in scenario.vms}))
        md += [f"## {scenario.name}", "",
               f"{len(scenario.vms)} VM(s): {benches}.  Modelled = virtual time: each event "
               f"at its `{exp.cost_profile}` price, GPU work at the device profile's.", "",
               "| mode | VMs pass | modelled ms | makespan ms | x native "
               "| Init+Close % | exits | traps | shadow syncs | PTEs scanned "
               "| hypercalls | paper |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for l in lines:
            ratio = f"{l.modelled_ms / native.modelled_ms:.1f}" \
                if native and native.modelled_ms and l.modelled_ms else "-"
            md.append(f"| {l.mode} | {l.passed}/{l.vms} | {l.modelled_ms:,.1f} "
                      f"| {l.makespan_ms:,.1f} | {ratio} | {l.init_close_pct:.0f} | {l.exits:,} | {l.traps:,} "
                      f"| {l.syncs:,} | {l.ptes_scanned:,} | {l.hypercalls:,} "
                      f"| {PAPER_REFERENCE.get(l.mode, '')} |")
        md += ["", f"![modes]({fig.name})", ""]
    md += ["Paper: Init+Close take " + PAPER_REFERENCE["init+close"] + ".", "",
           "Tags in the paper column: [abstract] = stated in the paper's abstract; "
           "[note] = from the project's reading note of the paper's evaluation.  "
           "x native = modelled ms over native's; modelled ms is summed over a mode's VM "
           "runs; makespan ms = first VM start to last VM end of one run (its VMs ran at "
           "the same time); Init+Close % = share of modelled time in those phases; exits = "
           "all VM exits; traps = MMIO the mediator trapped; PTEs = page-table entries.", "",
           "The emulator's own wall time (its speed on this host, not a result; `gpuvm "
           "bench` measures it) is in results.csv's wall_ms column, kept out of this "
           "report so that a rerun gives it byte for byte.", ""]
    return md


# ------------------------------------------------------------------------- isolation
@dataclass
class Share:
    """A VM's GPU utilisation in the window where every VM competed, against its share.
    An empty window (one VM finished before another's first GPU work) measures nothing:
    its utilisation reads 0 but is not a result (`measured` is False; the report says
    n/a rather than an error of -share)."""

    vm: str
    share: float
    utilisation: float
    dispatches: int
    mean_queue_ms: float
    window_ns: int = 0

    @property
    def measured(self) -> bool:
        return self.window_ns > 0

    @property
    def error_pp(self) -> float:
        return 100 * (self.utilisation - self.share)


def _metrics(r: VmRow) -> VmMetrics:
    m = VmMetrics(added_at=int(r.sched.get("added_at", 0)))
    removed = int(r.sched.get("removed_at", -1))
    m.removed_at = None if removed < 0 else removed
    m.busy = [tuple(b) for b in r.busy]
    m.gpu_time_ns = int(r.sched.get("gpu_time_ns", 0))
    return m


def isolation_window(rows: list[VmRow]) -> tuple[int, int]:
    """Device time during which every VM of the run was competing for the GPU: from the
    last VM's first piece of GPU work to the end of the first VM's last one (a VM whose
    guest is still booting, or has finished, is not competing)."""
    start = max((min(s for s, _ in r.busy) if r.busy else int(r.sched.get("added_at", 0)))
                for r in rows)
    end = min((max(e for _, e in r.busy) for r in rows if r.busy), default=start)
    return start, max(start, end)


def shares_in_window(rows: list[VmRow]) -> tuple[tuple[int, int], list[Share]]:
    t0, t1 = isolation_window(rows)
    return (t0, t1), [Share(r.vm, r.share, _metrics(r).utilisation_between(t0, t1),
                            int(r.sched.get("dispatches", 0)),
                            float(r.sched.get("mean_queue_delay_ns", 0)) / 1e6, t1 - t0)
                      for r in rows]


def isolation_report(exp: Experiment, rows: list[VmRow], out: Path) -> list[str]:
    md = []
    for scenario in exp.scenarios:
        panels, table = [], []
        for policy in exp.policies:
            for mode in exp.modes:
                runs = [r for r in rows if r.scenario == scenario.name and r.policy == policy
                        and r.mode == mode and r.sched]
                for rep in sorted({r.rep for r in runs}):
                    run = [r for r in runs if r.rep == rep]
                    (t0, t1), shares = shares_in_window(run)
                    worst = max((abs(s.error_pp) for s in shares if s.measured), default=None)
                    table.append((policy, mode, rep, t1 - t0, shares, worst))
                    end = max((e for r in run for _, e in r.busy), default=t1)
                    panels.append(UtilisationPanel(
                        f"{scenario.name} — {policy.upper()} ({mode}, rep {rep}): "
                        + (f"max error {worst:.1f} pp" if worst is not None
                           else "no time with every VM competing"),
                        {r.vm: _metrics(r) for r in run},
                        {s.vm: s.share for s in shares}, (t0, t1), end))
        if not table:
            md += [f"## {scenario.name}", "", "No run completed.", ""]
            continue
        fig = render_panels(panels, out / f"isolation-{scenario.name}.png",
                            "device (virtual) time")
        md += [f"## {scenario.name}", "",
               "GPU utilisation of each VM while every VM was running (device time), "
               "against its share.", "",
               "| policy | mode | rep | window s | VM | share % | util % | error pp "
               "| dispatches | mean queue ms |", "|---|---|---|---|---|---|---|---|---|---|"]
        for policy, mode, rep, span, shares, worst in table:
            for s in shares:
                util, error = (f"{100 * s.utilisation:.1f}", f"{s.error_pp:+.1f}") \
                    if s.measured else ("n/a", "n/a")
                md.append(f"| {policy} | {mode} | {rep} | {span / 1e9:.2f} | {s.vm} "
                          f"| {100 * s.share:.1f} | {util} | {error} | {s.dispatches:,} "
                          f"| {s.mean_queue_ms:.2f} |")
        for policy in exp.policies:
            runs = [shares for p, _, _, _, shares, _ in table if p == policy
                    and all(s.measured for s in shares)]
            if not runs:
                if any(p == policy for p, *_ in table):
                    md.append(f"\n**{policy.upper()}**: n/a (no run had time with every "
                              f"VM competing for the GPU).")
                continue
            errors = [abs(s.error_pp) for shares in runs for s in shares]
            mean = sum(errors) / len(errors)
            line = f"\n**{policy.upper()}**: mean |util − share| {mean:.1f} pp " \
                   f"(worst {max(errors):.1f})"
            if policy == "band":
                line += (" — within" if mean <= BAND_TOLERANCE_PP else " — NOT within") + \
                    f" {BAND_TOLERANCE_PP:g} pp of the shares on average (Gdev reports 7%)"
            pair = runs[0]
            if len(pair) == 2 and pair[0].share != pair[1].share and pair[1].utilisation:
                line += f"; measured {pair[0].utilisation / pair[1].utilisation:.2f}:1 for " \
                        f"shares {pair[0].share / pair[1].share:.0f}:1"
            md.append(line + ".")
        md += ["", f"![isolation]({fig.name})", ""]
    return md


def reprice(exp: Experiment, rows: list[VmRow]) -> None:
    """A wall-clock run's modelled times from its stored exact counts and the
    experiment's current profile.  A virtual-clock run's are the virtual times it ran
    (with its profile), which contention makes more than its counts' prices."""
    if exp.clock != "wall":
        return
    costs = load_costs(exp.cost_profile)
    for r in rows:
        mediated = MODES[r.mode].mediated
        r.modelled_ns = {phase: costs.modelled_ns(c, mediated)
                         for phase, c in r.phase_counters.items()}


def write_report(exp: Experiment, rows: list[VmRow], out: Path, complete: bool = True,
                 resume: str = "") -> Path:
    """report.md, results.csv and figures in `out`; report.json records how many rows and
    which configuration the report was built from (so `--report` never replaces it by one
    built from fewer).  An incomplete run's report says so in its first lines."""
    reprice(exp, rows)
    write_csv(rows, out / "results.csv")
    planned = planned_vm_runs(exp)
    md = [f"# {exp.name}", ""]
    if not complete:
        md += [f"**INCOMPLETE**: the experiment was interrupted after {len(rows)} of "
               f"{planned} planned VM runs"
               + (f"; finish it with `{resume}`" if resume else "") + ".", ""]
    md += [exp.description, "",
           f"Modes: {', '.join(exp.modes)}; policies: {', '.join(exp.policies)}; repetitions: "
           f"{exp.repetitions}"
           + (", made in rounds (one run of every point a round)"
              if exp.order == "rounds" and exp.repetitions > 1 else "") + "; " + (
               f"device clock: virtual (each event at its price in {exp.cost_profile}; "
               f"results repeat on any host); "
               if exp.clock == "virtual" else
               f"device clock: wall time, scale {exp.time_scale:g}; ") + "backend: "
           f"{', '.join(sorted({r.backend for r in rows})) or exp.backend}.", "",
           f"Runs: {len(rows)} of {planned} planned VM runs, {sum(r.passed for r in rows)} "
           "passed.  Raw rows: `runs.jsonl`; table: `results.csv`.", ""]
    failed = [r for r in rows if not r.passed]
    if failed:
        md += ["Failed VMs:", ""] + [f"- {r.scenario}/{r.mode}/{r.policy}/{r.vm}: {r.error}"
                                     for r in failed] + [""]
    if exp.kind == "hostmem":
        md += hostmem_report(exp, rows, out)
    elif exp.kind == "oversubscription":
        md += oversubscription_report(exp, rows, out)
    else:
        md += (isolation_report if exp.kind == "isolation" else benchmarks_report)(exp, rows,
                                                                                   out)
    path = out / REPORT
    write_atomically(path, "\n".join(md) + "\n")
    write_atomically(out / REPORT_RECORD, json.dumps(
        {"rows": len(rows), "complete": complete, "config_sha256": config_hash(exp)}) + "\n")
    return path


def report_rows(out: Path) -> int | None:
    """How many rows the report in `out` was built from (None: no report recorded)."""
    try:
        return int(json.loads((out / REPORT_RECORD).read_text())["rows"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
