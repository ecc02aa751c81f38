"""`gpuvm bench recording`: one VM plain vs recorded, by turns (gpuvm.bench.recording)."""

from __future__ import annotations

import pytest

from gpuvm.bench.recording import Pair, summary


def test_the_cost_per_event_is_each_pairs_own_difference():
    pairs = [Pair(plain_ns=1_000_000, traced_ns=1_100_000, events=50),  # +2 us
             Pair(plain_ns=2_000_000, traced_ns=1_900_000, events=50),  # -2 us
             Pair(plain_ns=1_000_000, traced_ns=1_200_000, events=50)]  # +4 us
    us, low, high, ratio = summary(pairs)
    assert (us, low, high) == pytest.approx((2.0, -2.0, 4.0))
    assert ratio == pytest.approx(1.1)


def test_bench_recording_runs_pairs_and_prints_a_row_per_mode(gpuvm_cli):
    rc, out, err = gpuvm_cli("bench", "recording", "--modes", "pv", "--pairs", "2")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("pv"))
    cells = [c.strip() for c in row.strip("│").split("│")]
    assert int(cells[1].replace(",", "")) > 0  # the trace's events
    assert float(cells[2].replace(",", "")) > 0 and float(cells[3].replace(",", "")) > 0
    assert err.count("pair") == 2


def test_an_unknown_mode_is_one_error_line(gpuvm_cli):
    rc, out, err = gpuvm_cli("bench", "recording", "--modes", "pv,warp")
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and "'warp'" in err
