"""Scheduler parameters, with the defaults Gdev and GPUvm shipped.

All times are integer nanoseconds so the same numbers mean the same thing on the
emulator's device clock and in simpy.  Configs may spell a time with a unit suffix
(`period_ms = 30`, `band_wait_us = 500`); the suffix is folded into ns here, once.

Where each default comes from (see shared/reference/gpuvm.md, "Scheduling"):
- period_ns = 30 ms: Gdev `GDEV_PERIOD_DEFAULT 30000 /* microseconds */`
  (common/gdev_sched.h); the credit thread replenishes every period.
- credit_bound_ns = period: Gdev `GDEV_CREDIT_INACTIVE_THRESHOLD GDEV_PERIOD_DEFAULT`.
  Gdev *resets* a credit beyond ±threshold to 0; GPUvm's reading (gpuvm.md) and this
  code *clamp* it to ±bound, so a VM never loses earned credit or sheds debt by
  overshooting.
- band_wait_ns = 500 µs: Gdev `__gdev_vsched_band_yield_chance` and GPUvm's a3
  `yield_chance(500us)`.  (GPUvm's first BAND used 50 µs.)
- util_window_ns = 1 s: Gdev `GDEV_UPDATE_INTERVAL 1000000` (µs): utilisation is GPU
  time / elapsed, restarted every second.  Here the window slides instead of restarting,
  so the estimate never drops to a noisy near-empty window.
- util_sample_ns = 0 (measure at every decision): Gdev recomputed utilisation once per
  period (30 ms) in its credit thread and GPUvm's a3 sampled every 500 ms, because a
  kernel thread's timer was the only place to do it.  A stale sample lets a long-kernel
  VM that has just reached its share be dispatched again for up to a sample's length;
  in the 2-VM isolation model it overshoots by about 3 pp with 30 ms sampling and
  under 1 pp measured exactly.  Set util_sample_ms = 30 to reproduce Gdev.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

MS = 1_000_000
US = 1_000

# config suffix -> ns multiplier; "" is the plain field name, already in ns
_UNITS: dict[str, int] = {"_ns": 1, "_us": US, "_ms": MS, "_s": 1_000_000_000}


@dataclass(frozen=True)
class SchedulerParams:
    """Tunables of the policies (FIFO ignores them; QUANTUM uses only quantum_*)."""

    period_ns: int = 30 * MS
    credit_bound_ns: int | None = None  # None: same as period_ns
    band_wait_ns: int = 500 * US
    util_window_ns: int = 1000 * MS
    util_sample_ns: int = 0  # 0: measured afresh at every decision
    quantum_ns: int = 30_000 * MS  # QUANTUM: exclusive use per turn (nvshare's 30 s)
    quantum_idle_ns: int = 500 * US  # QUANTUM: idle this long with others waiting: let go

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "credit_bound_ns":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{f.name}: must be an integer number of ns, got {value!r}")
            minimum = 0 if f.name in ("band_wait_ns", "util_sample_ns", "quantum_idle_ns") \
                else 1
            if value < minimum:
                raise ValueError(f"{f.name}: must be >= {minimum}, got {value}")

    @property
    def credit_bound(self) -> int:
        return self.period_ns if self.credit_bound_ns is None else self.credit_bound_ns

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> SchedulerParams:
        """Build from a config table; keys are field names, optionally with a unit suffix
        in place of `_ns` (`period_ms`, `band_wait_us`, `util_window_s`)."""
        known = {f.name.removesuffix("_ns") for f in fields(cls)}
        values: dict[str, int] = {}
        for key, raw in config.items():
            base, scale = _split_unit(key)
            if base not in known:
                raise ValueError(f"{key}: unknown scheduler parameter "
                                 f"(known: {', '.join(sorted(k + '_ns' for k in known))})")
            name = base + "_ns"
            if name in values:
                raise ValueError(f"{key}: {name} given twice")
            values[name] = _to_ns(key, raw, scale)
        return cls(**values)


def _split_unit(key: str) -> tuple[str, int]:
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if key.endswith(suffix):
            return key[: -len(suffix)], _UNITS[suffix]
    return key, 1


def _to_ns(key: str, raw: Any, scale: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"{key}: must be a number, got {raw!r}")
    return round(raw * scale)  # sub-ns fractions of a config value are noise
