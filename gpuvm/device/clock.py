"""The device clock: engine time paced against wall time.

Engines occupy themselves for the time the profile models; the clock says when that time
has passed.  `time_scale` > 1 runs device time faster than wall time (tests, scaled-down
experiments) without changing any count or any modelled duration.
"""

from __future__ import annotations

import time


class DeviceClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._t0 = time.perf_counter_ns()

    def now_ns(self) -> int:
        return int((time.perf_counter_ns() - self._t0) * self.time_scale)

    def wall_seconds_until(self, device_ns: int) -> float:
        """How long to sleep (wall seconds) until the device clock reaches device_ns."""
        return max(0.0, (device_ns - self.now_ns()) / self.time_scale / 1e9)
