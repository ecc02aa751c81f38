"""`gpuvm model FILE.toml`: the model of the whole system on an experiment file's
scenarios -- each VM replays the cached trace of its benchmark x mode (recorded on the
emulator once), priced by a cost profile, competing for the mediator and the engine
under the scheduler policy.  `--vms N` makes every scenario N VMs of its
kind (its VMs repeated in turn), so "1,024 VMs of this kind" needs no 1,024-VM run."""

from __future__ import annotations

import argparse

from gpuvm.errors import UserError
from gpuvm.vmm.backends import BACKENDS


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"bad VM counts {text!r} (want e.g. 1,2,4,8)") from None
    if not values or min(values) < 1:
        raise UserError(f"bad VM counts {text!r}: each must be at least 1")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment file (TOML)")
    parser.add_argument("--profile", default=None,
                        help="cost profile(s), comma-separated (default: the file's)")
    parser.add_argument("--vms", default=None, metavar="N[,N...]",
                        help="run every scenario with N VMs of its kind (several: a sweep)")
    parser.add_argument("--dask", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the points on Dask: a local cluster, or the scheduler at "
                             "ADDRESS")
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    parser.add_argument("--refresh", action="store_true", help="re-record the traces")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="backend that records missing traces")


def main(args: argparse.Namespace) -> int:
    import csv
    import sys

    from rich.console import Console
    from rich.table import Table

    from gpuvm.experiment.config import ConfigError, load
    from gpuvm.experiment.costs import load_costs
    from gpuvm.sim.sweep import points_for, run_sweep, traces_needed

    try:
        exp = load(args.config)
        profiles = (args.profile or exp.cost_profile).split(",")
        for name in profiles:
            load_costs(name)
    except (ConfigError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if not exp.scenarios:
        raise UserError(f"{args.config}: has no scenarios of its own (a suite? give one of "
                        "its files)")
    counts = _ints(args.vms) if args.vms else [0]
    points = points_for(exp, counts, profiles)
    traces = traces_needed(exp, points, args.backend, args.refresh)
    rows = run_sweep(exp, points, traces, args.dask,
                     progress=lambda line: print(f"model: {line}", file=sys.stderr))
    table = Table(title=f"{exp.name}: the model of the whole system")
    for col in ("scenario", "mode", "policy", "profile", "VMs", "VM alone ms",
                "makespan ms", "x alone", "events"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["scenario"], r["mode"], r["policy"], r["profile"],
                      f"{r['vms']:,}", f"{r['alone_ns'] / 1e6:,.2f}",
                      f"{r['makespan_ns'] / 1e6:,.2f}",
                      f"{r['makespan_ns'] / r['alone_ns']:.2f}" if r["alone_ns"] else "-",
                      f"{r['events']:,}")
    Console(width=150).print(table)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0
