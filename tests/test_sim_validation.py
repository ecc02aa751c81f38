"""The model predicts this emulator: calibrated on single-VM and 2-VM runs, it predicts
the makespan of 4 VMs it never saw within a loose bound.

The bound is loose (60%; three runs here gave -5 to -11%, one inside the full suite
went past 50%, and under a load of 6 the fit once gave traps no cost at all) because the
host is shared, which is also why it is a `timing` test, left out of the default suite:
other load moves wall times between the calibration runs and the validated ones.  It
still fails if the model loses its contention (4 VMs predicted like 1 VM: about -75%) or
the fit breaks (costs of 0, or of 10x)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from gpuvm.calibrate import emulator
from gpuvm.experiment.config import parse
from gpuvm.experiment.execute import execute
from gpuvm.experiment.rundir import RunDir

LOOSE_BOUND_PCT = 60.0

CONFIG = """
[experiment]
name = "validate"
modes = ["fv-opt", "pv"]
repetitions = 2
output = "{out}"
[[scenario]]
name = "mmul-1vm"
[[scenario.vm]]
name = "vm"
benchmark = "mmul"
params = [64]
[[scenario]]
name = "idle-1vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
[[scenario]]
name = "mmul-2vm"
[[scenario.vm]]
name = "vm"
benchmark = "mmul"
params = [64]
count = 2
[[scenario]]
name = "mmul-4vm"
[[scenario.vm]]
name = "vm"
benchmark = "mmul"
params = [64]
count = 4
"""


@pytest.mark.timing
def test_model_predicts_four_vms_from_one_and_two(tmp_path):
    exp = parse(CONFIG.format(out=tmp_path), "validate.toml")
    rows = [asdict(r) for r in execute(exp, RunDir.create(exp))]
    assert all(r["passed"] for r in rows)
    single = [r for r in rows if r["scenario"].endswith("-1vm")]
    two = [r for r in rows if r["scenario"] == "mmul-2vm"]
    profile = emulator.fit_serialised_share(
        two, emulator.profile_from(emulator.fit_event_costs(single)))
    assert profile.trap_ns > 1000  # a trap costs microseconds here, never nothing
    four = [r for r in rows if r["scenario"] == "mmul-4vm" and r["mode"] == "fv-opt"]
    (point,) = emulator.validate(four, profile)
    assert point.vms == 4
    assert abs(point.error_pct) <= LOOSE_BOUND_PCT, point
