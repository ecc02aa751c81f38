"""`gpuvm run`: benchmarks in VMs sharing one emulated GPU, and a table of what happened.

What each VM runs is said once per VM with `--vm 'bench=mmul,size=64,type=...'`
(repeatable); `-b/--size/--inject/--type` give every VM the same.  The summary is one
table (VM x phase) that fits 80 columns; `--detail` adds the per-VM tables, `--json` and
`--out DIR` give the same rows an experiment writes (gpuvm/experiment/execute.py VmRow).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console

from gpuvm.device import regs
from gpuvm.device.clock import CLOCKS
from gpuvm.errors import UserError
from gpuvm.experiment import cli as experiment_cli
from gpuvm.experiment.config import Experiment, ScenarioConfig, VmConfig
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import rows_for
from gpuvm.mdevctl import MdevStore
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevTypeError
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import DEFAULT_HOST_BACKING_MIB
from gpuvm.run.execute import run_vms
from gpuvm.run.mediated import gpu_types, machine_profile
from gpuvm.run.observe import ProgressObserver, StatusWriter
from gpuvm.run.result import VmResult
from gpuvm.run.spec import RunError, RunOptions, VmSpec
from gpuvm.run.tables import render, render_comparison, render_summary, render_vms
from gpuvm.trace import TraceRecorder
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.backends import BACKENDS
from gpuvm.vmm.guest_ram import ALLOCATIONS, default_allocation
from scheduler import POLICIES

PINNED_BENCHMARKS = ("vecadd", "madd", "mmul", "fmadd", "memcpy")  # params[1] = pinned
COST_PROFILE = "xen-2014"


# ------------------------------------------------------------------------ values
def _int(text: str) -> int:
    """An integer in any base (0x1000); `1e6` is refused with what to write instead."""
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    hint = f" (write {int(value)})" if math.isfinite(value) and value.is_integer() else ""
    raise argparse.ArgumentTypeError(f"{text!r} is not an integer{hint}")


def _size(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _positive_float(unit: str = ""):
    """An argparse type: a finite number above 0 (of `unit`, named in the error)."""
    of = f" of {unit}" if unit else ""
    after = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number{of}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be more than 0{after}")
        return value
    return parse


_seconds = _positive_float("seconds")
_scale = _positive_float()


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing")
    return names


def benchmark_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in guest_programs.BENCHMARKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"no benchmark {bad[0] if bad else text!r} (have {', '.join(guest_programs.BENCHMARKS)})")
    return names


# ------------------------------------------------------------------------ --vm
VM_KEYS = {
    "bench": "benchmark (as -b)", "size": "params[0] (as --size)",
    "params": "all parameters, colon-separated (64:1)", "inject": "fault injection",
    "type": "mdev type", "mdev": "a defined mdev's UUID", "share": "scheduler weight",
    "pinned": "1: pinned host buffers", "vector": "probe: vector name", "addr": "probe: "
    "address", "len": "probe: length",
}


@dataclass
class VmRequest:
    """One VM as the command line says it (every key optional; defaults come from the
    run-wide flags)."""

    bench: str | None = None
    params: list[int] | None = None
    inject: str | None = None
    type: str | None = None
    mdev: str | None = None
    share: float | None = None
    pinned: bool = False
    probe: dict[str, int] = field(default_factory=dict)


def vm_request(text: str) -> VmRequest:
    """Parse `bench=mmul,size=64,inject=bad-method,type=T` (one --vm)."""
    req = VmRequest()
    for item in (i.strip() for i in text.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise argparse.ArgumentTypeError(f"{item!r}: want KEY=VALUE (keys: "
                                             f"{', '.join(VM_KEYS)})")
        if key == "bench":
            req.bench = benchmark_list(value)[0]
        elif key == "size":
            req.params = [_size(value)] + (req.params or [])[1:]
        elif key == "params":
            req.params = [_size(v) for v in value.split(":")]
        elif key == "inject":
            if value not in abi.FI_NAMES:
                raise argparse.ArgumentTypeError(f"inject={value!r}: no such fault (have "
                                                 f"{', '.join(sorted(abi.FI_NAMES))})")
            req.inject = value
        elif key == "type":
            req.type = value
        elif key == "mdev":
            req.mdev = value
        elif key == "share":
            req.share = _scale(value)
        elif key == "pinned":
            req.pinned = value not in ("0", "no", "false")
        elif key == "vector":
            if value not in guest_programs.PROBE_VECTORS:
                raise argparse.ArgumentTypeError(
                    f"vector={value!r}: no such probe vector (have "
                    f"{', '.join(guest_programs.PROBE_VECTORS)})")
            req.probe["vector"] = guest_programs.PROBE_VECTORS[value]
        elif key in ("addr", "len"):
            req.probe[key] = _size(value)
        else:
            raise argparse.ArgumentTypeError(f"no VM key {key!r} (have "
                                             f"{', '.join(VM_KEYS)})")
    return req


# ------------------------------------------------------------------------ arguments
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, metavar="FILE.toml",
                        help="run the scenarios of an experiment file instead (same as "
                             "`gpuvm experiment FILE`); takes no other run option")
    parser.add_argument("--benchmark", "-b", type=benchmark_list,
                        metavar="NAME[,NAME...]",
                        help=f"benchmark(s): VM i runs the i-th (have: "
                             f"{', '.join(guest_programs.BENCHMARKS)})")
    parser.add_argument("--vm", action="append", type=vm_request, default=[],
                        metavar="KEY=VALUE[,...]",
                        help="one VM, its options in one place (repeatable): "
                             + "; ".join(f"{k}: {v}" for k, v in VM_KEYS.items())
                             + ". Keys left out come from -b/--size/--inject/--type")
    parser.add_argument("--mode", default="native",
                        help="how the GPU is shared: one mode, several separated by commas "
                             "(a comparison table follows), or 'all' (have: "
                             f"{', '.join(MODES)})")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="how guests run: kvm (a KVM vCPU per VM; its page-table "
                             "stores queue in KVM's coalesced-MMIO ring unless "
                             "$GPUVM_COALESCE=0, which makes each exit: same counts and "
                             "modelled times, more wall time), inproc (the driver "
                             "as a shared library in this process), auto (kvm when "
                             "/dev/kvm works)")
    parser.add_argument("--size", type=_size, nargs="+", default=[], metavar="N",
                        help="benchmark parameters of every VM: params[0] (size, at least "
                             "1; left out = the benchmark's default), params[1], ...")
    parser.add_argument("--pinned", action="store_true",
                        help="pinned host buffers (sets params[1] = 1)")
    parser.add_argument("--inject", choices=sorted(abi.FI_NAMES),
                        help="make every VM's driver program this error (one VM: --vm "
                             "inject=...)")
    parser.add_argument("--vms", type=_positive_int, default=None,
                        help="number of VMs (default: one per benchmark or --vm named)")
    parser.add_argument("--pv", action="store_true", help="run the paravirtual driver")
    parser.add_argument("--pv-batch", type=_size, default=0,
                        help="PV: entries per hypercall (1 = pv-naive, 0 = the maximum)")
    parser.add_argument("--ram-alloc", default=None, choices=ALLOCATIONS,
                        help="when the host allocates each guest's RAM: as the VM is built "
                             "(default: $GPUVM_RAM_ALLOC, else immediate), or as the guest "
                             "first touches it")
    parser.add_argument("--timeout", type=_seconds, default=600.0,
                        help="wall seconds each VM may run (more than 0)")
    parser.add_argument("--time-scale", type=_scale, default=1.0,
                        help="device clock speed relative to wall time: 2 makes GPU work "
                             "take half the wall time (default 1)")
    parser.add_argument("--clock", default=None, choices=CLOCKS,
                        help="device clock: virtual (the default) -- each event a guest "
                             "causes takes its price in the cost profile, GPU work the "
                             "device profile's time, so every result repeats on any host -- "
                             "or wall (a live demo: results then depend on this host)")
    parser.add_argument("--vram-mib", type=_positive_int,
                        help="VRAM of the emulated GPU in MiB (default: the device "
                             "profile's); the vGPU types are sized from it")
    parser.add_argument("--type", dest="mdev_type", type=_names, metavar="TYPE[,TYPE...]",
                        help="the vGPU (mdev) type of each VM, the i-th for VM i (default: "
                             "the GPU's default type; see `gpuvm mdev types`); native VMs "
                             "get a GPU of that type's shape")
    parser.add_argument("--mdev", type=_names, metavar="UUID[,UUID...]",
                        help="run VM i on the mdev defined with this UUID (`gpuvm mdev "
                             "create`): its type and mode come from the definition")
    parser.add_argument("--gpus", type=_positive_int, default=1,
                        help="emulated GPUs in the host (mediated modes): each VM's vGPU "
                             "goes on the first with an instance of its type left")
    parser.add_argument("--host-backing-mib", type=_positive_int, default=None,
                        help="host memory the backing stores of oversubscribed vGPUs "
                             "(types ending -OS) may take together, per GPU, in MiB "
                             "(default 16384)")
    parser.add_argument("--isolated", action="store_true",
                        help="each VM in its own VMM process, its device attached over "
                             "vfio-user (the same virtual times and counts as in-process)")
    parser.add_argument("--policy", default="fifo", choices=tuple(POLICIES),
                        help="the GPU scheduler of mediated modes (default fifo)")
    parser.add_argument("--detail", action="store_true",
                        help="also print each VM's tables (every count, MMIO by block)")
    parser.add_argument("--json", action="store_true",
                        help="print the run's rows as JSON (as an experiment's runs.jsonl) "
                             "instead of tables")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="write the rows to DIR/runs.jsonl (as an experiment does)")
    parser.add_argument("--trace", type=Path, metavar="FILE",
                        help="write a trace Perfetto opens (Chrome JSON; one per mode: "
                             "FILE, or FILE with -MODE before its suffix)")


# ------------------------------------------------------------------------ specs
def _default_type(vram_size: int | None) -> str:
    return mdev_types.default_type_id(gpu_types(machine_profile(RunOptions(vram_size=vram_size))))


def _type_vram(type_id: str, vram_size: int | None) -> int:
    types = gpu_types(machine_profile(RunOptions(vram_size=vram_size)))
    try:
        return mdev_types.lookup(types, type_id).partition.vram_size
    except MdevTypeError as exc:
        raise RunError(str(exc)) from None


def _probe_params(req: VmRequest, params: list[int], vram: int) -> list[int]:
    """A probe needs a vector: without one it probes through the channel's page table
    the first byte past its own VRAM (an attacker's first try), 16 bytes."""
    if params and params[0]:
        return params
    out = [req.probe.get("vector", guest_programs.PROBE_VECTORS["channel_pt"]),
           req.probe.get("addr", vram), req.probe.get("len", 16)]
    return out + params[3:]


def _mdev_fields(uuid: str) -> dict[str, object]:
    """A defined mdev's type, mode and UUID, and the GPU it is on: its parent's index
    among the host's GPUs (the run gets at least that many)."""
    try:
        store = MdevStore()
        d = store.get(uuid)
        gpu = store.parent_of(d.parent).index
    except MdevTypeError as exc:
        raise RunError(str(exc)) from None
    return {"mdev_type": d.type_id, "mode": d.mode, "mdev_uuid": d.uuid, "gpu": gpu}


def machine_gpus(asked: int, specs: list[VmSpec]) -> int:
    """The run's GPU count: what --gpus asks, or more where a VM's mdev is on a later
    parent GPU."""
    return max([asked] + [s.gpu + 1 for s in specs if s.gpu is not None])


def specs_from_args(args: argparse.Namespace) -> list[VmSpec]:
    requests: list[VmRequest] = args.vm or []
    benchmarks: list[str] = args.benchmark or []
    count = args.vms if args.vms is not None else max(len(requests), len(benchmarks))
    vram = args.vram_mib * regs.MiB if args.vram_mib else None
    default_type = _default_type(vram)
    specs = []
    for i in range(count):
        req = requests[i % len(requests)] if requests else VmRequest()
        bench = req.bench or (benchmarks[i % len(benchmarks)] if benchmarks else None)
        if bench is None:
            raise RunError(f"vm{i}: no benchmark (give -b NAME or --vm bench=NAME)")
        params = list(req.params if req.params is not None else args.size)
        if args.pinned or req.pinned:
            if bench not in PINNED_BENCHMARKS:
                raise RunError(f"vm{i}: pinned buffers apply to "
                               f"{', '.join(PINNED_BENCHMARKS)}, not {bench}")
            params += [0] * max(0, 2 - len(params))
            params[1] = 1
        if bench != "probe" and params and params[0] == 0:
            raise RunError(f"vm{i}: size 0 means nothing to {bench}; leave --size out "
                           f"for its default")
        mdev = req.mdev or (args.mdev[i % len(args.mdev)] if args.mdev else None)
        vgpu: dict[str, object]
        if mdev:
            vgpu = _mdev_fields(mdev)
        else:
            vgpu = {"mdev_type": req.type or (args.mdev_type[i % len(args.mdev_type)]
                                              if args.mdev_type else default_type)}
        if bench == "probe":
            params = _probe_params(req, params, _type_vram(str(vgpu["mdev_type"]), vram))
        specs.append(VmSpec(f"vm{i}", bench, params, req.inject or args.inject, args.pv,
                            args.pv_batch, share=req.share,
                            ram_alloc=args.ram_alloc or default_allocation(), **vgpu))
    return specs


def parse_modes(text: str) -> list[str]:
    modes = list(MODES) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise RunError(f"no mode {unknown[0] if unknown else text!r} "
                       f"(have {', '.join(MODES)}, or all)")
    return modes


RUN_ONLY = ("policy", "benchmark", "vm", "size", "pinned", "inject", "vms", "pv", "pv_batch",
            "ram_alloc", "timeout", "time_scale", "clock", "vram_mib", "mdev_type", "mdev",
            "detail", "json", "out", "trace")


def _config_conflicts(args: argparse.Namespace, parser_defaults: dict[str, object]) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in RUN_ONLY + ("mode",)
            if getattr(args, name, None) != parser_defaults.get(name)]


_DEFAULTS = {"policy": "fifo", "benchmark": None, "vm": [], "size": [], "pinned": False, "inject": None,
             "vms": None, "pv": False, "pv_batch": 0, "ram_alloc": None, "timeout": 600.0, "time_scale": 1.0, "clock": None,
             "vram_mib": None, "mdev_type": None, "mdev": None, "detail": False,
             "json": False, "out": None, "trace": None, "mode": "native"}


# ------------------------------------------------------------------------ rows
def experiment_rows(args: argparse.Namespace, runs: dict[str, list[VmResult]]) -> list:
    """The rows an experiment of this run would write (one per VM and mode)."""
    costs = load_costs(COST_PROFILE)
    rows = []
    for mode, results in runs.items():
        vms = tuple(VmConfig(r.spec.name, r.spec.benchmark, tuple(r.spec.params),
                             share=r.spec.share or 1.0, inject=r.spec.inject)
                    for r in results)
        scenario = ScenarioConfig("cli", vms)
        exp = Experiment("gpuvm-run", "benchmarks", (scenario,), modes=tuple(runs),
                         backend=args.backend, cost_profile=COST_PROFILE)
        rows += rows_for(exp, scenario, mode, args.policy, 0, results, costs)
    return rows


def _trace_path(base: Path, mode: str, several: bool) -> Path:
    return base if not several else base.with_name(f"{base.stem}-{mode}{base.suffix}")


# ------------------------------------------------------------------------ main
def main(args: argparse.Namespace) -> int:
    if args.config is not None:
        conflicts = _config_conflicts(args, _DEFAULTS)
        if conflicts:
            raise UserError(f"--config runs the file's scenarios; it takes no "
                            f"{', '.join(conflicts)}")
        return experiment_cli.main(argparse.Namespace(config=args.config, report=None,
                                                      backend=None if args.backend == "auto"
                                                      else args.backend))
    if not args.benchmark and not args.vm:
        raise UserError("--benchmark (or --vm, or --config) is required")
    # the terminal's width, or when piped $COLUMNS else 80: the tables are built to fit 80
    console = Console()
    runs: dict[str, list[VmResult]] = {}
    specs_by_mode: dict[str, list[VmSpec]] = {}
    failed: list[str] = []
    try:
        modes = parse_modes(args.mode)
        specs = specs_from_args(args)
        if any(s.mode for s in specs):  # mdevs carry their own mode: one run on the GPU
            modes = [next(s.mode for s in specs if s.mode)]
        for mode in modes:
            specs_by_mode[mode] = specs
            runs[mode] = _run_mode(args, mode, specs, len(modes), console)
            prefix = f"{mode}: " if len(modes) > 1 else ""
            failed += [f"{prefix}{r.error() or 'failed'}" for r in runs[mode] if not r.passed]
    except RunError as exc:
        raise UserError(str(exc)) from None
    rows = experiment_rows(args, runs)
    if args.out is not None:
        _write_rows(args.out, rows)
    if args.json:
        print(json.dumps([asdict(r) for r in rows]))
    else:
        _print_tables(console, args, runs, rows)
    if failed:  # not bad input: the run was made and its rows written (exit status 1)
        print(f"gpuvm: error: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _run_mode(args: argparse.Namespace, mode: str, specs: list[VmSpec], n_modes: int,
              console: object) -> list[VmResult]:
    prices = load_costs(COST_PROFILE).event_prices(MODES[mode].mediated)
    options = RunOptions(mode=mode, prices=prices, backend=args.backend, timeout=args.timeout,
                         time_scale=args.time_scale, gpus=machine_gpus(args.gpus, specs),
                         isolated=args.isolated, clock=args.clock,
                         host_backing_mib=args.host_backing_mib or DEFAULT_HOST_BACKING_MIB,
                         vram_size=args.vram_mib * regs.MiB if args.vram_mib else None,
                         scheduler={"policy": args.policy} if args.policy != "fifo" else {})
    observers: list[object] = [StatusWriter(mode, args.policy)]
    trace = None
    if args.trace is not None:
        trace = TraceRecorder(args.time_scale)
        observers.append(trace)
    with ExitStack() as stack:
        if sys.stdout.isatty() and sys.stderr.isatty() and not args.json:
            observers.append(stack.enter_context(ProgressObserver(
                len(specs), f"{mode}: VMs done", Console(stderr=True))))
        results = run_vms(specs, options, observers=observers)
    if trace is not None:
        try:
            written = trace.write(_trace_path(args.trace, mode, n_modes > 1))
            print(f"trace: {written} (open it in ui.perfetto.dev)", file=sys.stderr)
        except OSError as exc:
            raise RunError(f"--trace {args.trace}: {exc.strerror or exc}") from None
    return results


def _write_rows(out: Path, rows: list) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "runs.jsonl", "a") as f:
            for row in rows:
                f.write(json.dumps(asdict(row)) + "\n")
    except OSError as exc:
        raise UserError(f"--out {out}: {exc.strerror or exc}") from None
    print(f"rows: {out / 'runs.jsonl'}", file=sys.stderr)


def _print_tables(console: object, args: argparse.Namespace,
                  runs: dict[str, list[VmResult]], rows: list) -> None:
    if args.detail:
        for mode, results in runs.items():
            for r in results:
                for renderable in render(r, r.outcome.backend, mode):
                    console.print(renderable)
        if len(runs) > 1:
            console.print(render_comparison(runs, ",".join(args.benchmark or ["--vm"])))
    for renderable in render_vms(runs, rows):
        console.print(renderable)
    for renderable in render_summary(rows, COST_PROFILE):
        console.print(renderable)
