"""The emulator against itself (gpuvm.calibrate.halves): each half of a point's
repetitions predicted by the other half's fastest run, and by the model from the other
half's fastest trace -- so a miss can be told the model's or the measurement's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvm.calibrate import halves, validation

BUNDLE = Path(__file__).parent / "data" / "validation-h100-exits"  # fv-opt, pv; 2 reps


@dataclass(frozen=True)
class Rep:
    mode: str
    vms: int
    rep: int
    makespan_ns: int
    trace: Mapping = field(default_factory=dict)


def _trace_ns(trace: Mapping) -> int:
    return trace["ns"]


def test_each_half_is_predicted_by_the_other_halfs_fastest_run_and_trace():
    traces = {r: {"ns": ns} for r, ns in enumerate((50, 40, 45, 60))}
    runs = [Rep("pv", 2, r, span, traces[r]) for r, span in enumerate((100, 130, 90, 120))]
    chosen = {p.reference: p for p in halves.picks(runs, _trace_ns)}
    # even reps 0, 2 (fastest 90), odd 1, 3 (fastest 120)
    assert (chosen[0].reference_ns, chosen[0].other_ns) == (90, 120)
    assert (chosen[1].reference_ns, chosen[1].other_ns) == (120, 90)
    # the replay is the other half's run with the fastest trace, not the fastest run
    assert chosen[0].replay.rep == 1 and chosen[1].replay.rep == 2
    model = {1: 99, 2: 132}  # the model's makespan of each replayed repetition
    pts = {p.reference: p for p in halves.points(list(chosen.values()),
                                                 lambda m: model[m.rep])}
    assert pts[0].other_pct == pytest.approx(100 * (120 / 90 - 1))
    assert pts[0].model_pct == pytest.approx(10.0)
    assert pts[1].model_pct == pytest.approx(10.0)


def test_a_point_run_in_one_half_only_is_not_compared():
    runs = [Rep("fv", 8, 0, 100, {"ns": 1}), Rep("pv", 1, 0, 10, {"ns": 1}),
            Rep("pv", 1, 1, 11, {"ns": 1})]
    assert {(p.mode, p.vms) for p in halves.picks(runs, _trace_ns)} == {("pv", 1)}
    assert halves.picks(runs[:1], _trace_ns) == []
    assert "no halves" in halves.summary([[]])


def test_a_half_meets_the_goal_only_with_every_point_within_it():
    def point(vms: int, reference: int, other: float, model: float) -> halves.HalfPoint:
        return halves.HalfPoint("pv", vms, reference, other, model)
    bundle = [point(1, 0, 9.0, 1.0), point(2, 0, -10.5, 2.0),
              point(1, 1, -8.3, 10.0), point(2, 1, 11.7, -3.0)]
    s = halves.score([bundle])
    assert (s.halves, s.other_all_within, s.model_all_within) == (2, 0, 2)
    assert (s.points, s.other_within, s.model_within) == (4, 2, 4)
    # a half lacking one of its bundle's points is not counted as a whole half
    assert halves.score([bundle[:3]]).halves == 1
    line = halves.summary([bundle])
    assert "2/4 points within 10%" in line and "in 0 of 2 halves" in line


@given(st.lists(st.integers(1, 10**9), min_size=2, max_size=12))
def test_the_two_halves_disagree_by_one_ratio_seen_from_either_side(spans):
    runs = [Rep("fv", 4, r, s, {"ns": s}) for r, s in enumerate(spans)]
    a, b = halves.points(halves.picks(runs, _trace_ns), lambda m: m.makespan_ns)
    assert (1 + a.other_pct / 100) * (1 + b.other_pct / 100) == pytest.approx(1.0)


def test_a_bundles_halves_are_the_same_with_or_without_the_spread():
    """With the spread the replays are every repetition's, reused; without it only the
    halves' own are made: the same numbers either way, the model's a replay of a trace
    the other half recorded."""
    measured, fits, about = validation.load(BUNDLE)
    measured = [m for m in measured if m.mode == "pv"]  # seconds, not tens of them
    fits = [f for f in fits if f[0] == "pv"]
    full = validation.analyse(measured, fits, about["cpus"])
    lean = validation.analyse(measured, fits, about["cpus"], with_spread=False)
    assert lean.halves == full.halves
    assert {(h.mode, h.vms) for h in full.halves} == {(p.mode, p.vms) for p in full.points}
    assert len(full.halves) == 2 * len(full.points)  # two repetitions: one each half
    spread = {(s.mode, s.vms): s for s in full.spread}
    for h in full.halves:
        # two repetitions: the other half is one repetition, its model error the spread's
        other = 1 - h.reference
        assert h.model_pct == pytest.approx(
            (1 + spread[(h.mode, h.vms)].rep_errors_pct[other] / 100)
            * (1 + h.other_pct / 100) * 100 - 100)
    assert validation.analyse(measured, fits, about["cpus"], with_spread=False,
                              with_halves=False).halves == []


def test_calibrate_prints_each_point_against_itself_and_the_model(capsys):
    """One bundle: each half's own numbers beside the counts; several: the counts."""
    from rich.console import Console

    from gpuvm.calibrate.command import print_halves
    bundle = [halves.HalfPoint("pv", 4, 0, 12.0, -3.0), halves.HalfPoint("pv", 4, 1, -10.7, 4.0)]
    print_halves(Console(width=200), [bundle])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "pv" in line and "│" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == \
        ["pv", "4", "+12 -11", "0/2", "11.3", "-3 +4", "2/2", "3.5"]
    assert "the model from the other half's trace: 2/2" in out
    print_halves(Console(width=200), [bundle, bundle])
    assert "+12 -11" not in capsys.readouterr().out
