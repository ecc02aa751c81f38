"""`gpuvm calibrate`: --gpu measures a real GPU; --pt-footprint computes page-table VRAM;
--emulator measures this emulator's per-event costs and validates the model against it;
--lock-use times threaded VMs' work under the interpreter lock by VM count;
--lock-probe runs Python threads taking turns at that lock without KVM, beside the model.

The GPU part needs an NVIDIA GPU and CuPy or PyTorch; without them it says so in one line
and exits non-zero.  The footprint part runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from gpuvm.calibrate.stats import MAX_REPS_FACTOR, MIN_REPS, SHORT_MODE_S
from gpuvm.errors import UserError

if TYPE_CHECKING:
    from gpuvm.calibrate.core_speed import CoreSamples
    from gpuvm.experiment.costs import CostProfile

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
EXIT_NO_GPU = 3
SHMEM_MODES = ("always", "within_size", "advise", "never", "deny", "force")
COSTS_DIR = Path("experiments") / "costs"
TRACE_REPS = 2  # --trace-reps's default: a bundle's command names it only where it differs


def parse_size(text: str) -> int:
    """'4M', '64MiB', '1G', '4096' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if match is None or int(match.group(1)) <= 0:
        raise UserError(f"bad size {text!r} (want e.g. 4096, 4K, 64M, 1G)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    """'64M,1G' -> [64 MiB, 1 GiB]; an empty list is a bad size like any other."""
    parts = [part for part in text.split(",") if part.strip()]
    return [parse_size(part) for part in parts] if parts else [parse_size(text)]


def parse_counts(text: str, what: str = "VM counts") -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"bad {what} {text!r} (want e.g. 1,8)") from None
    if not counts or min(counts) < 1:
        raise UserError(f"bad {what} {text!r}: each must be at least 1")
    return counts


def parse_microseconds(text: str, what: str) -> list[float]:
    """'4,8,28' -> [4.0, 8.0, 28.0]: one or more stretches in microseconds, each > 0."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"bad {what} {text!r} (want microseconds, e.g. 4,28)") from None
    if not values or min(values) <= 0:
        raise UserError(f"bad {what} {text!r}: each must be above 0")
    return values


def human(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the value >= 1: '2 MiB', '2.00006 MiB'."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--gpu", action="store_true",
                      help="measure host-memory transfer and pinning costs on a real NVIDIA GPU")
    what.add_argument("--pt-footprint", action="store_true",
                      help="VRAM used by GPU page tables mapping pinned sysram (no GPU needed)")
    what.add_argument("--emulator", action="store_true",
                      help="measure this emulator's per-event wall costs into a cost profile "
                           "and validate the model's makespans against it")
    what.add_argument("--lock-use", action="store_true",
                      help="time each vCPU thread of 1..8 threaded VMs inside and outside "
                           "KVM_RUN: work under the interpreter lock, and the lock's free "
                           "time, per exit")
    what.add_argument("--lock-probe", action="store_true",
                      help="Python threads taking turns at the interpreter lock without "
                           "KVM (held / free stretches), beside the model's lock on the "
                           "same loops")
    what.add_argument("--show", type=Path, metavar="PROFILE",
                      help="print a profile written by --gpu (no GPU needed)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    g = parser.add_argument_group("--gpu")
    g.add_argument("--backend", choices=("auto", "cupy", "torch"), default="auto")
    g.add_argument("--sizes", default="64M,1G", help="bandwidth copy sizes (default 64M,1G)")
    g.add_argument("--pin-size", default="1G", help="region pinned / copied into (default 1G)")
    g.add_argument("--chunk", default="4M", help="pinning chunk (default 4M)")
    g.add_argument("--chunk-offset", default="0",
                   help="shift the chunk grid by this much (e.g. 1M: chunk edges inside huge pages)")
    g.add_argument("--also-offset", default="1M",
                   help="a second chunk grid for the pin and D2H-into rows (default 1M: every "
                        "chunk edge inside a 2 MiB huge page; 0: none)")
    g.add_argument("--shmem-thp", default="never,always",
                   help="shmem_enabled modes to measure under, each set as root and put "
                        "back after (default never,always; 'asis': the machine's own)")
    g.add_argument("--smart-pinning", action="store_true",
                   help="time the smart-pinning workload (pin none / all / the profile's hot "
                        "allocations) instead; writes gpu-<model>-smart.toml")
    g.add_argument("--smart-sizes", default="4K,16K,64K,256K,1M,4M,16M,64M,256M,1G",
                   help="allocation sizes for --smart-pinning")
    g.add_argument("--reps", type=int, default=7, help=f"repetitions (>= {MIN_REPS}; default 7)")
    g.add_argument("--out", type=Path, default=None,
                   help="profile TOML to write (default experiments/costs/gpu-<model>.toml)")
    e = parser.add_argument_group("--emulator")
    e.add_argument("--trace-reps", dest="emulator_reps", type=int, default=TRACE_REPS,
                   metavar="N",
                   help=f"repetitions of each trace and each validation run (default "
                        f"{TRACE_REPS}; the fastest is kept; a mode whose repetitions take under "
                        f"{SHORT_MODE_S:g} s gets more, up to {MAX_REPS_FACTOR}x)")
    e.add_argument("--modes", dest="emulator_modes", default=None,
                   help="validate (--lock-use: time) these modes only (default: "
                        "experiments/scaling.toml's)")
    e.add_argument("--profile-out", type=Path, default=None,
                   help="profile to write (default when measuring: "
                        "experiments/costs/emulator.toml; with --from: none)")
    e.add_argument("--isolated", dest="emulator_isolated", action="store_true",
                   help="each VM in its own VMM process over vfio-user (as `gpuvm run "
                        "--isolated`): one server thread answers every VM's traps")
    e.add_argument("--from", dest="emulator_from", type=Path, nargs="+", default=None,
                   metavar="DIR",
                   help="analyse the measurements saved in DIR (results/validation/<time>) "
                        "instead of running guests; several: each point's error in "
                        "each, their mean and spread (gpuvm.calibrate.across)")
    e.add_argument("--more-of", dest="emulator_more_of", type=Path, default=None,
                   metavar="DIR",
                   help="run --trace-reps more repetitions of the bundle in DIR, on the "
                        "machine that measured it, and write them with DIR's as a new "
                        "bundle (DIR is left as it is)")
    e.add_argument("--recorder-cost", dest="emulator_recorder_cost",
                   choices=("apart", "in-place"), default="apart",
                   help="what recording a trace cost per event, taken off the traces: "
                        "timed apart (default), or per mode in place on idle VMs where the "
                        "bundle has it -- measured and shown either way; on the lent "
                        "machines of 2026-11-27 the in-place values moved the points "
                        "further from the emulator, never closer "
                        "(docs/model-validation.md)")
    u = parser.add_argument_group("--lock-use")
    u.add_argument("--repeat", dest="lock_reps", type=int, default=2, metavar="N",
                   help="runs of each mode and VM count (default 2)")
    u.add_argument("--sample-every", dest="lock_sample_every", type=int, default=1,
                   metavar="N",
                   help="time one KVM_RUN in N on average and scale the sums (default "
                        "1: every one; timing an exit holds the lock ~3-5 us)")
    p = parser.add_argument_group("--lock-probe")
    p.add_argument("--threads", default="2,4,8", help="thread counts (default 2,4,8)")
    p.add_argument("--free-us", default="4,8,14,20,28,40",
                   help="stretches with the lock let go, us (default 4,8,14,20,28,40)")
    p.add_argument("--held-us", type=float, default=12.0,
                   help="the stretch holding it, us (default 12: an fv exit's handler)")
    p.add_argument("--loops", type=int, default=5000, help="loops per thread a run "
                   "(default 5000)")
    p.add_argument("--handoff-us", type=float, default=None,
                   help="the model's hand-off (default: the lock's idle time per take "
                        "of 4 threads taking turns, measured first)")
    p.add_argument("--signal-us", type=float, default=None,
                   help="what waking a thread costs the model's waker (default: "
                        "measured first, gpuvm.calibrate.wake_cost)")
    f = parser.add_argument_group("--pt-footprint")
    f.add_argument("--map-size", default="1G", help="pinned bytes mapped (default 1G)")
    f.add_argument("--vms", default=None,
                   help="VM/process counts (default --pt-footprint: 1,8; --lock-use: "
                        "experiments/scaling.toml's)")
    f.add_argument("--mmu", choices=("fermi", "v2"), default="fermi",
                   help="page-table format: the emulated Fermi's (4K/128K pages) or a current "
                        "NVIDIA GPU's five-level one (4K/64K/2M pages, gpuvm.calibrate.mmu_v2)")
    f.add_argument("--build-limit", default="3G",
                   help="--mmu v2: build and read back only tables that fit this much "
                        "emulated VRAM (default 3G); larger ones are counted")
    f.add_argument("--no-cross-check", action="store_true",
                   help="arithmetic only: skip building the tables in emulated VRAM")


def main(args: argparse.Namespace) -> int:
    if args.gpu:
        return main_gpu(args)
    if args.emulator:
        return main_emulator(args)
    if args.show:
        return main_show(args)
    if args.lock_use:
        return main_lock_use(args)
    if args.lock_probe:
        return main_lock_probe(args)
    return main_footprint(args)


def main_show(args: argparse.Namespace) -> int:
    from gpuvm.calibrate.profile import load, to_json_dict

    try:
        profile = load(args.show)
    except FileNotFoundError:
        raise UserError(f"{args.show}: no such profile") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{args.show}: not a GPU profile ({exc})") from None
    if args.json:
        print(json.dumps(to_json_dict(profile), indent=2))
    else:
        print_profile(profile)
    return 0


# ------------------------------------------------------------------ --gpu
def model_slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; otherwise a filename-safe form of the name."""
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", gpu_name)
    if match:
        return match.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "gpu"


def main_gpu(args: argparse.Namespace) -> int:
    from gpuvm.calibrate import gpu
    from gpuvm.calibrate.cuda import NoGpu, find_backend
    from gpuvm.calibrate.profile import to_json_dict, to_toml

    if args.reps < MIN_REPS:
        raise UserError(f"--reps {args.reps}: need at least {MIN_REPS} for a median and spread")
    sizes, pin_bytes, chunk = parse_sizes(args.sizes), parse_size(args.pin_size), \
        parse_size(args.chunk)
    offset = 0 if args.chunk_offset.strip() == "0" else parse_size(args.chunk_offset)
    if chunk % 4096 or pin_bytes % 4096 or any(s % 4096 for s in sizes):
        raise UserError("--sizes, --pin-size and --chunk must be multiples of 4 KiB")
    also = 0 if args.also_offset.strip() == "0" else parse_size(args.also_offset)
    for flag, value, text in (("--chunk-offset", offset, args.chunk_offset),
                              ("--also-offset", also, args.also_offset)):
        if value >= chunk or value % 4096:
            raise UserError(f"{flag} {text} must be a 4 KiB multiple smaller than --chunk")
    modes = () if args.shmem_thp == "asis" else tuple(m.strip() for m in args.shmem_thp.split(","))
    bad = [m for m in modes if m not in SHMEM_MODES]
    if bad:
        raise UserError(f"--shmem-thp {bad[0]!r} is not one of {', '.join(SHMEM_MODES)} or asis")
    smart = tuple(parse_sizes(args.smart_sizes)) if args.smart_pinning else ()
    try:
        cuda = find_backend(args.backend)
    except NoGpu as exc:
        print(f"gpuvm: error: calibrate --gpu: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    command = "gpuvm calibrate " + shlex.join(sys.argv[sys.argv.index("calibrate") + 1:]) \
        if "calibrate" in sys.argv else "gpuvm calibrate --gpu"
    plan = gpu.Plan(sizes, pin_bytes, chunk, args.reps, command, offset, modes,
                    (also,) if also else (), smart, transfers=not args.smart_pinning)
    log = (lambda m: print(f"… {m}", file=sys.stderr, flush=True)) if not args.json \
        else (lambda m: None)
    try:
        profile = gpu.calibrate(cuda, plan, log)
    except NoGpu as exc:
        print(f"gpuvm: error: calibrate --gpu: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    suffix = "-smart" if args.smart_pinning else ""
    out = args.out or COSTS_DIR / f"gpu-{model_slug(profile.device.gpu)}{suffix}.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_toml(profile))
    if args.json:
        print(json.dumps(to_json_dict(profile), indent=2))
    else:
        print_profile(profile)
        print(f"profile written to {out}")
    return 0


def print_profile(profile) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from gpuvm.calibrate.smart_pinning import crossover

    d = profile.device
    console = Console(width=140)
    console.print(escape(f"{d.gpu}, driver {d.driver}, CUDA {d.cuda_runtime}, {d.backend}, "
                         f"kernel {d.kernel}; shmem THP [{d.shmem_thp}], anon THP "
                         f"[{d.anon_thp}]; measured {d.date}; {d.reps} reps, median [min–max]"))
    for s in profile.thp:
        console.print(escape(f"shmem THP {s.requested}: reads [{s.selected}]"
                             + (f" -- NOT measured: {s.note}" if s.note else "")))
    if profile.bandwidth:
        t = Table(title="copy bandwidth, GiB/s")
        for col in ("shmem THP", "size", "direction", "host memory",
                    escape("GiB/s median [min–max]")):
            t.add_column(col)
        for b in profile.bandwidth:
            t.add_row(b.shmem_thp, human(b.nbytes), b.direction.upper(), b.host,
                      escape(b.gib_s.text()))
        console.print(t)
    if profile.pin:
        t = Table(title=f"chunked pin/unpin (cudaHostRegister/Unregister), "
                        f"{human(d.chunk_bytes)} chunks")
        for col in ("shmem THP", "grid at", "memory", "huge-mapped before→after", "size",
                    "register ms", "unregister ms", "µs/chunk pin", "µs/chunk unpin"):
            t.add_column(col)
        for p in profile.pin:
            pin_us, unpin_us = p.per_chunk_us()
            t.add_row(p.shmem_thp, human(p.chunk_offset) if p.chunk_offset else "0", p.memory,
                      f"{_kib(p.huge_kib)} → {_kib(p.huge_kib_after)}", human(p.nbytes),
                      escape(p.register_ms.text()), escape(p.unregister_ms.text()),
                      f"{pin_us:.1f}", f"{unpin_us:.1f}")
        console.print(t)
    if profile.d2h_into:
        t = Table(title="D2H into a memfd (THP vs MADV_NOHUGEPAGE), GiB/s; huge pages: the "
                        "region's (smaps) and the system's ShmemHugePages (meminfo)")
        for col in ("shmem THP", "grid at", "memory", "how the driver handles it",
                    "region huge before→after", "system shmem huge before→after",
                    escape("GiB/s median [min–max]")):
            t.add_column(col)
        for c in profile.d2h_into:
            t.add_row(c.shmem_thp, human(c.chunk_offset) if c.chunk_offset else "0", c.memory,
                      c.mode, f"{_kib(c.huge_kib_before)} → {_kib(c.huge_kib_after)}",
                      f"{_kib(c.shmem_huge_kib_before)} → {_kib(c.shmem_huge_kib_after)}",
                      escape(c.gib_s.text()))
        console.print(t)
        console.print(f"huge-page split cost from these rows: {profile.thp_split_us()} µs "
                      "(0: the kernel split nothing)")
    if profile.smart:
        t = Table(title="smart pinning: allocate + fill + copies + free, ms median [min–max]")
        for col in ("size", *(f"{p}" for p in ("none", "smart", "all")), "smart/none",
                    "all/none"):
            t.add_column(col)
        by = {(r.policy, r.nbytes): r for r in profile.smart}
        for size in sorted({r.nbytes for r in profile.smart}):
            row = [by.get((p, size)) for p in ("none", "smart", "all")]
            if None in row:
                continue
            t.add_row(human(size), *(escape(r.ms.text(3)) for r in row),
                      f"{row[1].ms.median / row[0].ms.median:.2f}",
                      f"{row[2].ms.median / row[0].ms.median:.2f}")
        console.print(t)
        for policy, against in (("smart", "none"), ("all", "none"), ("all", "smart")):
            size = crossover(profile.smart, policy, against)
            console.print(f"{policy} beats {against} from "
                          f"{human(size) if size else 'no size measured'} up")


def _kib(kib: int) -> str:
    return "?" if kib < 0 else human(kib * 1024) if kib else "0"


# ------------------------------------------------------------------ --emulator
def _reps_per_mode(measured) -> str:
    """'2' where every mode had as many repetitions, else 'fv 2, pv 8'
    (validation.measure gives short modes more); then, for a mode whose short runs were
    each the fastest of several, how many runs each VM count's point is the fastest of
    ('; runs per 1/2/4/8 VMs: pv 24/12/12/12')."""
    reps: dict[str, set[int]] = {}
    runs: dict[str, dict[int, int]] = {}
    for m in measured:
        reps.setdefault(m.mode, set()).add(m.rep)
        per_count = runs.setdefault(m.mode, {})
        per_count[m.vms] = per_count.get(m.vms, 0) + m.samples
    counts = {mode: len(r) for mode, r in reps.items()}
    text = str(next(iter(counts.values()))) if len(set(counts.values())) == 1 else \
        ", ".join(f"{mode} {n}" for mode, n in counts.items())
    more = {mode: per_count for mode, per_count in runs.items()
            if max(per_count.values()) > counts[mode]}
    if not more:
        return text
    vms = sorted({n for per_count in more.values() for n in per_count})
    return text + f"; runs per {'/'.join(map(str, vms))} VMs: " + ", ".join(
        f"{mode} " + "/".join(str(per_count.get(n, 0)) for n in vms)
        for mode, per_count in more.items())


def recorder_cost_in_place(args: argparse.Namespace) -> bool:
    """Whether `--recorder-cost in-place` asked for each mode's in-place recorder cost
    (one bundle or several `--from`: both read it here)."""
    return args.emulator_recorder_cost == "in-place"


def main_emulator(args: argparse.Namespace) -> int:
    """Fit this emulator's per-event costs from per-event traces, then validate the model
    on 1/2/4/8-VM runs each predicted from a trace recorded just before it
    (gpuvm.calibrate.validation says why).  With --from, the same analysis of a bundle
    measured before (here or on another machine), without running a guest."""
    from dataclasses import asdict, replace

    from rich.console import Console
    from rich.table import Table

    from gpuvm.calibrate import emulator, lock_use, record_cost, validation
    from gpuvm.experiment.config import REPO

    reps = args.emulator_reps
    if reps < 1:
        raise UserError(f"--trace-reps must be >= 1, got {reps}")
    if args.emulator_from is not None and args.emulator_more_of is not None:
        raise UserError("--from analyses a bundle, --more-of measures more of one: "
                        "give one of them")
    if args.emulator_from is not None and len(args.emulator_from) > 1:
        return main_across(args)
    source = args.emulator_from[0] if args.emulator_from is not None else None
    if source is not None:
        try:
            measured, fit_traces, about = validation.load(source)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        bundle = None
        title = f"{about.get('benchmark', '?')} measured by `{about.get('command', '?')}` " \
                f"on {about.get('cpus', '?')} cores at load {about.get('load', '?')}"
        try:
            cores = validation.load_cores(source)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    else:
        measured, fit_traces, about, cores = (
            _measure_more(args, reps, args.emulator_more_of)
            if args.emulator_more_of is not None else _measure_emulator(args, reps))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        bundle = validation.save(REPO / "results" / "validation" / stamp, measured,
                                 fit_traces, about, cores)
        title = f"{about['benchmark']} (fastest of {_reps_per_mode(measured)})"
    try:
        aside = validation.AsideMeasures.from_about(about)
    except ValueError as exc:
        raise UserError(f"{source or bundle}: {exc}") from None
    wake, uses, recorder = aside.wake, aside.lock_use, aside.record_event_ns
    in_place = recorder_cost_in_place(args)
    analysis = aside.analyse(measured, fit_traces, about.get("cpus"), in_place=in_place)
    profile, kept, points = analysis.profile, analysis.kept, analysis.points
    profile_out = args.profile_out
    if profile_out is None and bundle is not None:
        profile_out = COSTS_DIR / ("emulator-isolated.toml" if about.get("isolated")
                                   else "emulator.toml")
    if profile_out is not None:
        profile_out.parent.mkdir(parents=True, exist_ok=True)
        profile_out.write_text(emulator.to_toml(profile, about.get("command", "?")))
    speeds = validation.core_speeds(kept, cores)
    report = json.dumps({"about": about, "profile": asdict(profile),
                         "points": [asdict(p) | {"error_pct": p.error_pct}
                                    | ({"cores": asdict(speeds[(p.mode, p.vms)])}
                                       if (p.mode, p.vms) in speeds else {})
                                    for p in points],
                         "spread": [asdict(s) for s in analysis.spread],
                         "halves": [asdict(h) for h in analysis.halves]},
                        indent=1) + "\n"
    if bundle is not None:
        (bundle / "points.json").write_text(report)
    if args.json:
        print(report, end="")
        return 0
    console = Console(width=120)
    t = Table(title="this emulator's costs (ns), fitted from per-event traces")
    t.add_column("event")
    t.add_column("ns", justify="right")
    for key in ("trap_ns", "exit_free_ns", "mmio_native_ns", "io_exit_ns", "wait_ns",
                "hypercall_ns", "hcall_entry_ns", "shadow_sync_ns", "pte_scanned_ns",
                "pt_zero_word_ns", "remap_ns", "host_cores", "lock_handoff_ns",
                "lock_signal_ns"):
        t.add_row(key, f"{getattr(profile, key):,.2f}")
    console.print(t)
    if profile_out is not None:
        print(f"profile written to {profile_out}")
    print_wake(wake, about)
    print_wake_cost(about)
    if not about.get("isolated"):
        print_lock_prices(profile, about)
    print("what recording a trace cost per event, taken off its exit loop (timed apart, "
          "gpuvm.calibrate.record_cost): "
          + (f"{recorder / 1e3:.2f} us" if recorder else "not measured (the traces are "
             "replayed as recorded)")
          + ("; in place, on plain and recorded runs of "
             f"{record_cost.IN_SITU_BENCHMARK} VMs ("
             + ("each mode's traces take their own" if in_place else
                "shown, not taken off: --recorder-cost in-place takes them") + "): "
             + ", ".join(f"{mode} {ns / 1e3:.2f} us"
                         for mode, ns in aside.record_event_in_situ.items())
             if aside.record_event_in_situ else ""))
    own = lock_use.handoff_curve(uses)
    if own is not None:
        print(f"  priced instead as the lock sat free per exit of the lock's own timed runs "
              f"({lock_use.GROWTH_MODE} VMs of {lock_use.GROWTH_BENCHMARK}), by the wait "
              f"per sleep (us): {own.text()}")
    switches = [f"{mode} {line}" for mode in sorted({u.mode for u in uses})
                if (line := lock_use.switches_text(uses, mode))]
    if switches:
        print("the lock's timed runs, per exit: sleeps / cores lost (the vCPU threads' "
              "voluntary / involuntary context switches; in brackets those outside "
              "KVM_RUN, holding the lock, and the holders' time off their cores): "
              + "; ".join(switches))
    if profile.lock_work_vms:
        print_growth(profile)
    # one VM per phase, priced by counts (not by its recorded times): where prices miss
    priced = replace(profile, recorded_times=0.0)
    t = Table(title="one VM alone, per phase: recorded vs counts x fitted costs (ms)")
    for col in ("mode", "phase", "recorded", "priced", "error %"):
        t.add_column(col, justify="right")
    for m in kept:
        if m.vms != 1:
            continue
        for phase, rec, mod in emulator.trace_phase_points(m.mode, m.trace, priced):
            t.add_row(m.mode, phase, f"{rec:,.1f}", f"{mod:,.1f}",
                      f"{100 * (mod - rec) / rec:+.1f}" if rec else "-")
    console.print(t)
    print_validation(console, points, analysis.spread, f"model vs emulator makespan, {title} "
                     f"(cores fitted on {validation.FIT_VMS} VMs)", speeds)
    print_halves(console, [analysis.halves])
    if cores is not None and len(cores.ms):
        print(validation.core_summary(cores, speeds, points))
    if not about.get("isolated"):  # VMs as threads: the one shape with the lock
        print_needed_handoffs(validation.needed_handoffs(kept, profile),
                              profile.lock_handoff_ns)
        print_vcpu_usage(analysis.spread)
    if bundle is not None:
        print(f"measurements and points written to {bundle} (re-analyse with "
              f"`gpuvm calibrate --emulator --from {bundle}`)")
    return 0


def main_across(args: argparse.Namespace) -> int:
    """`--from DIR DIR ...`: every bundle analysed as `--from DIR` analyses it, each
    point's errors side by side with their mean and spread (gpuvm.calibrate.across)."""
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from gpuvm.calibrate import across, halves
    from gpuvm.calibrate.emulator import GOAL_ERROR_PCT

    if args.profile_out is not None:
        raise UserError("--profile-out takes one --from bundle, not "
                        f"{len(args.emulator_from)}")
    directories = list(args.emulator_from)
    try:
        analysed = across.reanalysed(directories, in_place=recorder_cost_in_place(args))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    per_bundle = [a.points for a in analysed]
    points = across.across(per_bundle)
    scores = across.scores(directories, per_bundle)
    per_half = [a.halves for a in analysed]
    if args.json:
        print(json.dumps({
            "bundles": [{"directory": str(s.directory), "points": s.points,
                         "within": s.within, "mean_abs_pct": s.mean_abs_pct,
                         "halves": [asdict(h) for h in a.halves]}
                        for s, a in zip(scores, analysed)],
            "points": [{"mode": p.mode, "vms": p.vms, "errors_pct": list(p.errors_pct),
                        "mean_pct": p.mean_pct, "sd_pct": p.sd_pct, "within": p.within}
                       for p in points],
            "halves": asdict(halves.score(per_half)),
            "by_slow_share": [asdict(b) for b in across.by_slow_share(analysed)]},
            indent=1))
        return 0
    t = Table(title=f"model vs emulator makespan, error % in each of {len(directories)} "
                    f"bundles (each analysed as `--from DIR` would)")
    for col in ("mode", "VMs", *(f"#{i + 1}" for i in range(len(directories))),
                "mean %", "sd", f"within {GOAL_ERROR_PCT:g}%"):
        t.add_column(col, justify="right")
    for p in points:
        t.add_row(p.mode, str(p.vms),
                  *(f"{e:+.0f}" if e is not None else "-" for e in p.errors_pct),
                  f"{p.mean_pct:+.1f}", f"{p.sd_pct:.1f}", f"{p.within}/{len(p.present)}")
    Console(width=160).print(t)
    for i, s in enumerate(scores):
        print(f"#{i + 1} {s.directory}: {s.within}/{s.points} points within "
              f"{GOAL_ERROR_PCT:g}%, mean |error| {s.mean_abs_pct:.1f}%")
    print(f"every point within {GOAL_ERROR_PCT:g}% in {sum(s.all_within for s in scores)} "
          f"of {len(scores)} bundles")
    if slow := across.slow_text(across.by_slow_share(analysed)):
        print(slow)
    print_halves(Console(width=160), per_half)
    return 0


def _measure_emulator(args: argparse.Namespace, reps: int
                      ) -> tuple[list, list[tuple[str, dict]], dict, CoreSamples | None]:
    """Everything `_measure_emulator_runs` measures, with the host's cores sampled
    throughout (gpuvm.calibrate.core_speed): the probes are forked first, while this
    process has one thread."""
    from gpuvm.calibrate.core_speed import CoreProbe

    with CoreProbe() as probe:
        measured, fit_traces, about = _measure_emulator_runs(args, reps)
    return measured, fit_traces, about, probe.samples


def _measure_emulator_runs(args: argparse.Namespace, reps: int
                           ) -> tuple[list, list[tuple[str, dict]], dict]:
    """Trace the calibration file's single VMs, then run the scaling file's VM counts,
    the lock's timed rounds among them."""
    from gpuvm.calibrate import (lock_turns, lock_use, record_cost, untimed_growth, validation,
                                 wake_cost)
    from gpuvm.calibrate.lock_rounds import LockRounds
    from gpuvm.calibrate.wake import WAKE_MODE, measure, measure_on_exits
    from gpuvm.experiment.config import REPO, load
    from gpuvm.sim.traces import TraceKey, record_fastest

    load_before = round(os.getloadavg()[0], 2)  # the host's load, before ours adds to it
    fit_exp = load(REPO / "experiments" / "calibrate-emulator.toml")
    scaling, bench = _scaling()
    _progress(f"measuring how long a woken thread takes to run again, and its next exit "
              f"({WAKE_MODE})")
    # on a VM's own exits; a backend without KVM_RUN: on a pipe alone (no exit's work)
    on_exits = measure_on_exits(bench.benchmark, bench.params, WAKE_MODE) or measure()
    turns: list[lock_turns.Turns] = []
    if not args.emulator_isolated:  # VMs in processes of their own pass no such lock
        _progress("measuring how long the interpreter lock sits free between threads "
                  "taking turns at it, by how long they waited")
        turns = lock_turns.measure()
    _progress("timing what waking a sleeping thread costs the thread that wakes it")
    woken = wake_cost.measure()
    wake = lock_turns.through_lock(on_exits, turns)
    _progress("timing the trace recorder's own work per event")
    recorder = record_cost.measure()
    modes = args.emulator_modes.split(",") if args.emulator_modes else list(scaling.modes)
    unknown = [m for m in modes if m not in scaling.modes and m not in fit_exp.modes]
    if unknown:
        raise UserError(f"--modes: unknown mode {unknown[0]!r}")
    _progress(f"timing the trace recorder in place: plain and recorded "
              f"{record_cost.IN_SITU_BENCHMARK} VMs of each mode by turns")
    in_situ = record_cost.in_situ(modes, isolated=args.emulator_isolated,
                                  progress=_progress)
    counts = sorted({len(s.vms) for s in scaling.scenarios})
    rounds = LockRounds(args.emulator_isolated, modes, counts, _progress)
    # 1. single VMs of the calibration file, traced (fastest of `reps` each)
    fit_traces = []
    for scenario in fit_exp.scenarios:
        if len(scenario.vms) != 1:
            continue
        for mode in fit_exp.modes:
            key = TraceKey(scenario.vms[0].benchmark, scenario.vms[0].params, mode,
                           args.emulator_isolated)
            _progress(f"tracing {key.file_name}")
            fit_traces.append((mode, record_fastest(key, reps)))
    # 2. the scaling runs, each VM count right after a trace of one VM
    measured = validation.measure(bench.benchmark, bench.params, modes, counts, reps,
                                  progress=_progress, isolated=args.emulator_isolated,
                                  before_rep=rounds.before_rep)
    rounds.after()
    command = "gpuvm calibrate --emulator" + _trace_reps_flag(reps) \
        + (f" --modes {args.emulator_modes}" if args.emulator_modes else "") \
        + (" --isolated" if args.emulator_isolated else "")
    about = {"command": command, "benchmark": _benchmark_label(bench),
             "isolated": args.emulator_isolated,
             "cpus": os.cpu_count(), "load": load_before, "wake": wake.to_about(),
             "wake_on_exits": on_exits.to_about(), "lock_turns": lock_turns.to_about(turns),
             wake_cost.ABOUT_KEY: woken.to_about(),
             "lock_use": lock_use.to_about(rounds.uses),
             untimed_growth.ABOUT_KEY: untimed_growth.to_about(rounds.untimed),
             "host": validation.this_host(),
             record_cost.ABOUT_KEY: round(recorder, 1),
             record_cost.IN_SITU_KEY: {mode: round(ns, 1) for mode, ns in in_situ.items()},
             "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    return measured, fit_traces, about


def _scaling():
    """experiments/scaling.toml, and the benchmark its VMs run: what --emulator validates
    the model on and --lock-use times."""
    from gpuvm.experiment.config import REPO, load

    scaling = load(REPO / "experiments" / "scaling.toml")
    return scaling, scaling.scenarios[0].vms[0]


def _benchmark_label(bench) -> str:
    """'mmul [128]': how a bundle's "about" names its benchmark."""
    return f"{bench.benchmark} {list(bench.params)}"


def _trace_reps_flag(reps: int) -> str:
    """' --trace-reps N' as a bundle's command names it; '' for the default."""
    return f" --trace-reps {reps}" if reps != TRACE_REPS else ""


def _progress(line: str) -> None:
    """A line of how far a long measurement has got, on stderr (stdout is the report)."""
    print(f"… {line}", file=sys.stderr, flush=True)


def _measure_more(args: argparse.Namespace, reps: int, source: Path
                  ) -> tuple[list, list[tuple[str, dict]], dict, CoreSamples | None]:
    """`--more-of DIR`: `reps` more repetitions of DIR's scaling runs, numbered after its
    own, returned with everything DIR holds (its traces for the fit, its probes, its
    lock's rounds) as one measurement; DIR itself is left as it is.  Why: a repetition
    of fv at 8 VMs is half a minute, and with two repetitions a point's fastest run moved
    by 8-21% between the even and the odd one (gpuvm.calibrate.halves) -- more of them
    than fit one sitting (a lent machine's command stops at 10 minutes) are taken in
    two.  Only on the machine, and the boot, that measured DIR."""
    from gpuvm.calibrate import lock_use, untimed_growth, validation
    from gpuvm.calibrate.core_speed import CoreProbe
    from gpuvm.calibrate.lock_rounds import LockRounds

    try:
        before, fit_traces, about = validation.load(source)
        cores_before = validation.load_cores(source)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    here = validation.this_host()
    host = about.get("host")
    if host != here:
        there = host.get("name") if isinstance(host, dict) else None
        raise UserError(f"--more-of {source}: measured on "
                        f"{there or 'a machine it does not name'}"
                        + (" before its last boot" if there == here["name"] else "")
                        + f", not on this one ({here['name']}): more repetitions must come "
                          "from the machine that measured the first")
    if args.emulator_modes or args.emulator_isolated:
        raise UserError("--more-of measures the modes (and --isolated) of its bundle: "
                        "leave out --modes and --isolated")
    _, bench = _scaling()
    if about.get("benchmark") != _benchmark_label(bench):
        raise UserError(f"--more-of {source}: measured {about.get('benchmark')!r}, "
                        f"experiments/scaling.toml now runs '{_benchmark_label(bench)}'")
    modes = list(dict.fromkeys(m.mode for m in before))
    counts = sorted({m.vms for m in before})
    isolated = bool(about.get("isolated"))
    load_before = round(os.getloadavg()[0], 2)
    first_rep = max(m.rep for m in before) + 1
    rounds = LockRounds(isolated, modes, counts, _progress, first_rep)
    with CoreProbe() as probe:
        more = validation.measure(bench.benchmark, bench.params, modes, counts, reps,
                                  progress=_progress, isolated=isolated,
                                  before_rep=rounds.before_rep, first_rep=first_rep)
        rounds.after()
    cores = probe.samples.joined(cores_before) if probe.samples is not None \
        else cores_before
    added = {"command": f"gpuvm calibrate --emulator --more-of {source}"
                        + _trace_reps_flag(reps),
             "load": load_before, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    about = dict(about) | {
        "command": f"{about.get('command', '?')}; {added['command']}",
        "lock_use": list(about.get("lock_use", ())) + lock_use.to_about(rounds.uses),
        untimed_growth.ABOUT_KEY: list(about.get(untimed_growth.ABOUT_KEY, ()))
        + untimed_growth.to_about(rounds.untimed),
        "more": list(about.get("more", ())) + [added]}
    return before + more, fit_traces, about, cores


def main_lock_use(args: argparse.Namespace) -> int:
    """Each vCPU thread of the scaling file's VM counts timed inside and outside
    KVM_RUN (gpuvm.calibrate.lock_use): which part of an exit grows with the VMs."""
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from gpuvm.calibrate import lock_use
    from gpuvm.vmm.kvm import kvm_usable

    if args.lock_reps < 1:
        raise UserError(f"--repeat must be >= 1, got {args.lock_reps}")
    if args.lock_sample_every < 1:
        raise UserError(f"--sample-every must be >= 1, got {args.lock_sample_every}")
    scaling, bench = _scaling()
    modes = args.emulator_modes.split(",") if args.emulator_modes else list(scaling.modes)
    unknown = [m for m in modes if m not in scaling.modes]
    if unknown:
        raise UserError(f"--modes: unknown mode {unknown[0]!r} (have "
                        f"{', '.join(scaling.modes)})")
    counts = parse_counts(args.vms) if args.vms else \
        sorted({len(s.vms) for s in scaling.scenarios})
    usable, why = kvm_usable()
    if not usable:
        raise UserError(f"--lock-use times KVM_RUN and needs KVM: {why}")
    load_before = round(os.getloadavg()[0], 2)
    try:
        uses = lock_use.measure(bench.benchmark, bench.params, modes, counts,
                                args.lock_reps, _progress,
                                sample_every=args.lock_sample_every)
    except RuntimeError as exc:
        raise UserError(f"--lock-use: {exc}") from None
    if args.json:
        print(json.dumps([asdict(u) | {"held_ns": u.held_ns} for u in uses], indent=1))
        return 0
    sampled = f", one exit in {args.lock_sample_every} timed" \
        if args.lock_sample_every > 1 else ""
    t = Table(title=f"threaded VMs of {bench.benchmark} {list(bench.params)}, per exit "
                    f"(us), {os.cpu_count()} cores at load {load_before}{sampled}")
    for col in ("mode", "VMs", "run", "makespan ms", "held", "in KVM_RUN CPU",
                "waited per sleep", "sleeps per exit", "cores lost (holding)",
                "holder off core", "lock held %", "lock free"):
        t.add_column(col, justify="right")
    for u in sorted(uses, key=lambda u: (modes.index(u.mode), u.vms, u.rep)):
        exits = max(1, u.exits)
        t.add_row(u.mode, str(u.vms), str(u.rep), f"{u.makespan_ns / 1e6:,.1f}",
                  f"{u.per_exit_us(u.held_ns):.1f}", f"{u.per_exit_us(u.in_run_cpu_ns):.1f}",
                  f"{u.waited_us:.1f}", f"{u.sleeps / exits:.2f}",
                  f"{u.preemptions / exits:.2f} ({u.held_preemptions / exits:.2f})",
                  f"{u.per_exit_us(u.held_off_core_ns):.1f}",
                  f"{100 * u.lock_share:.0f}", f"{u.free_per_exit_us:.1f}")
    Console(width=160).print(t)
    print("held: a vCPU thread's CPU outside KVM_RUN (its work under the interpreter "
          "lock); cores lost: involuntary context switches, in brackets those outside "
          "KVM_RUN (holding the lock); holder off core: wall time outside KVM_RUN that "
          "was not CPU; lock free: the makespan less all held time, per exit")
    return 0


def main_lock_probe(args: argparse.Namespace) -> int:
    """Python threads taking turns at the interpreter lock without KVM, and the model's
    lock on the same loops (gpuvm.calibrate.lock_probe)."""
    from dataclasses import asdict

    from rich.console import Console
    from rich.table import Table

    from gpuvm.calibrate import lock_probe, lock_turns, wake_cost

    threads = parse_counts(args.threads, "--threads")
    free = parse_microseconds(args.free_us, "--free-us")
    if args.held_us <= 0 or args.loops < 1:
        raise UserError(f"--held-us must be above 0 and --loops at least 1, got "
                        f"{args.held_us:g} and {args.loops}")
    for name, value in (("--handoff-us", args.handoff_us), ("--signal-us", args.signal_us)):
        if value is not None and value < 0:
            raise UserError(f"{name} must be >= 0, got {value:g}")
    cores = os.cpu_count() or 1
    load_before = round(os.getloadavg()[0], 2)
    handoff_ns = round(args.handoff_us * 1e3) if args.handoff_us is not None else \
        lock_turns.take_turns(lock_probe.HANDOFF_THREADS).idle_ns
    woken = wake_cost.measure()
    signal_ns = round(args.signal_us * 1e3) if args.signal_us is not None else \
        round(woken.signal_ns)
    runs = lock_probe.measure(threads, free, args.held_us, args.loops)
    pairs = [(run, lock_probe.modelled(run, cores, handoff_ns, signal_ns=signal_ns))
             for run in runs]
    if args.json:
        print(json.dumps({"cores": cores, "load": load_before, "handoff_ns": handoff_ns,
                          "signal_ns": signal_ns, wake_cost.ABOUT_KEY: woken.to_about(),
                          "runs": [{"probe": asdict(r), "model": asdict(m)}
                                   for r, m in pairs]}, indent=1))
        return 0
    t = Table(title=f"threads looping {args.held_us:g} us under the interpreter lock and a "
                    f"free stretch off it, per loop: {cores} cores at load {load_before}; "
                    f"the model's hand-off {handoff_ns / 1e3:.1f} us, signal "
                    f"{signal_ns / 1e3:.2f} us")
    for col in ("threads", "free us", "probe us", "probe sleeps", "model us",
                "model sleeps", "model error %"):
        t.add_column(col, justify="right")
    for run, model in pairs:
        t.add_row(str(run.threads), f"{run.free_us:g}", f"{run.loop_ns / 1e3:.1f}",
                  f"{run.sleeps_per_loop:.2f}", f"{model.loop_ns / 1e3:.1f}",
                  f"{model.sleeps_per_loop:.2f}",
                  f"{100 * (model.loop_ns / run.loop_ns - 1):+.1f}")
    Console(width=120).print(t)
    print(f"probe: the fastest of {lock_probe.ROUNDS} runs of {args.loops} loops a thread; "
          "sleeps: voluntary context switches per loop and thread (the model: takes that "
          "waited for the lock)")
    print(f"waking a sleeping thread costs the thread that wakes it: {woken.text()}")
    return 0


def print_growth(profile: CostProfile) -> None:
    """The work under the lock's growth as priced: each timed mode's, beside the count
    its scale begins at (one VM where the rounds timed one VM alone, else the
    hand-off's FIT_VMS) -- from its untimed runs where it has its cores' takes priced
    with them (validation.untimed_priced), and those rates."""
    from gpuvm.calibrate import lock_use
    from gpuvm.experiment.costs import (GUEST_PREEMPTS_OF, GUEST_WORK_SCALE_OF,
                                        HELD_PREEMPTS_OF, LOCK_WORK_SCALE_OF)
    base = int(profile.lock_work_vms[0])
    beside = "one VM's" if base == 1 else f"{base} VMs'"
    bench = {lock_use.PV_GROWTH_MODE: lock_use.PV_GROWTH_BENCHMARK}
    modes = (lock_use.GROWTH_MODE, lock_use.PV_GROWTH_MODE, *lock_use.BESIDE_MODES)

    def own(fields: dict[str, str], plain: str, mode: str) -> tuple[float, ...]:
        return getattr(profile, fields.get(mode, plain))

    scales = [(mode, own(LOCK_WORK_SCALE_OF, "lock_work_scale", mode)) for mode in modes
              if mode == lock_use.GROWTH_MODE or own(LOCK_WORK_SCALE_OF, "", mode)]
    rates = {mode: (own(GUEST_PREEMPTS_OF, "guest_preempts_per_ms", mode),
                    own(HELD_PREEMPTS_OF, "held_preempts_per_ms", mode)) for mode in modes}
    print(f"the work under the lock, beside {beside} (VMs of each mode apart; untimed: "
          f"their CPU per VM in untimed runs, else timed per exit): "
          + "; ".join(f"{mode} ({bench.get(mode, lock_use.GROWTH_BENCHMARK)}, "
                      f"{'untimed' if rates[mode][0] else 'timed'}) "
                      f"{lock_use.text(profile.lock_work_vms, scale)}" for mode, scale in scales))
    guests = [(mode, own(GUEST_WORK_SCALE_OF, "guest_work_scale", mode)) for mode in modes]
    if any(scale for _, scale in guests):
        print("the guests' time inside KVM_RUN, beside one VM's (the same runs): "
              + "; ".join(f"{mode} {lock_use.text(profile.lock_work_vms, scale)}"
                          for mode, scale in guests if scale))
    taken = [(mode, guest, held) for mode, (guest, held) in rates.items() if guest]
    if taken:
        print("cores taken per ms of the threads' CPU, in their guests / holding the lock "
              "(the lock's timed runs): "
              + "; ".join(f"{mode} " + ", ".join(
                  f"{n:.0f} VMs {g:.1f} / {h:.2f}"
                  for n, g, h in zip(profile.lock_work_vms[1:], guest[1:], held[1:]))
                  for mode, guest, held in taken))


def print_wake_cost(about: dict) -> None:
    """What waking a sleeping thread cost the waker in this sitting (measured since
    2026-11-29: gpuvm.calibrate.wake_cost; the replay's lock_signal_ns)."""
    from gpuvm.calibrate.wake_cost import WakeCost

    woken = WakeCost.from_about(about)
    print("waking a sleeping thread costs the thread that wakes it: "
          + (woken.text() if woken else "not measured in this bundle"))


def print_lock_prices(profile: CostProfile, about: dict) -> None:
    """How the replay's interpreter lock was priced (validation.price_lock): each cost
    measured in the sitting, or fitted on the 2-VM points where the bundle is from
    before it was measured."""
    from gpuvm.calibrate import validation
    from gpuvm.calibrate.wake_cost import WakeCost

    fitted = f"fitted on {validation.FIT_VMS} VMs (not measured in this bundle)"
    print(f"the lock as priced: a woken thread lands {profile.lock_handoff_ns / 1e3:.1f} us "
          "later ("
          + ("the wake-up curve at its shortest sleep" if profile.wake_latency_ns else fitted)
          + f"); waking it costs the thread letting the lock go "
          f"{profile.lock_signal_ns / 1e3:.2f} us ("
          + ("measured" if WakeCost.from_about(about) else
             fitted if profile.wake_latency_ns else "none: not measured") + ")")


def print_wake(wake, about: dict) -> None:
    """The wake curve the model priced long waits with, as it was measured: through the
    interpreter lock by threads taking turns (gpuvm.calibrate.lock_turns), or, in
    bundles from before that, across a pipe."""
    from gpuvm.calibrate import lock_turns

    if wake is None:
        print("a thread woken after sleeping: not measured (every hand-off alike)")
        return
    work = " + then handles its exit in (us)" if wake.work_ns else ""
    if about.get("lock_turns"):
        turns = [lock_turns.Turns.from_about(t) for t in about["lock_turns"]]
        print(f"the interpreter lock, passed to a thread that waited (us), sat free (us)"
              f"{work}: {wake.text()}")
        print(f"  threads taking turns, waited -> sat free (us): {lock_turns.text(turns)}")
    else:
        print(f"a thread woken after sleeping (us) runs Python again after (us){work}: "
              f"{wake.text()}")


def print_validation(console, points, spread, title: str, speeds=None) -> None:
    """The kept points beside their spread: a point's error means little where its
    repetitions' own errors range wider than it, or its runs back to back ("runs'
    spread %": Spread.runs_spread_pct) differ by more.  With `speeds`
    (validation.core_speeds), the share of the host's sampled cores that ran slow during
    each kept run."""
    from rich.table import Table

    from gpuvm.calibrate import emulator, validation

    by_point = {(s.mode, s.vms): s for s in spread}
    server = any(s.server_per_vm is not None for s in spread)
    speeds = speeds or {}
    t = Table(title=title)
    for col in ("mode", "VMs", "emulator ms", "model ms", "error %", "each rep's error %",
                "their median %", "reps' spread %", "runs' spread %") \
            + (("server per VM",) if server else ()) \
            + (("cores slow %",) if speeds else ()):
        t.add_column(col, justify="right")
    for p in points:
        s = by_point.get((p.mode, p.vms))
        ratio = s.server_per_vm if s else None
        speed = speeds.get((p.mode, p.vms))
        t.add_row(p.mode, str(p.vms), f"{p.measured_ms:,.1f}", f"{p.predicted_ms:,.1f}",
                  f"{p.error_pct:+.1f}",
                  " ".join(f"{e:+.0f}" for e in s.rep_errors_pct) if s else "-",
                  f"{s.median_error_pct:+.1f}" if s else "-",
                  f"{s.measured_spread_pct:.0f}" if s else "-",
                  f"{s.runs_spread_pct:.0f}" if s and s.runs_spread_pct is not None else "-",
                  *((f"{ratio:.2f}x" if ratio is not None else "-",) if server else ()),
                  *((f"{100 * speed.slow_share:.0f}" if speed else "-",) if speeds else ()))
    console.print(t)
    print(emulator.summary(points))
    print(validation.spread_summary(spread))


def print_halves(console, per_bundle) -> None:
    """Per point, the emulator against itself beside the model (gpuvm.calibrate.halves):
    each half of a bundle's repetitions against the other half's fastest run, and
    against the model's replay of the other half's fastest trace; then one line."""
    from rich.table import Table

    from gpuvm.calibrate import halves
    from gpuvm.calibrate.emulator import GOAL_ERROR_PCT

    by_point: dict[tuple[str, int], list] = {}
    for half_points in per_bundle:
        for h in half_points:
            by_point.setdefault((h.mode, h.vms), []).append(h)
    if by_point:
        goal = f"{GOAL_ERROR_PCT:g}%"
        t = Table(title="the emulator against itself: each half of a point's repetitions "
                        "(even, odd) predicted by the other half's fastest run, and by the "
                        "model from the other half's fastest trace")
        each = len(per_bundle) == 1  # one bundle: its two halves' own numbers
        for col in ("mode", "VMs") + (("other half %",) if each else ()) \
                + (f"other within {goal}", "other mean |%|") \
                + (("model %",) if each else ()) + (f"model within {goal}", "model mean |%|"):
            t.add_column(col, justify="right")
        for (mode, vms), hs in sorted(by_point.items()):
            cells = [mode, str(vms)]
            for errors in ([h.other_pct for h in hs], [h.model_pct for h in hs]):
                if each:
                    cells.append(" ".join(f"{e:+.0f}" for e in errors))
                cells += [f"{sum(abs(e) <= GOAL_ERROR_PCT for e in errors)}/{len(errors)}",
                          f"{statistics.mean(map(abs, errors)):.1f}"]
            t.add_row(*cells)
        console.print(t)
    print(halves.summary(per_bundle))


def print_needed_handoffs(needed: dict[tuple[str, int], float], priced: float) -> None:
    """One line per mode: the interpreter lock's hand-off each count of VMs as threads
    would need to come out right, beside the one every point was priced with."""
    modes = sorted({mode for mode, _ in needed})
    if not modes:
        return
    print(f"the lock hand-off each point needs (us; priced at {priced / 1e3:.1f}):")
    for mode in modes:
        print(f"  {mode}: " + ", ".join(f"{vms} VMs {ns / 1e3:.1f}"
                                        for (m, vms), ns in sorted(needed.items())
                                        if m == mode))


def print_vcpu_usage(spread) -> None:
    """Per mode, what the VMs beside one did to its vCPU thread in the run, against the
    model: the sleeps they added, beside the exits the model has sleep for the
    interpreter lock -- whether the model's lock makes the VMs wait as often as the
    run's did; and its CPU time over one VM's alone, beside the model VM's time on host
    cores over one VM's (its guests grown, its work under the lock grown, the wake-ups
    it signalled) -- whether a VM's own work grows as the model has it."""
    def lines(measured: str, run: Callable, model: Callable, cell: Callable) -> list[str]:
        by_point = {(s.mode, s.vms): s for s in spread if getattr(s, measured) is not None}
        out = []
        for mode in sorted({mode for mode, _ in by_point}):
            alone = by_point.get((mode, 1))
            if alone is None:
                continue
            out.append(f"  {mode}: " + ", ".join(
                f"{vms} VMs " + cell(run(s, alone), model(s, alone))
                for (m, vms), s in sorted(by_point.items()) if m == mode and vms > 1))
        return out
    sleeps = lines("sleeps_per_vm",
                   lambda s, a: s.sleeps_per_vm - a.sleeps_per_vm,
                   lambda s, a: s.model_sleeps_per_vm - a.model_sleeps_per_vm,
                   lambda run, model: f"{run:+,.0f} / {model:+,.0f}")
    if sleeps:
        print("sleeps per VM beyond one VM's, run / model (the vCPU thread's waits; the "
              "exits the model has wait for the lock), median of the repetitions:")
        print("\n".join(sleeps))
    cpu = lines("cpu_per_vm_ns",
                lambda s, a: s.cpu_per_vm_ns / a.cpu_per_vm_ns,
                lambda s, a: s.model_cpu_per_vm_ns / a.model_cpu_per_vm_ns,
                lambda run, model: f"{run:.2f}x / {model:.2f}x")
    if cpu:
        print("CPU per VM over one VM's, run / model (the vCPU thread's CPU time; the "
              "model VM's time on host cores), median of the repetitions:")
        print("\n".join(cpu))


# ------------------------------------------------------------------ --pt-footprint
def main_footprint(args: argparse.Namespace) -> int:
    from gpuvm.calibrate.footprint import build_and_count, footprint_table

    nbytes, counts = parse_size(args.map_size), parse_counts(args.vms or "1,8")
    if args.mmu == "v2":
        return main_footprint_v2(args, nbytes, counts)
    try:
        rows = footprint_table(nbytes, counts)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    built = {} if args.no_cross_check else {
        r: build_and_count(r.nbytes, r.page, r.spaces, r.shared) for r in rows}
    for r, b in built.items():
        if (b.allocated_bytes, b.ptes, b.pdes, b.pts, b.pages_translated) != \
                (r.pt_bytes, r.ptes, r.pdes, r.pts, r.spaces * r.nbytes // 4096):
            print(f"gpuvm: error: cross-check failed for {r}: built {b}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps([{**r.__dict__, "pte_bytes": r.pte_bytes, "pde_bytes": r.pde_bytes,
                           "entry_bytes": r.entry_bytes,
                           "cross_checked": r in built} for r in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"GPU page tables mapping {human(nbytes)} of pinned sysram "
                    f"(PDE covers 128 MiB; small PT 32768 entries, large PT 1024)")
    for col in ("page", "VMs", "mapping", "PTEs", "PDEs", "(PTEs+PDEs)×8", "tables",
                "table VRAM", "built = counted"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r.page, str(r.spaces), "shared" if r.shared else "own tables",
                  f"{r.ptes:,}", f"{r.pdes:,}", f"{r.entry_bytes:,} B ({human(r.entry_bytes)})",
                  str(r.pts), human(r.pt_bytes), "yes" if r in built else "not built")
    Console(width=140).print(t)
    return 0


def main_footprint_v2(args: argparse.Namespace, nbytes: int, counts: list[int]) -> int:
    from gpuvm.calibrate import mmu_v2

    limit = 0 if args.no_cross_check else parse_size(args.build_limit)
    try:
        rows = mmu_v2.study(nbytes, counts, limit)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    bad = [(f, b) for f, b in rows if b is not None and not mmu_v2.agrees(f, b)]
    if bad:
        print(f"gpuvm: error: read back differs from the counts for {bad[0][0]}: {bad[0][1]}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([{"page": f.page, "nbytes": f.nbytes, "spaces": f.spaces,
                           "shared": f.shared, "tables": f.tables, "entries": f.entries,
                           "table_bytes": f.table_bytes, "pte_bytes": f.pte_bytes,
                           "seed_bytes": f.entries["pte"] * mmu_v2.SEED_PTE_BYTES,
                           "built": b is not None,
                           "vram_used": b.vram_used if b else mmu_v2.vram_needed(f),
                           "pages_translated": f"{b.pages_translated}/{b.pages_checked}"
                           if b else None} for f, b in rows], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"version-2 GPU page tables mapping {human(nbytes)} of pinned sysram "
                    "(PD3/PD2/PD1/PD0 + 4K or 64K page tables; 2M pages in PD0)")
    for col in ("page", "spaces", "mapping", "page entries", "tables", "table bytes",
                "VRAM (4K-aligned)", "seed: 8 B/page", "built, read back"):
        t.add_column(col, justify="right")
    for f, b in rows:
        t.add_row(f.page, str(f.spaces), "shared once" if f.shared else "own tables",
                  f"{f.entries['pte']:,}", f"{sum(f.tables.values()):,}",
                  f"{f.table_bytes:,} ({human(f.table_bytes)})",
                  human(b.vram_used if b else mmu_v2.vram_needed(f)),
                  human(f.entries["pte"] * mmu_v2.SEED_PTE_BYTES),
                  f"yes, {b.pages_translated}/{b.pages_checked} pages translated" if b
                  else "counted only (over --build-limit)")
    Console(width=160).print(t)
    return 0
