"""What one VM got from the engine: exact counts, GPU time, queueing delay, and its busy
intervals, from which utilisation over any window or time grid is computed afterwards.

Keeping the intervals (two ints per submission) rather than pre-sampled utilisation
lets a report choose its window and resolution later, and makes the averages exact
instead of an average of samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class VmMetrics:
    """Per-VM record kept by the Dispatcher; times in ns."""

    added_at: int
    removed_at: int | None = None
    submitted: int = 0
    dispatches: int = 0
    completions: int = 0
    gpu_time_ns: int = 0
    queue_delay_sum_ns: int = 0
    queue_delay_max_ns: int = 0
    busy: list[tuple[int, int]] = field(default_factory=list)  # [start, end) on the engine

    @property
    def mean_queue_delay_ns(self) -> float:
        return self.queue_delay_sum_ns / self.dispatches if self.dispatches else 0.0

    def record_dispatch(self, queued_at: int, now: int) -> None:
        delay = now - queued_at
        self.dispatches += 1
        self.queue_delay_sum_ns += delay
        self.queue_delay_max_ns = max(self.queue_delay_max_ns, delay)

    def record_completion(self, start: int, end: int) -> None:
        self.completions += 1
        self.gpu_time_ns += end - start
        if end > start:
            self.busy.append((start, end))

    def gpu_time_between(self, t0: int, t1: int) -> int:
        """Engine time of this VM inside [t0, t1], exactly."""
        return int(self._cumulative(np.array([t1]))[0] - self._cumulative(np.array([t0]))[0])

    def utilisation_between(self, t0: int, t1: int) -> float:
        """GPU time / elapsed over [t0, t1] (the whole interval, not the VM's life)."""
        return self.gpu_time_between(t0, t1) / (t1 - t0) if t1 > t0 else 0.0

    def utilisation_series(self, times: np.ndarray, window: int) -> np.ndarray:
        """Sliding-window utilisation at each time: GPU time in [t - window, t] over the
        window, or over the VM's life if it is younger than the window (as BAND measures
        it); 0 before the VM existed."""
        t = np.asarray(times, dtype=np.int64)
        low = np.maximum(t - window, self.added_at)
        elapsed = t - low
        busy = self._cumulative(t) - self._cumulative(low)
        with np.errstate(divide="ignore", invalid="ignore"):
            util = np.where(elapsed > 0, busy / np.maximum(elapsed, 1), 0.0)
        return np.clip(util, 0.0, 1.0)

    def _cumulative(self, t: np.ndarray) -> np.ndarray:
        """Total busy time before each t (intervals are disjoint and in time order)."""
        if not self.busy:
            return np.zeros(len(t), dtype=np.int64)
        spans = np.asarray(self.busy, dtype=np.int64)
        starts, ends = spans[:, 0], spans[:, 1]
        done = np.concatenate(([0], np.cumsum(ends - starts)))
        idx = np.searchsorted(ends, t, side="right")  # intervals finished by t
        partial = np.zeros(len(t), dtype=np.int64)
        inside = idx < len(starts)
        j = idx[inside]
        partial[inside] = np.clip(t[inside] - starts[j], 0, ends[j] - starts[j])
        return done[idx] + partial
