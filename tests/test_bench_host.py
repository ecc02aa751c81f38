"""`gpuvm bench host`: a host whose cores change speed shows it."""

from __future__ import annotations

import os

import pytest

from gpuvm import cli
from gpuvm.bench import host


def test_steadiness_counts_slow_runs_and_their_longest_streak():
    s = host.steadiness([10.0, 16.0, 15.5, 10.2, 16.5, 9.8, 12.0])
    assert (s.fastest_ms, s.slowest_ms, s.median_ms) == (9.8, 16.5, 12.0)
    assert (s.slow, s.longest_slow_streak) == (3, 2)  # 12.0 is under 1.25 x 9.8
    assert s.spread == pytest.approx(16.5 / 9.8)
    steady = host.steadiness([10.0, 10.5, 11.0])
    assert (steady.slow, steady.longest_slow_streak) == (0, 0)
    # a core's runs against the fastest of all cores
    assert host.steadiness([13.0, 13.1], fastest_ms=10.0).slow == 2
    with pytest.raises(ValueError):
        host.steadiness([])


def test_measure_pins_each_run_in_turn_and_restores_the_affinity():
    before = os.sched_getaffinity(0)
    cpus = sorted(before)[:2]
    runs = host.measure(4, 1000, cpus)
    assert [r.cpu for r in runs] == [cpus[i % len(cpus)] for i in range(4)]
    assert all(r.ms > 0 for r in runs) and runs == sorted(runs, key=lambda r: r.at_s)
    assert os.sched_getaffinity(0) == before


def test_the_bench_prints_a_row_per_core(capsys):
    cpu = sorted(os.sched_getaffinity(0))[0]
    assert cli.main(["bench", "host", "--runs", "4", "--work", "1000",
                     "--cpus", f"{cpu},{cpu}"]) == 0
    out = capsys.readouterr().out
    assert "pinned, all" in out and f"core {cpu}" in out and "slowest/fastest" in out


def test_bad_arguments_get_one_line(capsys):
    assert cli.main(["bench", "host", "--cpus", "x"]) == 2
    assert cli.main(["bench", "host", "--cpus", "100000"]) == 2
    assert cli.main(["bench", "host", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all("bench host" in line for line in err), err
