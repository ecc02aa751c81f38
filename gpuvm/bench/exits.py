"""`gpuvm bench exits`: what one trapped BAR access costs on KVM, and what remap saves.

One guest (guest_tools/bench_exits.c) does N 32-bit BAR0 stores twice, then stores to
a BAR1 page backed by a memslot, then N stores into BAR0's PRAMIN window, all in one VM
run, so the numbers share the host's conditions:

- raw:      every store exits and the VMM re-enters at once -- the floor set by KVM and
            the Python ioctl, with no handler at all;
- dispatch: the same stores through the runner's normal exit path (BAR window lookup,
            exit counters, ``device.write(0, PMC_INTR_EN, 4, v)``);
- remap:    stores to the memslot-backed page: no exit at all;
- posted:   stores KVM queues in its coalesced-MMIO ring (the PRAMIN window is a zone)
            and the VMM hands to the device at the next exit, one store instruction
            each: each still a KVM exit, but one KVM handles in the kernel.  (The
            driver zeroes page tables with one `rep stos` per run, which KVM repeats
            in the kernel without re-entering the guest: cheaper still.)

The guest brackets the loops with phase marks (HtoD = raw, Launch = dispatch,
DtoH = remap, Close = posted), so the session's per-phase wall time and exit counts
delimit them; the counts double as a check (N BAR0 write exits while dispatching, none
while remapped, nearly none while posting).
Host noise is 20-40 %, so each figure is the minimum over several VM runs.  Each phase
is also timed in the vCPU thread's CPU time (the guest, KVM and the VMM all run on it):
on a host whose cores are shared, wall time counts the others' turns, CPU time does not.
`--runs N` measures it all N times over, for the spread of the ratios; `--goals` runs
what issue 77 asks for in one command (`gpuvm bench exits --goals`).

With ``--transport vfio-user`` each dispatch target is also measured served from another
process over a vfio-user socket (gpuvm/vfio/user/): every trapped store becomes a
REGION_WRITE message and its reply, the path a VM in its own VMM process takes.  Those
rows are given as ratios both to the raw exit and to the same target in-process.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import json
import mmap
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

from gpuvm.bench.timing import span
from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.errors import UserError
from gpuvm.experiment.costs import load_costs, mmio_exits
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.run import run_vms
from gpuvm.run.cli import COST_PROFILE
from gpuvm.run.spec import GpuDevice, RunOptions, VmSpec
from gpuvm.vfio.passthrough import PassthroughGpu
from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.server import DeviceServer
from gpuvm.vmm import abi
from gpuvm.vmm.guest_build import GuestTarget, build_flat
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestSession, boot_params_for
from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm import kvm_usable
from gpuvm.vmm.kvm.runner import KvmRunner, coalescing
from gpuvm.vmm.kvm.vcpu import COALESCED_STORES, DIRECT_ACCESSES, ExitLoop
from gpuvm.vmm.vfio_attach import AttachedDevice, attach

GUEST = GuestTarget("bench_exits", ["bench_exits.c"])
RAM_SIZE = 16 * regs.MiB
BAR_SIZES = {0: regs.BAR0_SIZE, 1: 16 * regs.MiB}
BAR_BASES = {0: abi.GUEST_BAR0_BASE, 1: abi.GUEST_BAR1_BASE}
REMAP_OFFSET = 0x10000  # BAR1 offset of the memslot-backed page
PHASE_RAW, PHASE_DISPATCH, PHASE_REMAP, PHASE_POSTED = "HtoD", "Launch", "DtoH", "Close"
DEFAULT_ITERATIONS = 10_000
DEFAULT_REPEATS = 3
REMAP_FACTOR = 1000  # remapped stores are ~1e5x cheaper: run more so one exit is noise


BENCH_TARGETS = ("all", "auto", "gpu", "vgpu", "registers")


def bench_target(kind: str) -> tuple[GpuDevice, str, Callable[[], None]]:
    """The VFIO device the dispatch loop writes to, its name, and how to release it.

    - gpu: the emulated GPU passed through whole (a native-mode guest's device);
    - vgpu: a full-virtualization vGPU in front of one (the store is trapped and
      emulated by the mediator, as every BAR0 access of an `fv` guest is);
    - registers: a dict-backed register file (the floor: a store and a count)."""
    if kind not in BENCH_TARGETS:
        raise ValueError(f"target {kind!r} is not one of {', '.join(BENCH_TARGETS)}")
    if kind == "registers":
        return RegisterFileDevice(BAR_SIZES), "RegisterFile", lambda: None
    gpu = Gpu(vram_size=1 * regs.GiB)
    if kind == "gpu":
        return PassthroughGpu(gpu), "Gpu", gpu.release_memory
    med = Mediator(gpu.start())
    vgpu = med.add_vm("bench", MODES["fv"], PartitionSpec(vram_size=256 * regs.MiB))

    def release() -> None:
        med.close()
        gpu.release_memory()
    return vgpu, "VGpu (fv)", release


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
        reason_at = api.RUN_EXIT_REASON // 4
        while True:
            ioctl(fd, KVM_RUN)
            if u32[reason_at] == EXIT_MMIO:
                continue
            if u32[reason_at] != api.KVM_EXIT_IO or not self._u8[api.RUN_IO_DIRECTION]:
                return self._unexpected(u32[reason_at])
            port = self._u16[api.RUN_IO_PORT // 2]
            value = u32[self._u64[api.RUN_IO_DATA_OFFSET // 8] >> 2]
            if self.session.port_out(port, value):
                return None
            if port == abi.PORT_PHASE and abi.PHASE_NAMES[value] == PHASE_DISPATCH:
                return True


class BenchSession(GuestSession):
    """Also times every phase in the vCPU thread's CPU time (phase marks are `out`s the
    vCPU thread handles), beside the wall time every session records."""

    def __init__(self, name: str, ram: GuestRam, attached: AttachedDevice) -> None:
        super().__init__(name, ram, attached)
        self.phase_cpu_ns: dict[str, int] = {}
        self._mark: tuple[str, int] | None = None

    def port_out(self, port: int, value: int) -> bool:
        if port in (abi.PORT_PHASE, abi.PORT_EXIT):  # a phase ends (the last at the exit)
            now = time.thread_time_ns()
            if self._mark is not None:
                self.phase_cpu_ns[self._mark[0]] = now - self._mark[1]
            self._mark = (abi.PHASE_NAMES[value], now) if port == abi.PORT_PHASE and \
                0 <= value < len(abi.PHASE_NAMES) else None
        return super().port_out(port, value)


TRANSPORTS = ("inproc", "vfio-user")
OVER_SOCKET = " over vfio-user"


def serve_target(kind: str, fd: int) -> None:
    """Serve one bench target on the connected socket `fd` until the client hangs up
    (run in a process of its own by `served_target`)."""
    device, _, release = bench_target(kind)
    try:
        DeviceServer(socket.socket(fileno=fd), device, device, None, kind).serve()
    finally:
        release()


def served_target(kind: str, poll_us: float | None = None):
    """(client device, release) for `kind` served by a child process; `poll_us` sets
    the child's poll time (protocol.SPIN_S; default: its own)."""
    ours, theirs = socket.socketpair()
    poll = "" if poll_us is None else \
        f"import gpuvm.vfio.user.protocol as p; p.SPIN_S = {poll_us * 1e-6!r}; "
    child = subprocess.Popen([sys.executable, "-c",
                              poll + "from gpuvm.bench.exits import serve_target; "
                              f"serve_target({kind!r}, {theirs.fileno()})"],
                             pass_fds=[theirs.fileno()])
    theirs.close()
    device = VfioUserDevice(ours, f"bench {kind}")

    def release() -> None:
        device.close()
        child.wait(30)
    return device, release


def _one_run(image: Path, iterations: int, remap_iterations: int,
             kind: str, transport: str = "inproc") -> dict[str, float | int | str]:
    class BenchRunner(KvmRunner):
        loop_class = RawThenDispatchLoop

    ram = GuestRam(RAM_SIZE)
    page = mmap.mmap(-1, mmap.PAGESIZE)  # stands in for a page of VRAM
    host = ctypes.c_uint32.from_buffer(page)
    if transport == "vfio-user":
        device, release = served_target(kind)
        name = _target_name(kind) + OVER_SOCKET
        device.share(ram.host_address, ram.size, ram.share_fd())
    else:
        device, name, release = bench_target(kind)
    attached = None
    try:
        attached = attach(device, device, ram, "bench-exits")
        session = BenchSession("bench-exits", ram, attached)
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
        cpu = session.phase_cpu_ns
        posted = phases[PHASE_POSTED].counters
        return {
            "target": name,
            "raw_us": phases[PHASE_RAW].wall_ns / iterations / 1e3,
            "dispatch_us": phases[PHASE_DISPATCH].wall_ns / iterations / 1e3,
            "posted_us": phases[PHASE_POSTED].wall_ns / iterations / 1e3,
            "raw_cpu_us": cpu[PHASE_RAW] / iterations / 1e3,
            "dispatch_cpu_us": cpu[PHASE_DISPATCH] / iterations / 1e3,
            "posted_cpu_us": cpu[PHASE_POSTED] / iterations / 1e3,
            # KVM's exits to userspace while posting: the ring full, and the exit port
            "posted_exits": mmio_exits(posted) + posted.get("exits.io", 0)
            - posted.get(COALESCED_STORES, 0),
            "posted_stores": posted.get("exits.mmio.bar0.write", 0),
            "remap_us": phases[PHASE_REMAP].wall_ns / remap_iterations / 1e3,
            "dispatch_exits": phases[PHASE_DISPATCH].counters.get("exits.mmio.bar0.write", 0),
            "remap_exits": mmio_exits(remap_counts),
        }
    finally:
        del host
        if attached is not None:
            attached.detach()
        release()
        ram.close()
        page.close()


def _target_name(kind: str) -> str:
    return {"registers": "RegisterFile", "gpu": "Gpu", "vgpu": "VGpu (fv)"}[kind]


def run_exit_bench(iterations: int = DEFAULT_ITERATIONS, repeats: int = DEFAULT_REPEATS,
                   remap_iterations: int | None = None,
                   target: str = "all", transport: str = "inproc", runs: int = 1) -> dict:
    """Measure raw / dispatched / remapped cost per BAR store (µs, min over `repeats` VM
    runs per target), `runs` times over.  target "all" measures the device and the
    mediated vGPU in one run.

    Returns {iterations, remap_iterations, repeats, runs, raw_us, raw_cpu_us, remap_us,
    remap_over_raw, remap_exits, targets: {name: {dispatch_us, dispatch_cpu_us, over_raw,
    cpu_over_raw, over_raw_runs, cpu_over_raw_runs, exits, posted_us, posted_cpu_us,
    posted_over_raw_runs, posted_cpu_over_raw_runs, posted_stores, posted_exits}}}: each
    target's ratio is taken against the raw loop of its own VM runs, in wall time and in
    the vCPU thread's CPU time; `*_runs` has one ratio per run (their spread), the others
    use every run.  posted_*: the stores through the coalesced ring (posted_stores of
    them counted as trapped, with posted_exits exits to userspace)."""
    if iterations < 1 or repeats < 1 or runs < 1:
        raise ValueError("iterations, repeats and runs must be at least 1")
    remap_iterations = remap_iterations or iterations * REMAP_FACTOR
    image = build_flat(GUEST)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r} is not one of {', '.join(TRANSPORTS)}")
    kinds = ["gpu", "vgpu"] if target in ("all", "auto") else [target]
    transports = ["inproc"] if transport == "inproc" else ["inproc", transport]
    rounds = [[_one_run(image, iterations, remap_iterations, kind, way)
               for _ in range(repeats) for kind in kinds for way in transports]
              for _ in range(runs)]
    every = [r for one in rounds for r in one]

    def ratio(mine: list[dict], key: str, path: str = "dispatch") -> float:
        return min(r[f"{path}{key}"] for r in mine) / min(r[f"raw{key}"] for r in mine)

    targets = {}
    for name in dict.fromkeys(r["target"] for r in every):
        mine = [r for r in every if r["target"] == name]
        per_run = [[r for r in one if r["target"] == name] for one in rounds]
        targets[name] = {"dispatch_us": min(r["dispatch_us"] for r in mine),
                         "dispatch_cpu_us": min(r["dispatch_cpu_us"] for r in mine),
                         "over_raw": ratio(mine, "_us"),
                         "cpu_over_raw": ratio(mine, "_cpu_us"),
                         "over_raw_runs": [ratio(one, "_us") for one in per_run],
                         "cpu_over_raw_runs": [ratio(one, "_cpu_us") for one in per_run],
                         "exits": int(min(r["dispatch_exits"] for r in mine)),
                         "posted_us": min(r["posted_us"] for r in mine),
                         "posted_cpu_us": min(r["posted_cpu_us"] for r in mine),
                         "posted_over_raw_runs": [ratio(one, "_us", "posted")
                                                  for one in per_run],
                         "posted_cpu_over_raw_runs": [ratio(one, "_cpu_us", "posted")
                                                      for one in per_run],
                         "posted_stores": int(min(r["posted_stores"] for r in mine)),
                         "posted_exits": int(max(r["posted_exits"] for r in mine))}
    for name, t in targets.items():  # a served target against the same one in-process
        if name.endswith(OVER_SOCKET):
            t["over_inproc"] = t["dispatch_us"] / \
                targets[name.removesuffix(OVER_SOCKET)]["dispatch_us"]
    raw = min(r["raw_us"] for r in every)
    remap = min(r["remap_us"] for r in every)
    return {"iterations": iterations, "remap_iterations": remap_iterations,
            "repeats": repeats, "runs": runs, "raw_us": raw,
            "raw_cpu_us": min(r["raw_cpu_us"] for r in every), "remap_us": remap,
            "remap_over_raw": remap / raw,
            "remap_exits": int(max(r["remap_exits"] for r in every)), "targets": targets}


TRAP_GOAL = 1.1  # issue 77: a mediated trap within 1.1x of a raw exit


def print_exit_bench(r: dict) -> None:
    """A rich table: µs per access and the ratios to raw, in wall and CPU time."""
    runs = f", {r['runs']} runs: lowest-highest" if r["runs"] > 1 else ""
    table = Table(title=f"BAR0 store cost on KVM, {r['iterations']:,} stores a loop "
                        f"(min of {r['repeats']} VM runs each{runs})")
    table.caption = (f"each store: PMC_INTR_EN; dispatched = exit loop + device.write "
                     f"(VFIO region); goal: mediated trap <= {TRAP_GOAL}x raw.  posted: "
                     f"PRAMIN stores queued in KVM's coalesced ring, handed to the device "
                     f"at the next exit (fv's page-table stores).  CPU: the vCPU thread's "
                     f"(guest, KVM and VMM), blind to other processes' turns")
    for col in ("path", "µs wall", "× raw", "µs CPU", "× raw CPU", "exits"):
        table.add_column(col, justify="left" if col == "path" else "right")
    socket_rows = any("over_inproc" in t for t in r["targets"].values())
    if socket_rows:
        table.add_column("× in-process", justify="right")
    table.add_row("raw (re-enter only)", f"{r['raw_us']:.3f}", "1.00",
                  f"{r['raw_cpu_us']:.3f}", "1.00", "not counted",
                  *([""] if socket_rows else []))
    for name, t in r["targets"].items():
        label = "mediated trap, " + name if name.startswith("VGpu") else "dispatch to " + name
        extra = [f"{t['over_inproc']:.2f}" if "over_inproc" in t else "1.00"] \
            if socket_rows else []
        table.add_row(label, f"{t['dispatch_us']:.3f}", span(t["over_raw_runs"], ".2f"),
                      f"{t['dispatch_cpu_us']:.3f}", span(t["cpu_over_raw_runs"], ".2f"),
                      f"{t['exits']:,}", *extra)
    for name, t in r["targets"].items():
        if name.endswith(OVER_SOCKET):
            continue  # the ring is drained in the VMM: the same either way
        table.add_row(f"posted (ring) to {name}", f"{t['posted_us']:.3f}",
                      span(t["posted_over_raw_runs"], ".2f"), f"{t['posted_cpu_us']:.3f}",
                      span(t["posted_cpu_over_raw_runs"], ".2f"),
                      f"{t['posted_exits']:,} of {t['posted_stores']:,}",
                      *([""] if socket_rows else []))
    table.add_row(f"remap (memslot, {r['remap_iterations']:,} stores)",
                  f"{r['remap_us']:.5f}", f"{r['remap_over_raw']:.6f}", "", "",
                  f"{r['remap_exits']:,}", *([""] if socket_rows else []))
    Console().print(table)


MODE_BENCH = "mmul"
UNEXITED = (COALESCED_STORES, DIRECT_ACCESSES)  # counted accesses that had no exit
MODE_BENCH_MODES = ("native", "fv")


def _mode_run(mode: str, size: int, on: bool) -> dict:
    """One mmul VM on KVM (virtual clock): its guest wall time, KVM's exits to userspace,
    the trapped accesses the model counts, and what must not change with the ring."""
    prices = load_costs(COST_PROFILE).event_prices(MODES[mode].mediated)  # as `gpuvm run`
    with coalescing(on):
        (result,) = run_vms([VmSpec("vm0", MODE_BENCH, [size])],
                            RunOptions(mode=mode, backend="kvm", clock="virtual",
                                       prices=prices))
    if not result.passed:
        raise RuntimeError(f"{mode}: {result.outcome.describe_failure()}")
    counts = [(p.name, {k: v for k, v in p.counters.items() if k not in UNEXITED})
              for p in result.session.phases]
    # every exit of the modelled system at its price, in order; a wait's length is the
    # virtual clock's (it can differ between two runs that trap every access too)
    priced = [e if e[0] != "w" else ["w"] for e in result.session.clock_party.stream.entries]
    totals: dict[str, int] = {}
    for p in result.session.phases:
        for k, v in p.counters.items():
            totals[k] = totals.get(k, 0) + v
    traps = mmio_exits(totals) + totals.get("exits.io", 0)
    vcpu = result.outcome.vcpu
    return {"wall_s": result.wall_ns / 1e9, "traps": traps,
            "cpu_s": vcpu.cpu_ns / 1e9 if vcpu is not None else float("nan"),
            "kvm_exits": traps - sum(totals.get(k, 0) for k in UNEXITED), "counts": counts,
            "priced": priced}


def run_mode_bench(size: int = 256, modes: tuple[str, ...] = MODE_BENCH_MODES,
                   repeats: int = 2) -> dict:
    """mmul `size` in each mode with the coalesced ring off (before) and on (after),
    the two runs back to back in every repeat, so each ratio is of one moment's host.

    Returns {size, repeats, modes: {mode: {traps, before_exits, after_exits,
    before_s: [..], after_s: [..], speedup: [..], cpu_speedup: [..], same_counts,
    same_priced}}}: `traps` the accesses the model counts (equal with and without the
    ring), `*_exits` KVM's exits to userspace, `speedup` each repeat's before/after guest
    wall time, `cpu_speedup` the same of the vCPU thread's CPU time (guest, KVM and VMM:
    blind to other processes' turns on a shared host); `same_counts`
    whether every phase's counts were equal in each pair, `same_priced` whether every
    exit of the modelled system had the same price in virtual time, in the same order
    (how long each wait on the GPU lasted left out: the virtual clock's, and it can
    differ between two runs that trap every access too)."""
    if size < 1 or repeats < 1:
        raise ValueError("size and repeats must be at least 1")
    out: dict[str, dict] = {}
    for _ in range(repeats):
        for mode in modes:
            before, after = _mode_run(mode, size, False), _mode_run(mode, size, True)
            m = out.setdefault(mode, {"traps": before["traps"], "before_exits": 0,
                                      "after_exits": 0, "before_s": [], "after_s": [],
                                      "speedup": [], "cpu_speedup": [],
                                      "same_counts": True,
                                      "same_priced": True})
            m["before_exits"] = max(m["before_exits"], before["kvm_exits"])
            m["after_exits"] = max(m["after_exits"], after["kvm_exits"])
            m["before_s"].append(before["wall_s"])
            m["after_s"].append(after["wall_s"])
            m["speedup"].append(before["wall_s"] / after["wall_s"])
            m["cpu_speedup"].append(before["cpu_s"] / after["cpu_s"])
            m["same_counts"] &= before["counts"] == after["counts"] and \
                before["traps"] == after["traps"] == m["traps"]
            m["same_priced"] &= before["priced"] == after["priced"]
    return {"size": size, "repeats": repeats, "modes": out}


def print_mode_bench(r: dict) -> None:
    table = Table(title=f"{MODE_BENCH} n={r['size']} on KVM, coalesced MMIO off (before) "
                        f"and on (after), {r['repeats']} runs each, back to back")
    table.caption = ("traps: accesses the model counts (the same either way); exits: KVM's "
                     "exits to userspace; wall: the guest's phases (fastest run); speedup: "
                     "before/after of "
                     "each pair of runs (lowest-highest), in wall time and in the vCPU "
                     "thread's CPU time; equal: every phase's counts, and every exit of the "
                     "modelled system at its price in virtual time, in order, in each pair")
    for col in ("mode", "traps", "exits", "wall s", "speedup", "CPU speedup", "equal"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for mode, m in r["modes"].items():
        table.add_row(mode, f"{m['traps']:,}",
                      f"{m['before_exits']:,}→{m['after_exits']:,}",
                      f"{min(m['before_s']):.2f}→{min(m['after_s']):.2f}",
                      span(m["speedup"], ".1f") + "x", span(m["cpu_speedup"], ".1f") + "x",
                      "yes" if m["same_counts"] and m["same_priced"] else "NO")
    Console().print(table)


GOAL_MMUL_SIZE = 256
GOAL_SPEEDUP = {"native": 10.0, "fv": 5.0}  # issue 77: wall time, ring and passthrough on
GOAL_NATIVE_EXITS = 1000
GOAL_RUNS = 2  # ratios from at least two runs: their spread


def run_goals(repeats: int = DEFAULT_REPEATS, iterations: int = DEFAULT_ITERATIONS) -> dict:
    """What issue 77 asks of the emulator's speed, measured on this host in one go: the
    trap bench `GOAL_RUNS` times over, then mmul n=256 in native and fv with fewer exits
    off and on, `GOAL_RUNS` pairs (see `judge_goals`)."""
    trap = run_exit_bench(iterations, repeats, target="all", runs=GOAL_RUNS)
    return judge_goals(trap, run_mode_bench(GOAL_MMUL_SIZE, tuple(GOAL_SPEEDUP), GOAL_RUNS))


def judge_goals(trap: dict, mmul: dict) -> dict:
    """{host, trap, mmul, goals: [{goal, measured, met}]} for a trap bench and an mmul
    comparison: each `measured` the spread over the runs in wall and CPU time, `met`
    judged on the worst run's CPU time (on an idle host the same as its wall time; on a
    shared one blind to the other processes' turns, which wall time counts)."""
    goals = []
    for name, t in trap["targets"].items():
        if name.startswith("VGpu"):
            worst = max(t["cpu_over_raw_runs"])
            goals.append({"goal": f"mediated trap <= {TRAP_GOAL}x raw",
                          "measured": f"{span(t['over_raw_runs'], '.2f')}x wall, "
                                      f"{span(t['cpu_over_raw_runs'], '.2f')}x CPU",
                          "met": worst <= TRAP_GOAL})
    n = mmul["size"]
    for mode, m in mmul["modes"].items():
        want = GOAL_SPEEDUP.get(mode)
        if want is not None:
            goals.append({"goal": f"mmul n={n} {mode}: >= {want:g}x less wall time",
                          "measured": f"{span(m['speedup'], '.1f')}x wall, "
                                      f"{span(m['cpu_speedup'], '.1f')}x CPU",
                          "met": min(m["cpu_speedup"]) >= want})
        if mode == "native":
            goals.append({"goal": f"mmul n={n} native: <= {GOAL_NATIVE_EXITS:,} exits",
                          "measured": f"{m['after_exits']:,}",
                          "met": m["after_exits"] <= GOAL_NATIVE_EXITS})
    same = [mode for mode, m in mmul["modes"].items() if m["same_counts"] and m["same_priced"]]
    goals.append({"goal": "counts and modelled times unchanged",
                  "measured": ", ".join(same) or "none",
                  "met": len(same) == len(mmul["modes"])})
    host = {"cores": os.cpu_count(), "load_1min": os.getloadavg()[0]}
    return {"host": host, "trap": trap, "mmul": mmul, "goals": goals}


def print_goals(r: dict) -> None:
    print_exit_bench(r["trap"])
    print_mode_bench(r["mmul"])
    table = Table(title=f"issue 77 on this host ({r['host']['cores']} cores, load "
                        f"{r['host']['load_1min']:.1f} at the end)")
    table.caption = ("met: on the worst run's CPU time (wall time counts other "
                     "processes' turns).  command: gpuvm bench exits --goals (--json)")
    for col in ("goal", "measured", "met"):
        table.add_column(col)
    for g in r["goals"]:
        table.add_row(g["goal"], g["measured"], "yes" if g["met"] else "NO")
    Console().print(table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                        help="trapped stores per loop (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="VM runs; each figure is the minimum (default %(default)s)")
    parser.add_argument("--target", choices=BENCH_TARGETS, default="all",
                        help="dispatch target: all (the device and a mediated vGPU, side by "
                             "side), gpu, vgpu, or a dict-backed register file")
    parser.add_argument("--transport", choices=TRANSPORTS, default="inproc",
                        help="vfio-user: also serve each target from another process over "
                             "a vfio-user socket, as a ratio to raw and to in-process")
    parser.add_argument("--mmul", type=int, default=0, metavar="N",
                        help="instead: mmul of size N in each of --modes with KVM's "
                             "coalesced MMIO off and on, back to back --repeats times: "
                             "exits, wall time and the speedup, counts and virtual times "
                             "checked equal")
    parser.add_argument("--modes", default=",".join(MODE_BENCH_MODES),
                        help="modes of the --mmul comparison (default %(default)s)")
    parser.add_argument("--runs", type=int, default=1,
                        help="measure the trap bench this many times over: the spread of "
                             "its ratios (default %(default)s)")
    parser.add_argument("--goals", action="store_true",
                        help="instead: what issue 77 asks, in one command -- the trap bench "
                             f"{GOAL_RUNS} times and mmul n={GOAL_MMUL_SIZE} native and fv "
                             f"off/on {GOAL_RUNS} times, judged against its goals")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main_exits(args: argparse.Namespace) -> int:
    """Entry point for `gpuvm bench exits`."""
    ok, why = kvm_usable()
    if not ok:
        raise UserError(f"bench exits needs KVM: {why}")
    if args.iterations < 1 or args.repeats < 1 or args.runs < 1:
        raise UserError("--iterations, --repeats and --runs must be at least 1")
    if args.mmul < 0:
        raise UserError("--mmul must be a size of at least 1")
    if args.goals:
        goals = run_goals(args.repeats, args.iterations)
        if args.json:
            print(json.dumps(goals, indent=2))
        else:
            print_goals(goals)
        return 0 if goals["goals"][-1]["met"] else 1  # the counts; speed is reported
    if args.mmul:
        modes = tuple(m for m in args.modes.split(",") if m)
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise UserError(f"--modes: {unknown[0] if unknown else args.modes!r} is not a "
                            f"mode (have {', '.join(MODES)})")
        result = run_mode_bench(args.mmul, modes, args.repeats)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print_mode_bench(result)
        return 0 if all(m["same_counts"] and m["same_priced"]
                        for m in result["modes"].values()) else 1
    result = run_exit_bench(args.iterations, args.repeats, target=args.target,
                            transport=args.transport, runs=args.runs)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_exit_bench(result)
    return 0


main = main_exits
