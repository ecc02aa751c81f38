"""`gpuvm bench exits`: what one trapped BAR access costs on KVM, and what remap saves.

One guest (guest_tools/bench_exits.c) does N 32-bit BAR0 stores twice and then stores to
a BAR1 page backed by a memslot, all in one VM run, so the three numbers share the host's
conditions:

- raw:      every store exits and the VMM re-enters at once -- the floor set by KVM and
            the Python ioctl, with no handler at all;
- dispatch: the same stores through the runner's normal exit path (BAR window lookup,
            exit counters, ``target.mmio_write(0, PMC_INTR_EN, 4, v)``);
- remap:    stores to the memslot-backed page: no exit at all.

The guest brackets the loops with phase marks (HtoD = raw, Launch = dispatch,
DtoH = remap), so the session's per-phase wall time and exit counts delimit them; the
counts double as a check (N BAR0 write exits while dispatching, none while remapped).
Host noise is 20-40 %, so each figure is the minimum over several VM runs.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import mmap
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gpuvm.device import regs
from gpuvm.vmm import abi
from gpuvm.vmm.guest_build import GuestTarget, build_flat
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestSession, boot_params_for
from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm.vcpu import ExitLoop
from gpuvm.vmm.target import ChannelFault, GpuTarget

GUEST = GuestTarget("bench_exits", ["bench_exits.c"])
RAM_SIZE = 16 * regs.MiB
BAR_SIZES = {0: regs.BAR0_SIZE, 1: 16 * regs.MiB}
BAR_BASES = {0: abi.GUEST_BAR0_BASE, 1: abi.GUEST_BAR1_BASE}
REMAP_OFFSET = 0x10000  # BAR1 offset of the memslot-backed page
PHASE_RAW, PHASE_DISPATCH, PHASE_REMAP = "HtoD", "Launch", "DtoH"
DEFAULT_ITERATIONS = 10_000
DEFAULT_REPEATS = 3
REMAP_FACTOR = 1000  # remapped stores are ~1e5x cheaper: run more so one exit is noise


class RegisterTarget:
    """A dict-backed register file: the dispatch target while no device model exists.

    It does what a trivial device register does (store, count) and nothing more."""

    def __init__(self) -> None:
        self.registers: dict[tuple[int, int], int] = {}
        self.writes = 0
        self.reads = 0

    def mmio_read(self, bar: int, offset: int, size: int) -> int:
        self.reads += 1
        return self.registers.get((bar, offset), 0)

    def mmio_write(self, bar: int, offset: int, size: int, value: int) -> None:
        self.writes += 1
        self.registers[(bar, offset)] = value

    def wait_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return predicate()

    def faults(self) -> list[ChannelFault]:
        return []

    def counters(self) -> dict[str, int]:
        return {"regs.reads": self.reads, "regs.writes": self.writes}

    def device_time_ns(self) -> int:
        return 0


TARGETS = ("auto", "gpu", "registers")


def bench_target(kind: str = "auto") -> tuple[GpuTarget, str]:
    """The device the dispatch loop writes to: the emulated GPU (`Gpu()`, a native-mode
    target) when it exists, or the dict-backed register file."""
    if kind not in TARGETS:
        raise ValueError(f"target {kind!r} is not one of {', '.join(TARGETS)}")
    if kind in ("auto", "gpu"):
        try:
            from gpuvm.device.gpu import Gpu
        except ImportError:
            if kind == "gpu":
                raise
        else:
            return Gpu(), "Gpu"
    return RegisterTarget(), "RegisterTarget"


class RawThenDispatchLoop(ExitLoop):
    """Re-enters on every MMIO exit without handling it until the guest marks the
    dispatch phase, then continues as the normal exit loop.  Only for the bench guest:
    raw mode does not complete MMIO reads."""

    def run(self) -> str | None:
        try:
            ended = self._raw()
        except InterruptedError:
            return self._stop_reason() or "interrupted"
        except OSError as exc:
            return f"KVM_RUN failed: {exc.strerror}"
        if ended is not True:
            return ended
        return super().run()

    def _raw(self) -> str | None | bool:
        """True when the dispatch phase begins, None when the guest exited, else why not."""
        ioctl, fd, KVM_RUN = fcntl.ioctl, self.vm.vcpu_fd, api.KVM_RUN
        EXIT_MMIO = api.KVM_EXIT_MMIO
        u32 = self._u32
        while True:
            ioctl(fd, KVM_RUN)
            if u32[2] == EXIT_MMIO:
                continue
            if u32[2] != api.KVM_EXIT_IO or not self._u8[32]:
                return self._unexpected(u32[2])
            port, value = self._u16[17], u32[self._u64[5] >> 2]
            if self.session.port_out(port, value):
                return None
            if port == abi.PORT_PHASE and abi.PHASE_NAMES[value] == PHASE_DISPATCH:
                return True


@dataclass
class ExitBenchResult:
    iterations: int
    remap_iterations: int
    repeats: int
    target: str
    raw_us: float
    dispatch_us: float
    remap_us: float
    dispatch_over_raw: float
    remap_over_raw: float
    dispatch_exits: int  # BAR0 write exits counted during the dispatch loop (== iterations)
    remap_exits: int  # MMIO exits during the remap loop (== 0)


def _one_run(image: Path, iterations: int, remap_iterations: int,
             target: GpuTarget) -> dict[str, float | int]:
    from gpuvm.vmm.kvm.runner import KvmRunner

    class BenchRunner(KvmRunner):
        loop_class = RawThenDispatchLoop

    ram = GuestRam(RAM_SIZE)
    page = mmap.mmap(-1, mmap.PAGESIZE)  # stands in for a page of VRAM
    host = ctypes.c_uint32.from_buffer(page)
    try:
        session = GuestSession("bench-exits", ram, target)
        boot_params_for(ram, "bench_exits", [iterations, REMAP_OFFSET, remap_iterations],
                        0, BAR_BASES, BAR_SIZES)
        runner = BenchRunner("bench-exits", image, ram, session, BAR_SIZES)
        runner.memslots.map(abi.GUEST_BAR1_BASE + REMAP_OFFSET, ctypes.addressof(host),
                            mmap.PAGESIZE)
        runner.start()
        outcome = runner.join(600)
        if outcome.failure or session.exit_code != 0:
            raise RuntimeError(f"exit bench guest failed: {outcome.describe_failure()}")
        if host.value != (remap_iterations - 1) & 0xFFFFFFFF:
            raise RuntimeError(f"remapped stores did not land in host memory "
                               f"(last value {host.value:#x})")
        phases = {p.name: p for p in session.phases}
        remap_counts = phases[PHASE_REMAP].counters
        return {
            "raw_us": phases[PHASE_RAW].wall_ns / iterations / 1e3,
            "dispatch_us": phases[PHASE_DISPATCH].wall_ns / iterations / 1e3,
            "remap_us": phases[PHASE_REMAP].wall_ns / remap_iterations / 1e3,
            "dispatch_exits": phases[PHASE_DISPATCH].counters.get("exits.mmio.bar0.write", 0),
            "remap_exits": sum(v for k, v in remap_counts.items()
                               if k.startswith("exits.mmio.")),
        }
    finally:
        del host
        ram.close()
        page.close()


def run_exit_bench(iterations: int = DEFAULT_ITERATIONS, repeats: int = DEFAULT_REPEATS,
                   remap_iterations: int | None = None,
                   target: str = "auto") -> dict[str, float | int | str]:
    """Measure raw / dispatch / remap cost per BAR store (µs, min over `repeats` runs);
    the keys are the fields of ExitBenchResult."""
    if iterations < 1 or repeats < 1:
        raise ValueError("iterations and repeats must be at least 1")
    remap_iterations = remap_iterations or iterations * REMAP_FACTOR
    image = build_flat(GUEST)
    runs = []
    for _ in range(repeats):
        device, target_name = bench_target(target)
        runs.append(_one_run(image, iterations, remap_iterations, device))
    raw = min(r["raw_us"] for r in runs)
    dispatch = min(r["dispatch_us"] for r in runs)
    remap = min(r["remap_us"] for r in runs)
    return asdict(ExitBenchResult(
        iterations=iterations, remap_iterations=remap_iterations, repeats=repeats,
        target=target_name, raw_us=raw, dispatch_us=dispatch, remap_us=remap,
        dispatch_over_raw=dispatch / raw, remap_over_raw=remap / raw,
        dispatch_exits=int(min(r["dispatch_exits"] for r in runs)),
        remap_exits=int(max(r["remap_exits"] for r in runs))))


def print_exit_bench(result: dict[str, float | int | str]) -> None:
    """A rich table: µs per access and the ratios to raw."""
    from rich.console import Console
    from rich.table import Table

    r = ExitBenchResult(**result)  # type: ignore[arg-type]
    table = Table(title=f"BAR0 store cost on KVM (min of {r.repeats} runs; "
                        f"dispatch target: {r.target})")
    table.caption = "dispatch: exit loop + target.mmio_write(0, PMC_INTR_EN, 4, v)"
    table.add_column("path")
    table.add_column("stores", justify="right")
    table.add_column("µs / access", justify="right")
    table.add_column("× raw", justify="right")
    table.add_column("exits counted", justify="right")
    table.add_row("raw (re-enter only)", f"{r.iterations:,}", f"{r.raw_us:.3f}", "1.00",
                  "not counted")
    table.add_row("dispatch (runner path)", f"{r.iterations:,}", f"{r.dispatch_us:.3f}",
                  f"{r.dispatch_over_raw:.2f}", f"{r.dispatch_exits:,}")
    table.add_row("remap (memslot)", f"{r.remap_iterations:,}", f"{r.remap_us:.5f}",
                  f"{r.remap_over_raw:.6f}", f"{r.remap_exits:,}")
    Console().print(table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                        help="trapped stores per loop (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="VM runs; each figure is the minimum (default %(default)s)")
    parser.add_argument("--target", choices=TARGETS, default="auto",
                        help="dispatch target: the emulated Gpu (auto when it exists) or a "
                             "dict-backed register file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main_exits(args: argparse.Namespace) -> int:
    """Entry point for `gpuvm bench exits`."""
    from gpuvm.cli import UserError
    from gpuvm.vmm.kvm import kvm_usable

    ok, why = kvm_usable()
    if not ok:
        raise UserError(f"bench exits needs KVM: {why}")
    if args.iterations < 1 or args.repeats < 1:
        raise UserError("--iterations and --repeats must be at least 1")
    result = run_exit_bench(args.iterations, args.repeats, target=args.target)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_exit_bench(result)
    return 0


main = main_exits
