"""`gpuvm calibrate`: --gpu measures a real GPU; --pt-footprint computes page-table VRAM.

The GPU part needs an NVIDIA GPU and CuPy or PyTorch; without them it says so in one line
and exits non-zero.  The footprint part runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

from gpuvm.calibrate.stats import MIN_REPS
from gpuvm.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
EXIT_NO_GPU = 3
COSTS_DIR = Path("experiments") / "costs"


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
    g.add_argument("--reps", type=int, default=7, help=f"repetitions (>= {MIN_REPS}; default 7)")
    g.add_argument("--out", type=Path, default=None,
                   help="profile TOML to write (default experiments/costs/gpu-<model>.toml)")
    f = parser.add_argument_group("--pt-footprint")
    f.add_argument("--map-size", default="1G", help="pinned bytes mapped (default 1G)")
    f.add_argument("--vms", default=None,
                   help="VM/process counts (default 1,8)")
    f.add_argument("--no-cross-check", action="store_true",
                   help="arithmetic only: skip building the tables in emulated VRAM")


def main(args: argparse.Namespace) -> int:
    if args.gpu:
        return main_gpu(args)
    if args.show:
        return main_show(args)
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
    if chunk % 4096 or pin_bytes % 4096 or offset % 4096 or any(s % 4096 for s in sizes):
        raise UserError("--sizes, --pin-size, --chunk and --chunk-offset must be multiples "
                        "of 4 KiB")
    if offset >= chunk:
        raise UserError(f"--chunk-offset {args.chunk_offset} must be smaller than --chunk")
    try:
        cuda = find_backend(args.backend)
    except NoGpu as exc:
        print(f"gpuvm: error: calibrate --gpu: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    command = "gpuvm calibrate " + shlex.join(sys.argv[sys.argv.index("calibrate") + 1:]) \
        if "calibrate" in sys.argv else "gpuvm calibrate --gpu"
    plan = gpu.Plan(sizes, pin_bytes, chunk, args.reps, command, offset)
    log = (lambda m: print(f"… {m}", file=sys.stderr)) if not args.json else (lambda m: None)
    profile = gpu.calibrate(cuda, plan, log)
    out = args.out or COSTS_DIR / f"gpu-{model_slug(profile.device.gpu)}.toml"
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

    d = profile.device
    console = Console(width=120)
    console.print(escape(f"{d.gpu}, driver {d.driver}, CUDA {d.cuda_runtime}, {d.backend}, "
                         f"kernel {d.kernel}; shmem THP [{d.shmem_thp}], anon THP "
                         f"[{d.anon_thp}]; measured {d.date}; {d.reps} reps, median [min–max]"))
    t = Table(title="copy bandwidth, GiB/s")
    for col in ("size", "direction", "host memory", escape("GiB/s median [min–max]")):
        t.add_column(col)
    for b in profile.bandwidth:
        t.add_row(human(b.nbytes), b.direction.upper(), b.host, escape(b.gib_s.text()))
    console.print(t)
    grid = f", grid shifted {human(d.chunk_offset)}" if d.chunk_offset else ""
    t = Table(title=f"chunked pin/unpin (cudaHostRegister/Unregister), {human(d.chunk_bytes)} "
                    f"chunks{grid}")
    for col in ("memory", "huge-mapped", "size", "register ms", "unregister ms",
                "µs/chunk pin", "µs/chunk unpin"):
        t.add_column(col)
    for p in profile.pin:
        t.add_row(p.memory, human(p.huge_kib * 1024) if p.huge_kib else "0", human(p.nbytes),
                  escape(p.register_ms.text()), escape(p.unregister_ms.text()),
                  f"{p.register_ms.median * 1000 / p.chunks:.1f}",
                  f"{p.unregister_ms.median * 1000 / p.chunks:.1f}")
    console.print(t)
    t = Table(title="D2H into a memfd (THP vs MADV_NOHUGEPAGE), GiB/s")
    for col in ("memory", "how the driver handles it", "huge-mapped before→after",
                escape("GiB/s median [min–max]")):
        t.add_column(col)
    for c in profile.d2h_into:
        t.add_row(c.memory, c.mode, f"{human(c.huge_kib_before * 1024) if c.huge_kib_before else '0'}"
                  f" → {human(c.huge_kib_after * 1024) if c.huge_kib_after else '0'}",
                  escape(c.gib_s.text()))
    console.print(t)


# ------------------------------------------------------------------ --pt-footprint
def main_footprint(args: argparse.Namespace) -> int:
    from gpuvm.calibrate.footprint import build_and_count, footprint_table

    nbytes, counts = parse_size(args.map_size), parse_counts(args.vms or "1,8")
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
