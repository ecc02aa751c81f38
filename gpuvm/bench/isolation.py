"""`gpuvm bench isolation`: N VMs on one shared GPU as threads of one process, then as
VMM processes attached over vfio-user, wall times side by side in one run.

In one process every VM's vCPU and its trap handling share one interpreter lock, so N
VMs use at most one core; in their own processes only the mediator's side of each trap
(the server) stays in the shared process.  The ratio says what that buys on this host
(it needs spare cores to show anything).  Each run's counts are also compared: the two
ways must do the same work.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from gpuvm.errors import UserError
from gpuvm.run import run_vms
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.vmm.backends import BACKENDS

DEFAULT_VMS = 8


def run_isolation_bench(vms: int = DEFAULT_VMS, benchmark: str = "mmul",
                        params: tuple[int, ...] = (128,), mode: str = "fv-opt",
                        backend: str = "auto") -> dict:
    specs = [VmSpec(f"vm{i}", benchmark, list(params)) for i in range(vms)]
    out: dict = {"vms": vms, "benchmark": benchmark, "params": list(params), "mode": mode}
    counts = {}
    for label, isolated in (("threads", False), ("processes", True)):
        options = RunOptions(mode=mode, backend=backend, isolated=isolated)
        t0 = time.perf_counter()
        results = run_vms(specs, options)
        out[f"{label}_s"] = time.perf_counter() - t0
        out[f"{label}_passed"] = all(r.passed for r in results)
        out["backend"] = results[0].outcome.backend
        counts[label] = [{p.name: {k: v for k, v in p.counters.items()
                                   if not k.startswith(("sched.", "exits."))}
                          for p in r.session.phases} for r in results]
    out["ratio"] = out["threads_s"] / out["processes_s"]
    out["same_counts"] = counts["threads"] == counts["processes"]
    return out


def print_isolation_bench(r: dict) -> None:
    table = Table(title=f"{r['vms']} VMs of {r['benchmark']} {r['params']} ({r['mode']}, "
                        f"{r['backend']}) on one GPU")
    table.add_column("VMs as")
    table.add_column("wall s", justify="right")
    table.add_column("passed")
    table.add_row("threads of one process", f"{r['threads_s']:.2f}",
                  str(r["threads_passed"]))
    table.add_row("processes over vfio-user", f"{r['processes_s']:.2f}",
                  str(r["processes_passed"]))
    table.caption = (f"threads / processes = {r['ratio']:.2f}x; same device counts: "
                     f"{r['same_counts']}")
    Console().print(table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vms", type=int, default=DEFAULT_VMS, help="VMs (default 8)")
    parser.add_argument("--benchmark", default="mmul")
    parser.add_argument("--param", type=int, action="append", default=None,
                        help="benchmark parameter (default mmul 128)")
    parser.add_argument("--mode", default="fv-opt")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--json", action="store_true")


def main_isolation(args: argparse.Namespace) -> int:
    if args.vms < 1:
        raise UserError("--vms must be at least 1")
    try:
        r = run_isolation_bench(args.vms, args.benchmark, tuple(args.param or (128,)),
                                args.mode, args.backend)
    except RunError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_isolation_bench(r)
    return 0
