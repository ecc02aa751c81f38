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
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Sequence

from gpuvm.calibrate.emulator import GOAL_ERROR_PCT, ValidationPoint
from gpuvm.calibrate.halves import HalfPoint


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
    return BundleAnalysis(analysis.points, analysis.halves)


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
