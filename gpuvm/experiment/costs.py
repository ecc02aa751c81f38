"""Modelled time: exact counts times a cost profile, plus the device's engine time.

Emulation costs differ from the paper's hardware (a Python trap is ~20 us, not ~1 us), so
wall time alone cannot be compared with the paper's ratios.  The counts are exact, so
pricing them with a stated profile (experiments/costs/*.toml) gives times that can; the
profile says what it assumes.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Mapping

from gpuvm.device import regs
from gpuvm.device.clock import EventPrices

# the checkout's experiments/costs/, or the copy a `pip install .` puts in the package
_CHECKOUT_COSTS = Path(__file__).resolve().parents[2] / "experiments" / "costs"
COSTS_DIR = _CHECKOUT_COSTS if _CHECKOUT_COSTS.is_dir() else \
    Path(__file__).resolve().parent / "files" / "costs"


def mmio_exits(counters: Mapping[str, int]) -> int:
    """Every MMIO exit a row or phase counted (`exits.mmio.<bar>.<read|write>`): in a
    mediated mode the traps, natively the bare-metal accesses they stand for."""
    return sum(v for k, v in counters.items() if k.startswith("exits.mmio."))


# the counted events whose time the mediator spends holding its lock
LOCKED_COUNTERS = frozenset({"shadow.ptes_scanned", "shadow.syncs", "shadow.bar_syncs"})


@dataclass(frozen=True)
class CostProfile:
    """What each counted event costs on a stated platform (a [costs] table): the counts
    are exact, so priced this way they give times that compare with the paper's."""

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
    # system serialises it; gpuvm.sim.stream_replay)
    trap_mediator_ns: float = 0.0
    # one 64-bit word of a new PV page directory or table zeroed by the hypervisor: the
    # PV path allocates whole tables, and zeroing them is what the native driver does
    # itself with BAR stores (pt_zero_words), so both pay for it
    pt_zero_word_ns: float = 0.0
    # one byte of a pageable copy staged through the runtime's pinned bounce buffer
    # (a guest memcpy; counted as copy.bounce_bytes)
    bounce_byte_ns: float = 0.0
    # VRAM oversubscription (gpuvm.sim.residency): one residency switch's fixed part,
    # the mediator's work per page moved (its shadow PTE rewritten), and the copy
    # engine's time per byte moved between VRAM and host memory
    residency_switch_ns: float = 0.0
    residency_page_ns: float = 0.0
    residency_byte_ns: float = 0.0

    def event_prices(self, mediated: bool) -> EventPrices:
        """These prices as the virtual clock charges them, event by event, on the trap
        path: the same events modelled_ns prices from counts (engine time aside, which
        the guest waits for on the GPU instead), so one VM alone spends exactly its
        priced counts in virtual time beside its waits."""
        bars = (regs.BAR0, regs.BAR1, regs.BAR3)  # BAR4's write is the hypercall itself
        exit_ns = {bar: self.trap_ns for bar in bars} if mediated else \
            {regs.BAR0: self.mmio_native_ns, regs.BAR1: self.aperture_native_ns,
             regs.BAR3: self.aperture_native_ns}
        counter_ns = {
            "pv.pts_allocated": self.pt_alloc_ns + regs.SMALL_PTES_PER_PT * self.pt_zero_word_ns,
            "hcall.set_pgd": regs.PDE_COUNT * self.pt_zero_word_ns,
            "hcall.calls": self.hypercall_ns,
            "hcall.entries": self.hcall_entry_ns,
            "shadow.ptes_scanned": self.pte_scanned_ns,
            "shadow.syncs": self.shadow_sync_ns,
            "shadow.bar_syncs": self.shadow_sync_ns,
            "remap.maps": self.remap_ns,
            "remap.unmaps": self.remap_ns,
        }
        return EventPrices({bar: round(ns) for bar, ns in exit_ns.items()},
                           round(self.trap_mediator_ns) if mediated else 0,
                           {k: v for k, v in counter_ns.items() if v},
                           LOCKED_COUNTERS)

    @staticmethod
    def pv_zero_words(counters: dict[str, int]) -> int:
        """Words the hypervisor zeroes for PV: a directory per SET_PGD, a small table per
        table it allocates (shadow.pv_space zeroes both whole)."""
        return (counters.get("hcall.set_pgd", 0) * regs.PDE_COUNT
                + counters.get("pv.pts_allocated", 0) * regs.SMALL_PTES_PER_PT)

    def modelled_ns(self, counters: dict[str, int], mediated: bool) -> float:
        """Engine time plus every counted event at its price.

        In native mode an MMIO exit stands for a bare-metal access (an uncached register
        read/write on BAR0, a posted store through BAR1/BAR3); in a mediated mode it is a
        trap (remapped accesses never exit, so cost nothing here)."""
        bar0 = sum(v for k, v in counters.items() if k.startswith("exits.mmio.bar0."))
        aperture = mmio_exits(counters) - bar0
        mmio = (bar0 + aperture) * self.trap_ns if mediated else \
            bar0 * self.mmio_native_ns + aperture * self.aperture_native_ns
        return (counters.get("engine.busy_ns", 0) + mmio
                + counters.get("pv.pts_allocated", 0) * self.pt_alloc_ns
                + self.pv_zero_words(counters) * self.pt_zero_word_ns
                + counters.get("copy.bounce_bytes", 0) * self.bounce_byte_ns
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
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise ValueError(f"cost profile {path}: {key}: must be a non-negative number "
                             f"of ns, got {value!r}")
    return CostProfile(path.stem, **{k: float(v) for k, v in table.items()})


# ------------------------------------------------------------------ host memory (issue 16)
@dataclass(frozen=True)
class HostMemCosts:
    """Prices of the host-memory events a guest reports (gpuvm/vmm/hostmem.py counters).

    Every value is a median measured by `gpuvm calibrate --gpu` (experiments/costs/gpu-*.toml):
    copy bandwidths at the largest size measured, cudaHostRegister/Unregister per chunk of
    a memfd in 4 KiB pages or on shmem THP, and `thp_split_us`, per 2 MiB huge page the
    kernel really split (hostmem.huge_splits, smaps before vs after), from the profile:
    0 where no chunk-pinned copy split a page (the H200: none did).  `thp_cut_us` prices
    instead every huge page a device-written pin range only partly covers
    (hostmem.huge_cuts, arithmetic): 0 in every measured profile; only the labelled
    scenario experiments/costs/hostmem-field-split.toml sets it, from the field report,
    not from our measurement."""

    name: str
    h2d_pinned_gib_s: float
    d2h_pinned_gib_s: float
    h2d_pageable_gib_s: float
    d2h_pageable_gib_s: float
    chunk_bytes: int
    pin_chunk_4k_us: float
    unpin_chunk_4k_us: float
    pin_chunk_thp_us: float
    unpin_chunk_thp_us: float
    thp_split_us: float = 0.0
    thp_cut_us: float = 0.0

    def breakdown_ns(self, counters: dict[str, int]) -> dict[str, float]:
        """Modelled ns per kind of event: DMA of pinned and chunk-pinned bytes at the
        pinned bandwidth, staged (bounce-buffer) bytes at the pageable bandwidth, pins and
        unpins per chunk-sized piece by backing, huge pages the kernel split, and (the
        field-report scenario only) huge pages pins cut."""
        def c(key: str) -> int:
            return counters.get(f"hostmem.{key}", 0)

        def at(nbytes: int, gib_s: float) -> float:
            return nbytes / (gib_s * (1 << 30)) * 1e9

        per_byte = 1e3 / self.chunk_bytes  # us per chunk -> ns per byte
        return {
            "pinned_dma": at(c("xfer.htod.pinned.bytes") + c("xfer.htod.chunks.bytes"),
                             self.h2d_pinned_gib_s)
            + at(c("xfer.dtoh.pinned.bytes") + c("xfer.dtoh.chunks.bytes"), self.d2h_pinned_gib_s),
            "staged": at(c("xfer.htod.staged.bytes"), self.h2d_pageable_gib_s)
            + at(c("xfer.dtoh.staged.bytes"), self.d2h_pageable_gib_s),
            "pin": (c("pin_bytes_4k") * self.pin_chunk_4k_us
                    + c("pin_bytes_thp") * self.pin_chunk_thp_us) * per_byte,
            "unpin": (c("unpin_bytes_4k") * self.unpin_chunk_4k_us
                      + c("unpin_bytes_thp") * self.unpin_chunk_thp_us) * per_byte,
            "split": c("huge_splits") * self.thp_split_us * 1e3,
            "cut": c("huge_cuts") * self.thp_cut_us * 1e3,
        }

    def modelled_ns(self, counters: dict[str, int]) -> float:
        return sum(self.breakdown_ns(counters).values())


def hostmem_costs_from_gpu_profile(name: str, costs: dict[str, float], chunk_bytes: int,
                                   thp_split_us: float = 0.0) -> HostMemCosts:
    """The prices from a measured profile's [costs] table (gpuvm/calibrate/profile.py)."""
    try:
        return HostMemCosts(
            name, costs["h2d_pinned_gib_s"], costs["d2h_pinned_gib_s"],
            costs["h2d_pageable_gib_s"], costs["d2h_pageable_gib_s"], chunk_bytes,
            costs["pin_chunk_memfd_4k_us"], costs["unpin_chunk_memfd_4k_us"],
            costs["pin_chunk_memfd_thp_us"], costs["unpin_chunk_memfd_thp_us"], thp_split_us)
    except KeyError as exc:
        raise ValueError(f"host-memory profile {name!r}: the measured profile has no "
                         f"{exc.args[0]!r}") from None


def load_hostmem_costs(name_or_path: str) -> HostMemCosts:
    """A measured GPU profile (gpu-*.toml: [costs] + [device]) or a file with a [hostmem]
    table naming its `base` measured profile and the values it overrides."""
    path = Path(name_or_path)
    if not path.suffix:
        path = COSTS_DIR / f"{name_or_path}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"host-memory profile {name_or_path!r} not found ({path})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"host-memory profile {path}: not valid TOML ({exc})") from None
    if "hostmem" in data:
        table = dict(data["hostmem"])
        base = table.pop("base", None)
        if not isinstance(base, str):
            raise ValueError(f"host-memory profile {path}: [hostmem] needs base = "
                             "\"<measured profile>\"")
        costs = load_hostmem_costs(base)
        names = {f.name for f in fields(HostMemCosts)} - {"name"}
        extra = sorted(set(table) - names)
        if extra:
            raise ValueError(f"host-memory profile {path}: unknown {extra[0]!r}")
        values = {f.name: getattr(costs, f.name) for f in fields(HostMemCosts)}
        values.update({k: type(values[k])(v) for k, v in table.items()})
        values["name"] = path.stem
        return HostMemCosts(**values)
    if "costs" not in data or "device" not in data:
        raise ValueError(f"host-memory profile {path}: needs [costs] and [device] (a "
                         "measured profile) or a [hostmem] table")
    return hostmem_costs_from_gpu_profile(path.stem, data["costs"],
                                          int(data["device"]["chunk_bytes"]),
                                          float(data["costs"].get("thp_split_us", 0.0)))
