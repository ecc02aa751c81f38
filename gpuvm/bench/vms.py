"""`gpuvm bench vms`: several VMs at once, each with a GPU of its own, against one alone.

Each distinct benchmark first runs alone (one VM, one emulated GPU), then all the VMs
run at the same time, each with its own GPU (native mode) or its own vGPU of one GPU.
Wall times side by side in one run: what concurrency costs when the VMs share nothing
but this machine's cores (and Python's GIL, unless --isolated puts each VM in its own
VMM process).  On KVM the whole comparison runs twice, with the coalesced-MMIO ring off
(every posted store exits) and on, so what the ring saves is measured in the same run;
each VM's exits to userspace are shown beside its wall time.  With --isolated and the
ring on, `--posted both` also runs the ring's pass with each drained store sent as a
vfio-user message of its own (not one REGION_WRITE_MULTI a drain), so what one message a
drain saves the mediator's process is measured in the same run too.  `--repeats N` runs
each pass N times over, alone then all at once each time, for the spread of the ratios
(the makespan of eight starting processes varies by a fifth from one run to the next on
the 16-core machine): lowest-highest and the median.
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from gpuvm.bench.timing import span
from gpuvm.errors import UserError
from gpuvm.experiment.costs import mmio_exits
from gpuvm.mediator.modes import MODES
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.vmm.backends import BACKENDS, resolve_backend
from gpuvm.vmm.kvm.runner import coalescing
from gpuvm.vmm.kvm.vcpu import COALESCED_STORES, DIRECT_ACCESSES
from gpuvm.vmm.vm_process import posting

DEFAULT = ("mmul", "madd", "fmadd", "memcpy")
RINGS = {"both": (False, True), "on": (True,), "off": (False,)}
POSTED = {"both": (False, True), "on": (True,), "off": (False,)}
# a pass's key -> what the table's title says of it
PASS_NAMES = {"off": "coalesced MMIO off", "on": "coalesced MMIO on",
              "unposted": "coalesced MMIO on, one vfio-user message a drained store"}


def kvm_exits(result) -> int:
    """A VM's exits to userspace: the trapped accesses it counted, less those that
    came through the coalesced ring or went to pages mapped as memory."""
    totals: dict[str, int] = {}
    for p in result.session.phases:
        for k, v in p.counters.items():
            totals[k] = totals.get(k, 0) + v
    return mmio_exits(totals) + totals.get("exits.io", 0) - totals.get(COALESCED_STORES, 0) \
        - totals.get(DIRECT_ACCESSES, 0)


def _one_pass(specs: list[VmSpec], options: RunOptions) -> dict:
    alone = {}
    for spec in specs:
        if spec.benchmark in alone:
            continue
        t0 = time.perf_counter()
        (result,) = run_vms([VmSpec(spec.name, spec.benchmark, spec.params)], options)
        alone[spec.benchmark] = {"elapsed_s": time.perf_counter() - t0,
                                 "s": result.wall_ns / 1e9, "passed": result.passed,
                                 "exits": kvm_exits(result)}
    t0 = time.perf_counter()
    together = run_vms(specs, options)
    served = [r.served for r in together if r.served is not None]
    return {"alone": alone, "together_s": time.perf_counter() - t0,
            # VMs in their own processes: the time the server's one thread spent
            # answering their accesses (each VM waits for that thread)
            "served_s": sum(t.access_ns for t in served) / 1e9 if served else None,
            "vms": [{"name": s.name, "benchmark": s.benchmark, "s": r.wall_ns / 1e9,
                     "passed": r.passed, "exits": kvm_exits(r)}
                    for s, r in zip(specs, together)]}


def _repeated(specs: list[VmSpec], options: RunOptions, repeats: int) -> dict:
    """The last of `repeats` passes, with every pass's ratios of all at once to the
    slowest alone: elapsed (`elapsed_ratios`) and the guests' phases (`guest_ratios`)."""
    runs = [_one_pass(specs, options) for _ in range(repeats)]
    last = dict(runs[-1])
    last["elapsed_ratios"] = [r["together_s"] / max(a["elapsed_s"] for a in r["alone"].values())
                              for r in runs]
    last["guest_ratios"] = [max(vm["s"] for vm in r["vms"]) /
                            max(a["s"] for a in r["alone"].values()) for r in runs]
    return last


def run_vms_bench(benchmarks: tuple[str, ...] = DEFAULT, backend: str = "auto",
                  mode: str = "native", size: int | None = None, isolated: bool = False,
                  ring: str = "both", posted: str = "on", repeats: int = 1) -> dict:
    """Each distinct benchmark alone, then one VM per entry of `benchmarks` at once, with
    the coalesced ring off and/or on (`ring`: both, on, off; only KVM has a ring), and
    an isolated VMM's drained stores in one message and/or one each (`posted`); each
    pass `repeats` times over (see `_repeated`)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    backend = resolve_backend(backend)
    rings = RINGS[ring] if backend == "kvm" else (True,)
    # the wall clock: this bench measures the emulator's own speed, VMs running side by
    # side; on the virtual clock they take turns at the mediator's lock in virtual-time
    # order (on one core when they are threads), which is what makes results repeat
    options = RunOptions(mode=mode, backend=backend, isolated=isolated, clock="wall")
    specs = [VmSpec(f"vm{i}", b, [size] if size else []) for i, b in enumerate(benchmarks)]
    passes = {}
    for on in rings:
        for post in POSTED[posted] if on and isolated and backend == "kvm" else (True,):
            with coalescing(on), posting(post):
                passes["off" if not on else "on" if post else "unposted"] = \
                    _repeated(specs, options, repeats)
    return {"backend": backend, "mode": mode, "size": size, "isolated": isolated,
            "repeats": repeats, "passes": passes}


def print_vms_bench(r: dict) -> None:
    console = Console()
    for ring, p in r["passes"].items():
        n = len(p["vms"])
        where = "processes" if r["isolated"] else "threads"
        t = Table(title=f"{n} VMs at once vs one at a time ({r['mode']}, {r['backend']}, "
                        f"VMs as {where}, {PASS_NAMES[ring]})")
        for col in ("VM", "benchmark", "alone s", f"in the {n}-VM run s", "exits alone",
                    "exits in the run", "pass"):
            t.add_column(col, justify="left" if col in ("VM", "benchmark") else "right")
        for vm in p["vms"]:
            a = p["alone"][vm["benchmark"]]
            t.add_row(vm["name"], vm["benchmark"], f"{a['s']:.2f}", f"{vm['s']:.2f}",
                      f"{a['exits']:,}", f"{vm['exits']:,}",
                      "PASS" if a["passed"] and vm["passed"] else "FAIL")
        slowest = max(a["elapsed_s"] for a in p["alone"].values())
        t.caption = (f"s: the guest's phases; {n} at once: {p['together_s']:.2f} s elapsed "
                     f"(machine set-up included), {p['together_s'] / slowest:.2f}x the "
                     f"slowest alone ({slowest:.2f} s)")
        if r["repeats"] > 1:
            t.caption = (f"the last of {r['repeats']} repeats, each alone then at once. "
                         f"{t.caption}.  Over the repeats: elapsed "
                         f"{_ratios(p['elapsed_ratios'])}, the guests' phases "
                         f"{_ratios(p['guest_ratios'])} the slowest alone")
        if p.get("served_s") is not None:
            ran = max(vm["s"] for vm in p["vms"])
            t.caption += (f"; the server's one thread answered their accesses for "
                          f"{p['served_s']:.2f} s of the {ran:.2f} s the guests ran")
        console.print(t)
    for slow, fast, what in (("off", "on", "with the coalesced ring (off / on, this run)"),
                             ("unposted", "on", "with a drain in one message (one a store / "
                                                "one a drain, this run)")):
        if {slow, fast} <= r["passes"].keys():
            console.print(f"{what}: " + _speedups(r["passes"][slow], r["passes"][fast]))


def _ratios(xs: list[float]) -> str:
    return f"{span(xs, '.2f')}x (median {statistics.median(xs):.2f}x)"


def _speedups(slow: dict, fast: dict) -> str:
    lines = [f"{b}: alone {slow['alone'][b]['s'] / fast['alone'][b]['s']:.1f}x faster"
             for b in fast["alone"]]
    lines.append(f"all at once: {slow['together_s'] / fast['together_s']:.1f}x faster")
    return "; ".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmarks", default=",".join(DEFAULT),
                        help="comma-separated benchmarks, one VM each (repeat one for "
                             "several VMs of it: mmul,mmul,...)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--mode", default="native", choices=list(MODES),
                        help="native: a GPU per VM; a mediated mode: a vGPU each on one GPU")
    parser.add_argument("--size", type=int, default=0,
                        help="params[0] of every VM (default: each benchmark's own)")
    parser.add_argument("--isolated", action="store_true",
                        help="each VM in its own VMM process")
    parser.add_argument("--ring", choices=list(RINGS), default="both",
                        help="KVM's coalesced MMIO off, on, or both in turn (default)")
    parser.add_argument("--posted", choices=list(POSTED), default="on",
                        help="with --isolated and the ring on: each drain of the ring in "
                             "one vfio-user message (on, default), one message a store "
                             "(off), or both in turn")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each pass this many times over, alone then all at once "
                             "each time: the spread and median of the ratios (default "
                             "%(default)s)")


def main_vms(args: argparse.Namespace) -> int:
    benchmarks = tuple(b for b in args.benchmarks.split(",") if b)
    if not benchmarks:
        raise UserError("--benchmarks: name at least one benchmark")
    if args.size < 0:
        raise UserError("--size must be at least 1")
    if args.repeats < 1:
        raise UserError("--repeats must be at least 1")
    r = run_vms_bench(benchmarks, args.backend, args.mode, args.size or None,
                      args.isolated, args.ring, args.posted, args.repeats)
    print_vms_bench(r)
    ok = all(a["passed"] for p in r["passes"].values() for a in p["alone"].values()) and \
        all(vm["passed"] for p in r["passes"].values() for vm in p["vms"])
    return 0 if ok else 1
