"""`gpuvm vm start`: one VM in this process, its vGPU served by `gpuvm serve`.

The VMM connects to the mdev's vfio-user socket, attaches the vGPU over it (DMA-maps its
RAM memfd, maps granted VRAM pages as memslots, takes its MSI as an eventfd), runs the
benchmark and prints how it went -- the per-phase counts with --json.  It exits 0 when
the guest passed, 1 when it did not.
"""

from __future__ import annotations

import argparse
import json

from gpuvm.errors import UserError
from gpuvm.mdevctl import MdevStore
from gpuvm.mediator.mdev_types import MdevTypeError
from gpuvm.mediator.modes import MODES
from gpuvm.run.spec import RunError, VmSpec
from gpuvm.serve import socket_path
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vmm import guest_programs
from gpuvm.vmm.backends import resolve_backend
from gpuvm.vmm.guest_build import BuildError
from gpuvm.vmm.vm_process import recorded_outcome, run_vm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="vm_command", required=True)
    start = sub.add_parser("start", help="run a benchmark in a VM attached to a served vGPU")
    start.add_argument("--mdev", required=True, metavar="UUID", help="the vGPU (gpuvm mdev "
                       "list) that `gpuvm serve` serves")
    start.add_argument("-b", "--bench", required=True, help="benchmark the guest runs")
    start.add_argument("-p", "--param", type=int, action="append", default=[],
                       help="benchmark parameter (repeat for params[0..])")
    start.add_argument("--name", default="", help="VM name (default: the UUID's prefix)")
    start.add_argument("--backend", default="auto", help="kvm, inproc or auto")
    start.add_argument("--timeout", type=float, default=600.0, help="wall seconds")
    start.add_argument("--json", action="store_true", help="print the whole record as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        definition = MdevStore().get(args.mdev)
    except MdevTypeError as exc:
        raise UserError(str(exc)) from None
    mode = MODES[definition.mode]
    spec = VmSpec(args.name or definition.uuid[:8], args.bench, list(args.param),
                  paravirtual=mode.pv, pv_batch=mode.pv_batch if mode.pv else 0)
    try:
        params, flags = spec.boot_params(), spec.flags()
        backend = resolve_backend(args.backend)
        kind = "flat" if backend == "kvm" else "shared"
        program = guest_programs.build_all([spec.program], kinds=(kind,))[spec.program]
    except (RunError, BuildError, ValueError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    path = socket_path(definition.uuid)
    try:
        device = VfioUserDevice.connect(str(path), spec.name)
    except VfioError as exc:
        raise UserError(f"{exc} (is `gpuvm serve` running?)") from None
    job = {"name": spec.name, "benchmark": spec.benchmark, "params": params, "flags": flags,
           "ram_size": spec.ram_size, "ram_alloc": spec.ram_alloc,
           "flat": str(program.flat) if program.flat else None,
           "shared": str(program.shared) if program.shared else None, "backend": backend,
           "timeout": args.timeout, "wait_timeout": min(30.0, args.timeout)}
    try:
        record = run_vm(device, job)
    except VfioError as exc:
        raise UserError(str(exc)) from None
    outcome, faults = recorded_outcome(record)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        verdict = "PASS" if outcome.passed else f"FAIL ({outcome.describe_failure()})"
        # within 80 columns; the time is this host's wall time, not a result
        print(f"{spec.name}: {args.bench} ({definition.mode}, over vfio-user, {backend}): "
              f"{verdict}\n  vGPU {definition.uuid}")
        for phase in outcome.session.phases:
            traps = sum(v for k, v in phase.counters.items() if k.startswith("trap."))
            exits = sum(v for k, v in phase.counters.items() if k.startswith("exits."))
            print(f"  {phase.name:8} traps {traps:7,}  exits {exits:7,}  "
                  f"wall {phase.wall_ns / 1e6:9,.2f} ms")
        for fault in faults:
            print(f"  fault: {fault}")
    return 0 if outcome.passed else 1
