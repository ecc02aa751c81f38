"""VMs in their own VMM processes, recorded: the guests of one start start together, the
trace comes back whatever its size, it says which part of each trap the server spent,
and the model serialises only that part."""

from __future__ import annotations

import selectors
import socket
import subprocess
import sys
import time

import numpy as np

from gpuvm.device import regs
from gpuvm.experiment.config import Scenario, VmConfig
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import specs_for
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.execute import machine_for
from gpuvm.run.isolated import VmProcess, collect_vm, spawn_vm, start_together
from gpuvm.sim.replay import CPU, FREE, SLEEP, VmTrace, event_steps, replay, replicate
from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.protocol import SERVER_ACCESS_COUNTER, SERVER_ENGINE_COUNTER
from gpuvm.vfio.user.server import DeviceServer
from gpuvm.vmm import guest_programs
from gpuvm.vmm.event_trace import EventTrace

XEN = load_costs("xen-2014")


def _recorded(mode: str, isolated: bool):
    scenario = Scenario("t", (VmConfig("vm", "mmul", (32,)),))
    (result,) = run_vms(specs_for(scenario), RunOptions(mode=mode, backend="inproc",
                                                        record_events=True,
                                                        isolated=isolated))
    assert result.passed, result.error()
    return result.session.recorder.trace()


def test_an_isolated_vm_sends_its_trace_with_the_servers_share_of_each_run():
    alone, isolated = _recorded("fv-opt", False), _recorded("fv-opt", True)
    # the same guest did the same things, in the same runs of events
    assert np.array_equal(isolated.code, alone.code)
    assert np.array_equal(isolated.events, alone.events)
    server = isolated.counter(SERVER_ACCESS_COUNTER)
    assert SERVER_ACCESS_COUNTER not in alone.names
    assert 0 < server.sum() < isolated.handler_ns.sum()
    # a run of traps had the server answer each of them
    traps = isolated.code < (1 << 16)
    assert (server[traps] > 0).all()
    # and the server ran the VM's channels: its kernels and copies
    assert isolated.counter(SERVER_ENGINE_COUNTER).sum() > 0


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
    """A VM process writes its outcome when it ends; a trace is more than a pipe holds,
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
    vm = spawn_vm(machine, spec, spec.boot_params(), spec.flags(), programs["driver"],
                  "inproc", options)
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
        machine.close()


def _trace(handler: int, server: int, gap: int, wait: bool = False) -> EventTrace:
    names = ("exits.mmio.bar0.write", "port.wait", SERVER_ACCESS_COUNTER)
    deltas = np.array([[100, int(wait), server]], dtype=np.int64)
    one = lambda v: np.array([v], dtype=np.int64)  # noqa: E731
    return EventTrace(one(1), one(0), one(100), one(handler), one(gap), one(gap), names,
                      deltas)


def test_the_model_serialises_only_the_servers_part_of_an_isolated_trace():
    steps = event_steps(_trace(1_000_000, 400_000, 2_000_000), XEN, mediated=True)
    total = {r: sum(s.ns for s in steps if s.resource == r) for r in (CPU, FREE, SLEEP)}
    # the server's part holds its one thread; the VMM's own and the guest's run free
    assert total == {CPU: 400_000, FREE: 2_600_000, SLEEP: 0}
    waited = event_steps(_trace(1_000_000, 400_000, 0, wait=True), XEN, mediated=True)
    assert sum(s.ns for s in waited if s.resource == SLEEP) == 600_000
    one = VmTrace("vm", tuple(steps))
    two = replay(replicate(one, 2), cores=8, interpreter_lock=True).makespan_ns
    eight = replay(replicate(one, 8), cores=16, interpreter_lock=True).makespan_ns
    assert one.alone_ns <= two <= one.alone_ns + 400_000
    # eight VMs need 8 x 0.4 ms of the server: it, not the VMs' own 2.6 ms, bounds them
    assert 8 * 400_000 <= eight < one.alone_ns + 8 * 400_000
