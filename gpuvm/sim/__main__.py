"""`python -m gpuvm.sim`: run the isolation scenarios under each policy, print the
summary table and write one utilisation figure per scenario."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from gpuvm.sim.figure import render_utilisation
from gpuvm.sim.model import simulate
from gpuvm.sim.results import summary_table
from gpuvm.sim.scenarios import SCENARIOS
from scheduler.config import POLICIES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuvm.sim", description=__doc__)
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--policy", choices=[*POLICIES, "all"], default="all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("results/sim"),
                        help="directory for the PNG figures")
    args = parser.parse_args(argv)
    scenarios = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    everything = []
    for name in scenarios:
        results = [simulate(SCENARIOS[name](), policy, seed=args.seed) for policy in policies]
        figure = render_utilisation(results, args.out / f"{name}.png")
        print(f"wrote {figure}", file=sys.stderr)
        everything.extend(results)
    Console().print(summary_table(everything))  # 80 columns when piped
    return 0


if __name__ == "__main__":
    sys.exit(main())
