"""Modelled time: exact counts times a cost profile, plus the device's engine time.

Emulation costs differ from the paper's hardware (a Python trap is ~20 us, not ~1 us), so
wall time alone cannot be compared with the paper's ratios.  The counts are exact, so
pricing them with a stated profile (experiments/costs/*.toml) gives times that can; the
profile says what it assumes.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from gpuvm.device import regs

COSTS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "costs"


@dataclass(frozen=True)
class CostProfile:
    name: str
    mmio_native_ns: float
    aperture_native_ns: float
    trap_ns: float
    hypercall_ns: float
    hcall_entry_ns: float
    pt_alloc_ns: float
    pte_scanned_ns: float
    shadow_sync_ns: float
    remap_ns: float
    # Optional keys (a profile without them prices those events at 0 / keeps the default):
    # the mediator's own part of trap_ns, done under its lock (the model of the whole
    # system serialises it; gpuvm.sim.replay)
    trap_mediator_ns: float = 0.0
    # one 64-bit word of a new PV page directory or table zeroed by the hypervisor: the
    # PV path allocates whole tables, and zeroing them is what the native driver does
    # itself with BAR stores (pt_zero_words), so both pay for it
    pt_zero_word_ns: float = 0.0
    # one byte of a pageable copy staged through the runtime's pinned bounce buffer
    # (a guest memcpy; counted as copy.bounce_bytes)
    bounce_byte_ns: float = 0.0
    # host cores the model of the whole system gives the VMs (gpuvm.sim.replay)
    host_cores: float = 8.0
    # a port I/O exit (phase marks, waits): nearly free on the paper's platform, not on
    # this emulator (gpuvm calibrate --emulator)
    io_exit_ns: float = 0.0

    @staticmethod
    def pv_zero_words(counters: dict[str, int]) -> int:
        """Words the hypervisor zeroes for PV: a directory per SET_PGD, a small table per
        table it allocates (shadow.pv_space zeroes both whole)."""
        return (counters.get("hcall.set_pgd", 0) * regs.PDE_COUNT
                + counters.get("pv.pts_allocated", 0) * regs.SMALL_PTES_PER_PT)

    def mediator_ns(self, counters: dict[str, int], mediated: bool) -> float:
        """The part of modelled_ns the mediator spends under its one lock: shadow syncs
        and the entries they scan (GPUvm: "page shadowing locks GPU resources") and its
        share of every trap.  PV work (validating hypercall entries, allocating and
        zeroing tables) is per VM and runs on the VM's own hypercall path."""
        if not mediated:
            return 0.0
        traps = sum(v for k, v in counters.items() if k.startswith("exits.mmio."))
        return (traps * self.trap_mediator_ns
                + counters.get("shadow.ptes_scanned", 0) * self.pte_scanned_ns
                + (counters.get("shadow.syncs", 0) + counters.get("shadow.bar_syncs", 0))
                * self.shadow_sync_ns)

    def modelled_ns(self, counters: dict[str, int], mediated: bool) -> float:
        """Engine time plus every counted event at its price.

        In native mode an MMIO exit stands for a bare-metal access (an uncached register
        read/write on BAR0, a posted store through BAR1/BAR3); in a mediated mode it is a
        trap (remapped accesses never exit, so cost nothing here)."""
        bar0 = sum(v for k, v in counters.items() if k.startswith("exits.mmio.bar0."))
        aperture = sum(v for k, v in counters.items() if k.startswith("exits.mmio.")) - bar0
        mmio = (bar0 + aperture) * self.trap_ns if mediated else \
            bar0 * self.mmio_native_ns + aperture * self.aperture_native_ns
        return (counters.get("engine.busy_ns", 0) + mmio
                + counters.get("pv.pts_allocated", 0) * self.pt_alloc_ns
                + self.pv_zero_words(counters) * self.pt_zero_word_ns
                + counters.get("copy.bounce_bytes", 0) * self.bounce_byte_ns
                + counters.get("exits.io", 0) * self.io_exit_ns
                + counters.get("hcall.calls", 0) * self.hypercall_ns
                + counters.get("hcall.entries", 0) * self.hcall_entry_ns
                + counters.get("shadow.ptes_scanned", 0) * self.pte_scanned_ns
                + (counters.get("shadow.syncs", 0) + counters.get("shadow.bar_syncs", 0))
                * self.shadow_sync_ns
                + (counters.get("remap.maps", 0) + counters.get("remap.unmaps", 0)) * self.remap_ns)


def load_costs(name_or_path: str) -> CostProfile:
    path = Path(name_or_path)
    if not path.suffix:
        path = COSTS_DIR / f"{name_or_path}.toml"
    try:
        table = tomllib.loads(path.read_text())["costs"]
    except FileNotFoundError:
        raise ValueError(f"cost profile {name_or_path!r} not found ({path})") from None
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        raise ValueError(f"cost profile {path}: needs a [costs] table ({exc})") from None
    names = {f.name for f in fields(CostProfile)} - {"name"}
    required = {f.name for f in fields(CostProfile) if f.default is MISSING} - {"name"}
    if not required <= set(table) <= names:
        missing, extra = sorted(required - set(table)), sorted(set(table) - names)
        raise ValueError(f"cost profile {path}: "
                         + (f"missing {missing[0]!r}" if missing else f"unknown {extra[0]!r}"))
    return CostProfile(path.stem, **{k: float(v) for k, v in table.items()})
