"""`gpuvm run`: benchmarks in VMs sharing one emulated GPU, and a table of what happened."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.mediator.modes import MODES
from gpuvm.run.execute import VmResult, run_vms
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.run.tables import TABLE_WIDTH, render, render_comparison
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.backends import BACKENDS

PINNED_BENCHMARKS = ("vecadd", "madd", "mmul", "fmadd", "memcpy")  # params[1] = pinned


def _int(text: str) -> int:
    return int(text, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE.toml",
                        help="run the scenarios of an experiment file instead (same as "
                             "`gpuvm experiment FILE`)")
    parser.add_argument("--benchmark", "-b", type=benchmark_list,
                        metavar="NAME[,NAME...]",
                        help=f"benchmark(s): VM i runs the i-th (have: "
                             f"{', '.join(guest_programs.BENCHMARKS)})")
    parser.add_argument("--mode", default="native",
                        help="how the GPU is shared: one mode, several separated by commas "
                             "(a comparison table follows), or 'all' (have: "
                             "native, fv, fv+remap, fv+lazy, fv-opt, pv-naive, pv)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--size", type=_int, nargs="+", default=[], metavar="N",
                        help="benchmark parameters: params[0] (size), params[1], ...")
    parser.add_argument("--pinned", action="store_true",
                        help="pinned host buffers (sets params[1] = 1)")
    parser.add_argument("--inject", choices=sorted(abi.FI_NAMES),
                        help="make the driver program this error")
    parser.add_argument("--vms", type=int, default=None,
                        help="number of VMs (default: one per benchmark named)")
    parser.add_argument("--pv", action="store_true", help="run the paravirtual driver")
    parser.add_argument("--pv-batch", type=int, default=0,
                        help="PV: entries per hypercall (1 = pv-naive, 0 = the maximum)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per VM")
    parser.add_argument("--isolated", action="store_true",
                        help="each VM in its own VMM process, its device attached over "
                             "vfio-user (same counts as in-process)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="device clock speed relative to wall time")
    parser.add_argument("--vram-mib", type=int, help="VRAM of the emulated GPU")
    parser.add_argument("--gpus", type=int, default=1,
                        help="emulated GPUs in the host (mediated modes): each VM's vGPU "
                             "goes on the first with an instance of its type left")
    parser.add_argument("--type", dest="mdev_type", type=_names, metavar="TYPE[,TYPE...]",
                        help="the vGPU (mdev) type of each VM, the i-th for VM i (default: "
                             "the GPU's default type; see `gpuvm mdev types`); native VMs "
                             "get a GPU of that type's shape")
    parser.add_argument("--mdev", type=_names, metavar="UUID[,UUID...]",
                        help="run VM i on the mdev defined with this UUID (`gpuvm mdev "
                             "create`): its type and mode come from the definition")


def benchmark_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in guest_programs.BENCHMARKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"no benchmark {bad[0] if bad else text!r} (have {', '.join(guest_programs.BENCHMARKS)})")
    return names


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing")
    return names


def _vgpu_of_vm(args: argparse.Namespace, i: int, vram_size: int | None) -> dict[str, object]:
    """VmSpec fields for VM i's vGPU: from --mdev (a defined instance), else --type."""
    if args.mdev:
        from gpuvm.mdevctl import MdevStore
        from gpuvm.mediator.mdev_types import MdevTypeError
        try:
            d = MdevStore().get(args.mdev[i % len(args.mdev)])
        except MdevTypeError as exc:
            raise RunError(str(exc)) from None
        return {"mdev_type": d.type_id, "mode": d.mode, "mdev_uuid": d.uuid}
    if args.mdev_type:
        return {"mdev_type": args.mdev_type[i % len(args.mdev_type)]}
    from gpuvm.mediator import mdev_types
    from gpuvm.run.mediated import gpu_types, machine_profile
    types = gpu_types(machine_profile(RunOptions(vram_size=vram_size)))
    return {"mdev_type": mdev_types.default_type_id(types)}


def specs_from_args(args: argparse.Namespace) -> list[VmSpec]:
    benchmarks: list[str] = args.benchmark
    params = list(args.size)
    if args.pinned:
        if any(b not in PINNED_BENCHMARKS for b in benchmarks):
            raise RunError(f"--pinned applies to {', '.join(PINNED_BENCHMARKS)}, "
                           f"not {', '.join(b for b in benchmarks if b not in PINNED_BENCHMARKS)}")
        params += [0] * max(0, 2 - len(params))
        params[1] = 1
    vms = args.vms if args.vms is not None else len(benchmarks)
    if vms < 1:
        raise RunError("--vms must be at least 1")
    vram = args.vram_mib * regs.MiB if args.vram_mib else None
    return [VmSpec(f"vm{i}", benchmarks[i % len(benchmarks)], params, args.inject, args.pv,
                   args.pv_batch, **_vgpu_of_vm(args, i, vram)) for i in range(vms)]


def parse_modes(text: str) -> list[str]:
    modes = list(MODES) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise RunError(f"no mode {unknown[0] if unknown else text!r} "
                       f"(have {', '.join(MODES)}, or all)")
    return modes


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    if args.config is not None:
        from gpuvm import experiment
        return experiment.main(argparse.Namespace(config=args.config, report=None,
                                                  backend=None if args.backend == "auto"
                                                  else args.backend))
    if not args.benchmark:
        raise UserError("--benchmark (or --config) is required")
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH)
    runs: dict[str, list[VmResult]] = {}
    failed: list[str] = []
    try:
        modes = parse_modes(args.mode)
        if args.mdev:  # each mdev carries its own mode: one run on the shared GPU
            modes = [specs_from_args(args)[0].mode]
        for mode in modes:
            specs = specs_from_args(args)
            options = RunOptions(mode=mode, backend=args.backend, timeout=args.timeout,
                                 time_scale=args.time_scale, gpus=args.gpus,
                                 isolated=args.isolated,
                                 vram_size=args.vram_mib * regs.MiB if args.vram_mib else None)
            results = runs[mode] = run_vms(specs, options)
            backend = results[0].outcome.backend
            for r in results:
                for renderable in render(r, backend, mode):
                    console.print(renderable)
            prefix = f"{mode}: " if len(modes) > 1 else ""
            failed += [f"{prefix}{r.error() or 'failed'}" for r in results if not r.passed]
    except RunError as exc:
        raise UserError(str(exc)) from None
    if len(runs) > 1:
        console.print(render_comparison(runs, ",".join(args.benchmark)))
    if failed:
        raise UserError("; ".join(failed))
    return 0


