"""`gpuvm bench vms`: several VMs at once, each with a GPU of its own, against one alone.

Each benchmark first runs alone (native mode, one VM, one emulated GPU), then all of them
run at the same time, each VM with its own GPU.  Wall times side by side in one run: what
concurrency costs when the VMs share nothing but this machine's cores (and Python's GIL).
"""

from __future__ import annotations

import argparse
import time

from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.vmm.backends import BACKENDS

DEFAULT = ("mmul", "madd", "fmadd", "memcpy")


def run_vms_bench(benchmarks: tuple[str, ...] = DEFAULT, backend: str = "auto") -> dict:
    from gpuvm.run import run_vms

    options = RunOptions(mode="native", backend=backend)
    alone = {}
    for i, bench in enumerate(benchmarks):
        t0 = time.perf_counter()
        (result,) = run_vms([VmSpec(f"vm{i}", bench)], options)
        alone[bench] = (time.perf_counter() - t0, result.passed)
    t0 = time.perf_counter()
    together = run_vms([VmSpec(f"vm{i}", b) for i, b in enumerate(benchmarks)], options)
    elapsed = time.perf_counter() - t0
    return {"backend": together[0].outcome.backend, "alone": alone, "together_s": elapsed,
            "together_passed": [r.passed for r in together],
            "together_vm_s": {b: r.wall_ns / 1e9
                              for b, r in zip(benchmarks, together)}}


def print_vms_bench(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    n = len(r["alone"])
    t = Table(title=f"{n} VMs at once vs one at a time (native, a GPU per VM, {r['backend']})")
    for col in ("benchmark", "alone s", f"in the {n}-VM run s", "pass"):
        t.add_column(col, justify="left" if col == "benchmark" else "right")
    for (bench, (secs, ok)), ok_together in zip(r["alone"].items(), r["together_passed"]):
        t.add_row(bench, f"{secs:.2f}", f"{r['together_vm_s'][bench]:.2f}",
                  "PASS" if ok and ok_together else "FAIL")
    sequential = sum(s for s, _ in r["alone"].values())
    slowest = max(s for s, _ in r["alone"].values())
    t.caption = (f"{n} at once: {r['together_s']:.2f} s elapsed, vs {sequential:.2f} s one "
                 f"after another ({r['together_s'] / sequential:.2f}x) and {slowest:.2f} s for "
                 f"the slowest alone ({r['together_s'] / slowest:.2f}x)")
    Console().print(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmarks", default=",".join(DEFAULT),
                        help="comma-separated benchmarks, one VM each")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)


def main_vms(args: argparse.Namespace) -> int:
    r = run_vms_bench(tuple(args.benchmarks.split(",")), args.backend)
    print_vms_bench(r)
    ok = all(ok for _, ok in r["alone"].values()) and all(r["together_passed"])
    return 0 if ok else 1
