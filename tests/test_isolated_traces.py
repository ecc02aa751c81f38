"""VMs in their own VMM processes: the guests of one start start together, an outcome
comes back whatever its size, and the server counts its time on each VM."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import time

from gpuvm.device import regs
from gpuvm.run import RunOptions, VmSpec
from gpuvm.run.execute import machine_for
from gpuvm.run.isolated import VmProcess, collect_vm, spawn_vm, start_together
from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.server import DeviceServer
from gpuvm.vmm import guest_programs
from gpuvm.vmm.vmm_forks import VmmForkServer


class _NoCounters:
    def counters(self) -> dict[str, int]:
        return {}


def test_the_server_counts_its_time_answering_accesses_and_not_its_stats():
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, RegisterFileDevice({0: regs.BAR0_SIZE}), _NoCounters(),
                          name="regs").start()
    client = VfioUserDevice(theirs, "regs")
    try:
        assert client.counters_with_server_time()["server.access_ns"] == 0
        for i in range(200):
            client.write(regs.BAR0, regs.PMC_INTR_EN, 4, i)
        after = client.counters_with_server_time()["server.access_ns"]
        assert after > 0
        assert client.counters_with_server_time()["server.access_ns"] == after
        assert "server.access_ns" not in client.counters()  # only where asked for
    finally:
        client.close()
        server.closed.wait(5)


def test_an_outcome_larger_than_the_pipe_does_not_block_the_vm():
    """A VM process writes its outcome when it ends; it may be more than a pipe holds,
    so the parent reads it while the VM runs."""
    size = 1 << 20
    process = subprocess.Popen([sys.executable, "-c",
                                f"import sys; sys.stdout.write('x' * {size})"],
                               stdout=subprocess.PIPE, text=True)
    vm = VmProcess(VmSpec("big", "idle", []), process, None, time.monotonic() + 60)
    vm.drain()
    assert process.wait(30) == 0
    vm.reader.join(30)
    assert len("".join(vm.output)) == size


def test_a_held_vm_is_built_but_runs_no_guest_code_until_told_to_go():
    options = RunOptions(mode="fv-opt", backend="inproc", timeout=120, isolated=True)
    spec = VmSpec("held", "mmul", [32])
    machine = machine_for(options.mode)(options, [spec])
    programs = guest_programs.build_all(["driver"], kinds=("shared",))
    forks = VmmForkServer()
    vm = spawn_vm(machine, spec, spec.boot_params(), spec.flags(), programs["driver"],
                  "inproc", options, forks)
    try:
        with selectors.DefaultSelector() as sel:  # wait for "ready" without reading it
            sel.register(vm.process.stdout, selectors.EVENT_READ)
            assert sel.select(60), "the VM was not built within a minute"
        time.sleep(0.3)
        traps = lambda: sum(v for k, v in vm.server.device.counts.items()  # noqa: E731
                            if k.startswith("trap."))
        assert vm.process.poll() is None and traps() == 0
        start_together([vm], options)
        record, _, served = collect_vm(machine, vm)
        assert record["failure"] is None and traps() > 0
        assert served.access_ns > 0  # the server's time on the VM comes back with it
    finally:
        if vm.process.poll() is None:
            vm.process.kill()
        forks.close()
        machine.close()
