"""`gpuvm run`: benchmarks in VMs sharing one emulated GPU, and a table of what happened.

Three layers, so the mediator can add modes and VMs without touching the rest:
- `VmSpec` says what one VM runs; `RunOptions` how (mode, backend, limits).
- A *machine* is what a mode builds for one run: the GPU and each VM's view of it
  (`attach` returns the GpuTarget the VM's accesses go to, and its hypercall handler).
  Modes are factories in `MODES`; "native" is here, others come with `register_mode`.
- `run_vms(specs, options)` builds the guests, runs every VM to the end and returns
  `VmResult`s; printing (`render`) and the CLI (`main`) only read those.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from dataclasses import dataclass
from typing import Callable

from gpuvm.device import regs
from gpuvm.device.faults import ChannelFault
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.backends import BACKENDS, GuestRunner, make_runner, resolve_backend
from gpuvm.vmm.guest_build import BuildError
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession, PhaseRecord, boot_params_for
from gpuvm.run_spec import Attachment, Machine, RunError, RunOptions, VmSpec
from scheduler.metrics import VmMetrics

__all__ = ["Attachment", "Machine", "RunError", "RunOptions", "VmSpec", "VmResult", "run_vms",
           "register_mode", "MODES", "render"]

BAR_BASES = {regs.BAR0: abi.GUEST_BAR0_BASE, regs.BAR1: abi.GUEST_BAR1_BASE,
             regs.BAR3: abi.GUEST_BAR3_BASE}
PINNED_BENCHMARKS = ("vecadd", "madd", "mmul", "fmadd", "memcpy")  # params[1] = pinned


class NativeMachine:
    """Native mode: no mediator.  Each VM owns an emulated GPU of its own (as if one
    physical GPU were passed through to each); its accesses reach that device directly,
    and the device DMAs straight into its RAM (guest-physical = bus address)."""

    paravirtual = False  # whether the PV driver may run here (it needs a hypercall handler)

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        from dataclasses import replace

        from gpuvm.device.profile import load_profile

        for spec in specs:
            if spec.paravirtual and not self.paravirtual:
                raise RunError(f"{spec.name}: native mode runs the unmodified driver; "
                               f"the PV driver needs a paravirtual mode")
        self.profile = load_profile(options.profile) if options.profile else load_profile()
        self.vram_size = options.vram_size
        if options.native_as_partition is not None:
            from gpuvm.mediator.partition import PartitionSpec
            part = PartitionSpec(**options.native_as_partition)
            self.profile = replace(self.profile, bar1_size=part.bar1_size,
                                   bar3_size=part.bar3_size,
                                   partitions=1)  # a vGPU reports its slice as one partition
            self.vram_size = part.vram_size
        self.time_scale = options.time_scale
        self.bar_sizes = {regs.BAR0: regs.BAR0_SIZE, regs.BAR1: self.profile.bar1_size,
                          regs.BAR3: self.profile.bar3_size}
        self.gpus: dict[str, object] = {}

    def attach(self, spec: VmSpec, ram: GuestRam) -> Attachment:
        from gpuvm.device.dma import RamPort
        from gpuvm.device.gpu import Gpu

        gpu = Gpu(self.profile, time_scale=self.time_scale, vram_size=self.vram_size)
        gpu.attach_sysram(RamPort(ram.array))
        self.gpus[spec.name] = gpu.start()
        return Attachment(gpu)

    def detach(self, spec: VmSpec) -> None:
        gpu = self.gpus.pop(spec.name, None)
        if gpu is not None:
            gpu.release_memory()

    def close(self) -> None:
        for name in list(self.gpus):
            self.gpus.pop(name).release_memory()


POLL_S = 0.005  # how often the runner looks for VMs that ended or are due to start

MODES: dict[str, Callable[[RunOptions, list[VmSpec]], Machine]] = {"native": NativeMachine}


def register_mode(name: str, factory: Callable[[RunOptions, list[VmSpec]], Machine]) -> None:
    """Make `--mode name` build its machine with `factory(options, specs)`."""
    MODES[name] = factory


@contextmanager
def mode_override(name: str, factory: Callable[[RunOptions, list[VmSpec]], Machine]):
    """Build `name`'s machines with `factory` for the duration, then restore the previous
    one (instrumented machines in tests and experiments)."""
    before = MODES[name]
    register_mode(name, factory)
    try:
        yield
    finally:
        register_mode(name, before)


# ------------------------------------------------------------------------------ running
@dataclass
class VmResult:
    spec: VmSpec
    outcome: GuestOutcome
    faults: list[ChannelFault]
    scheduler: VmMetrics | None = None  # what the GPU scheduler saw (mediated modes)

    @property
    def session(self) -> GuestSession:
        return self.outcome.session

    @property
    def passed(self) -> bool:
        return self.outcome.passed

    @property
    def record(self) -> dict[str, str]:
        """The guest's last result record ({} when it reported none)."""
        return self.session.results[-1] if self.session.results else {}

    def error(self) -> str | None:
        """One line saying why this VM failed (its first channel fault if it had one)."""
        if self.passed:
            return None
        if self.faults:
            return f"{self.spec.name}: {self.faults[0]}"
        return self.outcome.describe_failure()


def run_vms(specs: list[VmSpec], options: RunOptions | None = None) -> list[VmResult]:
    """Run every VM of `specs` to the end on one machine of `options.mode`."""
    options = options or RunOptions()
    if not specs:
        raise RunError("no VMs to run")
    if len({s.name for s in specs}) != len(specs):
        raise RunError("VM names must be unique")
    if options.mode not in MODES:
        raise RunError(f"no mode {options.mode!r} (have {', '.join(sorted(MODES))})")
    try:
        backend = resolve_backend(options.backend)
    except (ValueError, RuntimeError) as exc:
        raise RunError(str(exc)) from None
    from gpuvm.mediated_machine import guest_for_mode
    specs = [guest_for_mode(s, options.mode) for s in specs]
    boot = [(s, s.boot_params(), s.flags()) for s in specs]  # validate before building
    try:
        programs = guest_programs.build_all(sorted({s.program for s in specs}),
                                            kinds=("flat",) if backend == "kvm" else ("shared",))
    except BuildError as exc:
        raise RunError(str(exc)) from None

    machine = MODES[options.mode](options, specs)
    return _run_on(machine, boot, programs, backend, options)


@dataclass
class _Running:
    spec: VmSpec
    ram: GuestRam
    att: Attachment
    runner: GuestRunner
    deadline: float


def _run_on(machine: Machine, boot: list[tuple[VmSpec, list[int], int]],
            programs: dict, backend: str, options: RunOptions) -> list[VmResult]:
    """Start each VM at its start_delay (its partition is created then), collect each as it
    ends (its partition is given back then, while the others keep running)."""
    pending = sorted(boot, key=lambda b: b[0].start_delay)
    running: list[_Running] = []
    results: dict[str, VmResult] = {}
    rams: list[GuestRam] = []
    stuck = False
    t0 = time.monotonic()
    try:
        while pending or running:
            now = time.monotonic()
            due: list[_Running] = []  # attached together, then started together
            while pending and now - t0 >= pending[0][0].start_delay:
                spec, params, flags = pending.pop(0)
                ram = GuestRam(spec.ram_size)
                rams.append(ram)
                att = machine.attach(spec, ram)
                bar_sizes = att.bar_sizes or machine.bar_sizes
                session = GuestSession(spec.name, ram, att.target,
                                       wait_timeout=min(options.wait_slice, options.timeout),
                                       hypercall=att.hypercall)
                boot_params_for(ram, spec.benchmark, params, flags, BAR_BASES, bar_sizes)
                prog = programs[spec.program]
                runner = make_runner(backend, spec.name, prog.flat, prog.shared, ram, session,
                                     bar_sizes)
                if att.memslots is not None:
                    att.memslots(runner.memslots)
                due.append(_Running(spec, ram, att, runner, now + options.timeout))
            for r in due:
                r.runner.start()
                running.append(r)
            for r in [r for r in running if not r.runner.alive() or now >= r.deadline]:
                outcome = r.runner.join(max(0.0, r.deadline - time.monotonic()))
                metrics = getattr(machine, "metrics", lambda spec: None)(r.spec)
                results[r.spec.name] = VmResult(r.spec, outcome, r.att.target.faults(), metrics)
                running.remove(r)
                if r.runner.alive():
                    stuck = True  # its thread would not stop: leave its VM in place
                else:
                    machine.detach(r.spec)
            if pending or running:
                next_start = pending[0][0].start_delay - (time.monotonic() - t0) if pending \
                    else POLL_S
                time.sleep(max(0.0, min(POLL_S, next_start)))
        return [results[spec.name] for spec, _, _ in boot]
    finally:
        for r in running:  # only on an exception: stop what still runs
            r.runner.stop("the run was aborted")
            r.runner.join(5)
            stuck = stuck or r.runner.alive()
        # A guest thread that would not stop may still touch its RAM and the GPU: then
        # both stay mapped (leaked) rather than pulled from under it.
        if not stuck:
            machine.close()
            for ram in rams:
                ram.close()


# ------------------------------------------------------------------------------ table
def _sum(counters: dict[str, int], *names: str) -> int:
    return sum(counters.get(n, 0) for n in names)


def _prefix_sum(counters: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in counters.items() if k.startswith(prefix))


PHASE_COLUMNS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Exits BAR0", lambda c: _sum(c, "exits.mmio.bar0.read", "exits.mmio.bar0.write")),
    ("Exits BAR1", lambda c: _sum(c, "exits.mmio.bar1.read", "exits.mmio.bar1.write")),
    ("Exits BAR3", lambda c: _sum(c, "exits.mmio.bar3.read", "exits.mmio.bar3.write")),
    ("Exits I/O", lambda c: c.get("exits.io", 0)),
    # the device counts these in native mode; the vGPU counts the guest's own in mediated ones
    ("PRAMIN", lambda c: _prefix_sum(c, "mmio.bar0.pramin.") + _prefix_sum(c, "trap.bar0.pramin.")),
    ("TLB flush", lambda c: c.get("tlb.guest_flushes", c.get("tlb.flushes", 0))),
    ("Doorbell", lambda c: c.get("pfifo.doorbells", 0)),
    ("Copied bytes", lambda c: c.get("copy.bytes", 0)),
    ("Kernels", lambda c: c.get("compute.kernels", 0)),
]
MEDIATED_COLUMNS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Traps", lambda c: _prefix_sum(c, "trap.bar")),
    ("Shadow syncs", lambda c: c.get("shadow.syncs", 0)),
    ("PTEs scanned", lambda c: c.get("shadow.ptes_scanned", 0)),
    ("Refused", lambda c: c.get("shadow.ptes_refused", 0) + _prefix_sum(c, "trap.refused.")),
    ("Hypercalls", lambda c: c.get("hcall.calls", 0)),
]
TABLE_WIDTH = 150  # when stdout is not a terminal (rich would assume 80 columns)

DRIVER_COUNTS = ("pte_writes", "pde_writes", "pt_zero_words", "tlb_flushes", "doorbells",
                 "hypercalls", "hc_entries", "copies", "launches", "waits")


def _total(phases: list[PhaseRecord]) -> PhaseRecord:
    total = PhaseRecord("Total")
    for p in phases:
        total.wall_ns += p.wall_ns
        total.device_ns += p.device_ns
        for k, v in p.counters.items():
            total.counters[k] = total.counters.get(k, 0) + v
    return total


def render(result: VmResult, backend: str, mode: str) -> list[object]:
    """rich renderables describing one VM's run: phases, MMIO by block, driver counts."""
    from rich.table import Table
    from rich.text import Text

    s = result.session
    rec = result.record
    status = Text("PASS", style="bold green") if result.passed else Text("FAIL", style="bold red")
    sizes = " ".join(f"{k}={v}" for k, v in rec.items()
                     if k in ("n", "bytes", "iterations", "pinned", "vector", "addr", "len"))
    title = Text.assemble(f"{result.spec.name}: {result.spec.benchmark} {sizes} "
                          f"({mode}, {backend}) ", status)
    if "maxerr" in rec:
        title.append(f"  maxerr={rec['maxerr']} tol={rec.get('tol', '?')}")

    table = Table(title=title, title_justify="left")
    columns = PHASE_COLUMNS + (MEDIATED_COLUMNS if mode != "native" else [])
    table.add_column("Phase")
    table.add_column("Wall ms", justify="right")
    table.add_column("Device ms", justify="right")
    for name, _ in columns:
        table.add_column(name, justify="right", no_wrap=True)
    rows = s.phases + ([_total(s.phases)] if s.phases else [])
    for i, p in enumerate(rows):
        table.add_row(p.name, f"{p.wall_ns / 1e6:.2f}", f"{p.device_ns / 1e6:.2f}",
                      *(f"{fn(p.counters):,}" for _, fn in columns),
                      end_section=i == len(rows) - 2)

    total = rows[-1].counters if rows else {}
    blocks = Table(title="MMIO reaching the device, by block (all phases)", title_justify="left")
    blocks.add_column("Block")
    blocks.add_column("Reads", justify="right")
    blocks.add_column("Writes", justify="right")
    names = sorted({k.rsplit(".", 1)[0] for k in total
                    if k.startswith("mmio.") and k.endswith((".read", ".write"))})
    for n in names:
        blocks.add_row(n.removeprefix("mmio."), f"{total.get(n + '.read', 0):,}",
                       f"{total.get(n + '.write', 0):,}")
    driver = "  ".join(f"{k}={rec[k]}" for k in DRIVER_COUNTS if k in rec)
    out: list[object] = [table, blocks]
    if driver:
        out.append(Text(f"driver: {driver}"))
    return out


def totals(result: VmResult) -> PhaseRecord:
    return _total(result.session.phases)


def render_comparison(runs: dict[str, list[VmResult]], benchmark: str) -> object:
    """One row per mode (summed over its VMs): where the time and the traps went."""
    from rich.table import Table

    table = Table(title=f"{benchmark}: modes compared (sums over each mode's VMs)",
                  title_justify="left")
    for col in ("Mode", "VMs pass", "Wall ms", "Init+Close %", "Exits", "Traps",
                "Shadow syncs", "PTEs scanned", "Refused", "Hypercalls", "HC entries",
                "Remap maps"):
        table.add_column(col, justify="left" if col == "Mode" else "right", no_wrap=True)
    for mode, results in runs.items():
        phases = [p for r in results for p in r.session.phases]
        total = _total(phases)
        c = total.counters
        init_close = sum(p.wall_ns for p in phases if p.name in ("Init", "Close"))
        table.add_row(
            mode, f"{sum(r.passed for r in results)}/{len(results)}",
            f"{total.wall_ns / 1e6:,.1f}",
            f"{100 * init_close / total.wall_ns:.0f}" if total.wall_ns else "-",
            f"{_prefix_sum(c, 'exits.'):,}", f"{_prefix_sum(c, 'trap.bar'):,}",
            f"{c.get('shadow.syncs', 0):,}", f"{c.get('shadow.ptes_scanned', 0):,}",
            f"{c.get('shadow.ptes_refused', 0) + _prefix_sum(c, 'trap.refused.'):,}",
            f"{c.get('hcall.calls', 0):,}", f"{c.get('hcall.entries', 0):,}",
            f"{c.get('remap.maps', 0):,}")
    return table


# ------------------------------------------------------------------------------ CLI
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
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="device clock speed relative to wall time")
    parser.add_argument("--vram-mib", type=int, help="VRAM of the emulated GPU")


def benchmark_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in guest_programs.BENCHMARKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"no benchmark {bad[0] if bad else text!r} (have {', '.join(guest_programs.BENCHMARKS)})")
    return names


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
    return [VmSpec(f"vm{i}", benchmarks[i % len(benchmarks)], params, args.inject, args.pv,
                   args.pv_batch) for i in range(vms)]


def parse_modes(text: str) -> list[str]:
    modes = list(MODES) if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise RunError(f"no mode {unknown[0] if unknown else text!r} "
                       f"(have {', '.join(MODES)}, or all)")
    return modes


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gpuvm.errors import UserError

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
        for mode in modes:
            specs = specs_from_args(args)
            options = RunOptions(mode=mode, backend=args.backend, timeout=args.timeout,
                                 time_scale=args.time_scale,
                                 vram_size=args.vram_mib * regs.MiB if args.vram_mib else None,
                                 # compared with mediated modes, the native guest sees the
                                 # GPU one partition shows, so its driver does the same work
                                 native_as_partition={} if len(modes) > 1 else None)
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


def _register_mediated_modes() -> None:
    from gpuvm.mediated_machine import register
    register()


_register_mediated_modes()
