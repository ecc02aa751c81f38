"""A finished simulation: per-VM metrics and the summary an isolation report needs."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.table import Table

from gpuvm.sim.scenarios import Scenario
from scheduler.metrics import VmMetrics
from scheduler.policy import PolicyCounters


@dataclass(frozen=True)
class VmSummary:
    """One VM over the scenario's measure window (every VM active)."""

    vm: str
    share: float           # normalised nominal share
    utilisation: float     # GPU time / window length, exact
    gpu_time_ns: int       # over the whole run
    dispatches: int
    mean_queue_delay_ns: float
    max_queue_delay_ns: int
    demotions: int
    yield_waits: int
    kept_turns: int

    @property
    def error_pp(self) -> float:
        """Utilisation minus share, in percentage points."""
        return 100.0 * (self.utilisation - self.share)


@dataclass
class SimResult:
    """What one simulation came to: per-VM metrics and policy counters over the run."""

    scenario: Scenario
    policy: str
    seed: int
    end_ns: int
    metrics: dict[str, VmMetrics]
    counters: dict[str, PolicyCounters]
    events: int | None = None  # simpy events processed, when counted

    def summary(self) -> list[VmSummary]:
        t0, t1 = self.scenario.measure_window
        shares = self.scenario.nominal_shares()
        rows = []
        for spec in self.scenario.vms:
            m = self.metrics.get(spec.name)
            c = self.counters.get(spec.name, PolicyCounters())
            if m is None:  # never started within the run
                continue
            rows.append(VmSummary(
                vm=spec.name, share=shares[spec.name],
                utilisation=m.utilisation_between(t0, t1), gpu_time_ns=m.gpu_time_ns,
                dispatches=m.dispatches, mean_queue_delay_ns=m.mean_queue_delay_ns,
                max_queue_delay_ns=m.queue_delay_max_ns, demotions=c.demotions,
                yield_waits=c.yield_waits, kept_turns=c.kept_turns))
        return rows

    def max_error_pp(self) -> float:
        """The largest |utilisation - share| over the VMs, in percentage points."""
        return max(abs(row.error_pp) for row in self.summary())

    def event_counts(self) -> dict[str, int]:
        """Exact counts per VM, for checking that reruns are identical."""
        out: dict[str, int] = {}
        for vm, m in sorted(self.metrics.items()):
            c = self.counters.get(vm, PolicyCounters())
            for key, value in (("submitted", m.submitted), ("dispatches", m.dispatches),
                               ("completions", m.completions), ("gpu_time_ns", m.gpu_time_ns),
                               ("demotions", c.demotions), ("yield_waits", c.yield_waits),
                               ("kept_turns", c.kept_turns)):
                out[f"{vm}.{key}"] = value
        return out

    def utilisation_series(self, step_ns: int, window_ns: int
                           ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sliding-window utilisation of every VM on a common time grid."""
        times = np.arange(step_ns, self.end_ns + 1, step_ns, dtype=np.int64)
        return times, {vm: m.utilisation_series(times, window_ns)
                       for vm, m in self.metrics.items()}


def summary_table(results: Sequence[SimResult]) -> Group:
    """Every VM of every run, utilisation against share: a table per scenario, each
    within 80 columns."""
    tables: dict[str, Table] = {}
    for result in results:
        name = result.scenario.name
        if name not in tables:
            tables[name] = table = Table(
                title=f"{name}: GPU utilisation while all VMs are active (share vs "
                      f"measured)", title_justify="left", box=box.SIMPLE_HEAD,
                show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
            for col, justify in (("policy", "left"), ("vm", "left"), ("share\n%", "right"),
                                 ("util\n%", "right"), ("error\npp", "right"),
                                 ("dis-\npatches", "right"), ("queue ms\nmean/max", "right"),
                                 ("demo-\ntions", "right"), ("waits/\nkept", "right")):
                table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        table = tables[name]
        for row in result.summary():
            table.add_row(result.policy, row.vm,
                          f"{100 * row.share:.1f}", f"{100 * row.utilisation:.1f}",
                          f"{row.error_pp:+.1f}", str(row.dispatches),
                          f"{row.mean_queue_delay_ns / 1e6:.2f}/"
                          f"{row.max_queue_delay_ns / 1e6:.1f}",
                          str(row.demotions), f"{row.yield_waits}/{row.kept_turns}")
        table.add_section()
    return Group(*tables.values())


def format_summary(results: Sequence[SimResult], width: int = 150) -> str:
    """The summary table as plain text (for logs and reports)."""
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(summary_table(results))
    return console.export_text()
