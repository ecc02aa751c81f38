"""Timing for the benchmarks: the best of several runs (host noise only adds time), and
how a spread of ratios is written."""

from __future__ import annotations

import time
from typing import Callable


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Seconds of the fastest of `repeat` calls of fn."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def span(xs: list[float], fmt: str) -> str:
    """`lowest-highest` of xs in format `fmt` (one value when they print the same)."""
    lo, hi = min(xs), max(xs)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"
