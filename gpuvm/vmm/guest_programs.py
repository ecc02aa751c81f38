"""The guest programs and `gpuvm build-guest`.

One driver source tree (guest_tools/) gives two programs: `driver`, the unmodified driver
that native and every full-virtualization mode run byte for byte, and `driver_pv`, the
same sources with the paravirtual page-table path (-DGPUVM_PV).  Each is built as a flat
KVM image and as an in-process shared library by gpuvm.vmm.guest_build, which skips
builds whose inputs did not change, so calling `build_all()` before every run is cheap.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from gpuvm.errors import UserError
from gpuvm.vmm.guest_build import BuildError, GuestTarget, build_flat, build_shared

# params[7] of the boot parameters belongs to the driver: in the PV build, the entries
# per map/unmap hypercall (1 = pv-naive, 0 = HC_MAX_ENTRIES).  See guest_tools/include/params.h.
PARAM_PV_BATCH = 7
BENCH_NUM_PARAMS = 7

BENCHMARKS = ("vecadd", "madd", "mmul", "fmadd", "memcpy", "loop", "idle", "probe", "hostmem")

# Probe vectors (guest_tools/include/probe.h)
PROBE_VECTORS = {"channel_pt": 1, "bar1": 2, "bar3": 3, "pramin": 4, "ramin": 5,
                 "sysram": 6, "pv_map": 7}

_COMMON = [
    "platform/platform_kvm.c", "platform/platform_host.c",
    "lib/string.c", "lib/fmt.c", "lib/range.c", "lib/ram.c", "lib/io.c",
    "driver/gpu.c", "driver/vram.c", "driver/instmem.c", "driver/vm.c", "driver/hostmem.c",
    "driver/pushbuf.c", "driver/channel.c",
    "runtime/runtime.c",
    "bench/main.c", "bench/common.c", "bench/kernels.c", "bench/misc.c", "bench/probe.c",
    "bench/hostmem.c",
]

DRIVER = GuestTarget("driver", [*_COMMON, "driver/pt_direct.c"])
DRIVER_PV = GuestTarget("driver_pv", [*_COMMON, "driver/pt_pv.c"], defines={"GPUVM_PV": ""})
TARGETS: dict[str, GuestTarget] = {t.name: t for t in (DRIVER, DRIVER_PV)}
IMAGE_KINDS = ("flat", "shared")


@dataclass(frozen=True)
class GuestProgram:
    """The built forms of one guest target."""

    name: str
    flat: Path | None
    shared: Path | None


def build(target: GuestTarget, kinds: tuple[str, ...] = IMAGE_KINDS) -> GuestProgram:
    """Build `target` in the given forms (each skipped when already up to date)."""
    return GuestProgram(target.name,
                        build_flat(target) if "flat" in kinds else None,
                        build_shared(target) if "shared" in kinds else None)


def build_all(names: list[str] | None = None,
              kinds: tuple[str, ...] = IMAGE_KINDS) -> dict[str, GuestProgram]:
    """Build the named targets (all by default); raises BuildError with one line."""
    unknown = [n for n in names or [] if n not in TARGETS]
    if unknown:
        raise BuildError(f"no guest target {unknown[0]!r} (have {', '.join(TARGETS)})")
    return {n: build(TARGETS[n], kinds) for n in (names or list(TARGETS))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", action="append", choices=sorted(TARGETS),
                        help="build only this target (repeatable; default: all)")
    parser.add_argument("--kind", choices=("flat", "shared", "both"), default="both",
                        help="flat KVM image, in-process shared library, or both")


def main(args: argparse.Namespace) -> int:
    kinds = IMAGE_KINDS if args.kind == "both" else (args.kind,)
    try:
        programs = build_all(args.target, kinds)
    except BuildError as exc:
        raise UserError(str(exc)) from None
    for prog in programs.values():
        for path in (prog.flat, prog.shared):
            if path is not None:
                print(path)
    return 0
