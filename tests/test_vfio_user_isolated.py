"""VMs in their own VMM processes, their vGPUs attached over vfio-user: the same counts as
in-process, and one VMM killed mid-run costs only its own VM."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from gpuvm.mediator.host_port import work_counters
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.execute import machine_for
from gpuvm.run.isolated import run_isolated
from gpuvm.vmm import guest_programs
from gpuvm.vmm.kvm import kvm_usable
from parallel_runs import phase_counts, phase_counts_of

KVM_USABLE, KVM_WHY = kvm_usable()
PINNED = json.loads((Path(__file__).with_name("data") / "counts_default_type.json").read_text())
DEFAULT_TYPE = "gpuvm-Q6000-8Q"
CASES = {"vecadd": [1000], "madd": [16], "mmul": [32], "fmadd": [1000],
         "memcpy": [4096], "loop": [1000], "idle": []}
ISSUE_MODES = ["fv", "fv-opt", "pv"]
# counts are the same on either clock (work_counters leaves out the lock waits): these
# comparisons run on the wall clock, where an isolated VM's accesses need no turn at the
# mediator's clock; tests/test_virtual_time.py runs isolated VMs on the virtual clock
CLOCK = "wall"


def _isolated_run(bench: str, mode: str) -> tuple[VmSpec, RunOptions]:
    """One VM of the default type in its own VMM process (the in-process backend)."""
    return (VmSpec("vm0", bench, CASES[bench], mdev_type=DEFAULT_TYPE),
            RunOptions(mode=mode, backend="inproc", timeout=300, isolated=True,
                       clock=CLOCK))


@pytest.mark.parametrize("mode", ISSUE_MODES)
def test_isolated_vm_counts_equal_the_in_process_run(mode):
    assert phase_counts(*_isolated_run("mmul", mode)) == PINNED[f"mmul/{mode}"]


KVM_MODES = [*ISSUE_MODES, "fv+remap"]


@pytest.fixture(scope="module")
def isolated_counts():
    """Every benchmark in ISSUE_MODES, each VM in its own VMM process (the in-process
    backend), the runs spread over the host's cores."""
    return phase_counts_of({(bench, mode): _isolated_run(bench, mode)
                            for bench in CASES for mode in ISSUE_MODES})


@pytest.fixture(scope="module")
def kvm_counts():
    """Every benchmark in KVM_MODES on KVM, each VM in its own VMM process, spread likewise."""
    return phase_counts_of({
        (bench, mode): (VmSpec("vm0", bench, CASES[bench]),
                        RunOptions(mode=mode, backend="kvm", timeout=300, isolated=True,
                                   clock=CLOCK))
        for bench in CASES for mode in KVM_MODES})


@pytest.mark.slow
@pytest.mark.parametrize("bench", list(CASES))
@pytest.mark.parametrize("mode", ISSUE_MODES)
def test_every_benchmark_isolated_equals_in_process(bench, mode, isolated_counts):
    assert isolated_counts[(bench, mode)] == PINNED[f"{bench}/{mode}"]


@pytest.mark.slow
@pytest.mark.kvm
@pytest.mark.skipif(not KVM_USABLE, reason=KVM_WHY)
@pytest.mark.parametrize("bench", list(CASES))
@pytest.mark.parametrize("mode", KVM_MODES)
def test_isolated_kvm_counts_equal_in_process_kvm(bench, mode, kvm_counts):
    """On KVM the counts include exits; remap modes map granted VRAM pages as memslots in
    the VMM process from the server's memfd.  An in-process KVM VM counts what the pinned
    in-process runs count (tests/test_vfio_counts_pinned.py runs KVM against the same
    pins on the pre-VFIO partition), so the isolated one is held to the pins."""
    isolated = kvm_counts[(bench, mode)]
    assert not isinstance(isolated, str), isolated
    assert _counted(isolated) == PINNED[f"{bench}/{mode}"]


def _counted(counts: dict) -> dict:
    """Every count but kvm.*: how KVM delivered the accesses (its coalesced ring drains
    by timing), not what was counted -- each access is counted the same either way."""
    return {phase: {k: v for k, v in c.items() if not k.startswith("kvm.")}
            for phase, c in counts.items()}


def test_killed_vmm_leaves_the_others_running_and_its_partition_reusable():
    """Two 2Q vGPUs fill the GPU; the victim's VMM is SIGKILLed while its guest runs; a
    third VM started later gets the victim's partition (there is no other) and passes."""
    mode, bench, params = "fv-opt", "loop", [20000]
    specs = [VmSpec("victim", bench, params, mdev_type="gpuvm-Q6000-2Q"),
             VmSpec("survivor", "mmul", CASES["mmul"], mdev_type="gpuvm-Q6000-2Q"),
             VmSpec("late", "mmul", CASES["mmul"], mdev_type="gpuvm-Q6000-2Q",
                    start_delay=4.0)]
    options = RunOptions(mode=mode, backend="inproc", timeout=120)
    (expected,) = run_vms([VmSpec("survivor", "mmul", CASES["mmul"],
                                  mdev_type="gpuvm-Q6000-2Q")], options)
    killed = []

    def kill_when_running(vm) -> None:
        deadline = time.monotonic() + 30
        device = vm.server.device
        while time.monotonic() < deadline and \
                sum(v for k, v in device.counts.items() if k.startswith("trap.")) < 200:
            time.sleep(0.01)  # wait until its guest driver is well into its run
        killed.append(vm.process.poll() is None)  # still running when killed
        os.kill(vm.process.pid, signal.SIGKILL)

    def kill_victim(vm) -> None:
        if vm.spec.name == "victim":
            threading.Thread(target=kill_when_running, args=(vm,), daemon=True).start()

    machine = machine_for(mode)(options, specs)
    boot = [(s, s.boot_params(), s.flags()) for s in specs]
    programs = guest_programs.build_all(["driver"], kinds=("shared",))
    victim, survivor, late = run_isolated(machine, boot, programs, "inproc", options,
                                          on_spawn=kill_victim)
    assert killed == [True] and not victim.passed and "SIGKILL" in victim.error()
    assert survivor.passed and late.passed, (survivor.error(), late.error())
    # the same work as alone; the waits for the mediator's lock follow the VMs beside
    # it, as in test_mediated_modes (host_port.WALL_CLOCK_COUNTERS)
    want = {p.name: work_counters(p.counters) for p in expected.session.phases}
    assert {p.name: work_counters(p.counters) for p in survivor.session.phases} == want
    assert {p.name: work_counters(p.counters) for p in late.session.phases} == want
