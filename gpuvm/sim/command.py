"""`gpuvm model FILE.toml`: the model of the whole system on an experiment file's
scenarios -- each VM replays the cached trace of its benchmark x mode (recorded on the
emulator once), priced by a cost profile, competing for the mediator, the engine under
the scheduler policy, and the host cores.  `--vms N` makes every scenario N VMs of its
kind (its VMs repeated in turn), so "1,024 VMs of this kind" needs no 1,024-VM run."""

from __future__ import annotations

import argparse
import time

from gpuvm.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment file (TOML)")
    parser.add_argument("--profile", default=None,
                        help="cost profile (default: the file's; `emulator` predicts this "
                             "emulator)")
    parser.add_argument("--cores", type=int, default=None,
                        help="host cores (default: the profile's host_cores)")
    parser.add_argument("--vms", type=int, default=None,
                        help="run every scenario with this many VMs of its kind")
    parser.add_argument("--refresh", action="store_true", help="re-record the traces")
    parser.add_argument("--backend", choices=("kvm", "inproc", "auto"), default="auto",
                        help="backend that records missing traces")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gpuvm.experiment.config import ConfigError, load
    from gpuvm.experiment.costs import load_costs
    from gpuvm.mediator.modes import MODES
    from gpuvm.sim.replay import replay, trace_from_row
    from gpuvm.sim.traces import TraceKey, load_trace

    try:
        exp = load(args.config)
        costs = load_costs(args.profile or exp.cost_profile)
    except (ConfigError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if not exp.scenarios:
        raise UserError(f"{args.config}: has no scenarios of its own (a suite? give one of "
                        "its files)")
    if args.vms is not None and args.vms < 1:
        raise UserError(f"--vms {args.vms}: must be at least 1")
    cores = args.cores or int(costs.host_cores)
    table = Table(title=f"{exp.name}: the model, priced by {costs.name}, {cores} host cores")
    for col in ("scenario", "mode", "policy", "VMs", "VM alone ms", "makespan ms",
                "x alone", "events", "wall s"):
        table.add_column(col, justify="right")
    for scenario in exp.scenarios:
        vms = list(scenario.vms)
        if args.vms:
            vms = [vms[i % len(vms)] for i in range(args.vms)]
        for mode in exp.modes:
            traces = []
            for i, vm in enumerate(vms):
                data = load_trace(TraceKey(vm.benchmark, vm.params, mode), args.backend,
                                  refresh=args.refresh and i < len(scenario.vms))
                traces.append(trace_from_row({"vm": f"{vm.name}.{i}", "start_s": vm.start_s,
                                              "share": vm.share, **data},
                                             costs, MODES[mode].mediated))
            for policy in exp.policies if MODES[mode].mediated else exp.policies[:1]:
                t0 = time.process_time()
                result = replay(traces, cores=cores, policy=policy)
                wall = time.process_time() - t0
                alone = max(t.alone_ns for t in traces)
                table.add_row(scenario.name, mode, policy, f"{len(traces):,}",
                              f"{alone / 1e6:,.2f}", f"{result.makespan_ns / 1e6:,.2f}",
                              f"{result.makespan_ns / alone:.2f}" if alone else "-",
                              f"{result.events:,}", f"{wall:.2f}")
    Console(width=140).print(table)
    return 0
