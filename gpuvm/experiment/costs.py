"""Modelled time: exact counts times a cost profile, plus the device's engine time.

Emulation costs differ from the paper's hardware (a Python trap is ~20 us, not ~1 us), so
wall time alone cannot be compared with the paper's ratios.  The counts are exact, so
pricing them with a stated profile (experiments/costs/*.toml) gives times that can; the
profile says what it assumes.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

# the checkout's experiments/costs/, or the copy a `pip install .` puts in the package
_CHECKOUT_COSTS = Path(__file__).resolve().parents[2] / "experiments" / "costs"
COSTS_DIR = _CHECKOUT_COSTS if _CHECKOUT_COSTS.is_dir() else \
    Path(__file__).resolve().parent / "cost_profiles"


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
    if set(table) != names:
        missing, extra = sorted(names - set(table)), sorted(set(table) - names)
        raise ValueError(f"cost profile {path}: "
                         + (f"missing {missing[0]!r}" if missing else f"unknown {extra[0]!r}"))
    return CostProfile(path.stem, **{k: float(v) for k, v in table.items()})
