"""An isolated run: every VM in its own VMM process, its device served over vfio-user.

This process keeps the machine (the GPU and the mediator) and serves each VM's device on
one end of a socket pair (gpuvm/vfio/user/server.py); the other end goes to a child
process (gpuvm/vmm/vm_process.py) that creates the guest's RAM, attaches the device over
the socket, runs the guest and reports what its session recorded.  VMs start at their
start_delay and are collected as they end, as in an in-process run; a VM whose process
dies (killed, crashed) is reported failed, its device is torn down by the server
(interrupts, mappings and DMA dropped) and its vGPU removed, and the others run on.

A process takes a while to start (the interpreter, the imports, the guest's RAM), and
not the same while for each: the VMM processes are forks of one fork server the run
starts first, which has imported the VMM once (gpuvm/vmm/vmm_forks.py), and VMs due at
one time are all built first, each in its own process, and their guests then start
together (vm_process's "ready" / "go"), so eight VMs of a scaling run overlap as eight
threads of one process do -- measured on the 16-core machine, a pv VM's whole run is
shorter than the spread of eight process starts.

On a virtual device clock (the default) the clock stays here, with the GPU: each VM's
vCPU is a party of it in this process, driven by what its connection receives -- every
region access is one exit, priced by the vGPU as in-process, and the VMM reports the rest
(the guest's start, the ports it answers itself, its waits on the GPU, its end) as
GPUVM_CLOCK ops (gpuvm/vfio/user/vcpu_clock.py).  A VM's vCPU joins the clock when its
start comes in device time, as its process is spawned (in the run's order), holds device
time there while the process is built, and is charged from the word "go"; its vGPU is
removed at its vCPU's last time, in that order, as in-process.  One whose VMM dies has
its vCPU retired there and the others go on.  So an isolated run's rows are the threaded
run's, as deterministic.
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from gpuvm.run.removals import REMOVAL_WAIT_S, Removals, detach_at_last_time
from gpuvm.run.result import VmResult
from gpuvm.run.spec import Machine, RunOptions, ServedTime, VmSpec
from gpuvm.vfio.user.server import DeviceServer, ServerLoop, SharedMemory
from gpuvm.vmm import vm_process
from gpuvm.vmm.vmm_forks import ForkedVmm, VmmForkServer

POLL_S = 0.01
READY_S = 120.0  # a VM process not built by then is killed (reported failed)
# a VMM whose guest has ended (its vCPU left the clock) has this long to exit -- detach,
# write its outcome -- before it is killed: on a virtual clock device time waits at its
# last time until its vGPU is removed, so one that lingers would hold the others back
EXIT_GRACE_S = 30.0


def device_memory(device: Any) -> SharedMemory | None:
    """The memory a device's mappable regions may be backed by, as the fd to hand out: a
    vGPU's own partition's VRAM piece (gpuvm/device/vram.py), never the rest of VRAM.  A
    GPU passed through whole maps nothing (every BAR traps), so it has none."""
    gpu, part = getattr(device, "gpu", None), getattr(device, "part", None)
    if gpu is None or part is None:
        return None
    piece = gpu.vram.piece(part.vram_base)
    if piece is None:
        return None
    return SharedMemory(piece.host_address, piece.size, piece.fd)


@dataclass
class VmProcess:
    """A VM running in its own VMM process: the process, the server thread answering its
    device, its deadline and the output it sends while it runs."""

    spec: VmSpec
    process: ForkedVmm
    server: DeviceServer
    deadline: float
    # its outcome document, read while it runs: a document larger than the pipe holds
    # (a host-memory history, a long console) would block the VM's last write
    output: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None
    # charges its vCPU for its device's events from now (a virtual clock; called as the
    # guest is told to go: the VMM's own set-up is no event of the guest's)
    metered: Callable[[], None] | None = None
    exiting: bool = False  # its guest ended: its deadline is EXIT_GRACE_S from then

    def drain(self) -> None:
        """Read the process's outcome on a thread of its own, as it is written."""
        def read() -> None:
            assert self.process.stdout is not None
            self.output.append(self.process.stdout.read())
        self.reader = threading.Thread(target=read, name=f"{self.spec.name} outcome",
                                       daemon=True)
        self.reader.start()


def _virtual_clock(machine: Machine) -> Any:
    """The machine's clock if it is a virtual one, else None."""
    return machine.clock if machine.clock.virtual else None


def _start_ns(spec: VmSpec) -> int:
    return round(spec.start_delay * 1e9)


def spawn_vm(machine: Machine, spec: VmSpec, params: list[int], flags: int,
             program: Any, backend: str, options: RunOptions, forks: VmmForkServer,
             loop: ServerLoop | None = None) -> VmProcess:
    """Create the VM's device, serve it (on `loop`, else on a thread of its own -- always
    on a virtual clock, where that thread is the VM's vCPU, which joins the clock now, at
    the VM's start), and start the VMM process that attaches it (forked by `forks`)."""
    clock = _virtual_clock(machine)
    device = machine.attach(spec)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = DeviceServer(ours, device, device, device_memory(device), spec.name)
    metered: Callable[[], None] | None = None
    if clock is not None:  # held at its start until its guest runs (built: wall time)
        party = clock.guest(spec.name, _start_ns(spec), machine.clock_scope(spec))
        server.use_clock(party)
        metered = partial(machine.use_meter, spec, party)
    if loop is not None and clock is None:
        loop.add(server)
    else:
        server.start()
    job = {"fd": theirs.fileno(), "name": spec.name, "benchmark": spec.benchmark,
           "params": params, "flags": flags, "ram_size": spec.ram_size,
           "ram_backing": spec.ram_backing, "ram_alloc": spec.ram_alloc,
           "flat": str(program.flat) if program.flat else None,
           "shared": str(program.shared) if program.shared else None,
           "backend": backend, "timeout": options.timeout,
           "wait_timeout": min(options.wait_slice, options.timeout),
           "hold": True, "clock": "wall" if clock is None else "virtual"}
    try:
        process = forks.spawn(job, theirs.fileno())
    finally:
        theirs.close()
    deadline = time.monotonic() + READY_S + options.timeout + 30
    return VmProcess(spec, process, server, deadline, metered=metered)


def start_together(vms: list[VmProcess], options: RunOptions) -> None:
    """Wait until each of `vms` is built (its "ready" line), then start every guest at
    once.  One that exits first, or is not built within READY_S, is not started: it is
    killed and collected as failed."""
    waiting = {vm.process.stdout.fileno(): vm for vm in vms if vm.process.stdout}
    ready: list[VmProcess] = []
    with selectors.DefaultSelector() as selector:
        for fd, vm in waiting.items():
            selector.register(fd, selectors.EVENT_READ, vm)
        deadline = time.monotonic() + READY_S
        while waiting and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                vm = key.data
                selector.unregister(key.fd)
                del waiting[key.fd]
                assert vm.process.stdout is not None
                if vm.process.stdout.readline() == vm_process.READY:
                    ready.append(vm)
    for vm in waiting.values():
        vm.process.kill()
    now = time.monotonic()
    for vm in vms:
        assert vm.process.stdin is not None
        try:
            if vm in ready:
                if vm.metered is not None:
                    vm.metered()
                vm.process.stdin.write(vm_process.GO)
            vm.process.stdin.close()
        except OSError:
            pass  # it died meanwhile: collected as failed
        vm.deadline = now + options.timeout + 30
        vm.drain()


def collect_vm(machine: Machine, vm: VmProcess) -> tuple[dict[str, Any], Any, ServedTime]:
    """The finished (or dead) VM's record, scheduler metrics and the server's time on
    it (DeviceServer.served_ns); its device detached (on a virtual clock at its last
    time: run on a thread of its own, gpuvm/run/removals.py)."""
    try:
        if vm.reader is None:
            vm.drain()
        assert vm.reader is not None
        vm.reader.join()
        out = "".join(vm.output)
        rc = vm.process.wait()
        vm.process.close()
        vm.server.closed.wait(10)
        try:
            record = json.loads(out) if rc == 0 and out else None
        except ValueError:
            record = None
        if record is None:
            why = f"VMM process exited with status {rc}" if rc >= 0 else \
                f"VMM process killed by {signal.Signals(-rc).name}"
            record = vm_process.failed_outcome(vm.spec.name, why)
        metrics = machine.metrics(vm.spec)
        served = ServedTime(*vm.server.served_ns())
    finally:  # whatever happened, the device is given back and holds no time back
        _detach_at_last_time(machine, vm)
    return record, metrics, served


def _result(machine: Machine, vm: VmProcess) -> VmResult:
    """A finished VM's result, its device given back (collect_vm)."""
    record, metrics, served = collect_vm(machine, vm)
    outcome, faults = vm_process.recorded_outcome(record)
    if vm.server.vcpu is not None:  # its priced event stream, for the rows
        outcome.session.clock_party = vm.server.vcpu.party
    return VmResult(vm.spec, outcome, faults, metrics, served)


def _detach_at_last_time(machine: Machine, vm: VmProcess) -> None:
    """Give back the VM's device; on a virtual clock at its vCPU's last time, where the
    timer its vCPU left behind (ServedVcpu.retire) holds device time until then."""
    vcpu = vm.server.vcpu
    if vcpu is None:
        machine.detach(vm.spec)
        return
    try:
        detach_at_last_time(machine, vm.spec, vcpu.party, vcpu.leaving)
    finally:
        vcpu.party.leave()  # a server that never closed: its vCPU holds nothing back


def _last_time(vm: VmProcess) -> int | None:
    """The virtual time its vCPU left the clock at (None: on none, or not yet left)."""
    vcpu = vm.server.vcpu
    return vcpu.party.v if vcpu is not None and vcpu.ended else None


def run_isolated(machine: Machine, boot: list[tuple[VmSpec, list[int], int]],
                 programs: dict, backend: str, options: RunOptions,
                 on_spawn: Callable[[VmProcess], None] | None = None) -> list:
    """Run each VM of `boot` in its own process against `machine` (see the docstring);
    `on_spawn` sees each VM process as it starts (tests kill one)."""
    pending = sorted(boot, key=lambda b: b[0].start_delay)
    running: list[VmProcess] = []
    results: dict[str, VmResult] = {}
    clock = _virtual_clock(machine)
    # one thread answers every VM's socket -- on a wall clock: on a virtual one each
    # connection's thread is its VM's vCPU, and waits for its turn at the mediator's lock
    loop = ServerLoop() if clock is None else None
    forks = VmmForkServer()  # the VMM processes: forks of one that imported the VMM
    woken = threading.Event()
    # on a virtual clock a VM arrives when device time reaches its start_delay
    arrivals = clock.timer("arrivals", woken.set, ordered=True) if clock else None
    removals = Removals()
    if arrivals is not None and pending:
        arrivals.set_alarm(_start_ns(pending[0][0]))

    t0 = time.monotonic()
    try:
        while pending or running:
            now = time.monotonic()
            due: list[VmProcess] = []
            arrived = arrivals.due_at() if arrivals is not None else None
            while pending and (arrived is not None and arrived >= _start_ns(pending[0][0])
                               if arrivals is not None
                               else now - t0 >= pending[0][0].start_delay):
                spec, params, flags = pending.pop(0)
                due.append(spawn_vm(machine, spec, params, flags, programs[spec.program],
                                    backend, options, forks, loop))
                running.append(due[-1])
            if due:
                start_together(due, options)
            if arrivals is not None:  # only now that the arrived vCPUs hold the clock
                arrivals.set_alarm(_start_ns(pending[0][0]) if pending else None)
            for vm in due:
                if on_spawn is not None:
                    on_spawn(vm)
            for vm in running:
                if not vm.exiting and _last_time(vm) is not None:
                    vm.exiting = True
                    vm.deadline = min(vm.deadline, time.monotonic() + EXIT_GRACE_S)
            ended = [v for v in running if v.process.poll() is not None
                     or time.monotonic() >= v.deadline]
            for vm in ended:
                if vm.process.poll() is None:
                    vm.process.kill()
            for vm in ended:
                running.remove(vm)
                removals.start(vm.spec.name, partial(_result, machine, vm))
            for result in removals.take():
                results[result.spec.name] = result
            if (pending or running) and arrivals is not None:
                woken.wait(POLL_S)  # the arrivals' waker, or a look at the VMs
                woken.clear()
            elif pending or running:
                time.sleep(POLL_S)
        removals.join()
        for result in removals.take():
            results[result.spec.name] = result
        return [results[spec.name] for spec, _, _ in boot]
    finally:
        if arrivals is not None:
            arrivals.leave()
        for vm in running:
            vm.process.kill()
            vm.process.wait()
            vm.process.close()
            vm.server.closed.wait(10)
        removals.join(REMOVAL_WAIT_S)
        forks.close()
        if loop is not None:
            loop.close()
        machine.close()
