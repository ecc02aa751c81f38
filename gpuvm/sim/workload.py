"""What a simulated VM does: kernels of some length, think time between them, a start
and stop time, a share, and how many submissions it keeps outstanding.

A VM is a closed loop, like a CUDA program that launches and synchronises: it submits
a kernel, and once fewer than `depth` of its submissions are outstanding it thinks for
a while and submits the next.  depth=1 is launch-then-sync; a larger depth models
asynchronous launches that keep the VM's queue non-empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from scheduler.params import MS, US

DistKind = Literal["fixed", "uniform", "exponential"]
_UNIT_NS = {"ns": 1, "us": US, "ms": MS, "s": 1_000_000_000}


@dataclass(frozen=True)
class Dist:
    """A distribution of durations in ns: fixed(a), uniform[a, b], exponential(mean a)."""

    kind: DistKind
    a: int
    b: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "exponential"):
            raise ValueError(f"kind: unknown distribution {self.kind!r} "
                             "(known: fixed, uniform, exponential)")
        if self.a < 0 or self.b < 0:
            raise ValueError(f"{self.kind}: durations must be >= 0, got {self.a}, {self.b}")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"uniform: high {self.b} below low {self.a}")

    @classmethod
    def fixed(cls, ns: int) -> Dist:
        return cls("fixed", ns)

    @classmethod
    def uniform(cls, low: int, high: int) -> Dist:
        return cls("uniform", low, high)

    @classmethod
    def exponential(cls, mean: int) -> Dist:
        return cls("exponential", mean)

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else float(self.a)

    def sample(self, rng: np.random.Generator) -> int:
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return int(rng.integers(self.a, self.b, endpoint=True))
        return int(round(rng.exponential(self.a))) if self.a else 0

    @classmethod
    def from_dict(cls, field_name: str, config: Mapping[str, Any]) -> Dist:
        """{"fixed": 1, "unit": "ms"} | {"uniform": [10, 30], "unit": "ms"} |
        {"exponential": 200, "unit": "us"}; unit defaults to ns."""
        unit = config.get("unit", "ns")
        if unit not in _UNIT_NS:
            raise ValueError(f"{field_name}.unit: unknown unit {unit!r} (ns, us, ms, s)")
        kinds = [k for k in config if k != "unit"]
        if len(kinds) != 1 or kinds[0] not in ("fixed", "uniform", "exponential"):
            raise ValueError(f"{field_name}: give exactly one of fixed, uniform, exponential")
        kind, value = kinds[0], config[kinds[0]]
        scale = _UNIT_NS[unit]
        try:
            if kind == "uniform":
                low, high = value
                return cls(kind, round(low * scale), round(high * scale))
            return cls(kind, round(value * scale))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{field_name}: {exc}") from None


@dataclass(frozen=True)
class WorkloadSpec:
    """One simulated VM."""

    name: str
    kernel: Dist
    think: Dist = Dist.fixed(0)
    start_ns: int = 0
    stop_ns: int | None = None  # stops submitting at this time; None: runs to the end
    share: float = 1.0
    depth: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: a VM needs a name")
        if not self.share > 0:
            raise ValueError(f"share: vm {self.name!r} needs a share > 0, got {self.share}")
        if self.depth < 1:
            raise ValueError(f"depth: vm {self.name!r} needs depth >= 1, got {self.depth}")
        if self.kernel.kind == "fixed" and self.kernel.a == 0:
            raise ValueError(f"kernel: vm {self.name!r} has zero-length kernels")
        if self.start_ns < 0 or (self.stop_ns is not None and self.stop_ns <= self.start_ns):
            raise ValueError(f"start_ns/stop_ns: vm {self.name!r} has an empty active time")

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> WorkloadSpec:
        """{"name": "A", "kernel": {...}, "think": {...}, "start_s": 2, "share": 1,
        "depth": 1, "stop_s": 10}"""
        known = {"name", "kernel", "think", "start_ns", "start_ms", "start_s",
                 "stop_ns", "stop_ms", "stop_s", "share", "depth"}
        for key in config:
            if key not in known:
                raise ValueError(f"{key}: unknown workload field (known: {', '.join(sorted(known))})")
        name = str(config.get("name", ""))
        if "kernel" not in config:
            raise ValueError(f"kernel: vm {name!r} needs a kernel length distribution")
        return cls(
            name=name,
            kernel=Dist.from_dict("kernel", config["kernel"]),
            think=Dist.from_dict("think", config.get("think", {"fixed": 0})),
            start_ns=_time(config, "start", 0),
            stop_ns=_time(config, "stop", None),
            share=float(config.get("share", 1.0)),
            depth=int(config.get("depth", 1)),
        )


def _time(config: Mapping[str, Any], base: str, default: int | None) -> int | None:
    for suffix, scale in (("_ns", 1), ("_ms", MS), ("_s", 1_000_000_000)):
        if base + suffix in config:
            return round(config[base + suffix] * scale)
    return default
