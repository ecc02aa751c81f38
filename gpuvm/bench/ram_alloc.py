"""`gpuvm bench ram-alloc`: guest RAM allocated as the VM is built against as the guest
first touches it, side by side in one process.

On demand, each first touch of a guest page is a host page fault taken inside KVM_RUN
(gpuvm.vmm.guest_ram): time no trace of the VMM's handlers shows, and for VMs that are
threads of one process, faults on one address space.  Each repetition runs every
(mode, VM count) both ways, in alternating order, after one unmeasured VM of the mode
(a process's first runs are slower); the table gives the makespans' spread and the
vCPU threads' CPU time per VM, and the ratio of the medians.

A first table times what building and closing one VM's RAM up front costs outside any
run: its pages made and freed each time, or kept and zeroed for the next VM
(gpuvm.vmm.ram_pool), by turns.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.table import Table

from gpuvm.errors import UserError
from gpuvm.mediator.modes import MODES
from gpuvm.run import RunError, VmSpec, run_vms
from gpuvm.run.cli import parse_modes
from gpuvm.run.spec import RunOptions
from gpuvm.vmm.abi import GUEST_RAM_DEFAULT
from gpuvm.vmm.backends import BACKENDS
from gpuvm.vmm.guest_ram import ALLOCATIONS, GuestRam
from gpuvm.vmm.ram_pool import RamPool

DEFAULT_MODES = "pv,fv-opt"
DEFAULT_VMS = "1,2,4,8"


@dataclass(frozen=True)
class AllocRun:
    """One run of `gpuvm bench ram-alloc`: how long a run of `vms` VMs took with guest RAM
    allocated one way, so the two ways compare within one run."""

    mode: str
    vms: int
    alloc: str
    rep: int
    makespan_ms: float
    cpu_per_vm_ms: float  # the vCPU threads' CPU time, per VM (0: not measured)


def measure(benchmark: str, params: tuple[int, ...], modes: list[str], counts: list[int],
            repeat: int, backend: str = "auto") -> list[AllocRun]:
    def run(mode: str, n: int, alloc: str) -> tuple[float, float]:
        specs = [VmSpec(f"vm{i}", benchmark, list(params), paravirtual=MODES[mode].pv,
                        ram_alloc=alloc) for i in range(n)]
        results = run_vms(specs, RunOptions(mode=mode, backend=backend))
        failed = [r.error() for r in results if not r.passed]
        if failed:
            raise RunError(f"{mode} x{n} ({alloc}): {failed[0]}")
        vcpus = [r.outcome.vcpu for r in results if r.outcome.vcpu is not None]
        return (max(r.wall_ns for r in results) / 1e6,
                sum(u.cpu_ns for u in vcpus) / n / 1e6 if vcpus else 0.0)

    out = []
    for mode in modes:
        run(mode, 1, ALLOCATIONS[0])  # unmeasured
    for rep in range(repeat):
        order = ALLOCATIONS if rep % 2 == 0 else ALLOCATIONS[::-1]
        for mode in modes:
            for n in counts:
                for alloc in order:
                    span, cpu = run(mode, n, alloc)
                    out.append(AllocRun(mode, n, alloc, rep, span, cpu))
    return out


def measure_build(size: int, repeat: int) -> dict[str, list[float]]:
    """ms to build and close a VM's RAM of `size` bytes populated up front, by turns: made
    and freed each time ("fresh"), and taken from and given back to a pool ("kept")."""
    out: dict[str, list[float]] = {"fresh": [], "kept": []}
    pools = {"fresh": RamPool(limit_bytes=0), "kept": RamPool()}
    GuestRam(size, prealloc=True, pool=pools["kept"]).close()  # one kept before
    for rep in range(repeat):
        for way in ("fresh", "kept") if rep % 2 == 0 else ("kept", "fresh"):
            t0 = time.perf_counter()
            GuestRam(size, prealloc=True, pool=pools[way]).close()
            out[way].append((time.perf_counter() - t0) * 1e3)
    pools["kept"].drain()
    return out


def print_build_table(times: dict[str, list[float]], title: str) -> None:
    t = Table(title=title)
    for col in ("RAM", "build + close ms\n(min-median-max)", "over fresh"):
        t.add_column(col, justify="right", overflow="fold")
    fresh = statistics.median(times["fresh"])
    for way, ms in times.items():
        ms = sorted(ms)
        t.add_row(way, f"{ms[0]:,.1f}-{statistics.median(ms):,.1f}-{ms[-1]:,.1f}",
                  f"{statistics.median(ms) / fresh:.2f}x")
    Console().print(t)


def print_table(runs: list[AllocRun], title: str) -> None:
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    # within 80 columns: headers on two lines, a cell too wide folds (never cut)
    for col in ("mode", "VMs", "immediate ms\nmin-median-max", "ondemand ms\nmin-median-max",
                "ondemand /\nimmediate", "vCPU ms a VM\nimm. / ond."):
        t.add_column(col, justify="right", overflow="fold")
    cells: dict[tuple[str, int, str], list[AllocRun]] = {}
    for r in runs:
        cells.setdefault((r.mode, r.vms, r.alloc), []).append(r)
    for mode, n in dict.fromkeys((r.mode, r.vms) for r in runs):
        imm, ond = cells[(mode, n, "immediate")], cells[(mode, n, "ondemand")]

        def spread(rs: list[AllocRun]) -> str:
            spans = sorted(r.makespan_ms for r in rs)
            return f"{spans[0]:,.1f}-{statistics.median(spans):,.1f}-{spans[-1]:,.1f}"

        def median(rs: list[AllocRun], field: str) -> float:
            return statistics.median(getattr(r, field) for r in rs)
        t.add_row(mode, str(n), spread(imm), spread(ond),
                  f"{median(ond, 'makespan_ms') / median(imm, 'makespan_ms'):.2f}x",
                  f"{median(imm, 'cpu_per_vm_ms'):,.1f} / {median(ond, 'cpu_per_vm_ms'):,.1f}")
    Console().print(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"default {DEFAULT_MODES}")
    parser.add_argument("--vms", default=DEFAULT_VMS, help=f"VM counts (default {DEFAULT_VMS})")
    parser.add_argument("--benchmark", default="mmul")
    parser.add_argument("--size", type=int, nargs="*", default=[128], metavar="N",
                        help="the benchmark's parameters (default 128)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--build-only", action="store_true",
                        help="only the first table: building a VM's RAM, kept or fresh")


def main_ram_alloc(args: argparse.Namespace) -> int:
    try:
        modes = parse_modes(args.modes)
        counts = [int(c) for c in args.vms.split(",")]
    except RunError as exc:
        raise UserError(f"bench ram-alloc: {exc}") from None
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or args.repeat < 1:
        raise UserError(f"bench ram-alloc: VM counts >= 1 and --repeat >= 1 (got --vms "
                        f"{args.vms} --repeat {args.repeat})")

    load = os.getloadavg()[0]
    builds = 4 * args.repeat
    print_build_table(measure_build(GUEST_RAM_DEFAULT, builds),
                      f"one VM's {GUEST_RAM_DEFAULT >> 20} MiB of RAM up front, made fresh vs "
                      f"kept (ram_pool): {builds} of each by turns, {os.cpu_count()} cores, "
                      f"load {load:.2f} before")
    if args.build_only:
        return 0
    try:
        runs = measure(args.benchmark, tuple(args.size), modes, counts, args.repeat,
                       args.backend)
    except RunError as exc:
        raise UserError(str(exc)) from None
    print_table(runs, f"guest RAM up front vs on demand: {args.benchmark} {args.size}, "
                      f"{args.repeat} repetitions alternated, {os.cpu_count()} cores, load "
                      f"{load:.2f} before")
    return 0
