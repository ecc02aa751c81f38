"""Threaded VMs' vCPU threads timed inside and outside KVM_RUN
(gpuvm.calibrate.lock_use, RunOptions.time_kvm_run)."""

from __future__ import annotations

import json

import pytest

from gpuvm import cli
from gpuvm.calibrate import lock_use
from gpuvm.calibrate.lock_use import LockUse
from gpuvm.experiment.config import Scenario, VmConfig
from gpuvm.experiment.execute import specs_for
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions
from gpuvm.vmm.kvm import kvm_usable

USABLE, WHY = kvm_usable()
needs_kvm = pytest.mark.skipif(not USABLE, reason=WHY)


def test_per_exit_figures_come_from_the_summed_times():
    use = LockUse("fv", 2, 0, makespan_ns=3_000_000, exits=100, cpu_ns=4_000_000,
                  in_run_cpu_ns=1_500_000, in_run_wall_ns=3_500_000, sleeps=80)
    assert use.held_ns == 2_500_000
    assert use.per_exit_us(use.held_ns) == 25.0
    assert use.waited_us == 25.0  # (3.5 - 1.5) ms over 80 sleeps
    assert use.lock_share == pytest.approx(2.5 / 3)
    assert use.free_per_exit_us == 5.0  # (3.0 - 2.5) ms over 100 exits
    # held beyond the makespan (cores overlapping, no lock): nothing sat free
    assert LockUse("pv", 1, 0, 1_000, 10, 5_000, 0, 0, 0).free_per_exit_us == 0


@pytest.mark.kvm
@needs_kvm
def test_timing_kvm_run_counts_every_exit_and_splits_the_cpu():
    """Each KVM_RUN is one exit the guest made: the timed runs are the exits the session
    counted (MMIO and port I/O), plus none; CPU inside is within its wall time and
    within the thread's CPU; a run that does not ask times nothing."""
    scenario = Scenario("one", (VmConfig("vm0", "mmul", (64,)),))
    [timed] = run_vms(specs_for(scenario), RunOptions(mode="pv", backend="kvm",
                                                      time_kvm_run=True))
    assert timed.passed, timed.error()
    timer = timed.session.kvm_run_time
    exits = sum(v for p in timed.session.phases for k, v in p.counters.items()
                if k.startswith("exits.mmio.") or k == "exits.io")
    assert timer is not None and exits > 0
    assert exits <= timer.runs <= exits + 2
    assert 0 < timer.cpu_ns <= timer.wall_ns
    assert timer.cpu_ns < timed.outcome.vcpu.cpu_ns
    [plain] = run_vms(specs_for(scenario), RunOptions(mode="pv", backend="kvm"))
    assert plain.passed and plain.session.kvm_run_time is None


@pytest.mark.kvm
@needs_kvm
def test_measure_gives_a_run_per_mode_and_count():
    uses = lock_use.measure("mmul", (64,), ["pv"], [1, 2], reps=1)
    assert [(u.mode, u.vms, u.rep) for u in uses] == [("pv", 1, 0), ("pv", 2, 0)]
    one, two = uses
    assert two.exits > one.exits > 0  # two VMs, each its own exits
    assert 0 < one.held_ns < one.cpu_ns and 0 < two.held_ns < two.cpu_ns
    assert 0 < two.lock_share <= 1.5  # held time of threads taking turns at one lock


def test_bad_arguments_get_one_line(capsys):
    for argv, says in ((["--repeat", "0"], "--repeat must be >= 1"),
                       (["--modes", "fv,nope"], "unknown mode 'nope'")):
        rc = cli.main(["calibrate", "--lock-use", *argv])
        err = capsys.readouterr().err
        assert rc != 0 and says in err, err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.kvm
@needs_kvm
def test_the_command_prints_the_table_and_json(capsys):
    rc = cli.main(["calibrate", "--lock-use", "--modes", "pv", "--vms", "1", "--repeat", "1",
                   "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    [row] = json.loads(out)
    assert row["mode"] == "pv" and row["vms"] == 1 and row["exits"] > 0
    assert row["held_ns"] == row["cpu_ns"] - row["in_run_cpu_ns"]
    rc = cli.main(["calibrate", "--lock-use", "--modes", "pv", "--vms", "1,2", "--repeat", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "in KVM_RUN CPU" in out and "lock free" in out
