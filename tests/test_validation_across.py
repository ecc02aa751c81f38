"""Several validation bundles side by side (gpuvm.calibrate.across): each point's error in
each bundle, their mean and spread, and how often every point met the goal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpuvm.calibrate import across
from gpuvm.calibrate.emulator import ValidationPoint

# fv-opt and pv, 8 points, analysed in ~10 s
BUNDLE = Path(__file__).parent / "data" / "validation-h100-exits"


def _point(mode: str, vms: int, error_pct: float) -> ValidationPoint:
    return ValidationPoint(mode, vms, 100.0, 100.0 + error_pct)


def test_points_line_up_by_mode_and_vm_count_across_bundles():
    first = [_point("pv", 2, -4.0), _point("fv", 8, -12.0)]
    second = [_point("fv", 8, -6.0), _point("pv", 2, 2.0), _point("pv", 8, 30.0)]
    rows = {(p.mode, p.vms): p for p in across.across([first, second])}
    assert list(rows) == [("fv", 8), ("pv", 2), ("pv", 8)]
    assert rows[("fv", 8)].errors_pct == pytest.approx((-12.0, -6.0))
    assert rows[("fv", 8)].mean_pct == pytest.approx(-9.0)
    assert rows[("fv", 8)].sd_pct == pytest.approx(4.2426, abs=1e-3)
    assert rows[("fv", 8)].within == 1
    # a point one bundle lacks is left out of its statistics, not counted as 0
    assert rows[("pv", 8)].errors_pct == (None, pytest.approx(30.0))
    assert rows[("pv", 8)].mean_pct == pytest.approx(30.0)
    assert rows[("pv", 8)].sd_pct == 0.0
    assert rows[("pv", 8)].within == 0


def test_a_bundle_meets_the_goal_only_with_every_point_within_it():
    good = [_point("pv", 1, 9.9), _point("pv", 2, -10.0)]
    bad = [_point("pv", 1, 1.0), _point("pv", 2, -10.5)]
    scores = across.scores([Path("a"), Path("b")], [good, bad])
    assert [(s.within, s.points, s.all_within) for s in scores] == [(2, 2, True),
                                                                     (1, 2, False)]
    assert scores[1].mean_abs_pct == pytest.approx(5.75)


def test_points_fall_in_bands_by_how_slow_the_cores_ran_during_their_run():
    first = across.BundleAnalysis(
        [_point("pv", 1, 2.0), _point("pv", 2, -12.0), _point("fv", 8, 30.0)], [],
        {("pv", 1): 0.05, ("pv", 2): 0.25, ("fv", 8): 0.72})
    second = across.BundleAnalysis([_point("pv", 1, -4.0), _point("pv", 2, 8.0)], [],
                                   {("pv", 1): 0.4})  # pv 2: not sampled, left out
    bands = across.by_slow_share([first, second])
    assert [(b.label, b.points, b.within) for b in bands] == [
        ("under 20%", 1, 1), ("20-40%", 1, 0), ("40% or more", 2, 1)]
    assert bands[2].mean_abs_pct == pytest.approx(17.0)
    assert "40% or more: 2 points, 1 within 10%, mean |error| 17.0%" in \
        across.slow_text(bands)
    # bundles whose cores were not sampled say nothing
    unsampled = across.BundleAnalysis([_point("pv", 1, 2.0)], [])
    assert across.by_slow_share([unsampled]) == [] and across.slow_text([]) == ""


def test_the_same_measurements_twice_give_the_same_errors(tmp_path, gpuvm_cli):
    copy = tmp_path / "copy"
    shutil.copytree(BUNDLE, copy)
    rc, out, err = gpuvm_cli("calibrate", "--emulator", "--from", str(BUNDLE), str(copy),
                             "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert [b["directory"] for b in report["bundles"]] == [str(BUNDLE), str(copy)]
    assert len(report["points"]) == 8
    for p in report["points"]:
        first, second = p["errors_pct"]
        assert first == pytest.approx(second)  # the analysis is deterministic
        assert p["sd_pct"] == pytest.approx(0.0)
        assert p["within"] in (0, 2)
    # the emulator against itself: the same in both copies, and in the summary
    assert report["bundles"][0]["halves"] == report["bundles"][1]["halves"]
    assert report["halves"]["halves"] == 2 * 2  # two bundles of two repetitions
    assert report["by_slow_share"] == []  # a bundle from before the core probes
    # and each is the error `--from DIR` reports for that bundle alone
    alone = {(p.mode, p.vms): p.error_pct for p in across.bundle_analysis(BUNDLE).points}
    assert {(p["mode"], p["vms"]): p["errors_pct"][0] for p in report["points"]} \
        == pytest.approx(alone)


def test_an_unreadable_bundle_is_one_error_line_before_any_analysis(tmp_path, gpuvm_cli):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "runs.json").write_text("{not json")
    rc, out, err = gpuvm_cli("calibrate", "--emulator", "--from", str(BUNDLE), str(broken))
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(broken) in lines[0]


def test_a_profile_is_written_from_one_bundle_only(tmp_path, gpuvm_cli):
    rc, _, err = gpuvm_cli("calibrate", "--emulator", "--from", str(BUNDLE), str(BUNDLE),
                           "--profile-out", str(tmp_path / "p.toml"))
    assert rc != 0 and "--profile-out" in err
    assert not (tmp_path / "p.toml").exists()
