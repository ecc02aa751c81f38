"""Exact event counters, device-wide and per channel.

Counts are the project's primary, deterministic result (modelled and wall time are
derived or measured separately), so they are plain integers kept under the device lock.
"""

from __future__ import annotations

from collections import defaultdict


class Counters:
    """The device's event counts, device-wide and per channel: the project's exact,
    deterministic result, so plain integers kept under the device lock."""

    def __init__(self) -> None:
        self.total: defaultdict[str, int] = defaultdict(int)
        self.per_channel: defaultdict[int, defaultdict[str, int]] = \
            defaultdict(lambda: defaultdict(int))

    def inc(self, name: str, n: int = 1) -> None:
        self.total[name] += n

    def chan(self, chid: int, name: str, n: int = 1) -> None:
        """Count for one channel and in the device-wide total."""
        self.total[name] += n
        self.per_channel[chid][name] += n

    def flat(self) -> dict[str, int]:
        out = dict(self.total)
        for chid, counts in self.per_channel.items():
            for name, value in counts.items():
                out[f"chan.{chid}.{name}"] = value
        return out
