"""The same VMs run untimed beside the lock's timed rounds, and the cores the host takes
from their threads: what the model's growth and its cores taken are priced from."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuvm.calibrate import emulator, lock_use, untimed_growth, validation
from gpuvm.calibrate.command import print_growth
from gpuvm.calibrate.lock_use import LockUse
from gpuvm.calibrate.untimed_growth import UntimedRun
from gpuvm.experiment.costs import CostProfile, load_costs


def untimed(mode: str, vms: int, cpu_per_vm_ms: float, makespan_ms: float = 1.0,
            rep: int = 0) -> UntimedRun:
    return UntimedRun(mode, vms, rep, "idle", int(makespan_ms * 1e6),
                      int(cpu_per_vm_ms * 1e6 * vms), 0, 0)


def timed(mode: str, vms: int, held_us: float, guest_us: float, lost_in: int = 0,
          lost_holding: int = 0, exits: int = 1_000, split: bool = True) -> LockUse:
    """A timed run of `exits` exits: `held_us` and `guest_us` of CPU an exit outside and
    inside KVM_RUN, its threads' cores taken `lost_in` times inside it and
    `lost_holding` outside it."""
    held, guest = int(held_us * 1e3 * exits), int(guest_us * 1e3 * exits)
    return LockUse(mode, vms, 0, makespan_ns=10 * (held + guest), exits=exits,
                   cpu_ns=held + guest, in_run_cpu_ns=guest, in_run_wall_ns=guest,
                   sleeps=0, preemptions=lost_in + lost_holding,
                   in_run_preemptions=lost_in,
                   span_ns=(held + guest) if split else 0, span_cpu_ns=held + guest)


def test_each_counts_fastest_untimed_run_gives_its_cpu_per_vm_over_one_vms():
    """A run that landed in a lock convoy (the slower one of a count) is not the
    growth; a mode never run alone has none."""
    runs = [untimed("fv", 1, 100.0), untimed("fv", 2, 150.0, makespan_ms=3.0),
            untimed("fv", 2, 105.0, makespan_ms=2.0), untimed("fv", 4, 120.0),
            untimed("pv", 2, 50.0)]
    assert untimed_growth.growths(runs) == {"fv": ((1.0, 2.0, 4.0), (1.0, 1.05, 1.2))}
    again = untimed_growth.from_about({untimed_growth.ABOUT_KEY:
                                       untimed_growth.to_about(runs)})
    assert again == runs and untimed_growth.from_about({}) == []


def test_a_round_runs_the_counts_between_one_vm_and_the_most_more_often():
    """Their runs land in a lock convoy most often (2-VM fv runs: 1.9 s, or 3.2-4.9 s)."""
    assert untimed_growth.round_counts([1, 1, 2, 2, 4, 8], 1) == [1, 2, 4, 8, 2, 2, 4, 4]
    assert untimed_growth.round_counts([1, 2, 4], 3) == [1, 2, 4] * 3
    assert untimed_growth.round_counts([1, 2], 1) == [1, 2]


def test_cores_taken_come_per_ms_of_cpu_inside_and_outside_kvm_run():
    uses = [timed("fv", 1, 10.0, 30.0), timed("fv", 4, 10.0, 40.0, lost_in=400,
                                               lost_holding=20),
            timed("pv", 1, 10.0, 30.0, split=False), timed("pv", 4, 10.0, 30.0)]
    vms, guest, held = lock_use.preempt_rates(uses)["fv"]
    assert vms == (1.0, 4.0) and guest == (0.0, pytest.approx(10.0))
    assert held == (0.0, pytest.approx(2.0))
    assert "pv" not in lock_use.preempt_rates(uses)  # a run that did not split them


def test_a_mode_run_untimed_is_priced_from_those_runs_and_its_cores_taken():
    """fv ran untimed at the timed counts: its work and its guests grow as its CPU per
    VM did, and its cores are taken at the timed runs' rates; pv did not, and keeps the
    growth its timed runs had, with no cores taken."""
    uses = [timed(mode, n, held, 30.0, lost_in=100 * n)
            for mode in ("fv", "pv") for n, held in ((1, 10.0), (2, 13.0), (4, 15.0))]
    runs = [untimed("fv", n, cpu) for n, cpu in ((1, 100.0), (2, 104.0), (4, 111.0))]
    base = CostProfile("t", *([0.0] * 13), interpreter_lock=1.0)
    priced = validation.priced_growth(base, uses, runs)
    assert priced.lock_work_vms == (1.0, 2.0, 4.0)
    assert priced.lock_work_scale == priced.guest_work_scale == \
        pytest.approx((1.0, 1.04, 1.11))
    assert priced.pv_lock_work_scale == pytest.approx((1.0, 1.3, 1.5))
    assert priced.guest_preempts_per_ms == pytest.approx((100 / 30, 200 / 30, 400 / 30))
    assert priced.guest_preempts_per_ns(4, "pv") == priced.held_preempts_per_ns(4, "pv") == 0
    without = validation.priced_growth(base, uses)
    assert without.lock_work_scale == pytest.approx((1.0, 1.3, 1.5))
    assert without.guest_preempts_per_ms == () and without.guest_preempts_per_ns(4) == 0.0


def test_the_rates_run_between_the_counts_and_keep_through_toml(tmp_path):
    profile = CostProfile("t", *([0.0] * 13), lock_work_vms=(1.0, 2.0, 8.0),
                          lock_work_scale=(1.0, 1.1, 1.3),
                          guest_preempts_per_ms=(0.0, 2.0, 8.0),
                          fv_opt_held_preempts_per_ms=(0.0, 1.0, 4.0))
    assert profile.guest_preempts_per_ns(1) == 0.0
    assert profile.guest_preempts_per_ns(4) == pytest.approx(5.0 / 1e6)  # log2 halfway
    assert profile.guest_preempts_per_ns(64) == pytest.approx(8.0 / 1e6)  # flat beyond
    assert profile.guest_preempts_per_ns(8, "fv-opt") == pytest.approx(8.0 / 1e6)  # fv's
    assert profile.held_preempts_per_ns(8, "fv-opt") == pytest.approx(4.0 / 1e6)
    assert profile.held_preempts_per_ns(8) == 0.0
    with pytest.raises(ValueError, match="guest_preempts_per_ms"):
        replace(profile, guest_preempts_per_ms=(1.0,))
    path = tmp_path / "p.toml"
    path.write_text(emulator.to_toml(profile, "test"))
    again = load_costs(str(path))
    assert again.guest_preempts_per_ms == profile.guest_preempts_per_ms
    assert again.fv_opt_held_preempts_per_ms == profile.fv_opt_held_preempts_per_ms


def test_the_command_says_which_growth_came_untimed_and_the_cores_taken(capsys):
    profile = CostProfile("t", *([0.0] * 13), lock_work_vms=(1.0, 4.0),
                          lock_work_scale=(1.0, 1.1), pv_lock_work_scale=(1.0, 1.4),
                          guest_preempts_per_ms=(0.0, 8.3), held_preempts_per_ms=(0.0, 0.7))
    print_growth(profile)
    out = capsys.readouterr().out
    assert "fv (idle, untimed) 4 VMs 1.10x" in out and "pv (vecadd, timed) 4 VMs 1.40x" in out
    assert "fv 4 VMs 8.3 / 0.70" in out


def test_untimed_vms_run_the_benchmark_they_are_given(monkeypatch):
    """A scaling run's untimed VMs run its own benchmark (run_traces.runs_benchmark);
    calibrate's, the timed rounds' own (idle for fv, vecadd for pv)."""
    from types import SimpleNamespace

    from gpuvm.calibrate import lock_use
    ran = []

    def run_alike(benchmark, params, vms, options, what):
        ran.append((benchmark, tuple(params), vms, options.mode))
        return [SimpleNamespace(wall_ns=10, outcome=SimpleNamespace(vcpu=SimpleNamespace(
            cpu_ns=5, voluntary_switches=1, involuntary_switches=0))) for _ in range(vms)]
    monkeypatch.setattr("gpuvm.experiment.execute.run_alike", run_alike)
    runs = untimed_growth.measure("fv", [1, 2], 0, benchmark=("mmul", (128,)))
    assert ran == [("mmul", (128,), 1, "fv"), ("mmul", (128,), 2, "fv")]
    assert [r.benchmark for r in runs] == ["mmul", "mmul"] and runs[1].cpu_ns == 10
    ran.clear()
    untimed_growth.measure("pv", [1], 0)
    assert ran == [(lock_use.PV_GROWTH_BENCHMARK, tuple(lock_use.PV_GROWTH_PARAMS), 1, "pv")]
