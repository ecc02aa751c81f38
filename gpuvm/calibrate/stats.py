"""Median and spread of repeated measurements.

Kept free of the VMM and the model: `calibrate --gpu` imports it on a host without them."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_REPS = 5  # fewer gives a spread that says little


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
