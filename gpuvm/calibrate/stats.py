"""Median and spread of repeated measurements, and how many repetitions to take.

Kept free of the VMM and the model: `calibrate --gpu` imports it on a host without them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_REPS = 5  # fewer gives a spread that says little
# `calibrate --emulator`: a mode whose repetitions took less than this together gets more
# of them, up to MAX_REPS_FACTOR times the repetitions asked for (validation.measure)
SHORT_MODE_S = 20.0
MAX_REPS_FACTOR = 4
# and within each repetition, where a run is short, its trace and its runs are each the
# fastest of a few: as many as fit RUN_SAMPLES_S, at most MAX_RUN_SAMPLES.
# 6 s gave fv (~2.5 s a run with its set-up) two of each: with 2 s it got one, and one run
# on the lent machine (20261126-173135) recorded both repetitions' fv traces 1.26-1.35x
# slower than the plain run after them -- the guest's own time in KVM_RUN too, so the
# core, not the recorder (the cores sampled meanwhile ran slow as often either way).
# With two, the fastest trace over the fastest plain run still ranged 0.84-1.36 per
# repetition over eleven runs (fv: 0.87-1.35), where eight pairs of `gpuvm bench
# recording` put recording at 1.05x: 12 s gives fv four of each
RUN_SAMPLES_S = 12.0
MAX_RUN_SAMPLES = 6
# the 2-VM runs, which the host cores and the lock's hand-off are fitted on (so every
# 4- and 8-VM prediction leans on them), get this many times the budget: fv's (~4 s
# each) got two in 12 s, and one slow patch covering both on a lent machine
# (20261128-063933: 4.40 s against 3.82 / 3.74 s in the two sittings after it) fitted
# the hand-off at 11.7 us against 7.0 / 6.4 and moved fv and fv-opt at 4 and 8 VMs by
# 11-19%.  With 3x fv took six (+17 s a sitting); on three fresh lent machines
# (2026-11-28, 08:04-08:26) the fastest of six came 3-9% under the fastest of the first
# two, the hand-off fitted 0.7-1.7 us lower, and 25 of 36 points came within 10%
# against 24 with the first two alone (mean |error| 7.8% against 8.0%): a small gain,
# and no sitting had every point within 10% either way.  The 4- and 8-VM points, predicted
# from those, get the same budget, so that both sides of the comparison are the fastest
# of about as many runs: with 12 s fv at 4 VMs (8-9 s a run) kept its one run, and on
# the three lent sittings where it first had the budget (2026-11-28, 12:15-12:42, two
# machines) its fastest of 3, 4 and 3 came 3, 9 and 4% under its first, moving its error
# from -13.2 / -10.0 / -8.1% to -10.6 / -1.0 / -4.4% (on this 2-core host the first of 2
# was the fastest); fv-opt at 8 VMs (~4 s a run) went from 2-3 runs to 5-6, its fastest
# among the first ones each time (+30-35 s a sitting)
FIT_SAMPLES_FACTOR = 3


def repeats(rep: int, reps: int, spent_s: float, short_mode_s: float = SHORT_MODE_S) -> bool:
    """Whether a mode whose repetitions so far took `spent_s` gets repetition `rep`
    (0-based) when `reps` were asked for."""
    return rep < reps or (spent_s < short_mode_s and rep < reps * MAX_REPS_FACTOR)


def run_samples(one_run_s: float, budget_s: float = RUN_SAMPLES_S) -> int:
    """How many runs of one kind (one VM's trace recordings and plain runs; N VMs' runs)
    a repetition takes when one such run, set-up included, took `one_run_s`: at least
    one, and one each with no budget."""
    if budget_s <= 0:
        return 1
    if one_run_s <= 0:
        return MAX_RUN_SAMPLES
    return max(1, min(MAX_RUN_SAMPLES, int(budget_s / one_run_s)))


@dataclass(frozen=True)
class Spread:
    """A measured quantity over n repetitions: median, and the min-max range."""

    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples: list[float]) -> "Spread":
        if not samples:
            raise ValueError("no samples")
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def scaled(self, factor: float) -> "Spread":
        """The same spread in other units (factor > 0 keeps min below max)."""
        return Spread(self.median * factor, self.min * factor, self.max * factor, self.n)

    def inverted(self, numerator: float) -> "Spread":
        """numerator / x for each statistic: time spread -> rate spread (min and max swap)."""
        return Spread(numerator / self.median, numerator / self.max, numerator / self.min,
                      self.n)

    def text(self, digits: int = 2) -> str:
        return f"{self.median:.{digits}f} [{self.min:.{digits}f}–{self.max:.{digits}f}]"
