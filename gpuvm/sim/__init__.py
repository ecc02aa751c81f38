"""The simpy scaling model: simulated VMs, one non-preemptive engine, and the same
Dispatcher and policies the mediator uses.  `python -m gpuvm.sim` runs the isolation
scenarios and writes their figures."""

from gpuvm.sim.figure import render_utilisation
from gpuvm.sim.model import simulate
from gpuvm.sim.results import SimResult, VmSummary, format_summary, summary_table
from gpuvm.sim.scenarios import SCENARIOS, Scenario, isolation_2vm, staggered_4vm
from gpuvm.sim.workload import Dist, WorkloadSpec

__all__ = [
    "Dist", "SCENARIOS", "Scenario", "SimResult", "VmSummary", "WorkloadSpec",
    "format_summary", "isolation_2vm", "render_utilisation", "simulate",
    "staggered_4vm", "summary_table",
]
