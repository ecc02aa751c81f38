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

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuvm.calibrate import gpu, mmu_v2
from gpuvm.calibrate.cuda import NoGpu, find_backend
from gpuvm.calibrate.footprint import build_and_count, footprint_table
from gpuvm.calibrate.profile import load, to_json_dict, to_toml
from gpuvm.calibrate.smart_pinning import crossover
from gpuvm.calibrate.stats import MIN_REPS
from gpuvm.cli_values import parse_counts
from gpuvm.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
EXIT_NO_GPU = 3
SHMEM_MODES = ("always", "within_size", "advise", "never", "deny", "force")
DEFAULT_OUT_DIR = Path("experiments") / "costs"


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
    f = parser.add_argument_group("--pt-footprint")
    f.add_argument("--map-size", default="1G", help="pinned bytes mapped (default 1G)")
    f.add_argument("--vms", default=None,
                   help="VM/process counts (default 1,8)")
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
    if args.show:
        return main_show(args)
    return main_footprint(args)


def main_show(args: argparse.Namespace) -> int:
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
    out = args.out or DEFAULT_OUT_DIR / f"gpu-{model_slug(profile.device.gpu)}{suffix}.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_toml(profile))
    if args.json:
        print(json.dumps(to_json_dict(profile), indent=2))
    else:
        print_profile(profile)
        print(f"profile written to {out}")
    return 0


def print_profile(profile) -> None:
    d = profile.device
    console = Console()  # the terminal's width; piped, $COLUMNS or 80
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
        console.print(_whole(t))
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
        console.print(_whole(t))
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
        console.print(_whole(t))
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
        console.print(_whole(t))
        for policy, against in (("smart", "none"), ("all", "none"), ("all", "smart")):
            size = crossover(profile.smart, policy, against)
            console.print(f"{policy} beats {against} from "
                          f"{human(size) if size else 'no size measured'} up")


def _whole(table):
    """`table` made to fit the console whole: a cell too wide folds onto more lines, never
    cut with an ellipsis (a piped screen is 80 columns)."""
    table.box, table.pad_edge = box.SIMPLE_HEAD, False
    for column in table.columns:
        column.overflow = "fold"
    return table


def _kib(kib: int) -> str:
    return "?" if kib < 0 else human(kib * 1024) if kib else "0"


# ------------------------------------------------------------------ --pt-footprint
def main_footprint(args: argparse.Namespace) -> int:
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
    t = Table(title=f"GPU page tables mapping {human(nbytes)} of pinned sysram "
                    f"(PDE covers 128 MiB; small PT 32768 entries, large PT 1024)")
    for col in ("page", "VMs", "mapping", "PTEs", "PDEs", "entry bytes", "tables",
                "table VRAM", "built = counted"):  # entry bytes: (PTEs + PDEs) x 8
        t.add_column(col, justify="right", no_wrap=col in ("VMs", "PTEs", "PDEs", "tables"))
    for r in rows:
        t.add_row(r.page, str(r.spaces), "shared" if r.shared else "own tables",
                  f"{r.ptes:,}", f"{r.pdes:,}", human(r.entry_bytes),
                  str(r.pts), human(r.pt_bytes), "yes" if r in built else "not built")
    Console().print(_whole(t))  # the terminal's width; piped, $COLUMNS or 80
    return 0


def main_footprint_v2(args: argparse.Namespace, nbytes: int, counts: list[int]) -> int:
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
    Console().print(_whole(t))  # the terminal's width; piped, $COLUMNS or 80
    return 0
