"""A suite (kind = "suite") runs its included experiment files, each into its own run
directory, then writes one report beside the paper's numbers; `--report` rebuilds it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

OVERHEAD = """
[experiment]
name = "ov"
kind = "benchmarks"
modes = ["native", "fv", "fv+lazy", "pv"]
output = "{out}/ov"
[[scenario]]
name = "idle"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
"""

SCALING = """
[experiment]
name = "sc"
kind = "scaling"
modes = ["fv-opt", "pv"]
output = "{out}/sc"
fit_traces = "fit.toml"
[[scenario]]
name = "1vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
[[scenario]]
name = "2vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
count = 2
"""

FIT = """
[experiment]
name = "fit"
modes = ["fv-opt", "pv-naive"]
[[scenario]]
name = "idle-1vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
[[scenario]]
name = "idle-2vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
count = 2
"""

SUITE = """
[experiment]
name = "suite"
kind = "suite"
output = "{out}/suite"
include = ["ov.toml", "sc.toml"]
"""


def gpuvm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvm", "experiment", *args],
                          capture_output=True, text=True, timeout=600)


def _section(report: str, heading: str) -> str:
    """From `heading` to the next heading."""
    start = report.index(heading)
    end = report.find("\n#", start + len(heading))
    return report[start:end if end >= 0 else None]


def test_a_suite_runs_its_parts_and_reports_beside_the_paper(tmp_path: Path):
    for name, text in (("ov", OVERHEAD), ("sc", SCALING), ("fit", FIT), ("suite", SUITE)):
        (tmp_path / f"{name}.toml").write_text(text.format(out=tmp_path))
    done = gpuvm(str(tmp_path / "suite.toml"))
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("ov", "sc"):
        assert (tmp_path / part / "latest" / "COMPLETE").exists()
        assert (tmp_path / part / "latest" / "report.md").exists()
    report = (tmp_path / "suite" / "latest" / "report.md").read_text()
    for expected in ("## Overhead", "### Beside the paper", "~100x native",
                     "## Scaling", "model: makespan", "### Why, from the counts",
                     "a VM's waits for the mediator's lock"):
        assert expected in report, expected
    assert (tmp_path / "suite" / "latest" / "scaling.png").exists()
    # and the validation's figure, the model against the emulator's runs per mode
    assert (tmp_path / "suite" / "latest" / "validation.png").stat().st_size > 0
    assert "![validation](validation.png)" in _section(report, "### Validation")
    # the scaling run kept one VM's trace per mode, recorded beside its mode's 1-VM
    # runs (a recording right after each, the fastest kept), and the validation
    # replays those, the hand-off and cores fitted on its 2-VM runs
    traces = tmp_path / "sc" / "latest" / "traces"
    kept = sorted(p.name for p in traces.iterdir())
    assert kept == ["about.json", "fit", "idle_default_fv-opt_direct.npz",
                    "idle_default_pv_pv.npz", "recordings.json"]
    # and the single VMs of its fit_traces file (not the 2-VM one), the prices fitted
    # on them too
    assert sorted(p.name for p in (traces / "fit").iterdir()) == [
        "idle_default_fv-opt_direct.npz", "idle_default_pv-naive_pv.npz"]
    said = done.stderr
    recorded = said.index("recording one VM's trace for the validation: "
                          "idle_default_fv-opt_direct.npz")
    assert said.index("1vm fv-opt fifo rep 0") < recorded < said.index("1vm pv fifo rep 0")
    validation = _section(report, "### Validation")
    assert "recorded beside its mode's 1-VM runs (a recording right after each)" in validation
    assert "fitted on those traces and 2 single VMs of `fit.toml` recorded after" in validation
    counts = json.loads((traces / "recordings.json").read_text())
    assert set(counts) == {"idle_default_fv-opt_direct.npz", "idle_default_pv_pv.npz"}
    # with what recording cost per event on this host, timed beside them
    about = json.loads((tmp_path / "sc" / "latest" / "traces" / "about.json").read_text())
    assert about["record_event_ns"] > 0
    assert f"less what recording took per event ({about['record_event_ns'] / 1e3:.1f} us" \
        in validation
    # and what a wake-up cost the waker there, which prices the lock's signal
    from gpuvm.calibrate.wake_cost import WakeCost
    woken = WakeCost.from_about(about)
    assert woken is not None and woken.samples > 0
    assert f"costing the waker {woken.signal_ns / 1e3:.2f} us (measured with the traces)" \
        in validation
    # and how late a woken thread ran again: the hand-off, measured rather than fitted
    from gpuvm.calibrate.wake import WakeCurve
    curve = WakeCurve.from_about(about)
    assert curve is not None and curve.latency_ns[0] > 0
    assert f"landing {curve.latency_ns[0] / 1e3:.1f} us later (measured with the traces)" \
        in validation
    assert validation.count("| fv-opt |") == 2 and validation.count("| pv |") == 2
    again = gpuvm(str(tmp_path / "suite.toml"), "--report", str(tmp_path / "suite" / "latest"))
    assert again.returncode == 0, again.stderr[-2000:]
    rebuilt = (tmp_path / "suite" / "latest" / "report.md").read_text()
    assert _section(rebuilt, "### Validation") == validation  # the same traces, replayed
    wrong = gpuvm(str(tmp_path / "suite.toml"), "--report", str(tmp_path / "ov" / "latest"))
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1


def test_a_scaling_run_keeps_the_traces_of_vms_run_as_it_ran_them():
    """Traces of VMs in processes of their own (`isolated`) for a run of such VMs: the
    model replays the server's share of those (gpuvm.sim.replay)."""
    from gpuvm.experiment import run_traces
    from gpuvm.experiment.config import Experiment, Scenario, VmConfig

    scenarios = (Scenario("1vm", (VmConfig("vm", "idle", ()),)),
                 Scenario("2vm", (VmConfig("vm", "idle", ()), VmConfig("vm2", "idle", ()))))
    for isolated in (False, True):
        keys = run_traces.keys(Experiment("sc", "scaling", scenarios, modes=("fv-opt", "pv"),
                                          isolated=isolated))
        assert sorted(keys) == [("fv-opt", "1vm"), ("fv-opt", "2vm"), ("pv", "1vm"),
                                ("pv", "2vm")]
        assert len(set(keys.values())) == 2  # one trace per mode serves every count
        assert all(k.isolated == isolated for k in keys.values())


def test_a_scaling_run_that_asks_times_the_locks_rounds(monkeypatch):
    """`lock_rounds`: GROWTH_REPS rounds of the lock's timed runs at one VM alone, the
    base count and the scenarios' counts from it up (as `gpuvm calibrate --emulator`
    times them), for the experiment's modes -- what the report's validation grows the
    guests' and the lock's work by."""
    from gpuvm.calibrate import lock_use, untimed_growth
    from gpuvm.experiment import run_traces
    from gpuvm.experiment.config import Experiment, Scenario, VmConfig

    asked, asked_untimed, untimed_benchmarks = [], [], []

    def timed_round(modes, counts, rep, progress):
        asked.append((tuple(modes), tuple(counts), rep))
        return [lock_use.LockUse("fv", n, rep, 1_000_000, 10, 100, 0, 0, 0) for n in counts]

    def untimed_round(modes, counts, rep, progress, benchmark=None):
        asked_untimed.append((tuple(modes), tuple(counts), rep))
        untimed_benchmarks.append(benchmark)
        return [untimed_growth.UntimedRun("fv", n, rep, "idle", 1, 1, 0, 0) for n in counts]
    monkeypatch.setattr(lock_use, "timed_round", timed_round)
    monkeypatch.setattr(untimed_growth, "untimed_round", untimed_round)
    scenarios = tuple(Scenario(f"{n}vm", tuple(VmConfig(f"vm{i}", "mmul", (128,))
                                              for i in range(n))) for n in (1, 2, 4))
    monkeypatch.setattr("gpuvm.vmm.kvm.kvm_usable", lambda: (True, "here"))
    exp = Experiment("sc", "scaling", scenarios, modes=("fv-opt", "pv"), lock_rounds=True)
    rounds = run_traces.rounds_beside_runs(exp, "kvm", lambda line: None)
    for rep in range(lock_use.GROWTH_REPS + 1):  # before each round of runs
        rounds.before_rep(rep)
    rounds.after()
    counts = (1,) * lock_use.BASE_RUNS + (2,) * (lock_use.BASE_RUNS - 1) + (2, 4)
    assert asked == [(("fv-opt", "pv"), counts, rep) for rep in range(lock_use.GROWTH_REPS)]
    assert asked_untimed == asked  # the same counts untimed, round by round ...
    assert set(untimed_benchmarks) == {("mmul", (128,))}  # ... of the runs' own benchmark
    assert len(rounds.uses) == len(rounds.untimed) == lock_use.GROWTH_REPS * len(counts)
    assert rounds.among == lock_use.GROWTH_REPS  # every one before a round of runs
    # one round of runs (or a resumed run: none) leaves the rest to after the runs
    asked.clear()
    one = run_traces.rounds_beside_runs(exp, "kvm", lambda line: None)
    one.before_rep(0)
    one.after()
    assert [rep for *_, rep in asked] == [0] * lock_use.GROWTH_REPS and one.among == 1
    # asked for none, VMs in processes of their own, or in-process guests: none
    assert run_traces.rounds_beside_runs(replace(exp, lock_rounds=False), "kvm", print) is None
    assert run_traces.rounds_beside_runs(replace(exp, isolated=True), "kvm", print) is None
    assert run_traces.rounds_beside_runs(exp, "inproc", print) is None
    # VMs of more than one benchmark: the untimed runs run the timed rounds' own
    mixed = replace(exp, scenarios=exp.scenarios + (
        Scenario("8vm", tuple(VmConfig(f"vm{i}", "idle", ()) for i in range(8))),))
    assert run_traces.runs_benchmark(exp) == ("mmul", (128,))
    assert run_traces.runs_benchmark(mixed) is None


def test_the_scaling_section_says_what_the_vms_waited_for_the_mediators_lock():
    from gpuvm.experiment.paper import ScalePoint, _measured_waits
    eight = {"fv": ScalePoint("fv", 8, 900.0, 1000.0, 1.0, 2.0, wall_mediator_wait_ms=250.0),
             "pv": ScalePoint("pv", 8, 90.0, 100.0, 1.0, 2.0, wall_mediator_wait_ms=5.0)}
    text = _measured_waits(eight)
    assert "250.0 ms (fv, 25% of the makespan)" in text
    assert "5.0 ms (pv, 5% of the makespan)" in text
    # runs from before the waits were counted say nothing of them
    assert _measured_waits({m: ScalePoint(m, 8, 1.0, 1.0, 1.0, 1.0) for m in ("fv", "pv")}) == ""


def test_the_validation_says_when_the_locks_rounds_were_made():
    """Among the runs' rounds, partly after them (a run of one repetition), or all after
    them (a resumed run, or runs from before)."""
    from gpuvm.calibrate.lock_use import GROWTH_REPS
    from gpuvm.experiment.paper import _when_rounds
    assert _when_rounds(GROWTH_REPS) == f"before each of the first {GROWTH_REPS} rounds of runs"
    assert _when_rounds(1) == "before the first round of runs and after the runs"
    assert _when_rounds(0) == "after the runs"


def test_the_validation_shows_each_points_runs_and_names_the_widest_spread():
    """The table carries each point's runs and how far its slowest lay from its fastest,
    and the text names the point whose runs lay furthest apart -- this run's, not a
    number from another host."""
    from types import SimpleNamespace

    import pytest

    from gpuvm.experiment.paper import _validation_table, _widest, run_spans
    measured = [SimpleNamespace(mode="fv", vms=2, rep=rep, makespan_ns=ms * 1_000_000)
                for rep, ms in enumerate((4_935, 4_543, 4_519))]
    measured += [SimpleNamespace(mode="pv", vms=1, rep=rep, makespan_ns=ms * 1_000_000)
                 for rep, ms in enumerate((23, 37))]
    spans = run_spans(measured)
    fv = spans[("fv", 2)]
    assert (fv.runs, fv.fastest_ms, fv.slowest_ms) == (3, 4_519.0, 4_935.0)
    # odd runs (4,543) against even ones (the fastest of 4,935 and 4,519)
    assert fv.odd_vs_even_pct == pytest.approx(100 * (4_543 / 4_519 - 1))
    assert spans[("pv", 1)].odd_vs_even_pct == pytest.approx(100 * (37 / 23 - 1))
    assert _widest(spans) == ", and here the runs of pv at 1 VM took 23.0-37.0 ms, " \
                             "the widest spread"
    assert _widest({k: s for k, s in spans.items() if k[0] == "fv"}).endswith(
        "fv at 2 VMs took 4,519.0-4,935.0 ms, the widest spread")
    one = run_spans(measured[:1])
    assert _widest(one) == "" and one[("fv", 2)].odd_vs_even_pct is None
    point = SimpleNamespace(mode="fv", vms=2, measured_ms=4_519.0, predicted_ms=5_145.5,
                            error_pct=13.9)
    table = _validation_table("how", [point], spans)
    assert "| fv | 2 | 4,519.0 | 5,145.5 | +13.9 | 3 | 1.09x | +0.5 |" in table
    assert all(line.count("|") == 9 for line in table if line.startswith("|"))
    assert "points within 10%.  The emulator against itself (the fastest of each " \
           "point's odd runs against the fastest of its even ones): 1/2 points within " \
           "10%, mean |difference| 30.7%.  Of the model's 1 miss, 0 lie where the " \
           "emulator misses itself by over 10% too." in table[-2]
    # a validation without its runs (from the committed profile) keeps the five columns
    assert "| fv | 2 | 4,519.0 | 5,145.5 | +13.9 |" in _validation_table("how", [point])
    assert "against itself" not in _validation_table("how", [point])[-2]
    assert "miss" not in _validation_table("how", [point])[-2]


def test_the_validation_says_which_misses_lie_where_the_emulator_misses_itself():
    """A model miss at a point whose odd and even runs are themselves over the goal
    apart is counted and named; a miss at a steady point is counted only; a point
    within the goal is no miss, however unsteady."""
    from types import SimpleNamespace

    from gpuvm.experiment.paper import RunSpan, _misses_in_noise

    def point(mode: str, vms: int, error_pct: float) -> SimpleNamespace:
        return SimpleNamespace(mode=mode, vms=vms, error_pct=error_pct)

    spans = {("fv", 1): RunSpan(3, 2_000.0, 2_400.0, -11.1),
             ("fv", 2): RunSpan(3, 4_000.0, 4_100.0, +2.0),
             ("pv", 4): RunSpan(12, 80.0, 120.0, -13.2),
             ("pv", 8): RunSpan(1, 170.0, 170.0, None)}
    points = [point("fv", 1, +11.7), point("fv", 2, -16.6), point("pv", 4, +3.0),
              point("pv", 8, +20.0)]
    assert _misses_in_noise(points, spans) == (
        "Of the model's 3 misses, 1 lies where the emulator misses itself by over 10% "
        "too (fv at 1 VM).")
    spans[("fv", 2)] = RunSpan(3, 4_000.0, 4_600.0, -12.0)
    assert _misses_in_noise(points, spans).endswith(
        "3 misses, 2 lie where the emulator misses itself by over 10% too (fv at 1 VM, "
        "fv at 2 VMs).")
    assert _misses_in_noise([point("fv", 1, +9.9)], spans) == ""
    assert _misses_in_noise(points, {("pv", 8): spans[("pv", 8)]}) == ""
