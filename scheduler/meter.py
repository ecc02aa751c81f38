"""Measured utilisation of one VM: GPU time / elapsed over a sliding window.

BAND's demotion test compares this with the VM's share.  The window slides (Gdev restarts
a 1 s window instead), and a VM that joined less than a window ago is measured over its
own lifetime, so a new VM is not diluted by time before it existed.
"""

from __future__ import annotations

from collections import deque


class SlidingWindowMeter:
    """Charged busy intervals of one VM, kept only as far back as the window reaches."""

    def __init__(self, window: int, since: int) -> None:
        if window <= 0:
            raise ValueError(f"window: must be > 0, got {window}")
        self.window = window
        self.since = since
        self._intervals: deque[tuple[int, int]] = deque()
        self._busy = 0  # total length of the kept intervals

    def add(self, start: int, end: int) -> None:
        """Charge the VM for [start, end); intervals of one VM arrive in time order."""
        if end < start:
            raise ValueError(f"interval: end {end} before start {start}")
        if end > start:
            self._intervals.append((start, end))
            self._busy += end - start

    def busy(self, now: int) -> int:
        """GPU time charged inside [now - window, now]."""
        low = now - self.window
        while self._intervals and self._intervals[0][1] <= low:
            start, end = self._intervals.popleft()
            self._busy -= end - start
        if self._intervals and self._intervals[0][0] < low:
            return self._busy - (low - self._intervals[0][0])
        return self._busy

    def utilisation(self, now: int) -> float:
        """Fraction of the window (or of the VM's life, if shorter) spent on the GPU."""
        elapsed = min(self.window, now - self.since)
        if elapsed <= 0:
            return 0.0
        return min(1.0, self.busy(now) / elapsed)
