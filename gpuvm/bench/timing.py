"""Timing for the micro-benchmarks: the best of several runs (host noise only adds time)."""

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
