"""The model against what the emulator measured on the lent 16-core machine, re-analysed
from the bundles `gpuvm calibrate --emulator` kept (tests/data/validation-h100: the
makespans of 1, 2, 4 and 8 VMs of fv-opt and pv, and their traces; fv is left out only
because its traces make the replay take a minute; tests/data/validation-h100-isolated:
fv, fv-opt and pv with every VM in its own VMM process, `--isolated`;
tests/data/validation-h100-wake: fv-opt and pv of a run that measured the host's
wake-up curve too; tests/data/validation-h100-exits: of one that measured it on a VM's
own exits).

This is deterministic -- no guest runs, the same bundle gives the same predictions -- so
it holds the model, not the host, to a bound: a change to the replay, the fit or the
trace format that makes the model worse fails here.  The bound is loose because the
model is not yet within its 10% goal (README, "The model against the emulator"); the
test also checks that the mechanism fitted on the 2-VM runs (the interpreter lock's
hand-off) is what brings the 4- and 8-VM predictions closer."""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Callable

import pytest

from gpuvm.calibrate import validation
from gpuvm.calibrate.wake import WakeCurve

BUNDLE = Path(__file__).parent / "data" / "validation-h100"
# mean |error| over the bundle's 8 points: 26.1% when it was added (results/validation/
# 20261125-000343, the first with the vCPU threads' sleeps); 23.0% and 16.9% for the two
# before it
MEAN_BOUND_PCT = 30.0
# fv-opt and pv of results/validation/20261125-150109 (lent 16-core machine, with the
# host's wake-up curve measured at the start of the run: gpuvm.calibrate.wake)
WAKE_BUNDLE = Path(__file__).parent / "data" / "validation-h100-wake"
# fv-opt and pv of results/validation/20261125-175806 (lent machine; the curve measured
# on an fv-opt VM's own exits: the wake-up and the exit handled after it)
EXITS_BUNDLE = Path(__file__).parent / "data" / "validation-h100-exits"


@pytest.fixture(scope="module")
def analysis():
    measured, fits, about = validation.load(BUNDLE)
    return validation.analyse(measured, fits, about["cpus"])


def _mean_abs(points) -> float:
    return sum(abs(p.error_pct) for p in points) / len(points)


def test_the_model_predicts_the_measured_makespans_within_its_bound(analysis):
    assert {(p.mode, p.vms) for p in analysis.points} == \
        {(m, n) for m in ("fv-opt", "pv") for n in (1, 2, 4, 8)}
    assert _mean_abs(analysis.points) <= MEAN_BOUND_PCT, analysis.points


def test_the_lock_handoff_fitted_on_two_vms_improves_the_larger_runs(analysis):
    assert analysis.profile.lock_handoff_ns > 0
    without = validation.predict(analysis.kept, replace(analysis.profile, lock_handoff_ns=0.0))
    larger = [p for p in analysis.points if p.vms > validation.FIT_VMS]
    assert _mean_abs(larger) < _mean_abs([p for p in without if p.vms > validation.FIT_VMS])


def test_the_lock_costs_more_per_exit_with_more_vms_and_in_pv(analysis):
    """What the one fitted hand-off misses (docs/model-validation.md): the hand-off each
    point alone would need grows from 2 to 8 VMs in both modes, and pv needs about three
    times fv-opt's -- its handlers take the lock several times per exit (numpy and
    ioctls release it inside), which the model does not count."""
    needed = validation.needed_handoffs(analysis.kept, analysis.profile)
    assert set(needed) == {(m, n) for m in ("fv-opt", "pv") for n in (2, 4, 8)}
    for mode in ("fv-opt", "pv"):
        assert needed[(mode, 8)] > 1.3 * needed[(mode, 2)], needed
    for n in (2, 4, 8):
        assert needed[("pv", n)] > 2 * needed[("fv-opt", n)], needed


def test_pv_waits_for_the_lock_more_often_than_the_model_charges_it(analysis):
    """Why pv needs the larger hand-off: what the VMs beside one add to its vCPU
    thread's sleeps is 2.5-3x the exits the model has wait for the lock -- its handlers
    let the lock go inside (ioctls, numpy) and wait for it again.  fv-opt's VMs wait
    about as often as the model says at 2 VMs; at 8 each waits 25% more often."""
    spread = {(s.mode, s.vms): s for s in analysis.spread}
    assert all(s.sleeps_per_vm is not None for s in spread.values())

    def run_over_model(mode: str, vms: int) -> float:
        alone, s = spread[(mode, 1)], spread[(mode, vms)]
        return (s.sleeps_per_vm - alone.sleeps_per_vm) / \
            (s.model_sleeps_per_vm - alone.model_sleeps_per_vm)
    assert all(run_over_model("pv", n) > 2 for n in (2, 4, 8))
    assert 0.9 < run_over_model("fv-opt", 2) < 1.1
    assert run_over_model("fv-opt", 8) > 1.15


# VMs in VMM processes of their own (`gpuvm calibrate --emulator --isolated --trace-reps
# 4`): fv, fv-opt and pv of results/validation/20261123-192945, also from the 16-core
# machine, with the server's time on every run
ISOLATED = Path(__file__).parent / "data" / "validation-h100-isolated"
ISOLATED_MEAN_BOUND_PCT = 25.0  # 11.4% for this bundle (13.1% for the one before it)


@pytest.fixture(scope="module")
def isolated_analysis():
    measured, fits, about = validation.load(ISOLATED)
    assert about["isolated"]
    return validation.analyse(measured, fits, about["cpus"])


def test_the_model_predicts_isolated_vms_within_its_bound(isolated_analysis):
    assert {(p.mode, p.vms) for p in isolated_analysis.points} == \
        {(m, n) for m in ("fv", "fv-opt", "pv") for n in (1, 2, 4, 8)}
    assert _mean_abs(isolated_analysis.points) <= ISOLATED_MEAN_BOUND_PCT, \
        isolated_analysis.points
    # processes share no interpreter lock: nothing is fitted for one
    assert isolated_analysis.profile.lock_handoff_ns == 0


def test_eight_isolated_vms_wait_for_the_server_and_nothing_else(isolated_analysis):
    """The server's time in the traces is what the model serialises: counted as each
    VM's own instead, eight VMs would take little more than one.  (fv-opt's 8 VMs come
    out 34% short even so: its server took 1.44x as long per VM as the trace shows --
    test_the_server_took_longer_per_vm_with_more_vms_in_fv_opt.)"""
    from gpuvm.vfio.user.protocol import SERVER_ACCESS_COUNTER, SERVER_ENGINE_COUNTER

    def own(trace):
        events = trace["events"]
        deltas = events.deltas.copy()
        for name in (SERVER_ACCESS_COUNTER, SERVER_ENGINE_COUNTER):
            deltas[:, events.names.index(name)] = 0
        return dict(trace, events=replace(events, deltas=deltas))
    eight = [m for m in isolated_analysis.kept if m.vms == 8]
    served = validation.predict(eight, isolated_analysis.profile)
    unserved = validation.predict([replace(m, trace=own(m.trace)) for m in eight],
                                  isolated_analysis.profile)
    assert all(abs(p.error_pct) < 40 for p in served), served
    assert all(p.error_pct < -50 for p in unserved), unserved


def test_a_bundle_saved_again_loads_the_same(tmp_path):
    measured, fits, about = validation.load(BUNDLE)
    assert {m.samples for m in measured} == {1}  # measured before 1-VM samples were kept
    assert {m.runs_ns for m in measured} == {()}  # ... and before every run was kept
    # a 1-VM run that was the fastest of several says so, and keeps its runs' makespans
    measured = [replace(m, samples=4, runs_ns=(m.makespan_ns + 3, m.makespan_ns,
                                               m.makespan_ns + 1, m.makespan_ns + 2))
                if m.vms == 1 else m for m in measured]
    validation.save(tmp_path / "again", measured, fits, about)
    again, fits_again, about_again = validation.load(tmp_path / "again")
    assert about_again == about and len(fits_again) == len(fits)
    assert [(m.mode, m.vms, m.rep, m.makespan_ns, m.samples, m.runs_ns) for m in again] == \
        [(m.mode, m.vms, m.rep, m.makespan_ns, m.samples, m.runs_ns) for m in measured]
    assert all(a.trace["events"] == b.trace["events"] for a, b in zip(again, measured))


def test_a_bundle_is_never_written_over(tmp_path):
    measured, fits, about = validation.load(BUNDLE)
    validation.save(tmp_path / "b", measured[:1], [], about)
    with pytest.raises(FileExistsError):
        validation.save(tmp_path / "b", measured, fits, about)


def test_a_broken_bundle_is_one_error_line(tmp_path, gpuvm_cli):
    rc, _, err = gpuvm_cli("calibrate", "--emulator", "--from", str(tmp_path))
    assert rc == 2 and err.count("\n") == 1 and "not a validation bundle" in err
    shutil.copytree(BUNDLE, tmp_path / "b")
    next((tmp_path / "b").glob("*.npz")).write_bytes(b"not an npz")
    rc, _, err = gpuvm_cli("calibrate", "--emulator", "--from", str(tmp_path / "b"))
    assert rc == 2 and err.count("\n") == 1 and ".npz" in err, err
    # a wake-up curve that lost its latencies: named before any analysis runs
    shutil.copytree(WAKE_BUNDLE, tmp_path / "w")
    runs = tmp_path / "w" / validation.BUNDLE_RUNS
    data = json.loads(runs.read_text())
    del data["about"]["wake"]["latency_ns"]
    runs.write_text(json.dumps(data))
    rc, _, err = gpuvm_cli("calibrate", "--emulator", "--from", str(tmp_path / "w"))
    assert rc == 2 and err.count("\n") == 1 and "wake curve" in err and "/w" in err, err


def test_each_point_shows_how_its_repetitions_moved(isolated_analysis):
    """The table's error is read against its noise: every repetition's own error, and how
    far apart the emulator's repetitions were."""
    measured, _, _ = validation.load(ISOLATED)
    assert [(s.mode, s.vms) for s in isolated_analysis.spread] == \
        [(p.mode, p.vms) for p in isolated_analysis.points]
    for s in isolated_analysis.spread:
        reps = sorted((m for m in measured if (m.mode, m.vms) == (s.mode, s.vms)),
                      key=lambda m: m.rep)
        spans = [m.makespan_ns for m in reps]
        assert s.measured_spread_pct == pytest.approx(100 * (max(spans) / min(spans) - 1))
        assert len(s.rep_errors_pct) == 4
        assert list(s.rep_errors_pct) == pytest.approx(
            [p.error_pct for p in validation.predict(reps, isolated_analysis.profile)])
    assert "at most" in validation.spread_summary(isolated_analysis.spread)


def test_the_server_took_longer_per_vm_with_more_vms_in_fv_opt(isolated_analysis):
    """What the model does not know (docs/model-validation.md): per VM, the one server
    thread's time grew with the VM count -- in this bundle's run fv-opt's, whose 4- and
    8-VM runs are predicted short by that much (the next run of the same command, pv's
    instead).  fv's grew too before interrupts were routed to their own VM; in this
    bundle, from after, it stays near the trace's."""
    growth = {(s.mode, s.vms): s.server_per_vm for s in isolated_analysis.spread}
    assert all(r is not None for r in growth.values()), growth
    assert growth["fv-opt", 4] > 1.3 and growth["fv-opt", 8] > 1.3, growth
    assert growth["fv", 8] < 1.1, growth


def test_the_servers_time_on_a_run_is_kept_and_read_against_the_trace(tmp_path,
                                                                      isolated_analysis):
    from gpuvm.sim.replay import server_ns
    measured, fits, about = validation.load(ISOLATED)
    assert all(m.served_ns > 0 for m in measured)
    # twice the trace's server time per VM, in every run
    doubled = [replace(m, served_ns=2 * m.vms * server_ns(m.trace["events"])) for m in measured]
    validation.save(tmp_path / "doubled", doubled, fits, about)
    again, _, _ = validation.load(tmp_path / "doubled")
    assert [m.served_ns for m in again] == [m.served_ns for m in doubled]
    # the profile is fitted from the traces and makespans alone, not the server's time
    profile = isolated_analysis.profile
    assert all(s.server_per_vm == pytest.approx(2.0) for s in validation.spreads(again, profile))
    # a bundle from before the server's time was kept: nothing to show (its 1-VM
    # points suffice: every point reads it alike, and eight fv VMs replay slowly)
    unmeasured = [replace(m, served_ns=0) for m in measured if m.vms == 1]
    assert all(s.server_per_vm is None for s in validation.spreads(unmeasured, profile))


def test_the_vcpu_threads_usage_is_kept_and_set_beside_the_models(tmp_path, analysis):
    """A run's vCPU sleeps and CPU time survive the bundle; per point, the median per VM
    sits beside the model's: the exits it has wait for the lock -- none for one VM's
    channels alone beyond the engine's, more with every VM beside it -- and its VMs'
    time on host cores, which grows beside others by the hand-offs they pay.  A bundle
    from before: neither."""
    measured, fits, about = validation.load(BUNDLE)
    few = [replace(m, vcpu_sleeps=m.vms * (100 + m.rep),
                   vcpu_cpu_ns=m.vms * (1_000_000 + m.rep)) for m in measured
           if m.mode == "fv-opt" and m.vms in (1, 8)]
    validation.save(tmp_path / "usage", few, fits, about)
    again, _, _ = validation.load(tmp_path / "usage")
    assert [(m.vcpu_sleeps, m.vcpu_cpu_ns) for m in again] == \
        [(m.vcpu_sleeps, m.vcpu_cpu_ns) for m in few]
    profile = analysis.profile
    spread = {s.vms: s for s in validation.spreads(again, profile)}
    reps = {m.rep for m in few}
    assert spread[8].sleeps_per_vm == pytest.approx(statistics.median(100 + r for r in reps))
    assert spread[8].model_sleeps_per_vm > spread[1].model_sleeps_per_vm + 100
    assert spread[8].cpu_per_vm_ns == \
        pytest.approx(statistics.median(1_000_000 + r for r in reps))
    # each hand-off the model charged is time on a core
    assert spread[8].model_cpu_per_vm_ns - spread[1].model_cpu_per_vm_ns >= \
        0.9 * profile.lock_handoff_ns * \
        (spread[8].model_sleeps_per_vm - spread[1].model_sleeps_per_vm)
    old = [replace(m, vcpu_sleeps=0, vcpu_cpu_ns=0) for m in few if m.vms == 1]
    assert all(s.sleeps_per_vm is None and s.model_sleeps_per_vm is None and
               s.cpu_per_vm_ns is None and s.model_cpu_per_vm_ns is None
               for s in validation.spreads(old, profile))


def test_a_bundle_keeps_its_older_traces_but_the_cache_rerecords_them(tmp_path):
    """A trace of format 3 (a remote counter read's whole wait beyond the median
    counted) in a bundle: a bundle is what was measured, so it still loads; the trace
    cache, which stands for the present recorder, does not serve it."""
    from gpuvm.sim.traces import BUNDLE_FORMATS, FORMAT, read_trace, write_trace
    assert FORMAT != 3
    shutil.copytree(BUNDLE, tmp_path / "older")
    measured, _, _ = validation.load(BUNDLE)
    name = "trace001.npz"
    write_trace(tmp_path / "older" / name,
                read_trace(BUNDLE / name, BUNDLE_FORMATS) | {"format": 3})
    assert read_trace(tmp_path / "older" / name) is None
    assert read_trace(tmp_path / "older" / name, (3,)) is not None
    again, _, _ = validation.load(tmp_path / "older")
    assert [(m.mode, m.vms, m.makespan_ns) for m in again] == \
        [(m.mode, m.vms, m.makespan_ns) for m in measured]


def test_calibrate_prints_the_vcpu_usage_beside_the_models(capsys):
    """Per mode, beyond the 1-VM point: the sleeps the VMs beside one added, run / model,
    and each VM's CPU over one VM's alone, run / model; a point not measured is left
    out, and a bundle from before says nothing."""
    from gpuvm.calibrate.command import print_vcpu_usage
    spread = [validation.Spread("fv", 1, (0.0,), 0.0, None, 100.0, 10.0, 1e6, 2e6),
              validation.Spread("fv", 8, (0.0,), 0.0, None, 600.0, 300.0, 1.5e6, 2.2e6),
              validation.Spread("pv", 8, (0.0,), 0.0, None, 50.0, 5.0, 3e6, 3e6)]
    print_vcpu_usage(spread)
    out = capsys.readouterr().out.splitlines()
    assert "  fv: 8 VMs +500 / +290" in out and "  fv: 8 VMs 1.50x / 1.10x" in out, out
    assert not any(line.startswith("  pv") for line in out), out  # no 1-VM point
    print_vcpu_usage([validation.Spread("fv", n, (0.0,), 0.0) for n in (1, 8)])
    assert capsys.readouterr().out == ""



def _eight_vm_errors(bundle: Path, priced: Callable
                     ) -> tuple[WakeCurve, dict[str, dict[str, float]]]:
    """The bundle's wake curve, and its 8-VM errors per way of pricing the wake-ups:
    `priced(plain, wake)` names the profiles (plain: costs fitted from the bundle's
    traces, every hand-off alike); each gets its hand-off fitted on the 2-VM runs."""
    from gpuvm.calibrate import emulator
    measured, fits, about = validation.load(bundle)
    wake = WakeCurve.from_about(about)
    assert wake is not None
    kept = validation.fastest(measured)
    traces = list(fits) + [(m.mode, m.trace) for m in measured if m.vms == 1]
    plain = replace(emulator.trace_profile(emulator.fit_trace_costs(traces)),
                    recorded_times=1.0)
    eight = [m for m in kept if m.vms == 8]
    errors = {}
    for name, profile in priced(plain, wake).items():
        fitted = validation.fit_handoff(kept, profile, about["cpus"])
        errors[name] = {p.mode: p.error_pct for p in validation.predict(eight, fitted)}
    return wake, errors


def test_the_measured_wake_curve_brings_eight_vms_closer():
    """Each VM of eight waits for seven others' handlers (fv-opt: ~300 us), past the
    200 us the lent machine's idle vCPUs poll before they halt, and wakes late; with
    two it waits for one, inside the window.  A hand-off fitted on 2 VMs with the curve
    the run measured predicts both modes' 8-VM makespans closer than one fitted
    without it (fv-opt -19% -> -4%, pv -35% -> -28% when added)."""
    wake, errors = _eight_vm_errors(
        WAKE_BUNDLE, lambda plain, wake: {"plain": plain, "late": wake.priced_in(plain)})
    assert wake.latency_ns[-1] > wake.latency_ns[0]
    assert set(errors["late"]) == {"fv-opt", "pv"}
    for mode in ("fv-opt", "pv"):
        assert abs(errors["late"][mode]) < abs(errors["plain"][mode]) - 5, errors


def test_the_exits_slowing_after_a_long_sleep_brings_eight_vms_closer():
    """A woken thread's next exit is slower the longer it slept (its core idled): the
    run measured that on an fv-opt VM's own exits beside the wake-up.  A hand-off fitted
    on 2 VMs with both predicts the 8-VM makespans closer than one fitted with the
    wake-up alone (fv-opt -9.7% -> -4.5%, pv -43.0% -> -40.3% when added)."""
    wake, errors = _eight_vm_errors(EXITS_BUNDLE, lambda plain, wake: {
        "wake-up": replace(wake, work_ns=()).priced_in(plain),
        "and exit": wake.priced_in(plain)})
    assert wake.work_ns[-1] > wake.work_ns[0]
    assert set(errors["and exit"]) == {"fv-opt", "pv"}
    for mode in ("fv-opt", "pv"):
        assert abs(errors["and exit"][mode]) < abs(errors["wake-up"][mode]) - 2, errors


def test_the_reports_replays_come_out_the_same_in_worker_processes():
    """Every repetition's replay and each point's needed hand-off, in forked workers
    (min_cores=1 forces them on any host) and here: the same to the last bit."""
    measured, fits, about = validation.load(BUNDLE)
    pv = [m for m in measured if m.mode == "pv"]
    profile = validation.analyse(pv, [f for f in fits if f[0] == "pv"], about["cpus"],
                                 with_spread=False, with_halves=False).profile
    here = validation.spreads(pv, profile, min_cores=10**6)
    assert validation.spreads(pv, profile, min_cores=1) == here
    kept = validation.fastest(pv)
    assert validation.needed_handoffs(kept, profile, min_cores=1) == \
        validation.needed_handoffs(kept, profile, min_cores=10**6)
    assert validation.in_parallel(abs, [-1, 2, -3], min_cores=1) == [1, 2, 3]


def test_each_point_shows_how_far_apart_its_runs_back_to_back_were(analysis):
    """The runs' spread is each repetition's slowest run over its fastest (median over
    the repetitions), absent where every repetition ran once -- and the summary says it
    even where one repetition gives no spread between repetitions."""
    measured = [replace(m, runs_ns=(m.makespan_ns, m.makespan_ns * 11 // 10))
                if m.vms == 2 and m.rep == 0 else m for m in validation.load(BUNDLE)[0]]
    spread = validation.spreads(measured, analysis.profile, min_cores=10**6)
    by_point = {(s.mode, s.vms): s for s in spread}
    twos = [s for (mode, vms), s in by_point.items() if vms == 2]
    assert twos and all(s.runs_spread_pct == pytest.approx(10, abs=1e-6) for s in twos)
    assert all(s.runs_spread_pct is None for (mode, vms), s in by_point.items() if vms != 2)
    only_first = [m for m in measured if m.rep == 0]
    summary = validation.spread_summary(validation.spreads(only_first, analysis.profile,
                                                           min_cores=10**6))
    assert summary.startswith("runs of one point back to back: the slowest 10%"), summary


def test_the_points_the_handoff_is_fitted_on_move_with_it(analysis, isolated_analysis):
    """Priced either side of the fitted hand-off, each 2-VM point it is fitted on comes
    out at its own error at the cost and moves with it -- on the lent machine by points
    per microsecond; on a 2-core host whose fv VMs ran mostly inside KVM_RUN, fv's moved
    by 2 points from 10 to 20 us and the fit was noise (docs/model-validation.md).
    VMs in processes of their own fit no hand-off."""
    pulls = validation.handoff_pull(analysis.kept, analysis.profile)
    assert [p.mode for p in pulls] == \
        [m.mode for m in validation.handoff_fit_points(analysis.kept)] != []
    at = {p.mode: p.error_pct for p in analysis.points if p.vms == validation.FIT_VMS}
    for pull in pulls:
        assert pull.at_pct == pytest.approx(at[pull.mode], abs=0.05)
        assert pull.above_pct - pull.at_pct > 2 and pull.at_pct - pull.below_pct > 2, pull
    assert validation.handoff_pull(isolated_analysis.kept, isolated_analysis.profile) == []


def test_calibrate_prints_how_the_fitted_points_move_with_the_handoff(capsys):
    from gpuvm.calibrate.command import print_handoff_pull
    print_handoff_pull([validation.HandoffPull("fv", -5.4, -5.3, -3.4)], 15_000.0)
    out = capsys.readouterr().out.splitlines()
    assert "priced at 10.0 / 15.0 / 20.0 us" in out[0] and out[1:] == \
        ["  fv: 2 VMs -5.4 / -5.3 / -3.4"], out
    print_handoff_pull([validation.HandoffPull("fv", 1.0, 2.0, 3.0)], 2_000.0)
    assert "priced at 0.0 / 2.0 / 7.0 us" in capsys.readouterr().out
    print_handoff_pull([], 2_000.0)
    assert capsys.readouterr().out == ""
