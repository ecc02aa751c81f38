"""How long the interpreter lock sits free between threads taking turns at it, by how
long they waited (gpuvm.calibrate.lock_turns), and the wake curve made from it."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from gpuvm.calibrate import lock_turns
from gpuvm.calibrate.command import print_wake
from gpuvm.calibrate.lock_turns import Turns, take_turns, through_lock
from gpuvm.calibrate.wake import WakeCurve

EXITS = WakeCurve((5_000, 100_000, 400_000), (20_000, 22_000, 30_000),
                  (25_000, 25_000, 31_000))


def test_threads_taking_turns_pass_the_lock_and_wait_for_it():
    """Real threads at the real lock: the hashing lets it go, so the others take it and
    a thread coming back waits (sleeps) -- on the lent machines before nearly every
    take, on a 2-core host less often (a thread back from hashing often finds the lock
    free); a wait is a time short of the 5 ms after which CPython makes the holder let
    go, and the lock's idle time per take short of a take's whole time."""
    for threads in (2, 4):
        turns = take_turns(threads, takes=300)
        assert turns.threads == threads
        assert 0 < turns.sleeps_per_take <= 2, turns
        assert 0 < turns.waited_ns < 50_000_000, turns
        assert 0 <= turns.idle_ns < 10_000_000, turns


def test_measure_keeps_one_round_per_count_by_the_wait():
    kept = lock_turns.measure(threads=(3, 2), takes=100, rounds=3)
    assert sorted(t.threads for t in kept) == [2, 3]
    assert [t.waited_ns for t in kept] == sorted(t.waited_ns for t in kept)


def test_one_thread_is_not_taking_turns():
    with pytest.raises(ValueError, match="2 threads"):
        take_turns(1)
    with pytest.raises(ValueError, match="round"):
        lock_turns.measure(rounds=0)


def test_the_curve_takes_the_locks_idle_time_and_the_exits_work_at_those_waits():
    """Latency: the lock's idle time per take, by the wait, in ascending waits; the
    exit's work read off the exits' curve at each wait (linear between its sleeps, flat
    beyond); a count whose takes did not nearly all sleep is left out."""
    turns = [Turns(8, 400_000, 22_000, 1.05), Turns(2, 50_000, 9_000, 1.0),
             Turns(3, 100_000, 12_000, 0.5), Turns(12, 800_000, 25_000, 1.0)]
    curve = through_lock(EXITS, turns)
    assert curve.slept_ns == (50_000, 400_000, 800_000)
    assert curve.latency_ns == (9_000, 22_000, 25_000)
    assert curve.work_ns == (25_000, 31_000, 31_000)


def test_without_a_count_to_keep_the_exits_curve_stands():
    assert through_lock(EXITS, [Turns(2, 50_000, 9_000, 0.3)]) is EXITS
    pipe_only = WakeCurve((5_000,), (20_000,))
    assert through_lock(pipe_only, [Turns(2, 50_000, 9_000, 1.0)]).work_ns == ()


def test_a_bundle_keeps_the_turns_and_says_where_its_curve_came_from(capsys):
    turns = [Turns(2, 50_000, 9_000, 1.0), Turns(3, 100_000, 12_000, 0.5)]
    about = {"wake": through_lock(EXITS, turns).to_about(),
             "lock_turns": lock_turns.to_about(turns)}
    assert [Turns.from_about(t) for t in about["lock_turns"]] == turns
    assert about["lock_turns"][0] == asdict(turns[0])
    print_wake(WakeCurve.from_about(about), about)
    out = capsys.readouterr().out
    assert "the interpreter lock, passed to a thread that waited (us), sat free (us)" in out
    assert "50 us: 9.0 + 25.0" in out
    assert "3 threads: 100 -> 12.0 (not kept)" in out
    print_wake(EXITS, {"wake": EXITS.to_about()})  # a bundle from before the turns
    assert capsys.readouterr().out.startswith("a thread woken after sleeping (us)")
