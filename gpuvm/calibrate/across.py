"""The model's error per point over several validation bundles: how reproducible it is.

One `gpuvm calibrate --emulator` run says how far the model was off in that run.  On the
lent machines the same point came out -14% in one run and +2% in the next (fv-opt at 8
VMs, runs 20261126-172352 and -173135), so whether the model meets its goal is a
question about many runs, not one.  `gpuvm calibrate --emulator --from DIR DIR ...`
analyses each bundle exactly as `--from DIR` does (with today's code: bundles measured
before a change to the model show what the change does to them) and puts each point's
errors side by side: their mean (the model's bias there), their standard deviation
(the runs' noise), and in how many bundles the point, and every point, was within the
goal -- and beside them, how far each bundle's emulator missed itself, one half of its
repetitions against the other (gpuvm.calibrate.halves), so that a point the model
misses can be told from one the measurement cannot pin down.  The bundles are
independent, so they are analysed in worker processes where the host has the cores
(validation.in_parallel).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gpuvm.calibrate.emulator import GOAL_ERROR_PCT, ValidationPoint
from gpuvm.calibrate.halves import HalfPoint

if TYPE_CHECKING:
    from gpuvm.calibrate.validation import Measured


@dataclass(frozen=True)
class PointAcross:
    """One (mode, VMs) point's error in each bundle (None: the bundle has no such point)."""

    mode: str
    vms: int
    errors_pct: tuple[float | None, ...]

    @property
    def present(self) -> list[float]:
        return [e for e in self.errors_pct if e is not None]

    @property
    def mean_pct(self) -> float:
        return statistics.mean(self.present)

    @property
    def sd_pct(self) -> float:
        """The sample standard deviation (0 with one bundle)."""
        return statistics.stdev(self.present) if len(self.present) > 1 else 0.0

    @property
    def within(self) -> int:
        """In how many bundles the point was within the goal."""
        return sum(abs(e) <= GOAL_ERROR_PCT for e in self.present)


@dataclass(frozen=True)
class BundleScore:
    """One bundle's points against the goal."""

    directory: Path
    points: int
    within: int
    mean_abs_pct: float  # 0 for a bundle without points (it meets nothing: all_within)

    @property
    def all_within(self) -> bool:
        return self.points > 0 and self.within == self.points


@dataclass(frozen=True)
class BundleAnalysis:
    points: list[ValidationPoint]
    halves: list[HalfPoint]  # the emulator against itself (gpuvm.calibrate.halves)
    # per point, the share of the host's core samples that ran slow during its kept run
    # (validation.core_speeds; empty where the bundle's cores were not sampled)
    slow_shares: dict[tuple[str, int], float] = field(default_factory=dict)


# Where the core probes' slow share during a point's kept run falls: five sittings on
# the 2-core host (2026-11-29) put 27 of 31 points under 20% within 10% (mean |error|
# 4.3%), 12 of 19 at 20-40% (6.9%), 7 of 10 at 40% or more (10.5%)
# (docs/model-validation.md, "Sampled timing").
SLOW_BANDS = (0.2, 0.4)


@dataclass(frozen=True)
class SlowBand:
    """The points, over every bundle, whose kept run the probes saw this slow."""

    low: float  # slow share from (inclusive)
    high: float | None  # to (exclusive; None: no bound)
    points: int
    within: int
    mean_abs_pct: float  # 0 without points

    @property
    def label(self) -> str:
        if self.high is None:
            return f"{100 * self.low:.0f}% or more"
        if not self.low:
            return f"under {100 * self.high:.0f}%"
        return f"{100 * self.low:.0f}-{100 * self.high:.0f}%"


def by_slow_share(analysed: Sequence[BundleAnalysis],
                  bands: Sequence[float] = SLOW_BANDS) -> list[SlowBand]:
    """Every bundle's points, by the share of slow core samples during their kept run
    (SLOW_BANDS' edges): how many there are, how many within the goal, their mean
    |error|.  Why: a run on cores a neighbour slowed is the emulator's miss, not the
    model's, and over many bundles this says how much of the misses sit there.  Points
    whose run was not sampled are left out; empty where none was."""
    pairs = [(share, abs(p.error_pct)) for a in analysed for p in a.points
             if (share := a.slow_shares.get((p.mode, p.vms))) is not None]
    if not pairs:
        return []
    edges = [0.0, *bands, None]
    out = []
    for low, high in zip(edges, edges[1:]):
        errors = [e for share, e in pairs if share >= low and (high is None or share < high)]
        out.append(SlowBand(low, high, len(errors),
                            sum(e <= GOAL_ERROR_PCT for e in errors),
                            statistics.mean(errors) if errors else 0.0))
    return out


def slow_text(bands: Sequence[SlowBand]) -> str:
    """One line for `by_slow_share` ('' without bands)."""
    if not bands:
        return ""
    parts = [f"{b.label}: {b.points} points, {b.within} within {GOAL_ERROR_PCT:g}%"
             + (f", mean |error| {b.mean_abs_pct:.1f}%" if b.points else "")
             for b in bands]
    return ("by the share of the host's core samples that ran slow during each point's "
            "kept run: " + "; ".join(parts))


def bundle_analysis(directory: Path, in_place: bool = False) -> BundleAnalysis:
    """The kept points of one bundle and its halves, analysed as `--from DIR` analyses
    it (without the repetitions' spread, which this comparison does not show; with the
    recorder's in-place cost where `in_place`, as `--recorder-cost in-place`);
    ValueError naming the bundle where it cannot be read."""
    from gpuvm.calibrate import validation

    measured, fit_traces, about = validation.load(directory)
    try:
        aside = validation.AsideMeasures.from_about(about)
    except ValueError as exc:
        raise ValueError(f"{directory}: {exc}") from None
    analysis = aside.analyse(measured, fit_traces, about.get("cpus"), in_place=in_place,
                             with_spread=False)
    return BundleAnalysis(analysis.points, analysis.halves,
                          slow_shares(analysis.kept, directory))


def slow_shares(kept: Sequence[Measured], directory: Path) -> dict[tuple[str, int], float]:
    """Per kept run of the bundle in `directory`, the share of the host's core samples
    that ran slow during it (empty where the bundle's cores were not sampled)."""
    from gpuvm.calibrate import validation

    speeds = validation.core_speeds(kept, validation.load_cores(directory))
    return {key: speed.slow_share for key, speed in speeds.items()}


def across(per_bundle: Sequence[Sequence[ValidationPoint]]) -> list[PointAcross]:
    """Every (mode, VMs) any bundle has, with its error in each bundle, sorted."""
    keys = sorted({(p.mode, p.vms) for points in per_bundle for p in points})
    index = [{(p.mode, p.vms): p.error_pct for p in points} for points in per_bundle]
    return [PointAcross(mode, vms, tuple(errors.get((mode, vms)) for errors in index))
            for mode, vms in keys]


def scores(directories: Sequence[Path],
           per_bundle: Sequence[Sequence[ValidationPoint]]) -> list[BundleScore]:
    out = []
    for directory, points in zip(directories, per_bundle):
        errors = [abs(p.error_pct) for p in points]
        out.append(BundleScore(directory, len(errors),
                               sum(e <= GOAL_ERROR_PCT for e in errors),
                               statistics.mean(errors) if errors else 0.0))
    return out


def reanalysed(directories: Sequence[Path], in_place: bool = False
               ) -> list[BundleAnalysis]:
    """Each bundle's points and halves, in the bundles' order.  Every bundle is read
    once here first, so an unreadable one is reported (ValueError naming it) before
    any analysis starts."""
    from gpuvm.calibrate import validation

    for directory in directories:
        validation.load(directory)
    return validation.in_parallel(partial(bundle_analysis, in_place=in_place),
                                  list(directories))
