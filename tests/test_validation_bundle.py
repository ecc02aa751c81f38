"""The model against what the emulator measured on the lent 16-core machine, re-analysed
from the bundles `gpuvm calibrate --emulator` kept (tests/data/validation-h100: the
makespans of 1, 2, 4 and 8 VMs of fv-opt and pv, and their traces; fv is left out only
because its traces make the replay take a minute; tests/data/validation-h100-isolated:
fv, fv-opt and pv with every VM in its own VMM process, `--isolated`;
tests/data/validation-h100-wake: fv-opt and pv of a run that measured the host's
wake-up curve too).

And tests/data/validation-2core-cpython-lock: fv, fv-opt and pv of a sitting on the
2-core development host that measured everything the replay's lock prices (the wake-up
curve, the lock's timed rounds from one VM, what a wake-up costs the waker).

This is deterministic -- no guest runs, the same bundle gives the same predictions -- so
it holds the model, not the host, to a bound: a change to the replay, the pricing or the
trace format that makes the model worse fails here.  The older bundles predate the
measurements the lock as CPython writes it needs, so their bound is loose; the 2-core
bundle's is tight, and each measured cost is shown to bring its points closer."""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from gpuvm.calibrate import across, validation

BUNDLE = Path(__file__).parent / "data" / "validation-h100"
# mean |error| over the bundle's 8 points: 26.1% when it was added (results/validation/
# 20261125-000343, the first with the vCPU threads' sleeps); 23.0% and 16.9% for the two
# before it.  29.6% with the lock as CPython writes it (2026-11-29): the bundle has no
# wake-up curve nor wake cost, so the hand-off is fitted (at its most, 200 us) and the
# signal is none
MEAN_BOUND_PCT = 35.0
# results/validation/20261129-020242 (2 cores, load 0.16 -> 1.14): 11 of 12 points
# within 10%, mean |error| 3.0% when added
MEASURED_BUNDLE = Path(__file__).parent / "data" / "validation-2core-cpython-lock"
MEASURED_WITHIN = 10  # of 12
MEASURED_MEAN_BOUND_PCT = 5.0
# fv-opt and pv of results/validation/20261125-150109 (lent 16-core machine, with the
# host's wake-up curve measured at the start of the run: gpuvm.calibrate.wake)
WAKE_BUNDLE = Path(__file__).parent / "data" / "validation-h100-wake"


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


@pytest.fixture(scope="module")
def measured_analysis():
    measured, fits, about = validation.load(MEASURED_BUNDLE)
    return validation.AsideMeasures.from_about(about).analyse(
        measured, fits, about["cpus"], with_spread=False, with_halves=False)


def _errors(analysis, profile=None) -> dict[tuple[str, int], float]:
    points = analysis.points if profile is None else validation.predict(analysis.kept, profile)
    return {(p.mode, p.vms): p.error_pct for p in points}


def test_a_bundle_that_measured_the_locks_costs_is_predicted_within_its_bound(
        measured_analysis):
    """Nothing about the lock fitted: the hand-off is the wake-up curve's first latency,
    the signal the wake cost measured in the sitting, and the guests grow as the lock's
    timed rounds had them."""
    profile = measured_analysis.profile
    assert profile.lock_handoff_ns == profile.wake_latency_ns[0]
    assert profile.lock_signal_ns == pytest.approx(7_371, abs=1)
    assert profile.guest_work_scale and profile.guest_work_scale[-1] > 1.2
    errors = _errors(measured_analysis)
    assert len(errors) == 12
    assert sum(abs(e) <= 10 for e in errors.values()) >= MEASURED_WITHIN, errors
    assert _mean_abs(measured_analysis.points) <= MEASURED_MEAN_BOUND_PCT, errors


def test_each_kept_run_has_the_share_of_slow_core_samples_beside_it(measured_analysis):
    """The bundle sampled the host's cores (cores.npz): every kept run of its twelve
    points falls among the samples, each share a fraction (gpuvm.calibrate.across)."""
    shares = across.slow_shares(measured_analysis.kept, MEASURED_BUNDLE)
    assert set(shares) == {(p.mode, p.vms) for p in measured_analysis.points}
    assert all(0.0 <= share <= 1.0 for share in shares.values())
    assert across.slow_shares(measured_analysis.kept, BUNDLE) == {}  # not sampled


def test_the_measured_signal_brings_pv_closer(measured_analysis):
    """pv's handlers let the lock go inside (ioctls, numpy) and wake a sleeper each
    time: without the waker's cost pv at 2-8 VMs came out 13-22% short (-3.5 to +0.4
    with it when added)."""
    profile = measured_analysis.profile
    free = _errors(measured_analysis, replace(profile, lock_signal_ns=0.0))
    priced = _errors(measured_analysis)
    for vms in (2, 4, 8):
        assert abs(priced[("pv", vms)]) < abs(free[("pv", vms)]) - 5, (priced, free)


def test_the_guests_growth_brings_eight_vms_closer(measured_analysis):
    """Eight VMs' guests ran 1.37-1.56x one VM's time inside KVM_RUN per exit: without
    that fv and fv-opt at 8 VMs came out 27% and 18% short (-0.3 and -0.1 with it)."""
    profile = measured_analysis.profile
    flat = _errors(measured_analysis, replace(profile, guest_work_scale=(),
                                              pv_guest_work_scale=(),
                                              fv_opt_guest_work_scale=()))
    grown = _errors(measured_analysis)
    for mode in ("fv", "fv-opt"):
        assert abs(grown[(mode, 8)]) < abs(flat[(mode, 8)]) - 10, (grown, flat)


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
    time on host cores, which grows beside others by the wake-ups they signal.  A bundle
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
    # each wake-up signalled is time on the signaller's core; alone it wakes nobody
    signalled = {s.vms: s for s in validation.spreads(
        again, replace(profile, lock_signal_ns=10_000.0))}
    assert signalled[8].model_cpu_per_vm_ns > spread[8].model_cpu_per_vm_ns
    assert signalled[1].model_cpu_per_vm_ns == spread[1].model_cpu_per_vm_ns
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
