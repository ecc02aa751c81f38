"""Workload specs and scenarios: sampling, config parsing, and the errors they raise."""

import numpy as np
import pytest

from gpuvm.sim import Dist, Scenario, WorkloadSpec
from gpuvm.sim.__main__ import main

MS = 1_000_000


def test_distributions_sample_in_range_and_reproducibly():
    rng = np.random.default_rng(3)
    draws = [Dist.uniform(10, 20).sample(rng) for _ in range(200)]
    assert min(draws) >= 10 and max(draws) <= 20 and len(set(draws)) > 5
    again = np.random.default_rng(3)
    assert draws == [Dist.uniform(10, 20).sample(again) for _ in range(200)]
    assert Dist.fixed(5).sample(rng) == 5
    mean = np.mean([Dist.exponential(1000).sample(rng) for _ in range(4000)])
    assert 900 < mean < 1100


def test_workload_from_dict():
    spec = WorkloadSpec.from_dict({"name": "B", "kernel": {"uniform": [10, 30], "unit": "ms"},
                                   "think": {"fixed": 100, "unit": "us"}, "start_s": 2,
                                   "share": 2, "depth": 2})
    assert spec.kernel == Dist.uniform(10 * MS, 30 * MS)
    assert spec.think == Dist.fixed(100_000)
    assert (spec.start_ns, spec.share, spec.depth) == (2000 * MS, 2.0, 2)


@pytest.mark.parametrize("config, field", [
    ({"name": "A"}, "kernel"),
    ({"name": "A", "kernel": {"fixed": 1}, "colour": "red"}, "colour"),
    ({"name": "A", "kernel": {"gauss": 1}}, "kernel"),
    ({"name": "A", "kernel": {"fixed": 1, "unit": "h"}}, "kernel.unit"),
    ({"name": "A", "kernel": {"uniform": [3, 1]}}, "uniform"),
    ({"name": "A", "kernel": {"fixed": 1}, "share": 0}, "share"),
    ({"name": "A", "kernel": {"fixed": 1}, "depth": 0}, "depth"),
    ({"name": "A", "kernel": {"fixed": 0}}, "kernel"),
])
def test_bad_workloads_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        WorkloadSpec.from_dict(config)


def test_scenario_checks():
    a = WorkloadSpec("A", Dist.fixed(MS))
    with pytest.raises(ValueError, match="repeats"):
        Scenario("dup", (a, a), 10 * MS)
    late = WorkloadSpec("B", Dist.fixed(MS), start_ns=20 * MS)
    with pytest.raises(ValueError, match="measure window"):
        Scenario("never together", (a, late), 10 * MS)


def test_cli_writes_a_figure(tmp_path, capsys):
    assert main(["--scenario", "isolation-2vm", "--policy", "band", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "isolation-2vm.png").exists()
    assert "A-short" in capsys.readouterr().out
