"""Running VMs: build each guest, attach its device, run every VM to the end.

- `VmSpec` says what one VM runs; `RunOptions` how (mode, backend, limits).
- A *machine* is what the run's mode builds: the GPU(s) and, per VM, a VFIO device
  (a vGPU, or a whole GPU in native mode).  The mode table (gpuvm/mediator/modes.py) says
  whether a mode is mediated; that alone picks the machine.
- `run_vms(specs, options)` attaches each VM's device the way vfio-pci does
  (gpuvm/vmm/vfio_attach.py), runs the guests and returns `VmResult`s; tables and the CLI
  only read those.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from functools import partial
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from gpuvm.mediator.modes import MODES
from gpuvm.run.host_fit import available_bytes, shortfall
from gpuvm.run.isolated import run_isolated
from gpuvm.run.mediated import MediatedMachine, guest_for_mode
from gpuvm.run.native import NativeMachine
from gpuvm.run.removals import REMOVAL_WAIT_S, Removals, detach_at_last_time
from gpuvm.run.result import VmResult
from gpuvm.run.spec import Machine, RunError, RunOptions, VmSpec
from gpuvm.vfio.device import VfioError
from gpuvm.vmm import guest_programs
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.backends import GuestRunner, make_runner, resolve_backend
from gpuvm.vmm.guest_build import BuildError
from gpuvm.vmm.guest_ram import GuestRam, prealloc_for
from gpuvm.vmm.guest_session import GuestSession, boot_params_for
from gpuvm.vmm.hostmem import HostMemTracker
from gpuvm.vmm.vfio_attach import AttachedDevice, attach

POLL_S = 0.005  # how often the runner looks for VMs that ended or are due to start
MachineFactory = Callable[[RunOptions, list[VmSpec]], Machine]


def machine_for(mode: str) -> MachineFactory:
    """The machine a mode runs on: a GPU per VM (native) or one shared GPU."""
    return MediatedMachine if MODES[mode].mediated else NativeMachine


class RunObserver(Protocol):
    """Watches a run without steering it: progress displays, the status file `gpuvm smi`
    reads, traces.  Called from the run loop's thread; each keeps its own pace (tick comes
    every POLL_S) and must not raise."""

    def started(self, machine: Machine, spec: VmSpec, device: object,
                session: GuestSession) -> None: ...

    def tick(self, machine: Machine) -> None: ...

    def finished(self, machine: Machine, result: VmResult) -> None: ...

    def closing(self, machine: Machine) -> None: ...


def run_vms(specs: list[VmSpec], options: RunOptions | None = None,
            machine: MachineFactory | None = None,
            observers: Sequence[RunObserver] = ()) -> list[VmResult]:
    """Run every VM of `specs` to the end on one machine of `options.mode` (or the one
    `machine` builds: tests and experiments pass instrumented machines in); `observers`
    are told what starts and ends (gpuvm/run/observe.py)."""
    options = options or RunOptions()
    if not specs:
        raise RunError("no VMs to run")
    if len({s.name for s in specs}) != len(specs):
        raise RunError("VM names must be unique")
    for mode in {options.mode} | {s.mode for s in specs if s.mode}:
        if mode not in MODES:
            raise RunError(f"no mode {mode!r} (have {', '.join(MODES)})")
    if any(MODES[s.mode or options.mode].mediated != MODES[options.mode].mediated
           for s in specs):
        raise RunError("native and mediated VMs cannot share one run")
    try:
        backend = resolve_backend(options.backend)
    except (ValueError, RuntimeError) as exc:
        raise RunError(str(exc)) from None
    if options.confined and backend == "inproc" and len(specs) > 1 and not options.isolated:
        raise RunError("in-process guests are not confined (native code in the VMM process "
                       "can reach every VM's memory): a multi-tenant isolation run needs "
                       "the kvm backend (or isolated VMM processes)")
    specs = [guest_for_mode(s, options.mode) for s in specs]
    short = shortfall([s.ram_size for s in specs if prealloc_for(s.ram_alloc) is not False],
                      available_bytes())
    if short:
        raise RunError(short)
    boot = [(s, s.boot_params(), s.flags()) for s in specs]  # validate before building
    try:
        programs = guest_programs.build_all(sorted({s.program for s in specs}),
                                            kinds=("flat",) if backend == "kvm" else ("shared",))
    except BuildError as exc:
        raise RunError(str(exc)) from None
    if options.isolated:
        built = (machine or machine_for(options.mode))(options, specs)
        # VMs in processes of their own report only when they end: observers (progress,
        # smi's status file, traces) follow in-process runs
        return run_isolated(built, boot, programs, backend, options)
    with one_core(len(specs) > 1 and options.clock != "wall"):
        built = (machine or machine_for(options.mode))(options, specs)
        return _run_on(built, boot, programs, backend, options, observers)


@contextmanager
def one_core(wanted: bool) -> Iterator[None]:
    """Run the threads made inside (the GPU's engines, the scheduler, every vCPU) on the
    core this thread is on now, and put this thread back where it was after.

    Why: on the virtual clock the VMs take turns at the mediator's lock in virtual-time
    order, a hand-off between vCPU threads per trap -- and a thread woken on another
    core of a virtual machine waits for an interprocessor interrupt (2 fv VMs: 10.9 s on
    two cores, 6.5 s on one, the same virtual times).  The interpreter lock serialises
    the threads' work anyway.  The emulator's speed only; results do not change."""
    try:
        allowed = os.sched_getaffinity(0)
        here = int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError, AttributeError):
        wanted = False
    if not wanted or len(allowed) < 2 or here not in allowed:
        yield
        return
    os.sched_setaffinity(0, {here})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


@dataclass
class _Running:
    spec: VmSpec
    ram: GuestRam
    attached: AttachedDevice
    runner: GuestRunner
    deadline: float
    session: GuestSession
    party: object = None  # its vCPU on a virtual device clock


def _start(machine: Machine, spec: VmSpec, params: list[int], flags: int, ram: GuestRam,
           programs: dict, backend: str, options: RunOptions
           ) -> tuple[AttachedDevice, GuestRunner, GuestSession]:
    """Create the VM's device, attach it like vfio-pci, boot the guest's runner."""
    device = machine.attach(spec)
    try:
        attached = attach(device, device, ram, spec.name)
    except VfioError as exc:
        machine.detach(spec)
        raise RunError(f"{spec.name}: {exc}") from None
    session = GuestSession(spec.name, ram, attached,
                           wait_timeout=min(options.wait_slice, options.timeout),
                           hostmem=HostMemTracker(ram, spec.nohugepage_pinned))
    boot_params_for(ram, spec.benchmark, params, flags, BAR_BASES, attached.bar_sizes)
    prog = programs[spec.program]
    runner = make_runner(backend, spec.name, prog.flat, prog.shared, ram, session,
                         attached.bar_sizes)
    attached.connect_mappings(runner.memslots)
    return attached, runner, session


def _leave_clock(r: _Running) -> object | None:
    """An ended VM's vCPU leaves the virtual clock, and a timer holds device time at its
    last time until its vGPU is removed there (_remove_at_last_time, on a thread of its
    own: gpuvm/run/removals.py)."""
    if r.party is None:
        return None
    if r.session.leaving is not None:  # the guest's thread let go as it ended
        return r.session.leaving
    return r.party.retire()


def _result(machine: Machine, r: _Running, outcome: object) -> VmResult:
    """An ended VM's result, with the scheduler's record of it (once its GPU work is
    done), before its device is given back."""
    return VmResult(r.spec, outcome, r.attached.stats.faults(), machine.metrics(r.spec))


def _remove_at_last_time(machine: Machine, r: _Running, outcome: object,
                         leaving: object) -> VmResult:
    """An ended VM's result, then its device given back on a virtual clock: its vGPU is
    removed at its vCPU's last time (held there by `leaving`, from _leave_clock): this
    thread (gpuvm/run/removals.py) stamps the removal with that time."""
    try:
        result = _result(machine, r, outcome)
        r.attached.detach()
    finally:  # whatever happened, device time is not held back for it any longer
        detach_at_last_time(machine, r.spec, r.party, leaving)
    return result


def _run_on(machine: Machine, boot: list[tuple[VmSpec, list[int], int]],
            programs: dict, backend: str, options: RunOptions,
            observers: Sequence[RunObserver] = ()) -> list[VmResult]:
    """Start each VM at its start_delay (its device is created then), collect each as it
    ends (its device is given back then, while the others keep running).

    On a virtual device clock start_delay is device time: the arrivals are a timer of
    that clock, so a VM arrives when the GPU's time reaches its start, and its vCPU
    joins the clock at that time (gpuvm/device/clock.py)."""
    pending = sorted(boot, key=lambda b: b[0].start_delay)
    running: list[_Running] = []
    results: dict[str, VmResult] = {}
    rams: list[GuestRam] = []
    stuck = False
    clock = machine.clock
    virtual = clock.virtual
    woken = threading.Event()
    arrivals = clock.timer("arrivals", woken.set, ordered=True) if virtual else None
    removals = Removals()

    def publish(done: list[VmResult]) -> None:
        """Results the run now has, told to the observers (on this, the loop's thread)."""
        for result in done:
            results[result.spec.name] = result
            for o in observers:
                o.finished(machine, result)

    def start_ns(b: tuple[VmSpec, list[int], int]) -> int:
        return round(b[0].start_delay * 1e9)

    if arrivals is not None and pending:
        arrivals.set_alarm(start_ns(pending[0]))
    t0 = time.monotonic()
    try:
        while pending or running:
            now = time.monotonic()
            due: list[_Running] = []  # attached together, then started together
            arrived = arrivals.due_at() if virtual else None  # a settled arrival time
            while pending and (arrived is not None and arrived >= start_ns(pending[0])
                               if virtual else now - t0 >= pending[0][0].start_delay):
                spec, params, flags = pending.pop(0)
                ram = GuestRam(spec.ram_size, backing=spec.ram_backing,
                               prealloc=prealloc_for(spec.ram_alloc))
                rams.append(ram)
                attached, runner, session = _start(machine, spec, params, flags, ram,
                                                   programs, backend, options)
                party = None
                if virtual:
                    party = clock.guest(spec.name, start_ns((spec, params, flags)),
                                        machine.clock_scope(spec))
                    session.use_clock(party)
                    machine.use_meter(spec, party)
                due.append(_Running(spec, ram, attached, runner, now + options.timeout,
                                    session, party))
            if arrivals is not None:  # only now that the arrived vCPUs hold the clock
                arrivals.set_alarm(start_ns(pending[0]) if pending else None)
            for r in due:
                # counted as running before its thread starts: a stop signal between the
                # two must still stop and join it before the GPU and its RAM are closed
                # (a guest left running wrote into closed VRAM)
                running.append(r)
                r.runner.start()
                for o in observers:
                    o.started(machine, r.spec, r.attached.device, r.session)
            ended = [r for r in running if not r.runner.alive() or now >= r.deadline]
            leaving = {r.spec.name: _leave_clock(r) for r in ended if not r.runner.alive()}
            for r in ended:
                outcome = r.runner.join(max(0.0, r.deadline - time.monotonic()))
                running.remove(r)
                if r.party is not None and not r.runner.alive():
                    removals.start(r.spec.name, partial(
                        _remove_at_last_time, machine, r, outcome,
                        leaving.get(r.spec.name) or _leave_clock(r)))
                    r.party.leave()  # an ended VM holds no device time back
                    continue
                if r.party is not None:
                    r.party.leave()
                publish([_result(machine, r, outcome)])
                if r.runner.alive():
                    stuck = True  # its thread would not stop: leave its VM in place
                else:
                    r.attached.detach()
                    machine.detach(r.spec)
            publish(removals.take())
            for o in observers:
                o.tick(machine)
            if (pending or running) and virtual:
                woken.wait(POLL_S)  # the arrivals' waker, or a look at the VMs
                woken.clear()
            elif pending or running:
                next_start = pending[0][0].start_delay - (time.monotonic() - t0) if pending \
                    else POLL_S
                time.sleep(max(0.0, min(POLL_S, next_start)))
        removals.join()
        publish(removals.take())
        return [results[spec.name] for spec, _, _ in boot]
    finally:
        if arrivals is not None:
            arrivals.leave()
        for r in running:  # only on an exception: stop what still runs
            if r.party is not None:
                r.party.leave()
            r.runner.stop("the run was aborted")
            if r.runner.started():
                r.runner.join(5)
            stuck = stuck or r.runner.alive()
        removals.join(REMOVAL_WAIT_S)
        # A guest thread that would not stop may still touch its RAM and the GPU: then
        # both stay mapped (leaked) rather than pulled from under it.
        for o in observers:
            o.closing(machine)
        if not stuck:
            machine.close()
            for ram in rams:
                ram.close()
