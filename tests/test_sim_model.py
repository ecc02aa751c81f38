"""The simpy model: the isolation scenarios under each policy, determinism, outputs."""

from __future__ import annotations

import pytest

from gpuvm.sim import (Dist, Scenario, WorkloadSpec, format_summary, isolation_2vm,
                       render_utilisation, simulate, staggered_4vm)
from scheduler import SchedulerConfig

MS = 1_000_000
S = 1000 * MS

# shorter than the CLI's runs, still several seconds of contention
TWO = isolation_2vm(duration_ns=7 * S, long_start_ns=1 * S)
TWO_WEIGHTED = isolation_2vm(shares=(2.0, 1.0), duration_ns=7 * S, long_start_ns=1 * S)
FOUR = staggered_4vm(duration_ns=9 * S, gap_ns=1 * S)


def utils(result):
    return {row.vm: row.utilisation for row in result.summary()}


@pytest.mark.parametrize("scenario", [TWO, TWO_WEIGHTED, FOUR], ids=lambda s: s.name)
def test_band_holds_every_vm_within_5pp_of_its_share(scenario):
    result = simulate(scenario, "band", seed=1)
    assert result.max_error_pp() < 5.0, format_summary([result])


@pytest.mark.parametrize("policy", ["fifo", "credit"])
def test_fifo_and_credit_let_the_long_kernel_vm_take_the_gpu(policy):
    util = utils(simulate(TWO, policy, seed=1))
    assert util["B-long"] > 0.85 and util["A-short"] < 0.15


def test_fifo_misses_shares_in_the_4vm_scenario_and_band_fixes_it():
    fifo, band = (simulate(FOUR, p, seed=1).max_error_pp() for p in ("fifo", "band"))
    assert fifo > 15.0 and band < 5.0


def test_same_seed_same_counts_other_seed_other_counts():
    first = simulate(TWO, "band", seed=7).event_counts()
    assert simulate(TWO, "band", seed=7).event_counts() == first
    assert simulate(TWO, "band", seed=8).event_counts() != first
    assert first["A-short.kept_turns"] > 0 and first["B-long.dispatches"] > 0


def test_policy_params_reach_the_model():
    # without BAND's wait, the bursty VM cannot keep its turn
    no_wait = SchedulerConfig.from_dict({"policy": "band", "band_wait_us": 0})
    result = simulate(TWO, no_wait, seed=1)
    assert result.event_counts()["A-short.kept_turns"] == 0
    assert utils(result)["A-short"] < 0.4


def test_stopped_vm_leaves_and_the_rest_take_its_time():
    vms = (WorkloadSpec("A", Dist.fixed(5 * MS), Dist.fixed(10_000)),
           WorkloadSpec("B", Dist.fixed(5 * MS), Dist.fixed(10_000), stop_ns=1 * S))
    result = simulate(Scenario("leave", vms, 3 * S), "band")
    assert result.metrics["B"].removed_at is not None
    assert result.metrics["A"].utilisation_between(2 * S, 3 * S) > 0.95


def test_figure_and_table(tmp_path):
    results = [simulate(TWO, p, seed=0) for p in ("fifo", "band")]
    png = render_utilisation(results, tmp_path / "fig" / "two.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = format_summary(results)
    assert "A-short" in text and "band" in text and "fifo" in text
    times, series = results[1].utilisation_series(100 * MS, 1 * S)
    assert len(times) == 70 and set(series) == {"A-short", "B-long"}
    assert series["B-long"][5] == 0.0  # before B arrived at 1 s
