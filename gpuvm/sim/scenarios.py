"""The scheduling scenarios of the paper's isolation experiments, as simulated VMs.

Gdev's isolation experiment (ATC'12, reused by GPUvm) pits Rodinia LUD — many short
kernels with small host-side gaps — against HeartWall — long kernels — on two vGPUs.
The numbers here are stand-ins of that shape, not measurements: ~1 ms kernels with
20–100 µs gaps (a launch + synchronise round trip; shorter than BAND's 500 µs wait)
against 10–30 ms kernels starting 2 s later.  The gap matters: the engine idles during
the short-kernel VM's own gaps, and BAND charges nobody for that, so that VM ends up
below its share by about share × gap / (kernel + gap).  The 4-VM scenario staggers VMs of mixed kernel lengths
so each arrival visibly re-divides the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.sim.workload import Dist, WorkloadSpec
from scheduler.params import MS, US

S = 1000 * MS


@dataclass(frozen=True)
class Scenario:
    """VMs plus how long to run; averages are taken while every VM is active."""

    name: str
    vms: tuple[WorkloadSpec, ...]
    duration_ns: int
    # averaging window; None: from the last VM's start / to the end (or first stop)
    measure_from_ns: int | None = None
    measure_to_ns: int | None = None

    def __post_init__(self) -> None:
        if not self.vms:
            raise ValueError(f"vms: scenario {self.name!r} has no VMs")
        names = [vm.name for vm in self.vms]
        if len(set(names)) != len(names):
            raise ValueError(f"vms: scenario {self.name!r} repeats a VM name")
        if self.duration_ns <= 0:
            raise ValueError(f"duration_ns: must be > 0, got {self.duration_ns}")
        t0, t1 = self.measure_window
        if not t0 < t1:
            raise ValueError(f"measure window: scenario {self.name!r} has no time with "
                             f"every VM active ({t0} .. {t1})")

    @property
    def measure_window(self) -> tuple[int, int]:
        t0 = self.measure_from_ns
        if t0 is None:
            t0 = max(vm.start_ns for vm in self.vms)
        t1 = self.measure_to_ns
        if t1 is None:
            stops = [vm.stop_ns for vm in self.vms if vm.stop_ns is not None]
            t1 = min([self.duration_ns, *stops])
        return t0, t1

    def nominal_shares(self) -> dict[str, float]:
        """Each VM's share normalised over all VMs (all are active in the window)."""
        total = sum(vm.share for vm in self.vms)
        return {vm.name: vm.share / total for vm in self.vms}


def short_bursty(name: str, start_ns: int = 0, share: float = 1.0) -> WorkloadSpec:
    """LUD-like: ~1 ms kernels, 20–100 µs between a completion and the next launch."""
    return WorkloadSpec(name, kernel=Dist.uniform(800 * US, 1200 * US),
                        think=Dist.uniform(20 * US, 100 * US), start_ns=start_ns, share=share)


def long_kernels(name: str, start_ns: int = 0, share: float = 1.0,
                 low: int = 10 * MS, high: int = 30 * MS) -> WorkloadSpec:
    """HeartWall-like: 10–30 ms kernels, launched again shortly after each completes."""
    return WorkloadSpec(name, kernel=Dist.uniform(low, high),
                        think=Dist.uniform(50 * US, 150 * US), start_ns=start_ns, share=share)


def isolation_2vm(shares: tuple[float, float] = (1.0, 1.0), duration_ns: int = 12 * S,
                  long_start_ns: int = 2 * S) -> Scenario:
    """Short bursty kernels (A) against long kernels (B) arriving later."""
    a, b = shares
    name = "isolation-2vm" if a == b else f"isolation-2vm-{a:g}to{b:g}"
    return Scenario(name, (short_bursty("A-short", 0, a),
                           long_kernels("B-long", long_start_ns, b)), duration_ns)


def staggered_4vm(duration_ns: int = 16 * S, gap_ns: int = 2 * S) -> Scenario:
    """Four VMs joining one every `gap_ns`: short, long, medium, short."""
    vms = (
        short_bursty("VM1-short", 0),
        long_kernels("VM2-long", gap_ns),
        WorkloadSpec("VM3-medium", kernel=Dist.uniform(3 * MS, 7 * MS),
                     think=Dist.uniform(100 * US, 400 * US), start_ns=2 * gap_ns),
        long_kernels("VM4-long", 3 * gap_ns, low=20 * MS, high=40 * MS),
    )
    return Scenario("staggered-4vm", vms, duration_ns)


SCENARIOS = {
    "isolation-2vm": isolation_2vm,
    "weighted-2vm": lambda: isolation_2vm(shares=(2.0, 1.0)),
    "staggered-4vm": staggered_4vm,
}
