"""`gpuvm bench recording`: what recording a VM's events costs it -- one VM run plain and
run recorded, by turns.

The model replays traces recorded per event (gpuvm.vmm.event_trace), and
`gpuvm calibrate --emulator` sets each VM count's run beside the replay of a trace
recorded just before it: whatever the recorder adds to a trace shows up there as the
model's error.  The recorder's hot path is two clock reads and a few integer operations
per event, and one more call frame around the device and KVM_RUN; on the exit path,
where every object touched after KVM_RUN is cold (gpuvm.vmm.kvm.vcpu), that costs more
than it does in a warm loop.  So this bench measures it the one way that counts it all:
the same single VM, plain and recorded, in pairs back to back (the host's speed drifts
within minutes, so only a pair's own difference means something), per mode.  The
recorded side is the trace's own time (handler and between-event time: what the model
replays), the plain side the run's makespan, as `calibrate --emulator` compares them.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from gpuvm.vmm.backends import BACKENDS

DEFAULT_MODES = "fv,fv-opt,pv"
DEFAULT_PAIRS = 8
DEFAULT_BENCHMARK = "mmul"
DEFAULT_SIZE = 128


@dataclass(frozen=True)
class Pair:
    """One plain run and the recorded run right after it."""

    plain_ns: int
    traced_ns: int  # the trace's own time (gpuvm.calibrate.validation.trace_ns)
    events: int

    @property
    def per_event_ns(self) -> float:
        return (self.traced_ns - self.plain_ns) / max(1, self.events)

    @property
    def ratio(self) -> float:
        return self.traced_ns / self.plain_ns


def measure(benchmark: str, params: tuple[int, ...], mode: str, pairs: int,
            backend: str = "auto",
            progress: Callable[[str], None] = lambda line: None) -> list[Pair]:
    """`pairs` pairs of (plain run, recorded run) of one VM, after one unmeasured run
    (a mode's first run after another's is slower)."""
    from gpuvm.calibrate.validation import trace_ns
    from gpuvm.experiment.execute import run_alike
    from gpuvm.run.spec import RunOptions
    from gpuvm.sim.traces import TraceKey, record_run

    options = RunOptions(mode=mode, backend=backend)
    run_alike(benchmark, params, 1, options, f"{mode} (warm-up)")
    key = TraceKey(benchmark, params, mode, False)
    out = []
    for i in range(pairs):
        plain = max(r.wall_ns for r in run_alike(benchmark, params, 1, options, mode))
        trace = record_run(key, backend)
        out.append(Pair(plain, trace_ns(trace), int(trace["events"].events.sum())))
        progress(f"{mode} pair {i + 1}: plain {plain / 1e6:,.1f} ms, recorded "
                 f"{out[-1].traced_ns / 1e6:,.1f} ms")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", default=DEFAULT_MODES,
                        help=f"modes, comma-separated (default {DEFAULT_MODES})")
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS,
                        help=f"plain/recorded pairs per mode (default {DEFAULT_PAIRS})")
    parser.add_argument("--benchmark", default=DEFAULT_BENCHMARK,
                        help=f"the VM's benchmark (default {DEFAULT_BENCHMARK})")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE,
                        help=f"its size (default {DEFAULT_SIZE})")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)


def summary(pairs: Sequence[Pair]) -> tuple[float, float, float, float]:
    """(median, min, max) of the per-event cost in us, and the median trace/plain."""
    us = [p.per_event_ns / 1e3 for p in pairs]
    return (statistics.median(us), min(us), max(us),
            statistics.median(p.ratio for p in pairs))


def main_recording(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console
    from rich.table import Table

    from gpuvm.errors import UserError
    from gpuvm.mediator.modes import MODES

    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UserError(f"bench recording: unknown mode {unknown[0] if unknown else '(none)'!r}"
                        f" (have {', '.join(MODES)})")
    if args.pairs < 1 or args.size < 1:
        raise UserError(f"bench recording: --pairs and --size must be >= 1 (got "
                        f"--pairs {args.pairs} --size {args.size})")
    progress = lambda line: print(f"… {line}", file=sys.stderr, flush=True)  # noqa: E731
    load = os.getloadavg()[0]
    t = Table(title=f"one VM of {args.benchmark} [{args.size}] run plain, then recorded, "
                    f"{args.pairs} pairs a mode; {os.cpu_count()} cores, load {load:.2f} "
                    f"before")
    for col in ("mode", "events", "plain ms (median)", "recorded ms (median)",
                "recorded/plain", "us per event (median)", "min, max over pairs"):
        t.add_column(col, justify="right")
    for mode in modes:
        try:
            pairs = measure(args.benchmark, (args.size,), mode, args.pairs, args.backend,
                            progress)
        except (RuntimeError, ValueError) as exc:
            raise UserError(f"bench recording: {exc}") from None
        us, low, high, ratio = summary(pairs)
        t.add_row(mode, f"{pairs[0].events:,}",
                  f"{statistics.median(p.plain_ns for p in pairs) / 1e6:,.1f}",
                  f"{statistics.median(p.traced_ns for p in pairs) / 1e6:,.1f}",
                  f"{ratio:.3f}x", f"{us:+.2f}", f"{low:+.2f}, {high:+.2f}")
    Console(width=140).print(t)
    return 0
