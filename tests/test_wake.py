"""How long a woken thread takes to run again, by how long it slept (gpuvm.calibrate.wake),
and what the cost profile and the model make of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuvm.calibrate import emulator
from gpuvm.calibrate.wake import WakeCurve, measure, measure_on_exits
from gpuvm.experiment.costs import load_costs
from gpuvm.vmm.backends import kvm_usable

CURVE = dict(wake_slept_ns=(1_000.0, 3_000.0), wake_latency_ns=(10.0, 30.0))
KVM_OK, KVM_WHY = kvm_usable()


def test_the_wake_up_latency_is_measured_for_every_sleep():
    """A real measurement (a sleeping process woken through a pipe), a few samples: one
    latency per sleep asked, in ascending sleeps, each a positive time short of the
    sleep's order of magnitude plus a second (a wake-up lost would hang or be huge)."""
    curve = measure(slept_us=(400, 5), samples=5)
    assert curve.slept_ns == (5_000, 400_000)
    assert len(curve.latency_ns) == 2
    assert all(0 < ns < 1_000_000_000 for ns in curve.latency_ns), curve


@pytest.mark.kvm
@pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)
def test_a_vms_exits_are_timed_after_each_sleep():
    """A real fv-opt VM whose vCPU thread is put to sleep after every KVM_RUN: a
    wake-up latency and an exit's work per sleep, each positive and short of a second
    -- the ~7,400 exits take turns over the sleeps, so every sleep has hundreds."""
    curve = measure_on_exits("mmul", (128,), "fv-opt", slept_us=(300, 5))
    assert curve is not None
    assert curve.slept_ns == (5_000, 300_000)
    assert len(curve.latency_ns) == len(curve.work_ns) == 2
    assert all(0 < ns < 1_000_000_000 for ns in curve.latency_ns + curve.work_ns), curve


def test_without_kvm_run_there_is_nothing_to_sleep_after():
    """The in-process backend has no KVM_RUN: no curve (calibrate then measures on a
    pipe alone)."""
    assert measure_on_exits("mmul", (32,), "fv-opt", slept_us=(5,), backend="inproc") is None


def test_a_bundle_keeps_the_curve_and_an_older_one_has_none():
    curve = WakeCurve((5_000, 200_000), (8_000, 17_000))
    assert WakeCurve.from_about({"wake": curve.to_about()}) == curve
    assert WakeCurve.from_about({"cpus": 16}) is None
    with pytest.raises(ValueError, match="wake curve"):
        WakeCurve.from_about({"wake": {"slept_ns": [5_000]}})
    with pytest.raises(ValueError, match="wake curve"):
        WakeCurve.from_about({"wake": {"slept_ns": [5_000], "latency_ns": [1, 2]}})
    assert curve.text() == "5 us: 8.0, 200 us: 17.0"
    worked = WakeCurve((5_000, 200_000), (8_000, 17_000), (30_000, 36_500))
    assert WakeCurve.from_about({"wake": worked.to_about()}) == worked
    assert worked.text() == "5 us: 8.0 + 30.0, 200 us: 17.0 + 36.5"
    with pytest.raises(ValueError, match="exit's work per sleep"):
        WakeCurve.from_about({"wake": worked.to_about() | {"work_ns": [1]}})
    profile = worked.priced_in(load_costs("emulator"))
    assert profile.wake_extra_ns(200_000) == 9_000 + 6_500


def test_the_profile_charges_what_waking_took_beyond_the_shortest_sleep():
    """Linear between the measured sleeps, nothing below the first, flat past the last;
    without a curve nothing at all."""
    profile = replace(load_costs("emulator"), **CURVE)
    assert [profile.wake_extra_ns(ns) for ns in (0, 1_000, 2_000, 3_000, 9_000)] == \
        [0.0, 0.0, 10.0, 20.0, 20.0]
    assert load_costs("emulator").wake_extra_ns(1e9) == 0.0
    worked = replace(profile, wake_work_ns=(100.0, 105.0))  # the exit after it, too
    assert [worked.wake_extra_ns(ns) for ns in (1_000, 2_000, 9_000)] == [0.0, 12.5, 25.0]
    with pytest.raises(ValueError, match="wake_work_ns and wake_slept_ns"):
        replace(profile, wake_work_ns=(1.0,))


def test_the_curve_survives_the_profile_file_and_a_broken_one_is_named(tmp_path):
    profile = replace(load_costs("emulator"), **CURVE)
    path = tmp_path / "measured.toml"
    path.write_text(emulator.to_toml(profile, "gpuvm calibrate --emulator"))
    again = load_costs(str(path))
    assert (again.wake_slept_ns, again.wake_latency_ns, again.wake_work_ns) == \
        (CURVE["wake_slept_ns"], CURVE["wake_latency_ns"], ())
    worked = replace(profile, wake_work_ns=(100.0, 105.0))
    path.write_text(emulator.to_toml(worked, "gpuvm calibrate --emulator"))
    assert load_costs(str(path)).wake_work_ns == (100.0, 105.0)
    path.write_text(emulator.to_toml(profile, "gpuvm calibrate --emulator"))
    path.write_text(path.read_text().replace("wake_latency_ns = [10, 30]",
                                             "wake_latency_ns = [10]"))
    with pytest.raises(ValueError, match=r"measured\.toml: wake_slept_ns and wake_latency_ns"):
        load_costs(str(path))
