"""`gpuvm bench sim`: how fast the simpy model runs as VMs are added.

Each VM submits kernels of 1-3 ms with ~200 us gaps; the engine is always busy, so the
work per simulated second is the same at any VM count and events/s should be too.  It
prints events/s at each count, their ratio (the cost of a VM more), and the wall time of
the largest run -- the target: 1,024 VMs x 60 s of virtual time in <= 60 s on one core.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from gpuvm.errors import UserError
from gpuvm.sim.model import simulate
from gpuvm.sim.scenarios import S, Scenario
from gpuvm.sim.workload import Dist, WorkloadSpec
from scheduler.params import MS, US


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vms", default="16,1024", help="VM counts (default 16,1024)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="virtual seconds per run (default 60)")
    parser.add_argument("--policy", default="band", choices=("fifo", "credit", "band"))


def scenario(vms: int, seconds: float) -> Scenario:
    specs = tuple(WorkloadSpec(f"vm{i}", Dist("uniform", 1 * MS, 3 * MS),
                               Dist("exponential", 200 * US)) for i in range(vms))
    return Scenario(f"bench-{vms}", specs, int(seconds * S))


def main_sim(args: argparse.Namespace) -> int:
    try:
        counts = [int(v) for v in args.vms.split(",")]
    except ValueError:
        raise UserError(f"--vms {args.vms!r}: want counts like 16,1024") from None
    if not counts or min(counts) < 1 or args.seconds <= 0:
        raise UserError("--vms counts and --seconds must be positive")
    table = Table(title=f"simpy model, {args.policy}, {args.seconds:g} s of virtual time")
    for col in ("VMs", "events", "wall s", "events/s", "kernels"):
        table.add_column(col, justify="right", overflow="fold")
    rates = []
    for n in counts:
        t0 = time.process_time()
        result = simulate(scenario(n, args.seconds), args.policy, seed=0, count_events=True)
        wall = time.process_time() - t0
        rate = (result.events or 0) / wall if wall else 0.0
        rates.append(rate)
        kernels = sum(m.dispatches for m in result.metrics.values())
        table.add_row(f"{n:,}", f"{result.events:,}", f"{wall:.2f}", f"{rate:,.0f}",
                      f"{kernels:,}")
    console = Console()
    console.print(table)
    if len(rates) > 1 and min(rates):
        console.print(f"events/s at {counts[0]:,} VMs vs {counts[-1]:,} VMs: "
                      f"{rates[0] / rates[-1]:.2f}x (target <= 2x); {counts[-1]:,} VMs x "
                      f"{args.seconds:g} s took {wall:.1f} s of CPU (target <= 60 s)")
    return 0
