"""`gpuvm calibrate --emulator --more-of DIR`: more repetitions of a bundle, taken on the
machine (and boot) that measured it, numbered after its own and written with its runs as
a new bundle; DIR itself is left as it was.  Real guests run (pv, 1 and 2 VMs, one run
each: a few seconds)."""

from __future__ import annotations

import json
import os
import re
import shutil
from functools import partial
from pathlib import Path

import pytest

from gpuvm import cli
from gpuvm.calibrate import command, lock_use, untimed_growth, validation
from gpuvm.calibrate.lock_rounds import LockRounds
from gpuvm.vmm.kvm import kvm_usable

DATA = Path(__file__).parent / "data"


def calibrate(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(["calibrate", "--emulator", *argv])
    except SystemExit as exc:
        rc = int(exc.code)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def one_rep(tmp_path, monkeypatch) -> Path:
    """A bundle of pv at 1 and 2 VMs of the scaling file's benchmark, one repetition, one
    run per point, measured here; later measurements in the test take one run each too."""
    monkeypatch.setattr(validation, "measure", partial(
        validation.measure, short_mode_s=0, run_samples_s=0, trace_cache=tmp_path / "cache"))
    measured = validation.measure("mmul", (128,), ["pv"], (1, 2), reps=1)
    about = {"command": "gpuvm calibrate --emulator --modes pv", "benchmark": "mmul [128]",
             "isolated": False, "cpus": os.cpu_count(), "host": validation.this_host()}
    one_vm = [(m.mode, m.trace) for m in measured if m.vms == 1]
    return validation.save(tmp_path / "first", measured, one_vm, about)


def _set_host(bundle: Path, host: dict | None) -> None:
    path = bundle / validation.BUNDLE_RUNS
    data = json.loads(path.read_text())
    data["about"].pop("host", None)
    if host is not None:
        data["about"]["host"] = host
    path.write_text(json.dumps(data))


def test_more_repetitions_go_into_a_new_bundle_beside_the_first(one_rep, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setattr(lock_use, "GROWTH_REPS", 1)  # one real round is enough here
    runs_before = (one_rep / validation.BUNDLE_RUNS).read_bytes()
    rc, out, err = calibrate(capsys, "--more-of", str(one_rep), "--trace-reps", "1",
                             "--profile-out", str(tmp_path / "profile.toml"))
    assert rc == 0, err
    written = Path(re.search(r"measurements and points written to (\S+) ", out).group(1))
    try:
        assert written != one_rep
        measured, fits, about = validation.load(written)
        assert sorted({(m.vms, m.rep) for m in measured}) == [(1, 0), (1, 1), (2, 0), (2, 1)]
        assert len(fits) == 1  # the first bundle's traces for the fit, kept
        assert about["command"].endswith(f"--more-of {one_rep} --trace-reps 1")
        assert [m["command"] for m in about["more"]] == \
            [f"gpuvm calibrate --emulator --more-of {one_rep} --trace-reps 1"]
        assert about["host"] == validation.this_host()
        # the new repetition has its own trace, recorded just before its runs
        new = [m for m in measured if m.rep == 1]
        assert all(m.trace is not fits[0][1] for m in new)
        assert (written / "points.json").exists()
        if kvm_usable()[0]:  # VMs as threads: the sitting timed its own lock round
            assert {u["rep"] for u in about["lock_use"]} == {1}
        assert (one_rep / validation.BUNDLE_RUNS).read_bytes() == runs_before
        assert not (one_rep / "points.json").exists()
    finally:
        shutil.rmtree(written)


@pytest.mark.parametrize("host, says", [
    ({"name": "elsewhere", "boot": "b"}, "measured on elsewhere, not on this one"),
    (None, "measured on a machine it does not name"),
    ({"name": validation.this_host()["name"], "boot": "an earlier one"},
     "before its last boot"),
])
def test_more_of_a_bundle_from_another_machine_is_refused(one_rep, capsys, host, says):
    """A lent machine given back and started again is another machine: the first
    repetitions and the new ones would not be measurements of one thing."""
    _set_host(one_rep, host)
    rc, out, err = calibrate(capsys, "--more-of", str(one_rep))
    assert rc != 0 and out == ""
    (line,) = err.strip().splitlines()
    assert str(one_rep) in line and says in line


def test_more_of_with_modes_of_its_own_or_a_bundle_to_analyse_is_refused(one_rep, capsys):
    """One line each: the modes are the bundle's, --from analyses instead of measuring,
    and a bundle that is not there is named."""
    rc, out, err = calibrate(capsys, "--more-of", str(one_rep), "--modes", "pv")
    assert rc != 0 and out == "" and "leave out --modes" in err
    bundle = DATA / "validation-h100"
    rc, _, err = calibrate(capsys, "--more-of", str(bundle), "--from", str(bundle))
    assert rc != 0 and "give one of them" in err
    rc, _, err = calibrate(capsys, "--more-of", "/nonexistent/bundle")
    assert rc != 0 and "/nonexistent/bundle" in err and len(err.strip().splitlines()) == 1


def test_repetitions_are_numbered_from_the_first_asked(tmp_path):
    before: list[int] = []
    measured = validation.measure("mmul", (16,), ["pv"], (1,), reps=1, short_mode_s=0,
                                  run_samples_s=0, trace_cache=tmp_path,
                                  before_rep=before.append, first_rep=3)
    assert before == [3] and [m.rep for m in measured] == [3]


@pytest.mark.parametrize("first_rep", [0, 3])
def test_each_sitting_times_the_lock_before_its_own_first_repetitions(monkeypatch,
                                                                     first_rep):
    """A `--more-of` sitting's repetitions go on from its bundle's last; its lock rounds
    are timed before the first GROWTH_REPS of them all the same (more rounds pooled
    price the growth better), their rows labelled with the repetition they came before,
    and none is added after a sitting that had them all."""
    timed = _fake_rounds(monkeypatch)
    rounds = LockRounds(False, ["fv", "pv"], [1, 2, 4], lambda line: None,
                                 first_rep)
    last = first_rep + lock_use.GROWTH_REPS + 1
    for rep in range(first_rep, last + 1):
        rounds.before_rep(rep)
    rounds.after()
    reps = list(range(first_rep, first_rep + lock_use.GROWTH_REPS))
    assert sorted({u.rep for u in rounds.uses}) == reps
    assert timed == [(lock_use.GROWTH_BENCHMARK, 1),
                     (lock_use.PV_GROWTH_BENCHMARK, lock_use.PV_GROWTH_ROUNDS)] * len(reps)
    # each round runs the same VMs untimed, fv's and pv's, at its distinct counts
    assert sorted({run.rep for run in rounds.untimed}) == reps
    assert timed.untimed == [(mode, tuple(untimed_growth.round_counts(
        [1, 2, 4], untimed_growth.UNTIMED_RUNS[mode])), rep)
        for rep in reps for mode in ("fv", "pv")]


def test_a_sitting_of_one_repetition_times_its_other_rounds_after_it(monkeypatch):
    """One repetition leaves GROWTH_REPS - 1 rounds untimed before it: they come after
    its runs, labelled with it -- a growth from one round alone priced one 2-VM fv-opt
    run of 37.5 us per exit (against 28.0) as 1.53x."""
    timed = _fake_rounds(monkeypatch)
    rounds = LockRounds(False, ["fv"], [1, 2], lambda line: None, 5)
    rounds.before_rep(5)
    rounds.after()
    assert len(timed) == lock_use.GROWTH_REPS
    assert {u.rep for u in rounds.uses} == {5}
    isolated = LockRounds(True, ["fv"], [1, 2], lambda line: None)
    isolated.before_rep(0)
    isolated.after()  # VMs in processes of their own share no lock: nothing timed
    assert len(timed) == lock_use.GROWTH_REPS and not isolated.uses
    assert len(timed.untimed) == lock_use.GROWTH_REPS and not isolated.untimed
    assert set(timed.untimed_benchmarks) == {None}  # calibrate's: the timed rounds' own
    # a scaling run's rounds run its own benchmark untimed
    own = LockRounds(False, ["fv"], [1, 2], lambda line: None,
                     untimed_benchmark=("mmul", (128,)))
    own.before_rep(0)
    assert timed.untimed_benchmarks[-1] == ("mmul", (128,))


class _Asked(list):
    """What the rounds were asked to time, with what they were asked to run untimed."""

    untimed: list[tuple[str, tuple[int, ...], int]]
    untimed_benchmarks: list[tuple[str, tuple[int, ...]] | None]


def _fake_rounds(monkeypatch) -> _Asked:
    """lock_use.measure and untimed_growth.measure replaced by ones that note what they
    were asked to run (the rounds' scheduling is under test, not KVM), KVM taken as
    usable."""
    monkeypatch.setattr("gpuvm.vmm.kvm.kvm_usable", lambda: (True, "here"))
    timed = _Asked()
    timed.untimed = []
    timed.untimed_benchmarks = []

    def measure(benchmark, params, modes, counts, reps, progress=None, sample_every=1):
        timed.append((benchmark, reps))
        return [lock_use.LockUse(m, n, 0, 1, 1, 1, 0, 0, 0, benchmark,
                                 sample_every=sample_every)
                for m in modes for n in counts]

    def measure_untimed(mode, counts, rep, progress=None, benchmark=None):
        timed.untimed.append((mode, tuple(counts), rep))
        timed.untimed_benchmarks.append(benchmark)
        return [untimed_growth.UntimedRun(mode, n, rep, "idle", 1, 1, 0, 0) for n in counts]

    monkeypatch.setattr(lock_use, "measure", measure)
    monkeypatch.setattr(untimed_growth, "measure", measure_untimed)
    return timed


def test_every_run_of_a_repetition_is_kept_beside_its_fastest(tmp_path):
    """A point kept as the fastest of several runs keeps them all: how far a point's runs
    differ inside a sitting, and points compared at equal run counts, need them."""
    measured = validation.measure("mmul", (16,), ["pv"], (1, 2), reps=1, short_mode_s=0,
                                  run_samples_s=60, trace_cache=tmp_path)
    assert any(m.samples > 1 for m in measured)  # short runs: several each
    for m in measured:
        if m.samples == 1:
            assert m.runs_ns == ()
        else:
            assert len(m.runs_ns) == m.samples and min(m.runs_ns) == m.makespan_ns
