"""`gpuvm bench host`: how steady this host's cores are -- a fixed piece of CPU work
timed back to back.

Everything else this lab times (a trap, a VM's makespan, a model's error against the
emulator) rides on the host's cores running at one speed.  On the lent 16-core machines
(themselves virtual machines) they did not: this loop took ~9 ms or 15-22 ms by turns,
for a second or so at a time, pinned to any one of the 16 cores as well (README, "What
it measures"), and a 25 ms pv run landed on one speed whole (gpuvm.calibrate.validation.measure takes the fastest of
several short runs for that reason).  This bench says whether a host does that before
its numbers are trusted: each run is the same loop; a run counts as slow where it took
over SLOW_FACTOR times the fastest; with `--cpus` the thread is pinned to each listed
core in turn, and each core gets its row.  `gpuvm calibrate --emulator` samples every
core with the same loop while it measures (gpuvm.calibrate.core_speed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from typing import Sequence

from gpuvm.calibrate.core_speed import SLOW_FACTOR, spin

DEFAULT_RUNS = 300  # ~4 s: the lent machines changed speed every second or so
DEFAULT_WORK = 200_000  # loop iterations a run: ~10 ms of CPython on the lent machine


@dataclass(frozen=True)
class HostRun:
    cpu: int | None  # the core the thread was pinned to (None: not pinned)
    at_s: float  # when it started, from the first run's start
    ms: float


def measure(runs: int, work: int, cpus: Sequence[int] = ()) -> list[HostRun]:
    """`runs` timed runs of `spin(work)` back to back; with `cpus`, run i pinned to
    cpus[i % len(cpus)] (the thread's affinity restored after)."""
    before = os.sched_getaffinity(0) if cpus else None
    out: list[HostRun] = []
    start = time.perf_counter()
    try:
        for i in range(runs):
            cpu = cpus[i % len(cpus)] if cpus else None
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            t0 = time.perf_counter()
            spin(work)
            t1 = time.perf_counter()
            out.append(HostRun(cpu, t0 - start, (t1 - t0) * 1e3))
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
    return out


@dataclass(frozen=True)
class Steadiness:
    runs: int
    fastest_ms: float
    median_ms: float
    slowest_ms: float
    slow: int  # runs over SLOW_FACTOR x the fastest of all
    longest_slow_streak: int  # slow runs in a row

    @property
    def spread(self) -> float:
        return self.slowest_ms / self.fastest_ms


def steadiness(times_ms: Sequence[float], fastest_ms: float | None = None) -> Steadiness:
    """Of runs in the order they ran; `fastest_ms` is what "slow" is measured against
    (default: the fastest of these)."""
    if not times_ms:
        raise ValueError("no runs")
    fastest = min(times_ms) if fastest_ms is None else fastest_ms
    streak = longest = slow = 0
    for ms in times_ms:
        if ms > SLOW_FACTOR * fastest:
            slow += 1
            streak += 1
            longest = max(longest, streak)
        else:
            streak = 0
    return Steadiness(len(times_ms), min(times_ms), statistics.median(times_ms),
                      max(times_ms), slow, longest)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                        help=f"timed runs (default {DEFAULT_RUNS})")
    parser.add_argument("--work", type=int, default=DEFAULT_WORK,
                        help=f"loop iterations a run (default {DEFAULT_WORK:,})")
    parser.add_argument("--cpus", default="", help="pin run i to the i-th of these cores "
                        "in turn, e.g. 0,3,7 (default: not pinned)")


def main_host(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from gpuvm.errors import UserError

    try:
        cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else []
    except ValueError:
        raise UserError(f"bench host: bad --cpus {args.cpus!r} (want e.g. 0,3,7)") from None
    allowed = os.sched_getaffinity(0)
    if any(c not in allowed for c in cpus):
        raise UserError(f"bench host: --cpus {args.cpus}: this process may run on "
                        f"{sorted(allowed)} only")
    if args.runs < 2 or args.work < 1:
        raise UserError(f"bench host: --runs >= 2 and --work >= 1 (got --runs {args.runs} "
                        f"--work {args.work})")
    load = os.getloadavg()[0]
    runs = measure(args.runs, args.work, cpus)
    fastest = min(r.ms for r in runs)
    t = Table(title=f"the same loop ({args.work:,} iterations) timed {args.runs} times back "
                    f"to back over {runs[-1].at_s:.1f} s; {os.cpu_count()} cores, load "
                    f"{load:.2f} before; slow: over {SLOW_FACTOR}x the fastest of all")
    for col in ("cores", "runs", "fastest ms", "median ms", "slowest ms", "slowest/fastest",
                "slow runs", "most slow in a row"):
        t.add_column(col, justify="right", overflow="fold")

    def row(name: str, s: Steadiness) -> None:
        t.add_row(name, str(s.runs), f"{s.fastest_ms:.2f}", f"{s.median_ms:.2f}",
                  f"{s.slowest_ms:.2f}", f"{s.spread:.2f}x", f"{s.slow}",
                  str(s.longest_slow_streak))
    row("all" if not cpus else "pinned, all", steadiness([r.ms for r in runs]))
    for cpu in dict.fromkeys(cpus):
        row(f"core {cpu}", steadiness([r.ms for r in runs if r.cpu == cpu], fastest))
    Console().print(t)
    return 0
