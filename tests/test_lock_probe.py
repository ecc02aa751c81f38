"""Python threads taking turns at the interpreter lock without KVM, and the model's lock
on the same loops (gpuvm.calibrate.lock_probe, `gpuvm calibrate --lock-probe`)."""

from __future__ import annotations

import json

import pytest

from gpuvm import cli
from gpuvm.calibrate import lock_probe
from gpuvm.calibrate.lock_probe import GIL_FREE_MIN_BYTES, ProbeRun, Stretches

US = 1_000


def test_a_free_stretch_is_long_enough_for_hashlib_to_let_the_lock_go():
    """Shorter than CPython's 2,048 bytes, the hash would run holding the lock."""
    stretches = Stretches(free_bytes_per_us=100.0, held_objects_per_us=10.0)
    assert stretches.free_bytes(1.0) == GIL_FREE_MIN_BYTES
    assert stretches.free_bytes(40.0) == 4_000
    assert stretches.free_bytes(100.0) == 10_000
    assert stretches.held_objects(12.0) == 120


def test_the_stretches_are_sized_on_this_host():
    stretches = lock_probe.size_stretches()
    assert stretches.free_bytes_per_us > 0 and stretches.held_objects_per_us > 0


def test_one_modelled_thread_loops_its_two_stretches_back_to_back():
    alone = lock_probe.modelled(ProbeRun(1, 28.0, 12.0, 0.0, 0.0), cores=2,
                                handoff_ns=17 * US)
    assert alone.loop_ns == 40 * US and alone.sleeps_per_loop == 0


def test_modelled_threads_that_never_wait_run_at_one_threads_pace_and_cores_bound_more():
    """Two threads on two cores whose free stretch outlasts the held one find the lock
    held once, as they start together, and never again: the one woken then lands a
    hand-off after the other's drop and stays that far out of step.  (With no hand-off
    at all they stay exactly in step, one arriving at the instant the other drops, and
    the model's tie goes to the arrival: a sleep a loop.)  Four share the two cores: at
    least twice as long a loop."""
    two = lock_probe.modelled(ProbeRun(2, 28.0, 12.0, 0.0, 0.0), cores=2, handoff_ns=US,
                              loops=1000)
    # the second thread ends a held stretch and a landing after the first
    assert two.loop_ns == pytest.approx(40 * US, abs=(12 + 2) * US / 1000)
    assert two.sleeps_per_loop <= 1 / 1000
    four = lock_probe.modelled(ProbeRun(4, 28.0, 12.0, 0.0, 0.0), cores=2, handoff_ns=US)
    assert four.loop_ns >= 80 * US


def test_modelled_threads_whose_turns_overlap_take_the_lock_back_from_the_woken():
    """A free stretch shorter than the held one: with no hand-off the lock passes a
    thread at a time, every take a sleep, and a loop is both threads' held stretches.
    With a hand-off longer than the free stretch the thread that let the lock go is back
    before the woken one lands and takes it again (CPython lets it): the woken one
    sleeps again and again, and the threads' loops run nearly one after the other --
    a loop is about both threads' whole loops.  The waker's signal lengthens them."""
    run = ProbeRun(2, 4.0, 12.0, 0.0, 0.0)
    cheap = lock_probe.modelled(run, cores=2, handoff_ns=0)
    dear = lock_probe.modelled(run, cores=2, handoff_ns=10 * US)
    assert cheap.sleeps_per_loop > 0.9
    assert cheap.loop_ns == pytest.approx(2 * 12 * US, rel=0.01)
    assert 0.6 < dear.sleeps_per_loop < 0.9
    assert dear.loop_ns == pytest.approx(2 * (12 + 4) * US, rel=0.02)
    signalled = lock_probe.modelled(run, cores=2, handoff_ns=10 * US, signal_ns=2 * US)
    assert signalled.loop_ns > dear.loop_ns + US


def test_real_threads_take_turns_and_the_fastest_round_is_kept():
    stretches = lock_probe.size_stretches()
    runs = lock_probe.measure(threads=(2, 1), free_us=(20.0,), held_us=5.0, loops=200,
                              rounds=2, stretches=stretches)
    assert [(r.threads, r.free_us) for r in runs] == [(2, 20.0), (1, 20.0)]
    for run in runs:
        assert run.loop_ns > 0 and run.sleeps_per_loop >= 0, run
    with pytest.raises(ValueError):
        lock_probe.measure(rounds=0)
    with pytest.raises(ValueError):
        lock_probe.run_probe(0, 20.0, 5.0, stretches)


def test_the_command_prints_probe_and_model_side_by_side(capsys):
    rc = cli.main(["calibrate", "--lock-probe", "--threads", "2", "--free-us", "20,28",
                   "--held-us", "5", "--loops", "200", "--handoff-us", "0",
                   "--signal-us", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["handoff_ns"] == 0 and out["signal_ns"] == 0
    assert [(r["probe"]["threads"], r["probe"]["free_us"]) for r in out["runs"]] == \
        [(2, 20.0), (2, 28.0)]
    # with no hand-off to pay and the free stretch the longer, the model's two threads
    # wait only as they start together: a loop is its two stretches
    assert [r["model"]["loop_ns"] for r in out["runs"]] == \
        [pytest.approx(25 * US, rel=1e-3), pytest.approx(33 * US, rel=1e-3)]
    rc = cli.main(["calibrate", "--lock-probe", "--threads", "2", "--free-us", "20",
                   "--held-us", "5", "--loops", "200"])
    table = capsys.readouterr().out
    assert rc == 0 and "model error %" in table and "the model's hand-off" in table
    assert "signal" in table
    assert "waking a sleeping thread costs the thread that wakes it" in table


def test_the_command_keeps_what_a_wake_up_cost_the_waker(capsys):
    rc = cli.main(["calibrate", "--lock-probe", "--threads", "2", "--free-us", "20",
                   "--held-us", "5", "--loops", "50", "--handoff-us", "0", "--json"])
    woken = json.loads(capsys.readouterr().out)["wake_cost"]
    assert rc == 0 and woken["samples"] > 0
    assert woken["waking_ns"] > woken["plain_ns"] > 0


@pytest.mark.parametrize("argv, culprit", [
    (["--free-us", "0"], "--free-us"),
    (["--free-us", "4,x"], "--free-us"),
    (["--threads", "0"], "--threads"),
    (["--held-us", "0"], "--held-us"),
    (["--handoff-us", "-1"], "--handoff-us"),
    (["--signal-us", "-1"], "--signal-us"),
])
def test_bad_probe_arguments_are_one_line(capsys, argv, culprit):
    rc = cli.main(["calibrate", "--lock-probe", *argv])
    err = capsys.readouterr().err
    assert rc != 0 and culprit in err and len(err.strip().splitlines()) == 1, err
