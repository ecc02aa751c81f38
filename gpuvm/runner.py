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
from dataclasses import dataclass, field
from typing import Callable, Protocol

from gpuvm.device import regs
from gpuvm.device.faults import ChannelFault
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.backends import BACKENDS, GuestRunner, make_runner, resolve_backend
from gpuvm.vmm.guest_build import BuildError
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession, PhaseRecord, boot_params_for
from gpuvm.vmm.target import GpuTarget

BAR_BASES = {regs.BAR0: abi.GUEST_BAR0_BASE, regs.BAR1: abi.GUEST_BAR1_BASE,
             regs.BAR3: abi.GUEST_BAR3_BASE}
PINNED_BENCHMARKS = ("vecadd", "madd", "mmul", "fmadd", "memcpy")  # params[1] = pinned


class RunError(Exception):
    """A run cannot be set up (bad spec, unknown mode, build failure); one line."""


# ------------------------------------------------------------------------------ specs
@dataclass
class VmSpec:
    """One VM: the benchmark it runs and how its guest is configured."""

    name: str
    benchmark: str
    params: list[int] = field(default_factory=list)  # benchmark params[0..6]
    inject: str | None = None  # a key of abi.FI_NAMES
    paravirtual: bool = False  # run the PV driver build
    pv_batch: int = 0  # PV build: entries per hypercall (0 = HC_MAX_ENTRIES, 1 = naive)
    ram_size: int = abi.GUEST_RAM_DEFAULT

    @property
    def program(self) -> str:
        return guest_programs.DRIVER_PV.name if self.paravirtual else guest_programs.DRIVER.name

    def flags(self) -> int:
        flags = abi.BOOT_FLAG_PV if self.paravirtual else 0
        if self.inject is not None:
            if self.inject not in abi.FI_NAMES:
                raise RunError(f"{self.name}: unknown fault injection {self.inject!r} "
                               f"(have {', '.join(sorted(abi.FI_NAMES))})")
            flags |= abi.FI_NAMES[self.inject] << abi.BOOT_FI_SHIFT
        return flags

    def boot_params(self) -> list[int]:
        if self.benchmark not in guest_programs.BENCHMARKS:
            raise RunError(f"{self.name}: no benchmark {self.benchmark!r} (have "
                           f"{', '.join(guest_programs.BENCHMARKS)})")
        if len(self.params) > guest_programs.BENCH_NUM_PARAMS:
            raise RunError(f"{self.name}: at most {guest_programs.BENCH_NUM_PARAMS} "
                           f"benchmark parameters, got {len(self.params)}")
        if any(not 0 <= p < 1 << 64 for p in self.params) or self.pv_batch < 0:
            raise RunError(f"{self.name}: parameters must be unsigned 64-bit integers")
        params = list(self.params) + [0] * (abi.BOOT_NUM_PARAMS - len(self.params))
        params[guest_programs.PARAM_PV_BATCH] = self.pv_batch
        return params


@dataclass
class RunOptions:
    mode: str = "native"
    backend: str = "auto"  # kvm | inproc | auto
    timeout: float = 600.0  # per VM, wall seconds
    # Longest single PORT_WAIT; the driver re-waits while its channel is healthy, so this
    # only bounds how late a fault the wait did not see is noticed.
    wait_slice: float = 30.0
    time_scale: float = 1.0  # device clock speed relative to wall time
    vram_size: int | None = None  # None: the device profile's
    profile: str | None = None  # device profile name or path


# ------------------------------------------------------------------------------ machines
@dataclass
class Attachment:
    """How one VM reaches the GPU."""

    target: GpuTarget
    hypercall: Callable[[GuestRam, int], None] | None = None


class Machine(Protocol):
    """What a mode builds for one run (see the module docstring)."""

    bar_sizes: dict[int, int]

    def attach(self, spec: VmSpec, ram: GuestRam) -> Attachment: ...

    def close(self) -> None: ...


class NativeMachine:
    """Native mode: one VM owns the emulated GPU; its accesses reach the device directly,
    and the device DMAs straight into its RAM (guest-physical = bus address)."""

    paravirtual = False  # whether the PV driver may run here (it needs a hypercall handler)

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        from gpuvm.device.gpu import Gpu
        from gpuvm.device.profile import load_profile

        if len(specs) != 1:
            raise RunError(f"native mode runs exactly one VM (the GPU is not shared); "
                           f"got {len(specs)}")
        if specs[0].paravirtual and not self.paravirtual:
            raise RunError(f"{specs[0].name}: native mode runs the unmodified driver; "
                           f"the PV driver needs a paravirtual mode")
        profile = load_profile(options.profile) if options.profile else None
        self.gpu = Gpu(profile, time_scale=options.time_scale, vram_size=options.vram_size)
        self.bar_sizes = {regs.BAR0: regs.BAR0_SIZE, regs.BAR1: self.gpu.profile.bar1_size,
                          regs.BAR3: self.gpu.profile.bar3_size}
        self.gpu.start()

    def attach(self, spec: VmSpec, ram: GuestRam) -> Attachment:
        from gpuvm.device.dma import RamPort

        self.gpu.attach_sysram(RamPort(ram.array))
        return Attachment(self.gpu)

    def close(self) -> None:
        self.gpu.release_memory()


MODES: dict[str, Callable[[RunOptions, list[VmSpec]], Machine]] = {"native": NativeMachine}


def register_mode(name: str, factory: Callable[[RunOptions, list[VmSpec]], Machine]) -> None:
    """Make `--mode name` build its machine with `factory(options, specs)`."""
    MODES[name] = factory


# ------------------------------------------------------------------------------ running
@dataclass
class VmResult:
    spec: VmSpec
    outcome: GuestOutcome
    faults: list[ChannelFault]

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
    boot = [(s, s.boot_params(), s.flags()) for s in specs]  # validate before building
    try:
        programs = guest_programs.build_all(sorted({s.program for s in specs}),
                                            kinds=("flat",) if backend == "kvm" else ("shared",))
    except BuildError as exc:
        raise RunError(str(exc)) from None

    machine = MODES[options.mode](options, specs)
    rams: list[GuestRam] = []
    runners: list[tuple[VmSpec, Attachment, GuestRunner]] = []
    try:
        for spec, params, flags in boot:
            ram = GuestRam(spec.ram_size)
            rams.append(ram)
            att = machine.attach(spec, ram)
            session = GuestSession(spec.name, ram, att.target,
                                   wait_timeout=min(options.wait_slice, options.timeout),
                                   hypercall=att.hypercall)
            boot_params_for(ram, spec.benchmark, params, flags, BAR_BASES, machine.bar_sizes)
            prog = programs[spec.program]
            runners.append((spec, att, make_runner(backend, spec.name, prog.flat, prog.shared,
                                                   ram, session, machine.bar_sizes)))
        for _, _, runner in runners:
            runner.start()
        results = []
        for spec, att, runner in runners:
            outcome = runner.join(options.timeout)
            results.append(VmResult(spec, outcome, att.target.faults()))
        return results
    finally:
        # A guest thread that would not stop may still touch its RAM and the GPU: then
        # both stay mapped (leaked) rather than pulled from under it.
        if not any(getattr(r, "alive", lambda: False)() for _, _, r in runners):
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
    ("PRAMIN", lambda c: _prefix_sum(c, "mmio.bar0.pramin.")),
    ("TLB flush", lambda c: c.get("tlb.flushes", 0)),
    ("Doorbell", lambda c: c.get("pfifo.doorbells", 0)),
    ("Copied bytes", lambda c: c.get("copy.bytes", 0)),
    ("Kernels", lambda c: c.get("compute.kernels", 0)),
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
    table.add_column("Phase")
    table.add_column("Wall ms", justify="right")
    table.add_column("Device ms", justify="right")
    for name, _ in PHASE_COLUMNS:
        table.add_column(name, justify="right", no_wrap=True)
    rows = s.phases + ([_total(s.phases)] if s.phases else [])
    for i, p in enumerate(rows):
        table.add_row(p.name, f"{p.wall_ns / 1e6:.2f}", f"{p.device_ns / 1e6:.2f}",
                      *(f"{fn(p.counters):,}" for _, fn in PHASE_COLUMNS),
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


# ------------------------------------------------------------------------------ CLI
def _int(text: str) -> int:
    return int(text, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--benchmark", "-b", required=True, choices=guest_programs.BENCHMARKS)
    parser.add_argument("--mode", default="native",
                        help=f"how the GPU is shared (have: {', '.join(sorted(MODES))})")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument("--size", type=_int, nargs="+", default=[], metavar="N",
                        help="benchmark parameters: params[0] (size), params[1], ...")
    parser.add_argument("--pinned", action="store_true",
                        help="pinned host buffers (sets params[1] = 1)")
    parser.add_argument("--inject", choices=sorted(abi.FI_NAMES),
                        help="make the driver program this error")
    parser.add_argument("--vms", type=int, default=1, help="number of VMs")
    parser.add_argument("--pv", action="store_true", help="run the paravirtual driver")
    parser.add_argument("--pv-batch", type=int, default=0,
                        help="PV: entries per hypercall (1 = pv-naive, 0 = the maximum)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per VM")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="device clock speed relative to wall time")
    parser.add_argument("--vram-mib", type=int, help="VRAM of the emulated GPU")


def specs_from_args(args: argparse.Namespace) -> list[VmSpec]:
    params = list(args.size)
    if args.pinned:
        if args.benchmark not in PINNED_BENCHMARKS:
            raise RunError(f"--pinned applies to {', '.join(PINNED_BENCHMARKS)}, "
                           f"not {args.benchmark}")
        params += [0] * max(0, 2 - len(params))
        params[1] = 1
    if args.vms < 1:
        raise RunError("--vms must be at least 1")
    return [VmSpec(f"vm{i}", args.benchmark, params, args.inject, args.pv, args.pv_batch)
            for i in range(args.vms)]


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gpuvm.cli import UserError

    options = RunOptions(mode=args.mode, backend=args.backend, timeout=args.timeout,
                         time_scale=args.time_scale,
                         vram_size=args.vram_mib * regs.MiB if args.vram_mib else None)
    try:
        results = run_vms(specs_from_args(args), options)
    except RunError as exc:
        raise UserError(str(exc)) from None
    backend = results[0].outcome.backend
    console = Console(width=None if sys.stdout.isatty() else TABLE_WIDTH)
    for r in results:
        for renderable in render(r, backend, args.mode):
            console.print(renderable)
    failed = [r.error() for r in results if not r.passed]
    if failed:
        raise UserError("; ".join(e or "failed" for e in failed))
    return 0
